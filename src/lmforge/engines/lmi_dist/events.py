"""LMI-Dist: one request's outputs from the batching manager, turned into generation events.

Incremental detokenization, stop sequences, log-probs from the sampler's record, finish reasons, and
the final event of an aborted or failed request.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import FinishReason, GenerationEvent, SamplingParams, Token
from lmforge.engines.text import IncrementalDetokenizer, StopMatcher
from lmforge.errors import ERROR_TABLE

if TYPE_CHECKING:
    from lmforge.engines.lmi_dist.sampler import Record


@dataclass
class Live:
    """Bookkeeping of one in-flight request on the event-loop side."""

    outputs: deque[Any] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    dead_error: str | None = None
    engine_done: bool = False
    """The manager delivered its last output for this request (finished or failed)."""

    def push(self, output: Any) -> None:
        self.outputs.append(output)
        self.wake.set()


def terminal_event(reason: str, prompt_len: int, generated: int) -> GenerationEvent:
    """The last event of a request that was aborted (``reason == "aborted"``) or lost to a dead engine."""
    if reason == "aborted":
        return GenerationEvent(None, prompt_len, generated, finish_reason=FinishReason.ABORT)
    status = ERROR_TABLE["engine_dead"].status
    return GenerationEvent(
        None, prompt_len, generated, finish_reason=FinishReason.ERROR, error=reason, error_status=status
    )


async def output_events(
    live: Live,
    params: SamplingParams,
    record: Record,
    prompt_len: int,
    *,
    tokenizer: Any,
    eos_ids: list[int],
    counters: dict[str, float],
    loop_failure: Callable[[], str | None],
) -> AsyncIterator[GenerationEvent]:
    """The events of one request, from the outputs ``live`` receives until it finishes or dies."""
    from transformers.generation.continuous_batching.requests import RequestStatus

    detok = IncrementalDetokenizer(tokenizer)
    stops = StopMatcher(params.stop)
    seen = 0
    while True:
        if not live.outputs:
            if live.dead_error is not None:
                for token, text in stops.flush():
                    token.text = text
                    yield GenerationEvent(token, prompt_len, seen)
                yield terminal_event(live.dead_error, prompt_len, seen)
                return
            live.wake.clear()
            await live.wake.wait()
            continue
        output = live.outputs.popleft()
        live.engine_done = output.is_finished()
        if output.status == RequestStatus.FAILED:
            failure = loop_failure()
            if failure is not None:  # a dead rank or a fatal loop error, not this request's fault
                yield terminal_event(f"engine failure: {failure}", prompt_len, seen)
                return
            yield GenerationEvent(
                None,
                prompt_len,
                seen,
                finish_reason=FinishReason.ERROR,
                error=f"generation failed: {output.error}",
                error_status=ERROR_TABLE["model_error"].status,
            )
            return
        new_ids = output.generated_tokens[seen:]
        done = output.status == RequestStatus.FINISHED
        ready: list[tuple[Any, str]] = []
        for tid in new_ids:
            idx = seen
            seen += 1
            counters["tokens_total"] += 1
            silent = tid in params.stop_token_ids  # ends the reply; its text is not returned
            special = silent or tid in eos_ids
            token = Token(
                id=tid,
                text="",
                log_prob=record.logprobs[idx] if idx < len(record.logprobs) else math.nan,
                special=special,
                top_logprobs=_top(tokenizer, params, record, idx),
            )
            ready.extend(stops.push(token, "" if silent else detok.step(tid)))
            if stops.stopped:
                break
        reason: FinishReason | None = None
        if stops.stopped:
            reason = FinishReason.STOP_SEQUENCE
        elif done:
            ready.extend(stops.flush())
            reason = _finish_reason(output.generated_tokens, params, eos_ids)
        last = len(ready) - 1
        for i, (token, text) in enumerate(ready):
            token.text = text
            yield GenerationEvent(token, prompt_len, seen, finish_reason=reason if i == last else None)
        if reason is not None:
            if not ready:
                yield GenerationEvent(None, prompt_len, seen, finish_reason=reason)
            return


def _finish_reason(generated: list[int], params: SamplingParams, eos_ids: list[int]) -> FinishReason:
    last = generated[-1] if generated else None
    if last in params.stop_token_ids or (last in eos_ids and not params.ignore_eos):
        return FinishReason.EOS
    return FinishReason.LENGTH


def _top(
    tokenizer: Any, params: SamplingParams, record: Record, idx: int
) -> list[tuple[int, str, float]] | None:
    if params.top_n_logprobs <= 0 or idx >= len(record.top):
        return None
    return [(tid, tokenizer.decode([tid]), lp) for tid, lp in record.top[idx]]
