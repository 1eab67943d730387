"""LMI-Dist with a draft model proposing (``method: draft_model``), in-process on the tiny model: the same
events as without speculation (tokens, log-probs, top-n, finish), whatever the request's settings, alone
and together; the draft's bad folders refused at start naming the option; a draft that raises mid-run
ends its requests with the cause as a core death does, never a hang.

Drafts are written as model folders of their own: the tiny model itself (every greedy draft is the
target's choice: long accepted runs) and its first layer alone (a draft that is often wrong: rejected
runs rolled back in both caches)."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.engines.protocol import FinishReason, SamplingParams
from lmforge.errors import EngineDeadError
from lmforge.models.truncate import write_truncated_model
from tests.integration.test_lmi_dist_speculative import _same_events, _served
from tests.unit.test_lmi_dist_engine import collect, make_engine

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("lmi-dist-engine")]


def _spec(draft: Path, k: int = 4, **more: object) -> str:
    return json.dumps(
        {
            "method": "draft_model",
            "model": str(draft),
            "num_speculative_tokens": k,
            "disable_by_batch_size": 64,
        }
        | more
    )


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def drafts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafts")
    return {
        "whole": write_truncated_model(tiny_model, root / "whole", 2),
        "one-layer": write_truncated_model(tiny_model, root / "one-layer", 1),
    }


@pytest.fixture(scope="module")
def without(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> tuple[dict, dict]:
    want, want_crowd, _ = _served(tiny_model, loop)
    return want, want_crowd


@pytest.mark.parametrize("which", ["whole", "one-layer"])
def test_draft_speculation_gives_the_same_events_as_without(
    tiny_model: Path,
    loop: asyncio.AbstractEventLoop,
    drafts: dict[str, Path],
    without: tuple[dict, dict],
    which: str,
) -> None:
    want, want_crowd = without
    got, got_crowd, metrics = _served(tiny_model, loop, OPTION_SPECULATIVE_CONFIG=_spec(drafts[which]))
    problems = _same_events(want, want_crowd, got, got_crowd)
    assert not problems, "\n".join(problems[:20])
    proposed = metrics["speculative_proposed_tokens_total"]
    accepted = metrics["speculative_accepted_tokens_total"]
    assert proposed > 0 and proposed >= accepted
    label = '{proposer="draft_model"}'
    assert metrics[f"speculative_proposer_proposed_tokens_total{label}"] == proposed
    assert metrics[f"speculative_proposer_accepted_tokens_total{label}"] == accepted
    assert (
        metrics[f"speculative_proposer_mean_accepted_length{label}"]
        == metrics["speculative_mean_accepted_length"]
    )
    if which == "whole":  # the target as its own draft: its greedy drafts are (nearly) all accepted
        assert accepted > 0.5 * proposed, metrics
        assert metrics["speculative_paused_steps_total"] == 0  # nothing to pause the proposer for
    else:  # a draft that is often wrong: rejected drafts were rolled back, and the answers still equal
        assert accepted < proposed, metrics


def test_ngram_speculation_is_labelled_as_its_proposer(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> None:
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    engine = make_engine(tiny_model, loop, OPTION_SPECULATIVE_CONFIG=spec)
    try:
        loop.run_until_complete(
            collect(engine, "r", SamplingParams(max_new_tokens=24, ignore_eos=True), "a b c a b c a b")
        )
        metrics = engine.stats().metrics()
    finally:
        loop.run_until_complete(engine.shutdown())
    assert (
        metrics['speculative_proposer_proposed_tokens_total{proposer="ngram"}']
        == metrics["speculative_proposed_tokens_total"]
    )
    assert not any("draft_model" in key for key in metrics)


# --------------------------------------------------------------------------- bad drafts, refused at start


def _other_tokenizer(tiny_model: Path, folder: Path) -> Path:
    """The tiny model with two of its tokenizer's tokens swapped: the same size, another tokenizer."""
    shutil.copytree(tiny_model, folder)
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.__getitem__)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    return folder


def _other_vocab_size(tiny_model: Path, folder: Path) -> Path:
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config["vocab_size"] += 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _too_big(tiny_model: Path, folder: Path) -> Path:
    """The tiny model's config and tokenizer with a weights file whose header says 256 GiB of float32
    (a sparse file: no disk is used, and nothing reads the data before the check refuses it)."""
    shutil.copytree(tiny_model, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    header = json.dumps(
        {"lm_head.weight": {"dtype": "F32", "shape": [2**18, 2**16], "data_offsets": [0, 2**36]}}
    )
    raw = header.encode() + b" " * (-len(header) % 8)
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + 2**36)
    return folder


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_other_tokenizer, r"another tokenizer than the target's"),
        (_other_vocab_size, r"scores 2112 tokens, the target 2048"),
        (_too_big, r"does not fit in memory: it needs [\d,]+ MiB \(weights [\d,]+ MiB"),
        (lambda _tiny, folder: folder, r"is not a model folder \(no config\.json\)"),
    ],
    ids=["tokenizer", "vocab-size", "memory", "no-folder"],
)
def test_a_bad_draft_is_refused_at_start_naming_the_option(
    tiny_model: Path, loop: asyncio.AbstractEventLoop, tmp_path: Path, make: object, message: str
) -> None:
    folder = make(tiny_model, tmp_path / "draft")  # type: ignore[operator]
    with pytest.raises(Exception, match=r"option\.speculative_config: model=.*" + message):
        make_engine(tiny_model, loop, OPTION_SPECULATIVE_CONFIG=_spec(folder))


