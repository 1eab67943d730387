"""LMI-Dist's prompt scoring (``echo`` with ``logprobs``): prompts that wait together share one forward
pass (lmi_dist.prompt_scores, Core.score_waiting) and each gets what it gets scored alone."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from lmforge.engines.lmi_dist import ipc
from lmforge.engines.lmi_dist.prompt_scores import (
    ForwardGate,
    Scored,
    passes,
    score_prompts,
)

pytestmark = pytest.mark.xdist_group("prompt-scores")

VOCAB = 256
#: the passes' logits bound in these tests: 256 positions of this vocabulary
BUDGET = 256 * VOCAB


@pytest.fixture(autouse=True)
def _small_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmforge.engines.lmi_dist import prompt_scores

    monkeypatch.setattr(prompt_scores, "PASS_LOGITS", BUDGET)


@pytest.fixture(scope="module")
def model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def gate(model: Any) -> ForwardGate:
    return ForwardGate(model)


PROMPTS = [
    ([5, 9, 13, 200, 7, 7, 1], 3),
    ([42], 2),  # one token: nothing to score
    (list(range(3, 60)), 0),
    ([17, 4], 5),
]


def _same(got: Scored, want: Scored) -> None:
    assert [t for t, _, _ in got] == [t for t, _, _ in want]
    assert math.isnan(got[0][1]) and got[0][2] == []
    for (_, lp, top), (_, want_lp, want_top) in zip(got[1:], want[1:], strict=True):
        assert lp == pytest.approx(want_lp, abs=1e-5)
        assert [t for t, _ in top] == [t for t, _ in want_top]
        assert [v for _, v in top] == pytest.approx([v for _, v in want_top], abs=1e-5)


def _alone(model: Any, gate: ForwardGate, ids: list[int], top_n: int) -> Scored:
    return score_prompts(model, gate, [(ids, top_n)])[0]


def _same_as_alone(reply: ipc.Reply, model: Any, gate: ForwardGate, ids: list[int], top_n: int) -> None:
    """A core's reply (alternatives as lists, off the wire) is what the prompt gets scored alone."""
    assert reply.error is None, reply.error
    _same([(t, lp, [tuple(a) for a in top]) for t, lp, top in reply.value], _alone(model, gate, ids, top_n))


def test_prompts_scored_in_one_pass_get_what_each_gets_alone(model: Any, gate: ForwardGate) -> None:
    import torch

    alone = [_alone(model, gate, ids, top_n) for ids, top_n in PROMPTS]
    together = score_prompts(model, gate, PROMPTS)
    for got, want, (ids, top_n) in zip(together, alone, PROMPTS, strict=True):
        _same(got, want)
        assert len(got) == len(ids) and all(len(top) == top_n for _, _, top in got[1:])
    # and alone is the model's own log-softmax over the prompt
    ids = PROMPTS[0][0]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    want = torch.log_softmax(logits.float(), dim=-1)
    for pos in range(1, len(ids)):
        assert alone[0][pos][1] == pytest.approx(want[pos - 1, ids[pos]].item(), abs=1e-5)


def test_passes_keep_adapters_apart_and_the_logits_bounded() -> None:
    budget = BUDGET // VOCAB
    short = budget // 8
    # (length, adapter) in arrival order
    waiting = [(short, 0), (short, 3), (short, 0), (budget + 5, 0), (short, 3), (short, 0)]
    plan = passes(waiting, VOCAB)
    assert sorted(i for members in plan for i in members) == list(range(len(waiting)))
    assert plan == [[0, 2], [1, 4], [3], [5]]
    for members in plan:
        assert len({waiting[i][1] for i in members}) == 1
        longest = max(waiting[i][0] for i in members)
        assert len(members) == 1 or longest * len(members) <= budget
    # eight fill one pass, the ninth starts another
    assert passes([(short, 0)] * 9, VOCAB) == [list(range(8)), [8]]


