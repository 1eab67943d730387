"""LMI-Dist speculation with LoRA adapters: the request's own adapter verifies its drafts, so a batch
mixing the base model and adapters answers as PEFT does per adapter, and as the same server without
speculation does (tokens, log-probs, prompt scores), alone and in a crowd, for both proposers."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmforge.testing.lora import PeftReference
from lmforge.testing.server import RemoteServer, metrics
from tests.integration.test_lora import NEW, PROMPTS, generate, lora_model, peft  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _speculating(lora_model: Path, dst: Path, spec: dict[str, object]) -> Path:  # noqa: F811
    """A copy of the LoRA model folder that speculates as ``spec`` says."""
    shutil.copytree(lora_model, dst, symlinks=True)
    with (dst / "serving.properties").open("a") as f:
        f.write(f"option.speculative_config={json.dumps(spec)}\n")
    return dst


def test_adapters_verify_their_own_drafts(lora_model: Path, peft: PeftReference, tmp_path: Path) -> None:  # noqa: F811
    spec = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "disable_by_batch_size": 64,
    }
    model = _speculating(lora_model, tmp_path / "model", spec)
    jobs = [(p, "body", name) for p in PROMPTS for name in (None, "a1", "a2")]
    with RemoteServer(model) as srv, ThreadPoolExecutor(len(jobs)) as pool:
        outs = list(pool.map(lambda job: generate(srv, *job), jobs))
        stats = metrics(srv.url)
    for (prompt, _how, name), out in zip(jobs, outs, strict=True):
        assert out == peft.greedy(prompt, NEW, name), (prompt, name)
    assert stats["lmforge_engine_speculative_proposed_tokens_total"] > 0


@pytest.fixture(scope="module")
def without(lora_model: Path) -> Iterator[RemoteServer]:  # noqa: F811
    with RemoteServer(lora_model) as srv:
        yield srv


@pytest.mark.parametrize("proposer", ["ngram", "draft-whole", "draft-one-layer"])
def test_speculation_with_adapters_gives_the_same_answer(
    lora_model: Path,  # noqa: F811
    without: RemoteServer,
    tmp_path: Path,
    proposer: str,
) -> None:
    """:mod:`tests.same_answer`'s probes for the base model and adapters a1 and a2 in one crowd, with
    speculation on equal to off: generated tokens and their log-probs, alternatives, seeds, penalties,
    structured output and the prompt scores of the echo probes. The draft model is the base model
    (``draft-whole``: every draft is the base's greedy choice, which an adapter request must reject
    where its adapter disagrees) or its first layer (often wrong for everyone), given as a folder
    relative to the model folder."""
    from lmforge.models.truncate import write_truncated_model
    from tests.same_answer import same_with_speculation, standard_probes

    spec: dict[str, object] = {"num_speculative_tokens": 4, "disable_by_batch_size": 64}
    if proposer == "ngram":
        spec |= {"method": "ngram", "prompt_lookup_min": 1}
        model = _speculating(lora_model, tmp_path / "model", spec)
    else:
        spec |= {"method": "draft_model", "model": "draft"}
        model = _speculating(lora_model, tmp_path / "model", spec)
        write_truncated_model(lora_model, model / "draft", 2 if proposer == "draft-whole" else 1)
    probes = [*standard_probes(PROMPTS), *standard_probes(PROMPTS, adapter="a1")]
    probes += [p for p in standard_probes(PROMPTS, adapter="a2") if "echo" in p.name]
    with RemoteServer(model) as srv:
        on, near_ties = same_with_speculation(without.url, srv.url, probes)
        stats = metrics(srv.url)
    for tie in near_ties:
        warnings.warn(f"near-tie: {tie}", stacklevel=1)
    # the adapters change the answers (else this would check nothing of who verifies)
    assert on["completion"]["tokens"] != on["a1-completion"]["tokens"], "a1 changed nothing"
    assert on["echo-1"]["logprobs"] != on["a2-echo-1"]["logprobs"], "a2 changed nothing"
    proposed = stats["lmforge_engine_speculative_proposed_tokens_total"]
    accepted = stats["lmforge_engine_speculative_accepted_tokens_total"]
    assert proposed > 0, stats
    if proposer == "draft-whole":
        # the base requests accept the base model's drafts; a1's requests reject some of them
        assert 0 < accepted < proposed, (accepted, proposed)
