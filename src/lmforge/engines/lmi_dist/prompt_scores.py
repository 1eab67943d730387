"""LMI-Dist: the log-probs of a prompt's own tokens (OpenAI completions' ``echo`` with ``logprobs``).

transformers' batching manager scores the tokens it generates, never the prompt's, so the engine core
scores the prompt by one plain forward pass over it, on its helper thread beside the running batch.
Without the manager's paged cache the attention takes the stock SDPA path (:mod:`.attention`), and
the model's weights are only read. The log-probs are the model's own (no temperature or penalties), as vLLM's
``prompt_logprobs`` are.
"""

from __future__ import annotations

import math
from typing import Any

#: prompt positions scored per log-softmax (bounds the float32 copy of the logits)
_ROWS = 256

Scored = list[tuple[int, float, list[tuple[int, float]]]]
"""Per prompt token: (id, log-prob, the ``top_n`` most likely alternatives as (id, log-prob))."""


def score_prompt(model: Any, ids: list[int], top_n: int) -> Scored:
    """One entry per prompt token: the first unscored (NaN, no alternatives), every other with its
    log-prob given the tokens before it and its ``top_n`` most likely alternatives."""
    import torch

    out: Scored = [(ids[0], math.nan, [])]
    if len(ids) < 2:
        return out
    with torch.inference_mode():
        input_ids = torch.tensor([ids], device=model.device)
        logits = model(input_ids=input_ids, use_cache=False).logits[0, :-1]
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
