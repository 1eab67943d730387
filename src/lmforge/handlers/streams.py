"""An engine's event streams as the default handler answers them: collected whole, framed as they
come, several choices merged, or cut after the prompt (``echo`` with ``max_tokens: 0``).

Every stream ends with a final event. One that the engine ends without an answer, or that fails in
between, ends with an error: raised before the status line is sent, reported in-band after (the
formatter frames the final error event in its own schema).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from lmforge.engines.protocol import FinishReason, GenerationEvent
from lmforge.errors import LmforgeError, classify, error_for_status
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers.io import LastChunk

Events = AsyncGenerator[GenerationEvent, None]


def failure(event: GenerationEvent, openai: bool) -> LmforgeError | None:
    """The error of a final event without an answer: an engine error, and for OpenAI's schemas (which
    have no finish reason for it) an abort too; else None."""
    if openai:
        return ofmt.failure(event)
    if event.finish_reason == FinishReason.ERROR:
        return error_for_status(event.error_status, event.error or "generation failed")
    return None


def cut_short(last: GenerationEvent) -> GenerationEvent:
    """The final event for an engine stream that ended without one (a backend bug, reported as such)."""
    return GenerationEvent(
        None,
        last.prompt_tokens,
        last.generated_tokens,
        finish_reason=FinishReason.ERROR,
        error="the engine ended the stream without a final event",
        error_status=424,
    )


def error_event(last: GenerationEvent, exc: Exception) -> GenerationEvent:
    """The final event of a stream that failed after ``last``."""
    err: LmforgeError = classify(exc)
    return GenerationEvent(
        None,
        last.prompt_tokens,
        last.generated_tokens,
        finish_reason=FinishReason.ERROR,
        error=err.message,
        error_status=err.status,
    )


async def drain(first: GenerationEvent, events: Events, openai: bool) -> list[GenerationEvent]:
    """Every event of one stream, ending with its final one; a failed generation raises."""
    collected = [first]
    async for event in events:
        collected.append(event)
    if not collected[-1].finished:
        collected.append(cut_short(collected[-1]))
    err = failure(collected[-1], openai)
    if err is not None:
        raise err
    return collected


async def through_final(first: GenerationEvent, events: Events) -> Events:
    """``first``, then the stream's events up to its final one. A stream that ends without one, or
    fails, ends with an error event: the status line is gone, so errors are reported in-band."""
    event = first
    try:
        while True:
            yield event
            if event.finished:
                return
            try:
                event = await anext(events)
            except StopAsyncIteration:
                event = cut_short(event)
    except Exception as exc:
        yield error_event(event, exc)


async def frames(
    first: GenerationEvent,
    events: Events,
    media: str,
    stream_frame: Callable[[GenerationEvent, str], bytes],
    trailer: Callable[[str], bytes] | None,
) -> AsyncIterator[bytes]:
    """One stream's frames as each event comes, then ``trailer`` (OpenAI's usage and ``[DONE]``).

    The hot path (a frame per token) keeps its own loop: one async-generator hop less per token than
    :func:`through_final` (bench/streaming_ceiling.py). The final event's frame and the trailer go as
    one :class:`~lmforge.handlers.io.LastChunk`, which the server writes with the end of the body."""
    async with contextlib.aclosing(events):
        event = first
        try:
            while True:
                frame = stream_frame(event, media)
                if event.finished:
                    break
                yield frame
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    event = cut_short(event)
        except Exception as exc:  # the status line is gone: report in-band, in the stream's framing
            frame = stream_frame(error_event(event, exc), media)
        yield LastChunk(frame + trailer(media) if trailer is not None else frame)


async def merged_choices(
    formatters: Sequence[ofmt.ChatFormatter | ofmt.CompletionFormatter],
    n: int,
    starts: list[GenerationEvent],
    streams: list[Events],
    media: str,
) -> AsyncIterator[bytes]:
    """The choices' chunks as each is generated (OpenAI's ``index`` tells them apart), then the usage
    of all choices (``n`` per prompt) and ``[DONE]``. A choice that fails ends the whole stream with its
    error event."""
    queue: asyncio.Queue[tuple[int, GenerationEvent]] = asyncio.Queue()

    async def pump(i: int, first: GenerationEvent, events: Events) -> None:
        async with contextlib.aclosing(through_final(first, events)) as choice:
            async for event in choice:
                await queue.put((i, event))

    pairs = enumerate(zip(starts, streams, strict=True))
    tasks = [asyncio.create_task(pump(i, e, s)) for i, (e, s) in pairs]
    try:
        open_choices = len(tasks)
        while open_choices:
            i, event = await queue.get()
            yield formatters[i].stream_frame(event, media)
            if formatters[i].failed:
                yield ofmt.end_of_stream(media)
                return
            open_choices -= event.finished
        yield formatters[0].trailer(media, ofmt.choices_usage(formatters, n))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True)


async def prompt_only(events: Events) -> Events:
    """``echo`` with ``max_tokens: 0`` (lm-eval-harness's log-likelihood calls): the engine's first
    event brings the prompt's log-probs; the token it generated to get there is dropped and the
    answer is the prompt alone, finished by ``length`` with no completion tokens."""
    async with contextlib.aclosing(events):
        first = await anext(events)
        if first.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            yield first
            return
        yield GenerationEvent(
            None,
            first.prompt_tokens,
            0,
            finish_reason=FinishReason.LENGTH,
            prompt_logprobs=first.prompt_logprobs,
        )
