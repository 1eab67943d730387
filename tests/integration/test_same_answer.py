"""The same answer alone or in a crowd, on real weights (SmolLM2-135M-Instruct, fp32), on LMI-Dist and
vLLM: :mod:`tests.same_answer`'s probes sent one at a time and then all at once, shuffled, must give
identical tokens and log-probs (within 1e-4); the prompt log-probs of the ``echo`` probes (what
lm-eval-harness's log-likelihood requests read) must also equal a transformers forward pass over the
prompt (within 1e-3, the cross-engine tolerance of test_real_model.py).

Before the fix of 2026-11-28, LMI-Dist scored prompts in a forward pass that could overlap a batch
step and read its non-causal setting from the shared model config: 4-7 of 8 echo requests in a crowd
got log-probs off by up to 15 nats, and kept them afterwards alone. This module fails on that code.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.testing.server import RemoteServer
from tests.conftest import Reference
from tests.same_answer import (
    Answer,
    Probe,
    answers_alone,
    echo_probe,
    prompt_logprobs,
    same_alone_and_in_a_crowd,
    same_with_speculation,
    speculation_probes,
    standard_probes,
)
from tests.shared_vllm import needs_vllm

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]

#: prompts of different lengths (2 to ~40 tokens), so prefill and decode rows of other lengths share steps
PROMPTS = (
    "The capital of France is",
    "Water boils at one hundred degrees Celsius at sea level, and it freezes at",
    "def add(a, b):\n    return",
    "In 1492 Columbus sailed the ocean blue. In 1969 people first walked on the moon. The first "
    "programmable computer was built in",
    "One two",
    "Photosynthesis converts light energy into chemical energy in plants, algae and",
)
REFERENCE_TOL = 1e-3


@pytest.fixture(scope="module")
def reference_scores(smollm2_reference: Reference) -> dict[str, tuple[list[int], list[float]]]:
    """transformers' log-prob of each prompt token given those before it (one forward pass)."""
    import torch

    ref = smollm2_reference
    out = {}
    for prompt in PROMPTS:
        ids = list(ref.tokenizer(prompt)["input_ids"])
        with torch.inference_mode():
            logits = ref.model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        out[prompt] = ids, [logits[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    return out


def _probes() -> list[Probe]:
    return [
        *standard_probes(PROMPTS),
        *(echo_probe(f"score-{i}", p, max_tokens=0) for i, p in enumerate(PROMPTS)),
    ]


def _check_against_transformers(answers: dict, reference: dict[str, tuple[list[int], list[float]]]) -> None:
    for i, prompt in enumerate(PROMPTS):
        ids, want = reference[prompt]
        got = prompt_logprobs(answers[f"score-{i}"], len(ids))
        assert got[0] is None, f"{prompt!r}: the first prompt token has no log-prob"
        worst = max(abs(g - w) for g, w in zip(got[1:], want, strict=True))
        assert worst <= REFERENCE_TOL, f"{prompt!r}: prompt log-probs {got[1:]} vs transformers {want}"


def test_lmi_dist_same_alone_and_in_a_crowd(smollm2_lmi_dist: RemoteServer, reference_scores: dict) -> None:
    answers = same_alone_and_in_a_crowd(smollm2_lmi_dist.url, _probes())
    _check_against_transformers(answers, reference_scores)
    # and still right alone after the crowds (a crowd once left the scorer broken for good)
    again = same_alone_and_in_a_crowd(smollm2_lmi_dist.url, _probes()[-len(PROMPTS) :], rounds=0)
    _check_against_transformers(again, reference_scores)


#: n-gram prompt lookup as LMI-Dist serves it in these tests (disable_by_batch_size above the crowd, so
#: that the crowd speculates too)
SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 64}


def _speculation_probes() -> list[Probe]:
    """What the speculation tests send: probes that copy from their prompts, and the standard probes
    (sampled, structured, penalties, echo), which speculate little or not at all."""
    return [*speculation_probes(PROMPTS), *standard_probes(PROMPTS)]


@pytest.fixture(scope="module")
def speculation_off(smollm2_lmi_dist: RemoteServer) -> list[Answer]:
    """:func:`_speculation_probes` answered without speculation, each sent alone: what every
    speculating server of this module must answer, asked once."""
    return answers_alone(smollm2_lmi_dist.url, _speculation_probes())


@pytest.fixture(scope="module")
def smollm2_lmi_dist_speculative(smollm2_model: Path) -> Iterator[RemoteServer]:
    with RemoteServer(smollm2_model, env={"OPTION_SPECULATIVE_CONFIG": json.dumps(SPECULATION)}) as server:
        yield server


def test_lmi_dist_speculation_gives_the_same_answer(
    speculation_off: list[Answer], smollm2_lmi_dist_speculative: RemoteServer
) -> None:
    """Greedy answers with n-gram speculation equal those without, alone and in a crowd with requests
    that do not speculate (the standard probes: sampled, structured, penalties, echo); a flip at a
    near-tie is reported by name. The crowd's own consistency is checked by the standard probes too."""
    import httpx

    probes = _speculation_probes()
    _, near_ties = same_with_speculation(speculation_off, smollm2_lmi_dist_speculative.url, probes)
    for tie in near_ties:
        warnings.warn(f"near-tie: {tie}", stacklevel=1)  # reported by name in pytest's summary
    metrics = httpx.get(smollm2_lmi_dist_speculative.url + "/metrics").text
    accepted = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("lmforge_engine_speculative_accepted_tokens_total")
    )
    assert accepted > 0, "no draft was ever accepted: speculation did not run"


