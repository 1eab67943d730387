"""OpenAI's answers: ``chat.completion`` / ``chat.completion.chunk`` and ``text_completion``.

* A stream ends with a usage chunk (``choices: []``) when ``stream_options.include_usage`` asks,
  then, in SSE, ``data: [DONE]``.
* ``finish_reason`` takes only OpenAI's values (:data:`OPENAI_FINISH_REASON`, the one table): ``stop``,
  ``length``, ``tool_calls`` (a reply that is a complete tool call), or null mid-stream.
* A request the engine ended without an answer (an error, an abort) has no finish reason: a whole
  answer becomes the error's status, and a stream that already started ends with one event
  ``{"error": {"message", "type", "param", "code"}}`` (:meth:`lmforge.errors.LmforgeError.to_openai_dict`,
  as vLLM sends it), then ``data: [DONE]``; the official client raises it as an ``APIError``.
* Log-probs name every token by its real bytes (:mod:`lmforge.handlers.logprobs`); completions with
  ``echo`` and ``logprobs`` start with the prompt's tokens and log-probs.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Sequence
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.errors import LmforgeError, NotReadyError, error_for_status
from lmforge.handlers.formatters import SSE, dumps, frame
from lmforge.handlers.logprobs import TokenText

if TYPE_CHECKING:
    from lmforge.engines.protocol import Call
    from lmforge.handlers.reply_parsing import ReplyParser
    from lmforge.handlers.tool_calls import ToolCallMode

#: lmforge's finish reasons -> OpenAI's; None: the request has no answer to finish (the engine ended
#: it with an error or aborted it), see :func:`failure`
OPENAI_FINISH_REASON: dict[FinishReason, str | None] = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: None,
    FinishReason.ERROR: None,
}


def failure(event: GenerationEvent) -> LmforgeError | None:
    """The error of a final event that ends its request without an answer, else None."""
    reason = event.finish_reason
    if reason is None or OPENAI_FINISH_REASON[reason] is not None:
        return None
    if reason is FinishReason.ABORT:
        return NotReadyError("the engine aborted the request before it finished; retry it", retry_after=1)
    return error_for_status(event.error_status, event.error or "generation failed")


def end_of_stream(media_type: str) -> bytes:
    """What ends every OpenAI stream: SSE's ``data: [DONE]`` (nothing in jsonlines)."""
    return b"data: [DONE]\n\n" if media_type == SSE else b""


class _OpenAIFormatter:
    """What OpenAI's chat and completions answers share: id, created, model, usage."""

    object_name = ""
    """The ``object`` of streamed chunks (and of completions answers)."""
    id_prefix = ""

    def __init__(
        self,
        model_name: str,
        *,
        logprobs: bool,
        include_usage: bool = False,
        token_text: TokenText | None = None,
    ) -> None:
        self.id = f"{self.id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.index = 0
        """The choice this formatter builds (``n`` > 1: one formatter per choice, sharing id and created)."""
        self.model_name = model_name
        """The served model's name (or the adapter's) that the answer gives as ``model``."""
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.tokens: list[Token] = []
        self.last: GenerationEvent | None = None
        self.text = token_text or TokenText(None)
        """Names tokens in log-probs (their real bytes)."""
        self.failed = False
        """The stream ended with an error event."""

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
        }

    @staticmethod
    def usage(event: GenerationEvent) -> dict[str, int]:
        return {
            "prompt_tokens": event.prompt_tokens,
            "completion_tokens": event.generated_tokens,
            "total_tokens": event.prompt_tokens + event.generated_tokens,
        }

    def _collect(self, events: Iterable[GenerationEvent]) -> GenerationEvent:
        last: GenerationEvent | None = None
        for event in events:
            if event.token is not None:
                self.tokens.append(event.token)
            last = event
        assert last is not None and last.finish_reason is not None
        self.last = last
        return last

    def stream_frame(self, event: GenerationEvent, media_type: str) -> bytes:
        """``frame(self.chunk(event), media_type)``, byte for byte; a plain text chunk (the common
        case) is written from a template, as LMI's token line is. A final event without an answer
        (:func:`failure`) is the error event, after a chunk for the token it may bring."""
        token = event.token
        if event.finished and (err := failure(event)) is not None:
            self.failed, self.last = True, event
            last_token = b""
            if token is not None:
                last_token = frame(self.chunk(dataclasses.replace(event, finish_reason=None)), media_type)
            return last_token + frame(err.to_openai_dict(), media_type)
        if token is None or event.finished or not self._plain():
            return frame(self.chunk(event), media_type)
        if self._template is None:
            head = dumps({**self._envelope(self.object_name, [{"index": self.index}])})
            # '...,"choices":[{"index":N}]}' -> '...,"choices":[{"index":N,' + field + TEXT + tail
            self._template = (head[:-3] + self._text_field, self._tail)
        before, after = self._template
        line = f"{before}{encode_basestring(token.text)}{after}"
        return f"data: {line}\n\n".encode() if media_type == SSE else (line + "\n").encode()

    _template: tuple[str, str] | None = None
    _text_field = ""
    """What precedes a chunk's text, after the choice's index (``,"text":`` ...)."""
    _tail = ""
    """What follows a chunk's text."""

    def _plain(self) -> bool:
        """Whether the next chunk is the plain one the template writes."""
        return False

    def chunk(self, event: GenerationEvent) -> dict[str, Any]:
        raise NotImplementedError

    def _finish(self, out: dict[str, Any], event: GenerationEvent) -> dict[str, Any]:
        if event.finished:
            self.last = event
        return out

    def trailer(self, media_type: str, usage: dict[str, int] | None = None) -> bytes:
        """What ends a stream: the usage chunk when asked (``stream_options.include_usage``; ``usage``
        of all choices when there are several; none after an error event), then SSE's ``[DONE]``."""
        out = b""
        if self.include_usage and self.last is not None and not self.failed:
            usage = usage or self.usage(self.last)
            out += frame({**self._envelope(self.object_name, []), "usage": usage}, media_type)
        return out + end_of_stream(media_type)