# --------------------------------------------------------------------------- a draft that fails mid-run

_CRASHY = '''
from transformers import LlamaForCausalLM


class CrashyLlama(LlamaForCausalLM):
    """A draft that works until its cache holds 40 tokens, then raises (a fault mid-run)."""

    def forward(self, *args, past_key_values=None, **kwargs):
        if past_key_values is not None and past_key_values.get_seq_length() >= 40:
            raise RuntimeError("the crashy draft broke on purpose")
        return super().forward(*args, past_key_values=past_key_values, **kwargs)
'''


def test_a_draft_that_raises_mid_run_fails_its_requests_with_the_cause(
    tiny_model: Path, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The draft runs in the generation loop: its error ends the loop as any fatal step error does
    (the engine core reports its death, every in-flight request ends with the cause, the engine is
    dead and says so), and the requests get an answer, never a hang."""
    folder = write_truncated_model(tiny_model, tmp_path / "crashy", 1)
    (folder / "modeling_crashy.py").write_text(_CRASHY)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_crashy.CrashyLlama"}
    (folder / "config.json").write_text(json.dumps(config))
    engine = make_engine(
        tiny_model, loop, OPTION_SPECULATIVE_CONFIG=_spec(folder), OPTION_TRUST_REMOTE_CODE="true"
    )
    try:

        async def run() -> list:
            params = SamplingParams(max_new_tokens=200, ignore_eos=True)
            streams = [collect(engine, f"c{i}", params, "def f(x):") for i in range(3)]
            return await asyncio.wait_for(asyncio.gather(*streams), timeout=60)

        results = loop.run_until_complete(run())
        for events in results:
            last = events[-1]
            assert last.finish_reason == FinishReason.ERROR, last
            assert last.error and "the draft model" in last.error and "broke on purpose" in last.error
            assert len(events) < 200
        with pytest.raises(EngineDeadError, match="the draft model"):
            engine.check_health()
        assert engine._core is not None and engine._core.proc is not None
        assert engine._core.proc.wait(10) == 1
    finally:
        loop.run_until_complete(engine.shutdown())


# --------------------------------------------------------------------------- seeded sampling's distribution

#: sampled requests of the statistical test, tokens each, and the sampling's support per position
SAMPLES, TOKENS, TOP_K = 300, 12, 8
#: the false-failure rate of the chi-square test below (were the output distribution the target's)
ALPHA = 1e-3
BINS = 11  # 10 degrees of freedom: an even number, whose chi-square tail has a closed form


def _chi2_tail(x: float, dof: int) -> float:
    """P(chi-square with ``dof`` (even) degrees of freedom >= x): exp(-x/2) * sum_{i<dof/2} (x/2)^i / i!."""
    import math

    assert dof % 2 == 0
    half = x / 2
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(dof // 2))


def test_seeded_sampling_with_a_draft_is_the_targets_distribution(
    tiny_model: Path, loop: asyncio.AbstractEventLoop, drafts: dict[str, Path]
) -> None:
    """With a draft model proposing, a seeded sampled answer is drawn from the target's distribution.

    Why the draws are those without speculation, token for token: the sampler draws the token at index
    t of a request from a generator seeded by (the request's seed, t) alone, on the target's scores
    after the tokens before t. A verify row at index t sees exactly the tokens before it (the drafts
    before it are the ones it would have generated had they been accepted), so its draw is the one the
    request makes without speculation; the draft is accepted when it equals that draw, and the first
    row that differs emits its own draw and ends the step. For a greedy draft (a point mass on one
    token d) this is the rejection-sampling rule: d is accepted with probability p(d), and otherwise
    the token emitted is distributed as p without d, renormalised. So the output with speculation is
    the output without it, which is a draw from the target.

    Tested here: (1) the identity, for every one of ``SAMPLES`` seeds; (2) the distribution, on a
    small vocabulary: with ``top_k=8`` each position's support is the target's 8 best tokens, whose
    probabilities transformers' own forward of the tiny model gives (temperature 1). Each speculated
    position's token goes through the randomized probability integral transform of its position's
    distribution (u = F(token before) + V * p(token), V uniform from a fixed-seed generator): u is
    uniform on [0, 1] and independent across positions exactly when every token is a draw from the
    target's distribution given the tokens before it. A chi-square goodness-of-fit of the u over
    ``BINS`` equal bins then fails with probability ``ALPHA`` (0.1 %) were the implementation right; the
    seeds are fixed, so the outcome is the same on every run. A token outside the target's top 8 fails
    at once (unless the 8th and 9th scores tie within 1e-4: a float-rounding near-tie, counted)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    params = [
        SamplingParams(
            max_new_tokens=TOKENS,
            do_sample=True,
            temperature=1.0,
            top_k=TOP_K,
            seed=1000 + i,
            ignore_eos=True,
        )
        for i in range(SAMPLES)
    ]
    prompt = "def f(x):\n    return"

    def answers(engine: object) -> list[list[int]]:
        async def run() -> list[list[int]]:
            out: list[list[int]] = []
            for start in range(0, SAMPLES, 16):
                got = await asyncio.gather(
                    *(
                        collect(engine, f"s{i}", params[i], prompt)
                        for i in range(start, min(start + 16, SAMPLES))
                    )  # type: ignore[arg-type]
                )
                out += [[e.token.id for e in events if e.token] for events in got]
            return out

        return loop.run_until_complete(run())

    off = make_engine(tiny_model, loop)
    try:
        want = answers(off)
        prompt_ids = off.tokenizer.encode(prompt)
    finally:
        loop.run_until_complete(off.shutdown())
    on = make_engine(tiny_model, loop, OPTION_SPECULATIVE_CONFIG=_spec(drafts["whole"]))
    try:
        got = answers(on)
        metrics = on.stats().metrics()
    finally:
        loop.run_until_complete(on.shutdown())
    # (1) the same draws, seed by seed; and the draft path ran: drafts accepted and drafts rejected
    assert got == want, [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b][:10]
    assert 0 < metrics["speculative_accepted_tokens_total"] < metrics["speculative_proposed_tokens_total"], (
        metrics
    )

    # (2) the distribution: the target's top-8 probabilities at every position after the first
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    rng = np.random.default_rng(56)
    u: list[float] = []
    near_ties = 0
    with torch.inference_mode():
        for tokens in got:
            assert len(tokens) == TOKENS
            ids = torch.tensor([prompt_ids + tokens[:-1]])
            logits = model(ids).logits[0, len(prompt_ids) - 1 :]  # row j scores token j
            for j in range(1, TOKENS):  # token 0 comes from the prefill: never speculated
                top = torch.topk(logits[j], TOP_K + 1)
                values, order = top.values[:TOP_K], top.indices[:TOP_K].tolist()
                probs = torch.softmax(values, dim=-1).tolist()
                if tokens[j] not in order:
                    assert float(top.values[TOP_K - 1] - top.values[TOP_K]) <= 1e-4, (
                        f"token {j} of an answer ({tokens[j]}) is outside the target's top {TOP_K}"
                    )
                    near_ties += 1
                    continue
                r = order.index(tokens[j])
                u.append(sum(probs[:r]) + float(rng.random()) * probs[r])
    assert near_ties <= 3, f"{near_ties} near-ties at the top-{TOP_K} edge"
    counts = np.histogram(u, bins=BINS, range=(0.0, 1.0))[0]
    expected = len(u) / BINS
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    p_value = _chi2_tail(chi2, BINS - 1)
    assert p_value > ALPHA, f"chi-square {chi2:.1f} over {BINS} bins (p = {p_value:.2e}): {counts.tolist()}"


def test_metrics_show_the_proposer_over_http(tiny_model: Path, drafts: dict[str, Path]) -> None:
    """``/metrics`` of a server whose draft model proposes: the engine's series and the per-proposer
    family with its label, each family typed once (Prometheus' text format)."""
    import httpx

    from lmforge.testing.server import RemoteServer

    with RemoteServer(tiny_model, env={"OPTION_SPECULATIVE_CONFIG": _spec(drafts["whole"])}) as server:
        body = {"prompt": "def f(x):", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        httpx.post(server.url + "/v1/completions", json=body, timeout=60).raise_for_status()
        text = httpx.get(server.url + "/metrics", timeout=30).text
    lines = text.splitlines()
    types = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family typed twice"
    assert "lmforge_engine_speculative_proposer_accepted_tokens_total" in types
    assert not any("{" in name for name in types)
    values = {line.split()[0]: float(line.split()[1]) for line in lines if line and not line.startswith("#")}
    family = "lmforge_engine_speculative_proposer_"
    assert values[family + 'accepted_tokens_total{proposer="draft_model"}'] > 0
    assert (
        values[family + 'proposed_tokens_total{proposer="draft_model"}']
        == values["lmforge_engine_speculative_proposed_tokens_total"]
    )
    assert values[family + 'mean_accepted_length{proposer="draft_model"}'] > 1.0
