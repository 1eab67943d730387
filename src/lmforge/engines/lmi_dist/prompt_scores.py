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
in turn: a step waits at most one prompt's forward pass, the scorer at most one step. The scorer's rows
take its request's adapter from a setting of its own thread (:attr:`.lora.LoraLayers.scoring`), never
from the running step's layout, which the generation thread lays out outside the lock.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.engines.lmi_dist.lora import LoraLayers

#: prompt positions scored per log-softmax (bounds the float32 copy of the logits)
_ROWS = 256

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


def score_prompt(
    model: Any,
    gate: ForwardGate,
    ids: list[int],
    top_n: int,
    *,
    lora: LoraLayers | None = None,
    adapter_id: int = 0,
) -> Scored:
    """One entry per prompt token: the first unscored (NaN, no alternatives), every other with its
    log-prob given the tokens before it and its ``top_n`` most likely alternatives. ``adapter_id``
    must be installed in ``lora`` (the caller holds its slot) when it is not 0."""
    import torch

    out: Scored = [(ids[0], math.nan, [])]
    if len(ids) < 2:
        return out
    with torch.inference_mode():
        input_ids = torch.tensor([ids], device=model.device)
        with gate.lock, _adapter_only(lora, adapter_id):
            # causal, said outright: never read from the shared config (see the module's docstring)
            logits = model(input_ids=input_ids, use_cache=False, is_causal=True).logits[0, :-1]
        targets = input_ids[0, 1:]
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
