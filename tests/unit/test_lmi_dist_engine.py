"""LMI-Dist in-process: failure paths that need hooks a real server cannot reach (a dying loop)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.config import load_config
from lmforge.engines.lmi_dist.engine import LmiDistEngine
from lmforge.engines.protocol import (
    FieldError,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    RequestField,
    SamplingParams,
    StructuredOutput,
)
from lmforge.errors import EngineDeadError

#: the engine core is a process of its own: not for ``make test-fast``
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("lmi-dist-engine")]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make_engine(model: Path, loop: asyncio.AbstractEventLoop, **env: str) -> LmiDistEngine:
    resolved = load_config(model, env={"OPTION_NUM_THREADS": "1", **env})
    engine = LmiDistEngine(resolved.config)
    loop.run_until_complete(engine.start())
    return engine


@pytest.fixture(scope="module")
def engine(tiny_model: Path, loop: asyncio.AbstractEventLoop) -> Iterator[LmiDistEngine]:
    eng = make_engine(tiny_model, loop)
    yield eng
    loop.run_until_complete(eng.shutdown())


async def collect(
    engine: LmiDistEngine, rid: str, params: SamplingParams, prompt: str | list[int] = "def "
) -> list[GenerationEvent]:
    ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
    return [e async for e in engine.generate(GenerationRequest(rid, ids, params))]


def test_request_larger_than_max_model_len_is_rejected_up_front(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    with pytest.raises(FieldError) as err:
        loop.run_until_complete(collect(engine, "big", SamplingParams(max_new_tokens=engine.max_model_len)))
    assert err.value.field is RequestField.MAX_NEW_TOKENS
    assert str(engine.max_model_len) in err.value.message
    # The loop survived: the next request works.
    events = loop.run_until_complete(collect(engine, "ok", SamplingParams(max_new_tokens=4)))
    assert events[-1].finish_reason == FinishReason.LENGTH
    engine.check_health()


def test_closing_the_stream_mid_generation_cancels_and_frees_the_slot(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """What the server does when a client goes away: it stops iterating and closes the stream. The
    request stops, its batch slot is free for the next one and it counts as aborted."""
    engine = make_engine(tiny_model, loop, OPTION_MAX_ROLLING_BATCH_SIZE="1")
    params = SamplingParams(max_new_tokens=500, ignore_eos=True)

    async def scenario() -> list[GenerationEvent]:
        got: list[GenerationEvent] = []
        before = engine.stats().aborted_total
        request = GenerationRequest("close-me", engine.tokenizer.encode("def "), params)
        async with contextlib.aclosing(engine.generate(request)) as s:
            async for event in s:
                got.append(event)
                if len(got) == 3:
                    break
        assert engine.stats().running == 0
        assert engine.stats().aborted_total == before + 1
        # the only batch slot is free again: the next request runs to its end
        after = await asyncio.wait_for(collect(engine, "next", SamplingParams(max_new_tokens=4)), 30)
        assert after[-1].finish_reason == FinishReason.LENGTH
        return got

    try:
        got = loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(engine.shutdown())
    assert len(got) == 3 and not any(e.finished for e in got)


def test_closing_the_stream_cancels(engine: LmiDistEngine, loop: asyncio.AbstractEventLoop) -> None:
    async def scenario() -> None:
        before = engine.stats().aborted_total
        params = SamplingParams(max_new_tokens=500, ignore_eos=True)
        stream = engine.generate(GenerationRequest("close-me", engine.tokenizer.encode("def "), params))
        await anext(stream)
        await stream.aclose()
        assert engine.stats().running == 0
        assert engine.stats().aborted_total == before + 1

    loop.run_until_complete(scenario())


def _in_flight_then(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop, breaker: object
) -> list[list[GenerationEvent]]:
    """Three long requests in flight; once each has its first tokens, ``breaker()`` breaks the core."""

    async def scenario() -> list[list[GenerationEvent]]:
        params = SamplingParams(max_new_tokens=500, ignore_eos=True)
        streams = [collect(engine, f"d{i}", params) for i in range(3)]
        tasks = [asyncio.ensure_future(s) for s in streams]
        while engine.stats().tokens_total < 6:
            await asyncio.sleep(0.01)
        await breaker()  # type: ignore[operator]
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    return loop.run_until_complete(scenario())


def _assert_dead(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop, results: list[list[GenerationEvent]]
) -> None:
    for events in results:
        assert events[-1].finish_reason == FinishReason.ERROR
        assert events[-1].error and "engine failure" in events[-1].error
        assert events[-1].error_status == 503
        assert len(events) < 500  # ended mid-stream, not run to the end
    with pytest.raises(EngineDeadError):
        engine.check_health()
    with pytest.raises(EngineDeadError):
        loop.run_until_complete(collect(engine, "after", SamplingParams(max_new_tokens=3)))
    assert not engine.stats().healthy


def test_a_failing_generation_loop_ends_in_flight_requests_and_the_core(
    tiny_model: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """A token id past the vocabulary (the handler refuses it; sent straight to the engine here) breaks
    the core's batched step for every request: in-flight streams end with the cause, the engine is dead,
    and the core process exits non-zero."""
    engine = make_engine(tiny_model, loop)
    try:

        async def poison() -> None:
            bad = GenerationRequest(
                "poison", [5, len(engine.tokenizer) + 100], SamplingParams(max_new_tokens=3)
            )
            async for _ in engine.generate(bad):
                pass

        results = _in_flight_then(engine, loop, poison)
        _assert_dead(engine, loop, results)
        # the cause, as the device reports it: an IndexError on a CPU, a device-side assert on CUDA
        assert any(cause in (results[0][-1].error or "") for cause in ("IndexError", "CUDA")), results[0][-1]
        assert engine._core is not None and engine._core.proc is not None
        assert engine._core.proc.wait(10) == 1
    finally:
        loop.run_until_complete(engine.shutdown())


def test_the_core_runs_with_huge_pages_for_large_blocks(engine: LmiDistEngine) -> None:
    """The engine core's environment asks PyTorch for transparent huge pages (2 MiB+ blocks), unless
    the server's own environment says otherwise."""
    assert engine._core is not None and engine._core.proc is not None
    environ = Path(f"/proc/{engine._core.proc.pid}/environ").read_bytes().split(b"\0")
    want = os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
    assert f"THP_MEM_ALLOC_ENABLE={want}".encode() in environ


