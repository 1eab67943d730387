"""A scripted engine: the engine protocol with no model, for in-process HTTP contract tests.

It loads the model folder's real tokenizer (the handler tokenizes prompts and renders chat templates
with it, as with a real engine) and hands its tokens through lmforge's own
:class:`~lmforge.engines.streaming.TokenStream` (incremental detokenization, stop strings), so the
handler, the formatters and the ASGI app see what vLLM or LMI-Dist would give them.
Only the choice of tokens is scripted:

* the tokens of a request are a pure function of its prompt ids (:meth:`ScriptedEngine.script`), so a
  test can say exactly what the answer must be;
* after ``eos_after`` tokens the engine emits EOS (unless the request ignores it);
* ``gate``: when set, every generation waits on it before its first token (requests stay in flight);
* ``fail_after``: the engine ends a request with an engine error after that many tokens;
* ``cancel_after``: the engine cancels a request itself after that many tokens (as vLLM's ``abort`` and
  TensorRT-LLM's ``cancelled`` do): the stream ends with ``finish_reason=ABORT``;
* ``fail_start`` / :meth:`kill`: a load failure, and an engine that dies while serving;
* prompt log-probs (``SamplingParams.prompt_top_n``): every prompt token after the first scores
  ``LOG_PROB``; its alternatives are the prompt's own tokens up to it, the latest first (so a prompt
  of byte-level pieces gives alternatives that are pieces too).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING

from lmforge.engines.base import EngineBase
from lmforge.engines.protocol import (
    EngineStats,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    SamplingParams,
    Token,
)
from lmforge.engines.streaming import TokenStream
from lmforge.errors import EngineDeadError, LmforgeError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

#: the log-prob of every scripted token, and of its alternatives (top_n_tokens)
LOG_PROB = -0.5
MAX_MODEL_LEN = 512


class ScriptedEngine(EngineBase):
    """An :class:`lmforge.engines.protocol.Engine` whose tokens are a function of the prompt."""

    name = "scripted"

    def __init__(
        self,
        config: ServingConfig,
        extra_options: Mapping[str, str] | None = None,
        *,
        eos_after: int | None = None,
        fail_after: int | None = None,
        cancel_after: int | None = None,
        fail_start: str | None = None,
    ) -> None:
        super().__init__(config, extra_options)
        self.eos_after = eos_after
        self.fail_after = fail_after
        self.cancel_after = cancel_after
        self.fail_start = fail_start
        self.gate: asyncio.Event | None = None
        self.max_model_len = MAX_MODEL_LEN
        self.seen: list[GenerationRequest] = []
        self.reply: str | None = None
        """When set, every request is answered with this text, then EOS (within its max_new_tokens)."""
        self._running = 0
        self._alive = False
        self._pool: list[int] = []

    async def start(self) -> None:
        from transformers import AutoTokenizer

        if self.fail_start:
            raise LmforgeError(self.fail_start)
        path = self.config.model_path
        if path is None:
            raise LmforgeError("the scripted engine needs a local model folder for its tokenizer")
        self._tokenizer = AutoTokenizer.from_pretrained(str(path))
        self.eos_id = int(self._tokenizer.eos_token_id)
        special = set(self._tokenizer.all_special_ids)
        # ordinary word-like tokens: their texts concatenate without surprises
        for tid in range(len(self._tokenizer)):
            text = self._tokenizer.decode([tid])
            if tid not in special and text.strip().isalpha() and text.isascii():
                self._pool.append(tid)
        self._alive = True

    def script(self, prompt_ids: list[int], n: int) -> list[int]:
        """The ``n`` token ids this engine generates after ``prompt_ids`` (EOS not included)."""
        seed = sum(prompt_ids) + len(prompt_ids)
        return [self._pool[(seed + 7 * i) % len(self._pool)] for i in range(n)]

    def prompt_logprobs(self, ids: list[int], top_n: int | None) -> list[Token] | None:
        """The prompt's scored tokens (None unless asked): see the module docstring."""
        if top_n is None:
            return None
        out = [Token(ids[0], "", float("nan"))]
        for i in range(1, len(ids)):
            alternatives = list(dict.fromkeys(reversed(ids[: i + 1])))[:top_n]
            top = [(t, LOG_PROB - k) for k, t in enumerate(alternatives)]
            out.append(Token(ids[i], "", LOG_PROB, top_logprobs=top))
        return out

    def text(self, prompt: str, n: int) -> str:
        """The text of the first ``n`` generated tokens for a plain (LMI) prompt."""
        ids = self._tokenizer.encode(prompt)
        return str(self._tokenizer.decode(self.script(ids, n)))

    def kill(self) -> None:
        """The engine dies: ``check_health`` fails and running streams end with an error."""
        self._alive = False

    def check_health(self) -> None:
        if not self._alive:
            raise EngineDeadError("the scripted engine is dead")

    def stats(self) -> EngineStats:
        return self._stats(self._running, healthy=self._alive)

    async def shutdown(self) -> None:
        self._alive = False

    async def _generate(
        self, request: GenerationRequest, params: SamplingParams
    ) -> AsyncGenerator[GenerationEvent, None]:
        ids = request.prompt
        pending = self.prompt_logprobs(ids, params.prompt_top_n)
        self.seen.append(request)
        stream = TokenStream(self._tokenizer, params.stop, len(ids))
        planned = self.script(ids, params.max_new_tokens)
        eos_after = self.eos_after
        if self.reply is not None:
            planned = self._tokenizer.encode(self.reply, add_special_tokens=False)[: params.max_new_tokens]
            eos_after = len(planned)
            planned = [*planned, self.eos_id] if len(planned) < params.max_new_tokens else planned
        self._running += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            for i, tid in enumerate(planned):
                await asyncio.sleep(0)  # one event-loop turn per token, as an engine step gives
                if self.cancel_after is not None and i >= self.cancel_after:
                    for event in stream.end(FinishReason.ABORT):
                        yield event
                    return
                if not self._alive or (self.fail_after is not None and i >= self.fail_after):
                    reason = "the engine died" if not self._alive else f"scripted failure after {i} tokens"
                    for event in stream.step([], FinishReason.ERROR, reason):
                        event.prompt_logprobs, pending = pending, None
                        yield event
                    return
                eos = eos_after is not None and i >= eos_after and not params.ignore_eos
                token = Token(self.eos_id if eos else tid, "", LOG_PROB, special=eos)
                if params.top_n:
                    token.top_logprobs = [
                        (alt, LOG_PROB - k) for k, alt in enumerate(self.script([tid], params.top_n))
                    ]
                last = eos or i == len(planned) - 1
                finish = (FinishReason.EOS if eos else FinishReason.LENGTH) if last else None
                for event in stream.step([token], finish):
                    if pending is not None:
                        event.prompt_logprobs, pending = pending, None
                    yield event
                if stream.finished:
                    return
        finally:
            self._running -= 1
