"""LMI-Dist: the log-probs of a prompt's own tokens (OpenAI completions' ``echo`` with ``logprobs``).

transformers' batching manager scores the tokens it generates, never the prompt's, so the engine core
scores the prompt by one plain forward pass over it, on its helper thread. Without the manager's paged
cache the attention takes the stock SDPA path (:mod:`.attention`), and the model's weights are only
read. The log-probs are the model's own (no temperature or penalties), as vLLM's ``prompt_logprobs``
are, with the request's adapter applied when it names one.

That pass must never overlap a step of the running batch: a forward pass is not reentrant across
threads. transformers 5.19's forward wrapper sets ``config.is_causal`` on the shared config for the
length of a pass and puts back what it found, so a pass that starts while a batch step has it set
reads the step's ``False``, attends without a causal mask, and can leave ``False`` behind for every
later pass (prompt log-probs wrong by up to ~15 nats, alone or in a crowd, until the server restarts).
:class:`ForwardGate` makes every forward pass of the model, the batch's and the scorer's, take one lock
in turn: a step waits at most one scoring pass, the scorer at most one step. The scorer's rows
take its request's adapter from a setting of its own thread (:attr:`.lora.LoraLayers.scoring`), never
from the running step's layout, which the generation thread lays out outside the lock.

Prompts that wait together are scored together (:func:`score_prompts`, planned by :func:`passes`): one
pass over the prompts of one adapter, right-padded to the longest. Right padding changes nothing a
prompt's own tokens see (attention is causal: a token never reads a later position, and a row's
positions are its own), so no mask is needed and each row is the pass it would have had alone, up to
the rounding of a wider matrix product. A pass's cost grows with its tokens, so the gain is not the
scoring itself so much as what follows it: with one prompt a pass (before 2026-11-29), lm-eval's
``local-completions`` at ``num_concurrent=8`` on SmolLM2-135M sent its requests to the running batch
one by one, a prefill step each; scored together, they reach it together (the engine core's CPU for
that task: ~15 -> ~9.6 CPU-s).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.engines.lmi_dist.lora import LoraLayers

#: prompt positions scored per log-softmax (bounds the float32 copy of the logits)
_ROWS = 256
#: most logits (padded positions x vocabulary) one pass of several prompts may make: 256 MiB of
#: float32; a prompt too long for it alone is scored alone, as before
PASS_LOGITS = 64 * 2**20

Scored = list[tuple[int, float, list[tuple[int, float]]]]
"""Per prompt token: (id, log-prob, the ``top_n`` most likely alternatives as (id, log-prob))."""


class ForwardGate:
    """One forward pass of ``model`` at a time, whichever thread calls it: the model's ``forward`` is
    wrapped (on the instance) to hold :attr:`lock` (re-entrant, so a caller may hold it around a pass
    of its own). The wrapper keeps ``forward``'s signature (``functools.wraps``): transformers reads it
    to decide whether to pass ``logits_to_keep``, and without it every prefill would run the LM head
    on every prompt token rather than on the rows that pick a token."""

    def __init__(self, model: Any) -> None:
        self.lock = threading.RLock()
        forward: Callable[..., Any] = model.forward
        lock = self.lock

        @functools.wraps(forward)
        def gated(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return forward(*args, **kwargs)

        model.forward = gated


@contextmanager
def _adapter_only(lora: LoraLayers | None, adapter_id: int) -> Iterator[None]:
    """The LoRA layers apply ``adapter_id`` (0: none) to every row of this thread's passes, whatever
    the running step's layout (which the generation thread may be changing meanwhile)."""
    if lora is None:
        yield
        return
    lora.scoring.adapter = adapter_id
    try:
        yield
    finally:
        del lora.scoring.adapter


def score_prompts(
    model: Any,
    gate: ForwardGate,
    prompts: Sequence[tuple[list[int], int]],
    *,
    lora: LoraLayers | None = None,
    adapter_id: int = 0,
) -> list[Scored]:
    """For each ``(ids, top_n)``, one entry per prompt token: the first unscored (NaN, no
    alternatives), every other with its log-prob given the tokens before it and its ``top_n`` most
    likely alternatives. All the prompts take ``adapter_id`` (installed in ``lora``, its slot held by
    the caller, when it is not 0) and one forward pass (right-padded: see the module's docstring)."""
    import torch

    out: list[Scored] = [[(ids[0], math.nan, [])] for ids, _ in prompts]
    rows = [i for i, (ids, _) in enumerate(prompts) if len(ids) >= 2]
    if not rows:
        return out
    longest = max(len(prompts[i][0]) for i in rows)
    with torch.inference_mode():
        input_ids = torch.zeros((len(rows), longest), dtype=torch.long)
        for row, i in enumerate(rows):
            input_ids[row, : len(prompts[i][0])] = torch.tensor(prompts[i][0])
        input_ids = input_ids.to(model.device)
        with gate.lock, _adapter_only(lora, adapter_id):
            # causal, said outright: never read from the shared config (see the module's docstring)
            logits = model(input_ids=input_ids, use_cache=False, is_causal=True).logits
        for row, i in enumerate(rows):
            ids, top_n = prompts[i]
            out[i] += _read(ids, logits[row, : len(ids) - 1], input_ids[row, 1 : len(ids)], top_n)
    return out


def _read(ids: list[int], logits: Any, targets: Any, top_n: int) -> Scored:
    """The entries of ``ids[1:]`` from the logits of the positions before them."""
    import torch

    out: Scored = []
    for start in range(0, targets.shape[0], _ROWS):
        rows = torch.log_softmax(logits[start : start + _ROWS].float(), dim=-1)
        chosen = rows.gather(1, targets[start : start + _ROWS, None]).squeeze(1).tolist()
        top_lp, top_ids = rows.topk(top_n, dim=-1) if top_n else (None, None)
        for j, lp in enumerate(chosen):
            alternatives: list[tuple[int, float]] = []
            if top_ids is not None and top_lp is not None:
                alternatives = list(zip(top_ids[j].tolist(), top_lp[j].tolist(), strict=True))
            out.append((ids[1 + start + j], lp, alternatives))
    return out


def passes(prompts: Sequence[tuple[int, int]], vocab_size: int) -> list[list[int]]:
    """Which waiting prompts, given as ``(length, adapter id)`` in arrival order, share a pass: the
    prompts of one adapter, in order, while the pass's padded logits stay within
    :data:`PASS_LOGITS` (a prompt over it alone gets a pass of its own). Returns lists of indices."""
    budget = max(1, PASS_LOGITS // max(1, vocab_size))
    out: list[list[int]] = []
    open_pass: dict[int, tuple[list[int], int]] = {}  # adapter -> (the pass being filled, its longest)
    for i, (length, adapter) in enumerate(prompts):
        members, longest = open_pass.get(adapter, ([], 0))
        wider = max(longest, length)
        if members and wider * (len(members) + 1) > budget:
            members, wider = [], length
        if not members:
            out.append(members)
        members.append(i)
        open_pass[adapter] = (members, wider)
    return out