def _thp_enabled(pid: int | str) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("THP_enabled:"))


@pytest.mark.skipif(
    not Path("/proc/self/status").exists() or "THP_enabled:" not in Path("/proc/self/status").read_text(),
    reason="needs Linux's per-process THP flag (/proc/<pid>/status THP_enabled)",
)
def test_the_kv_cache_is_allocated_with_small_pages_and_huge_pages_come_back_after(
    engine: LmiDistEngine,
) -> None:
    """``small_pages`` turns the process's huge pages off only inside (the KV cache allocation: huge
    pages there cost seconds of memory compaction at start), and the engine core, which allocated its
    KV cache in it, has them on again for what it allocates later (LoRA factor sets, step buffers)."""
    from lmforge.engines.lmi_dist.loading import small_pages

    assert _thp_enabled("self") == "1"
    with small_pages():
        assert _thp_enabled("self") == "0"
    assert _thp_enabled("self") == "1"
    assert engine._core is not None and engine._core.proc is not None
    assert _thp_enabled(engine._core.proc.pid) == "1"


def test_the_core_profiles_its_own_steps(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The profiler runs in the engine core and records the generation thread's operators (the model
    runs there, not in the caller's thread or process); a second start while one runs, or a stop
    without a start, is refused."""
    from lmforge.errors import LmforgeError

    loop.run_until_complete(engine.start_profile())
    with pytest.raises(LmforgeError, match="already running"):
        loop.run_until_complete(engine.start_profile())
    loop.run_until_complete(collect(engine, "prof", SamplingParams(max_new_tokens=8, ignore_eos=True)))
    summary = loop.run_until_complete(engine.stop_profile(tmp_path / "p" / "profile.txt"))
    assert summary["wall_s"] > 0 and summary["aten_ops"] > 0
    import torch

    if torch.cuda.is_available():  # the core runs the model on the GPU: the profile sees it compute
        assert summary["busy_share"] > 0
    else:  # nothing runs on a device: what the profile saw was host work only
        assert summary["device_busy_s"] == 0
    table = (tmp_path / "p" / "profile.txt").read_text()
    assert "aten::" in table and ("aten::mm" in table or "aten::linear" in table or "aten::addmm" in table)
    with pytest.raises(LmforgeError, match="not running"):
        loop.run_until_complete(engine.stop_profile(tmp_path / "again.txt"))


def test_repetition_penalty_changes_greedy_output(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    plain = loop.run_until_complete(
        collect(engine, "rp0", SamplingParams(max_new_tokens=40, ignore_eos=True))
    )
    penal = loop.run_until_complete(
        collect(engine, "rp1", SamplingParams(max_new_tokens=40, ignore_eos=True, repetition_penalty=5.0))
    )
    ids_plain = [e.token.id for e in plain if e.token]
    ids_penal = [e.token.id for e in penal if e.token]
    assert ids_plain != ids_penal
    assert len(set(ids_penal)) >= len(set(ids_plain))


def test_top_n_logprobs(engine: LmiDistEngine, loop: asyncio.AbstractEventLoop) -> None:
    events = loop.run_until_complete(collect(engine, "top", SamplingParams(max_new_tokens=5, top_n=3)))
    for e in events:
        assert e.token is not None and e.token.top_logprobs is not None
        assert len(e.token.top_logprobs) == 3
        best_id, best_lp = e.token.top_logprobs[0]
        assert best_id == e.token.id  # greedy picks the most likely token
        assert best_lp == pytest.approx(e.token.log_prob)


def test_reused_request_ids_and_early_stops_never_lose_a_request(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """Ids reused right after a stop-string finish (whose cancel reaches the loop late) all complete."""

    async def scenario() -> list[list[GenerationEvent]]:
        first = await collect(engine, "same", SamplingParams(max_new_tokens=40, ignore_eos=True))
        text = "".join(e.token.text for e in first if e.token)
        stop = text[5:8]
        results = []
        for _ in range(5):
            results.append(await collect(engine, "same", SamplingParams(max_new_tokens=40, stop=(stop,))))
            results.append(await collect(engine, "same", SamplingParams(max_new_tokens=8)))
        return results

    results = loop.run_until_complete(asyncio.wait_for(scenario(), timeout=60))
    assert [r[-1].finish_reason for r in results] == [FinishReason.STOP_SEQUENCE, FinishReason.LENGTH] * 5
    assert engine.stats().running == 0


def test_concurrent_prompts_of_many_lengths_match_generate(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """Requests of different prompt lengths at once (steps that mix prefill chunks and decode rows,
    and steps of decode rows only): each gets exactly the tokens generate gives it alone."""
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [
        "def alpha(x):\n    return x * 2\n" * 6,
        "import os\nimport sys\n" * 9,
        "class A:\n    pass\n" * 4,
        "x",
        "for i in range(10):\n    print(i)\n" * 3,
        "a = 1\n" * 40,
    ]
    model = AutoModelForCausalLM.from_pretrained(engine.config.model_dir, dtype="float32").eval()
    tok = engine.tokenizer

    async def run_all() -> list[list[int]]:
        async def one(i: int, p: str) -> list[int]:
            await asyncio.sleep(0.01 * i)  # sleep-ok: arrivals spread over the first steps
            events = await collect(
                engine, f"pr{i}", SamplingParams(max_new_tokens=12, ignore_eos=True), prompt=p
            )
            return [e.token.id for e in events if e.token]

        return list(await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)]))

    results = loop.run_until_complete(run_all())
    for prompt, got in zip(prompts, results, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert got == ref[0, ids.shape[1] :].tolist()


def test_structured_output_constrains_only_its_own_rows(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """Constrained and free requests in one batch: each constrained reply follows its schema, the free
    ones give the tokens they give alone, and the reported log-probs are the model's own."""
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["n"],
            "additionalProperties": False,
        }
    )
    constrained = SamplingParams(max_new_tokens=24, structured=StructuredOutput("json_schema", schema))
    free = SamplingParams(max_new_tokens=24, ignore_eos=True, top_n=1)
    alone = loop.run_until_complete(collect(engine, "alone", free))

    async def mixed() -> list[list[GenerationEvent]]:
        runs = [collect(engine, f"c{i}", constrained, prompt=f"{i} = ") for i in range(3)]
        return await asyncio.gather(*runs, collect(engine, "free", free))

    *replies, together = loop.run_until_complete(asyncio.wait_for(mixed(), timeout=60))
    assert [e.token.id for e in together if e.token] == [e.token.id for e in alone if e.token]
    for events in replies:
        text = "".join(e.token.text for e in events if e.token)
        assert events[-1].finish_reason == FinishReason.EOS, text
        assert set(json.loads(text)) == {"n"} and 0 <= json.loads(text)["n"] <= 9
        for e in events:  # a log-prob of the unconstrained distribution: never above 0, often below
            assert e.token is not None and e.token.log_prob <= 0.0
    json_object = SamplingParams(max_new_tokens=6, structured=StructuredOutput("json_object"))
    first = loop.run_until_complete(collect(engine, "obj", json_object))[0]
    assert first.token is not None and first.token.text.startswith("{")
    assert engine.stats().running == 0