#: a draft model as LMI-Dist serves it in these tests: a copy of SmolLM2-135M with all its 30 decoder
#: layers, in its own model folder. Its proposals are the model's raw greedy choice, so most are accepted
#: (each step verifies several tokens, in crowds too), and the requests whose penalties, structured
#: output or stop strings change the choice reject some. A layer-truncated copy without training agrees
#: with the model too rarely to test much: its first 8 layers, 2 % of tokens (3 of 729 proposals
#: accepted here, 2026-12-03), each request soon stops speculating.
DRAFT_LAYERS = 30


@pytest.fixture(scope="module")
def smollm2_lmi_dist_draft(
    smollm2_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RemoteServer]:
    from lmforge.models.truncate import write_truncated_model

    folder = tmp_path_factory.mktemp("draft") / "smollm2-draft"
    draft = write_truncated_model(smollm2_model, folder, DRAFT_LAYERS)
    spec = {
        "method": "draft_model",
        "model": str(draft),
        "num_speculative_tokens": 4,
        "disable_by_batch_size": 64,
    }
    with RemoteServer(smollm2_model, env={"OPTION_SPECULATIVE_CONFIG": json.dumps(spec)}) as server:
        yield server


def test_lmi_dist_draft_speculation_gives_the_same_answer(
    speculation_off: list[Answer], smollm2_lmi_dist_draft: RemoteServer
) -> None:
    """Greedy answers with a draft model proposing equal those without, alone and in a crowd with
    requests that do not speculate; a flip at a near-tie is reported by name; the draft's proposals
    are accepted and rejected both (the verifier keeps some and drops others), and the per-proposer
    series say so."""
    import httpx

    probes = _speculation_probes()
    _, near_ties = same_with_speculation(speculation_off, smollm2_lmi_dist_draft.url, probes, rounds=1)
    for tie in near_ties:
        warnings.warn(f"near-tie: {tie}", stacklevel=1)
    metrics = httpx.get(smollm2_lmi_dist_draft.url + "/metrics").text
    values = {
        line.split()[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if " " in line and not line.startswith("#")
    }
    proposed = values['lmforge_engine_speculative_proposer_proposed_tokens_total{proposer="draft_model"}']
    accepted = values['lmforge_engine_speculative_proposer_accepted_tokens_total{proposer="draft_model"}']
    assert 0 < accepted < proposed, values
    assert proposed == values["lmforge_engine_speculative_proposed_tokens_total"]


@needs_vllm
@pytest.mark.vllm
def test_vllm_same_alone_and_in_a_crowd(smollm2_vllm: RemoteServer, reference_scores: dict) -> None:
    answers = same_alone_and_in_a_crowd(smollm2_vllm.url, _probes())
    _check_against_transformers(answers, reference_scores)
