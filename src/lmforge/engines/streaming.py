"""From an engine's new token ids to lmforge's generation events, shared by every backend (LMI-Dist,
vLLM, TensorRT-LLM, and the scripted test engine): lmforge detokenizes incrementally and matches stop strings
itself, so every token carries its own text whatever engine produced it, and a stop string is told
apart from EOS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.engines.text import IncrementalDetokenizer, StopMatcher
from lmforge.errors import ERROR_TABLE


@dataclass
class TokenStream:
    """One request's stream: feed it each step's new tokens (their ``text`` still empty)."""

    tokenizer: Any
    stop: tuple[str, ...]
    prompt_len: int
    silent: frozenset[int] = frozenset()
    """Ids whose text is never returned (a request's ``stop_token_ids``: they end it, as EOS does)."""
    generated: int = 0
    finished: bool = False
    detok: IncrementalDetokenizer = field(init=False)
    stops: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self.detok = IncrementalDetokenizer(self.tokenizer)
        self.stops = StopMatcher(self.stop)

    def step(
        self, tokens: list[Token], done: FinishReason | None, engine_reason: str = ""
    ) -> list[GenerationEvent]:
        """Events for one engine step. ``done`` is the engine's finish reason when this step ends the
        request (a stop string found here overrides it); ``engine_reason`` names an engine error."""
        ready: list[tuple[Token, str]] = []
        for token in tokens:
            if token.id in self.silent:
                token.special = True
                ready.extend(self.stops.push(token, ""))
                continue
            ready.extend(self.stops.push(token, self.detok.step(token.id)))
            if self.stops.stopped:
                break
        reason: FinishReason | None = None
        if self.stops.stopped:
            reason = FinishReason.STOP_SEQUENCE
        elif done is not None:
            ready.extend(self.stops.flush())
            reason = done
        events = []
        for token, text in ready:
            token.text = text
            self.generated += 1
            events.append(GenerationEvent(token, self.prompt_len, self.generated))
        if reason is not None:
            self.finished = True
            if not events:
                events.append(GenerationEvent(None, self.prompt_len, self.generated))
            events[-1].finish_reason = reason
            if reason is FinishReason.ERROR:
                events[-1].error = f"the engine ended the request: {engine_reason or 'unknown error'}"
                events[-1].error_status = ERROR_TABLE["model_error"].status
        return events

    def end(
        self, reason: FinishReason, error: str | None = None, status: int | None = None
    ) -> list[GenerationEvent]:
        """The closing events of a request the engine did not finish (abort, a dead engine): the text
        held back for a possible stop string, then a final event without a token."""
        events = []
        for token, text in self.stops.flush():
            token.text = text
            self.generated += 1
            events.append(GenerationEvent(token, self.prompt_len, self.generated))
        self.finished = True
        events.append(
            GenerationEvent(
                None, self.prompt_len, self.generated, finish_reason=reason, error=error, error_status=status
            )
        )
        return events