def choices_usage(formatters: Sequence[_OpenAIFormatter], n: int) -> dict[str, int]:
    """Usage of a request answered with several choices, ``n`` per prompt (the formatters in choice
    order): each prompt once however many choices it has, every choice's tokens (as vLLM counts)."""
    ends = [f.last for f in formatters]
    prompt = sum(e.prompt_tokens for e in ends[::n] if e is not None)
    completion = sum(e.generated_tokens for e in ends if e is not None)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ChatFormatter(_OpenAIFormatter):
    """Builds OpenAI chat-completion responses from the events of one request."""

    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"
    _text_field = ',"delta":{"content":'
    _tail = '},"logprobs":null,"finish_reason":null}]}'

    def _plain(self) -> bool:
        return self._sent_role and not self.logprobs and self.tool_mode is None and self.reply is None

    def __init__(
        self,
        model_name: str,
        *,
        logprobs: bool,
        include_usage: bool = False,
        tool_mode: ToolCallMode | None = None,
        reply: ReplyParser | None = None,
        token_text: TokenText | None = None,
    ) -> None:
        super().__init__(model_name, logprobs=logprobs, include_usage=include_usage, token_text=token_text)
        self._sent_role = False
        self.tool_mode = tool_mode
        self.reply = reply
        """Splits reasoning and the model's own tool calls out of the text (None: the text as it is)."""
        self._auto_calls = 0
        self._text: list[str] = []  # a forced tool call's text so far

    def final_json(self, events: Iterable[GenerationEvent]) -> dict[str, Any]:
        last = self._collect(events)
        assert last.finish_reason is not None
        text = "".join(t.text for t in self.tokens)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        calls = self.tool_mode.calls(text) if self.tool_mode is not None else None
        if calls is not None:
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        elif self.reply is not None:
            reasoning, content, found = self.reply.whole(text)
            if self.reply.reasoning is not None:
                message["reasoning_content"] = reasoning
            message["content"] = content if content or not found else None
            if found:
                calls = message["tool_calls"] = self._openai_calls(found)
        choice: dict[str, Any] = {
            "index": self.index,
            "message": message,
            "logprobs": {"content": [self.text.chat_entry(t) for t in self.tokens]}
            if self.logprobs
            else None,
            "finish_reason": self._finish_reason(last.finish_reason, calls),
        }
        return {**self._envelope("chat.completion", [choice]), "usage": self.usage(last)}

    @staticmethod
    def _finish_reason(reason: FinishReason, calls: list[dict[str, Any]] | None) -> str | None:
        """OpenAI's: a reply that ended as a complete tool call finishes with ``tool_calls``."""
        if calls and reason in (FinishReason.EOS, FinishReason.STOP_SEQUENCE):
            return "tool_calls"
        return OPENAI_FINISH_REASON[reason]

    def chunk(self, event: GenerationEvent) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if not self._sent_role:
            delta["role"] = "assistant"
            self._sent_role = True
        text = event.token.text if event.token is not None else ""
        calls = None
        if self.tool_mode is not None:
            calls = self._tool_delta(delta, text, event.finished)
        elif self.reply is not None:
            calls = self._parsed_delta(delta, text, event.finished)
        else:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": self.index,
            "delta": delta,
            "logprobs": (
                {"content": [self.text.chat_entry(event.token)]}
                if self.logprobs and event.token is not None
                else None
            ),
            "finish_reason": self._finish_reason(event.finish_reason, calls) if event.finish_reason else None,
        }
        return self._finish(self._envelope(self.object_name, [choice]), event)

    def _parsed_delta(self, delta: dict[str, Any], text: str, finished: bool) -> list[dict[str, Any]] | None:
        """A streamed chunk through the reply parser: reasoning and content as they become certain, the
        model's tool calls whole at the end."""
        assert self.reply is not None
        delta.update(self.reply.feed(text))
        if not finished:
            return None
        parts, found = self.reply.finish()
        for key, value in parts.items():
            delta[key] = delta.get(key, "") + value
        if not found:
            return None
        calls = self._openai_calls(found)
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return calls

    def _openai_calls(self, found: list[Call]) -> list[dict[str, Any]]:
        base = f"call_{uuid.uuid4().hex[:24]}"
        return [
            {"id": f"{base}_{i}" if i else base, "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(found)
        ]

    def _tool_delta(self, delta: dict[str, Any], text: str, finished: bool) -> list[dict[str, Any]] | None:
        """Fill a streamed chunk's delta for a forced tool call. A named function's arguments stream
        as they are generated (the first delta carries the call's id and name); the calls of
        ``tool_choice: "required"`` are sent whole once the array is complete. Returns the calls when
        the reply is complete."""
        assert self.tool_mode is not None
        first = not self._text
        self._text.append(text)
        if self.tool_mode.named is not None:
            if first:
                call = self.tool_mode.calls(text)
                assert call is not None
                delta["tool_calls"] = [{"index": 0, **call[0]}]
            else:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": text}}]
            return self.tool_mode.calls("".join(self._text)) if finished else None
        if not finished:
            return None
        full = "".join(self._text)
        calls = self.tool_mode.calls(full)
        if calls is None:
            delta["content"] = full  # cut short: the partial text, as text
        else:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        return calls


class CompletionFormatter(_OpenAIFormatter):
    """Builds OpenAI (legacy) completions responses: ``text_completion`` objects, logprobs as
    ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``. With ``echo`` the text starts with
    the prompt and, when the first event brings them, the log-probs with the prompt's tokens (the
    first one unscored: ``null``)."""

    object_name = "text_completion"
    id_prefix = "cmpl-"
    _text_field = ',"text":'
    _tail = ',"logprobs":null,"finish_reason":null}]}'

    def _plain(self) -> bool:
        return not self._echo_pending and not self.logprobs

    def __init__(
        self,
        model_name: str,
        *,
        logprobs: bool,
        include_usage: bool = False,
        echo: str | None = None,
        token_text: TokenText | None = None,
    ) -> None:
        super().__init__(model_name, logprobs=logprobs, include_usage=include_usage, token_text=token_text)
        self.echo = echo or ""
        """The prompt's text (``echo``; None: no echo)."""
        self._echoes = echo is not None
        self._echo_pending = self._echoes
        self._offset = len(self.echo)

    def _logprobs(self, tokens: list[Token], prompt: list[Token] | None = None) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offsets = []
        if prompt:
            at = 0
            for piece in self.text.pieces([t.id for t in prompt]):
                offsets.append(at)
                at += len(piece)
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token.text)
        return self.text.completion_logprobs([*(prompt or []), *tokens], offsets, first_unscored=bool(prompt))

    def final_json(self, events: Iterable[GenerationEvent]) -> dict[str, Any]:
        events = list(events)
        last = self._collect(events)
        assert last.finish_reason is not None
        prompt = next((e.prompt_logprobs for e in events if e.prompt_logprobs is not None), None)
        choice = {
            "index": self.index,
            "text": self.echo + "".join(t.text for t in self.tokens),
            "logprobs": self._logprobs(self.tokens, prompt if self._echoes else None),
            "finish_reason": OPENAI_FINISH_REASON[last.finish_reason],
        }
        return {**self._envelope(self.object_name, [choice]), "usage": self.usage(last)}

    def chunk(self, event: GenerationEvent) -> dict[str, Any]:
        tokens = [event.token] if event.token is not None else []
        text = "".join(t.text for t in tokens)
        prompt = None
        if self._echo_pending:
            text, self._echo_pending, prompt = self.echo + text, False, event.prompt_logprobs
        choice = {
            "index": self.index,
            "text": text,
            "logprobs": self._logprobs(tokens, prompt),
            "finish_reason": OPENAI_FINISH_REASON[event.finish_reason] if event.finish_reason else None,
        }
        return self._finish(self._envelope(self.object_name, [choice]), event)