def test_a_schema_that_cannot_compile_is_a_400_before_any_token(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    bad = StructuredOutput("json_schema", '{"type": "no-such-type"}')
    with pytest.raises(FieldError) as err:
        loop.run_until_complete(collect(engine, "bad", SamplingParams(max_new_tokens=4, structured=bad)))
    assert err.value.field is RequestField.STRUCTURED  # from the engine core, across its pipe
    events = loop.run_until_complete(collect(engine, "after", SamplingParams(max_new_tokens=4)))
    assert events[-1].finish_reason == FinishReason.LENGTH


def test_structured_output_without_xgrammar_is_a_400_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An image without xgrammar refuses a structured-output request with a 400, not a hang."""
    from lmforge.engines.structured import Grammars

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` now raises ImportError
    with pytest.raises(FieldError, match="xgrammar") as err:
        Grammars(object(), 8, [])
    assert err.value.field is RequestField.STRUCTURED


@pytest.mark.parametrize(
    ("failure", "status"),
    [
        (RuntimeError("vocabulary unreadable"), "failed"),  # anything: the request ends with an error
        (FieldError(RequestField.STRUCTURED, "xgrammar is not installed"), "rejected"),  # a 400
    ],
)
def test_a_grammar_that_cannot_be_built_answers_the_request(failure: Exception, status: str) -> None:
    """Whatever breaks while the engine core builds a request's grammar (on its helper thread), the
    frontend hears of that request, which is never submitted, and the core forgets it. (Found on a
    GPU machine without xgrammar, where such requests waited forever.)"""
    from types import SimpleNamespace

    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist import ipc
    from lmforge.engines.lmi_dist.core import Core
    from lmforge.engines.lmi_dist.sampler import RequestSampler

    def grammars() -> Any:
        raise failure

    sent: list[Any] = []
    push = SimpleNamespace(send=lambda raw, copy: sent.append(ipc.decode_from_core(raw)))
    core = Core(ServingConfig(), push)
    submitted: list[str] = []
    manager = SimpleNamespace(add_request=lambda *args, **kw: submitted.append(kw["request_id"]))
    core.built = SimpleNamespace(  # type: ignore[assignment]
        sampler=RequestSampler(grammars), manager=manager, eos_ids=[2]
    )
    core.router = SimpleNamespace(tracks={})
    params = SamplingParams(max_new_tokens=4, structured=StructuredOutput("json_object"))
    core.add(ipc.Add("r1", [1, 2, 3], ipc.Sampling.of(params)))
    core._helper.shutdown(wait=True)
    assert submitted == [] and core.router.tracks == {}
    [message] = sent
    [out] = message.items
    want = {"failed": ipc.FAILED, "rejected": ipc.REJECTED}[status]
    assert (out.rid, out.tokens, out.status) == ("r1", [], want)
    assert str(failure) in (out.error or "")


def test_prompt_logprobs_score_the_prompt_as_the_batch_scored_its_tokens(
    engine: LmiDistEngine, loop: asyncio.AbstractEventLoop
) -> None:
    """echo with logprobs: the prompt's log-probs come from a plain forward pass beside the running
    batch. Scoring prompt + the greedy reply must give back the log-probs (and, greedy, the top
    alternative) the batching loop's sampler recorded for that reply."""
    greedy = SamplingParams(max_new_tokens=6, top_n=2, ignore_eos=True)
    ids = engine.tokenizer.encode("def fibonacci(n):")
    reply = loop.run_until_complete(collect(engine, "g", greedy, prompt=ids))
    tokens = [e.token for e in reply if e.token is not None]
    scored_params = SamplingParams(max_new_tokens=1, prompt_top_n=2)
    whole = [*ids, *(t.id for t in tokens)]
    events = loop.run_until_complete(collect(engine, "s", scored_params, prompt=whole))
    scored = events[0].prompt_logprobs
    assert scored is not None and [t.id for t in scored] == whole
    assert all(e.prompt_logprobs is None for e in events[1:])
    assert scored[0].top_logprobs is None and scored[0].log_prob != scored[0].log_prob  # NaN: unscored
    for got, want in zip(scored[len(ids) :], tokens, strict=True):
        assert got.log_prob == pytest.approx(want.log_prob, abs=1e-4)
        assert got.top_logprobs is not None and len(got.top_logprobs) == 2
        assert got.top_logprobs[0][0] == want.id  # greedy: the reply's token is the most likely
    no_scores = loop.run_until_complete(collect(engine, "n", SamplingParams(max_new_tokens=1)))
    assert no_scores[0].prompt_logprobs is None
