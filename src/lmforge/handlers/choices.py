"""OpenAI's ``n`` > 1 and lists of prompts: one engine request per choice, all in the running batch at
once, answered together as one body or one stream of indexed choices."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

from lmforge.engines.protocol import FieldError, GenerationEvent
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers import streams
from lmforge.handlers.fields import in_client_terms
from lmforge.handlers.io import Output

if TYPE_CHECKING:
    from lmforge.engines.protocol import GenerationRequest
    from lmforge.handlers.replies import Replies
    from lmforge.handlers.request_common import ParsedRequest

Generate = Callable[["GenerationRequest", "ParsedRequest"], AsyncGenerator[GenerationEvent, None]]


def fan_out(
    n: int, runs: list[tuple[ParsedRequest, GenerationRequest]]
) -> list[tuple[ParsedRequest, GenerationRequest]]:
    """``n`` engine requests per prompt: choice ``p * n + i`` is prompt ``p``'s ``i``-th (vLLM's order)
    and samples as choice ``i`` of that prompt alone would (a seeded one with seed + i)."""
    choices: list[tuple[ParsedRequest, GenerationRequest]] = []
    for each, request in runs:
        for i in range(n):
            params = request.params
            if params.seed is not None:
                params = dataclasses.replace(params, seed=(params.seed + i) % 2**63)
            rid = f"{request.request_id}-{len(choices)}"
            choices.append((each, dataclasses.replace(request, request_id=rid, params=params)))
    return choices


async def answer_choices(
    replies: Replies,
    generate: Generate,
    n: int,
    model_name: str,
    runs: list[tuple[ParsedRequest, GenerationRequest]],
    media: str | None,
) -> Output:
    """Every choice of :func:`fan_out` run at once; the first that fails decides the answer (naming its
    prompt), else one body (usage summed) or one stream of indexed choices."""
    choices = fan_out(n, runs)
    sources = [generate(r, each) for each, r in choices]
    firsts = await asyncio.gather(*(anext(s) for s in sources), return_exceptions=True)
    for (each, _), first in zip(choices, firsts, strict=True):
        err = first if isinstance(first, BaseException) else streams.failure(first, openai=True)
        if err is not None:
            await asyncio.gather(*(s.aclose() for s in sources), return_exceptions=True)
            if isinstance(err, FieldError):
                raise in_client_terms(err, each) from None
            raise err
    starts = [f for f in firsts if isinstance(f, GenerationEvent)]
    formatters = [replies.openai(each, model_name) for each, _ in choices]
    for i, formatter in enumerate(formatters):
        formatter.index, formatter.id, formatter.created = i, formatters[0].id, formatters[0].created
    out = Output()
    if media is None:
        try:
            pairs = zip(starts, sources, strict=True)
            collected = await asyncio.gather(*(streams.drain(f, s, openai=True) for f, s in pairs))
        finally:
            await asyncio.gather(*(s.aclose() for s in sources), return_exceptions=True)
        bodies = [f.final_json(events) for f, events in zip(formatters, collected, strict=True)]
        answer = {**bodies[0], "choices": [b["choices"][0] for b in bodies]}
        answer["usage"] = ofmt.choices_usage(formatters, n)
        return out.add_as_json(answer)
    out.add_property("Content-Type", media)
    out.add_property("X-Accel-Buffering", "no")
    return out.add_stream_content(streams.merged_choices(formatters, n, starts, sources, media))
