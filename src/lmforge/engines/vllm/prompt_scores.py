"""vLLM: the log-probs of a prompt's own tokens (OpenAI completions' ``echo`` with ``logprobs``), from
the ``prompt_logprobs`` vLLM computes during prefill and hands over with a request's first output."""

from __future__ import annotations

import math
from typing import Any

from lmforge.engines.protocol import Token


def prompt_scores(output: Any, ids: list[int], top_n: int | None) -> list[Token] | None:
    """One token per prompt token (the first unscored: NaN, no alternatives), each with its
    ``top_n`` most likely alternatives; None when the request did not ask (``top_n`` None)."""
    if top_n is None:
        return None
    positions = output.prompt_logprobs or []
    out = [Token(ids[0], "", math.nan)]
    for i in range(1, len(ids)):
        position = positions[i] if i < len(positions) else None
        entry = position.get(ids[i]) if position else None
        # vLLM adds the prompt's own token to its top-n when it ranks lower: by rank, it comes last
        ranked = sorted((position or {}).items(), key=lambda kv: (kv[1].rank or 0, -kv[1].logprob))
        top = [(t, float(lp.logprob)) for t, lp in ranked[:top_n]]
        log_prob = float(entry.logprob) if entry is not None else math.nan
        out.append(Token(ids[i], "", log_prob, top_logprobs=top))
    return out