def _core_after(
    model: Any, gate: ForwardGate, calls: list[ipc.Call], later: list[ipc.Call] | None = None
) -> tuple[dict[int, Any], int]:
    """A core whose helper thread is busy while ``calls`` arrive, then ``later`` once those are answered:
    its replies by call id, and how many forward passes it made."""
    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.core import Core

    sent: list[Any] = []
    push = SimpleNamespace(send=lambda raw, copy: sent.append(ipc.decode_from_core(raw)))
    core = Core(ServingConfig(), push)
    core.built = SimpleNamespace(model=model, gate=gate, lora=None, vocab_size=VOCAB)  # type: ignore[assignment]
    forwards: list[int] = []
    hook = model.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    busy = threading.Event()
    core._helper.submit(busy.wait, 30)
    try:
        for call in calls:
            core.handle(call)
        busy.set()
        deadline = time.monotonic() + 30
        while len(sent) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        for call in later or []:
            core.handle(call)
    finally:
        busy.set()
        core._helper.shutdown(wait=True)
        hook.remove()
    replies = {m.call_id: m for m in sent}
    assert len(replies) == len(sent) == len(calls) + len(later or []), "one reply per call"
    return replies, len(forwards)


def _calls(prompts: list[tuple[list[int], int]]) -> list[ipc.Call]:
    return [
        ipc.Call(i, ipc.Method.SCORE_PROMPT, {"ids": ids, "top_n": n, "adapter": 0})
        for i, (ids, n) in enumerate(prompts)
    ]


def test_the_core_scores_the_prompts_waiting_together_and_answers_each(model: Any, gate: ForwardGate) -> None:
    """Calls that arrive while the core's helper thread is busy are one pass when it is free (a prompt
    too long to share one gets its own), and each answer is the prompt's own."""
    huge = ([3] * (BUDGET // VOCAB + 1), 1)
    replies, forwards = _core_after(model, gate, _calls([*PROMPTS, huge]))
    assert forwards == 2
    for i, (ids, top_n) in enumerate([*PROMPTS, huge]):
        _same_as_alone(replies[i], model, gate, ids, top_n)


def test_a_prompt_that_breaks_a_shared_pass_fails_alone(model: Any, gate: ForwardGate) -> None:
    """An id outside the vocabulary (the frontend never sends one: whatever breaks a pass) fails its
    own call; the prompts that shared its pass are scored again, each alone, and answered."""
    bad = ([1, VOCAB + 7, 2], 0)
    replies, forwards = _core_after(model, gate, _calls([PROMPTS[0], bad, PROMPTS[3]]))
    assert forwards == 1 + 3  # the shared pass, then each alone
    assert replies[1].kind == "model_error" and "IndexError" in (replies[1].error or "")
    for i, (ids, top_n) in ((0, PROMPTS[0]), (2, PROMPTS[3])):
        _same_as_alone(replies[i], model, gate, ids, top_n)


def test_calls_after_a_turn_are_the_next_turns_and_a_malformed_one_is_answered(
    model: Any, gate: ForwardGate
) -> None:
    """The calls that arrive once a turn of the helper has taken the waiting ones make the next turn's
    pass; a call without ids (lmforge's frontend never sends one) gets an error, and the others of its
    turn are scored."""
    first = _calls(PROMPTS[:2])
    later = [
        ipc.Call(10, ipc.Method.SCORE_PROMPT, {"ids": PROMPTS[2][0], "top_n": PROMPTS[2][1]}),
        ipc.Call(11, ipc.Method.SCORE_PROMPT, {"top_n": 1}),
        ipc.Call(12, ipc.Method.SCORE_PROMPT, {"ids": PROMPTS[3][0], "top_n": PROMPTS[3][1]}),
    ]
    replies, forwards = _core_after(model, gate, first, later)
    assert forwards == 2
    assert replies[11].kind == "model_error" and "KeyError" in (replies[11].error or "")
    for call_id, (ids, top_n) in ((0, PROMPTS[0]), (1, PROMPTS[1]), (10, PROMPTS[2]), (12, PROMPTS[3])):
        _same_as_alone(replies[call_id], model, gate, ids, top_n)
