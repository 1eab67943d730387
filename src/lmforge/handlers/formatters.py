"""Response schemas: the one place that decides what lmforge sends back.

* LMI ``json``: ``{"generated_text", "details"?}``; ``details`` = ``finish_reason``,
  ``generated_tokens``, ``inputs``, ``tokens[{id, text, log_prob}]`` (+ ``top_tokens``).
* LMI ``jsonlines`` (and ``sse``, the same objects as ``data:`` events): one line per token
  ``{"token": {...}, "generated_text": null, "details": null}``; the last line carries
  ``generated_text`` and, when asked, ``details`` without the token list.
* OpenAI: ``chat.completion`` / ``chat.completion.chunk`` and ``text_completion`` objects; a stream
  ends with a usage chunk (``choices: []``) when ``stream_options.include_usage`` asks, then, in SSE,
  ``data: [DONE]``.
* An error after the stream has started is the stream's last line, in the same framing, with
  ``finish_reason: "error"``, the message and the status code it would have had.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token

if TYPE_CHECKING:
    from lmforge.handlers.reply_parsing import Call, ReplyParser
    from lmforge.handlers.tools import ToolCallMode

JSON = "application/json"
JSONLINES = "application/jsonlines"
SSE = "text/event-stream"

_CHAT_FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.ERROR: "error",
}


# One encoder for every line: json.dumps with non-default options builds a new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    return _ENCODER.encode(obj)


_INF = float("inf")


def _lp(value: float) -> float | None:
    return value if value == value and value not in (float("inf"), float("-inf")) else None


def token_dict(token: Token) -> dict[str, Any]:
    out: dict[str, Any] = {"id": token.id, "text": token.text, "log_prob": _lp(token.log_prob)}
    if token.special:
        out["special_token"] = True
    return out


def _top_dicts(token: Token) -> list[dict[str, Any]]:
    return [{"id": i, "text": t, "log_prob": _lp(lp)} for i, t, lp in token.top_logprobs or []]


def frame(obj: Any, media_type: str) -> bytes:
    if media_type == SSE:
        return f"data: {dumps(obj)}\n\n".encode()
    return (dumps(obj) + "\n").encode()


class LmiFormatter:
    """Builds LMI responses from the events of one request."""

    def __init__(self, prompt: str, *, details: bool, return_full_text: bool) -> None:
        self.prompt = prompt
        self.details = details
        self.return_full_text = return_full_text
        self.tokens: list[Token] = []
        self.text_parts: list[str] = []

    def _details(self, event: GenerationEvent, *, with_tokens: bool) -> dict[str, Any]:
        d: dict[str, Any] = {
            "finish_reason": str(event.finish_reason),
            "generated_tokens": event.generated_tokens,
            "inputs": self.prompt,
            "prompt_tokens": event.prompt_tokens,
        }
        if with_tokens:
            d["tokens"] = [token_dict(t) for t in self.tokens]
            if any(t.top_logprobs for t in self.tokens):
                d["top_tokens"] = [_top_dicts(t) for t in self.tokens]
        return d

    def generated_text(self) -> str:
        text = "".join(self.text_parts)
        return self.prompt + text if self.return_full_text else text

    def add(self, event: GenerationEvent) -> None:
        if event.token is not None:
            self.tokens.append(event.token)
            self.text_parts.append(event.token.text)

    def final_json(self, event: GenerationEvent) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": self.generated_text()}
        if self.details:
            out["details"] = self._details(event, with_tokens=True)
        return out

    def stream_frame(self, event: GenerationEvent, media_type: str) -> bytes:
        """``frame(self.stream_line(event), media_type)``, byte for byte; a plain token line (the
        common case) is written from a template, 5-6x cheaper than building and encoding the dict."""
        token = event.token
        if (
            token is None
            or event.finished
            or token.special
            or token.top_logprobs
            or type(token.id) is not int
            or type(token.log_prob) is not float
        ):
            return frame(self.stream_line(event), media_type)
        self.tokens.append(token)
        self.text_parts.append(token.text)
        lp = token.log_prob
        lp_text = float.__repr__(lp) if lp == lp and lp not in (_INF, -_INF) else "null"
        line = (
            f'{{"token":{{"id":{token.id},"text":{encode_basestring(token.text)},"log_prob":{lp_text}}},'
            '"generated_text":null,"details":null}'
        )
        return f"data: {line}\n\n".encode() if media_type == SSE else (line + "\n").encode()

    def stream_line(self, event: GenerationEvent) -> dict[str, Any]:
        self.add(event)
        line: dict[str, Any] = {
            "token": token_dict(event.token) if event.token is not None else None,
            "generated_text": None,
            "details": None,
        }
        if event.token is not None and event.token.top_logprobs:
            line["top_tokens"] = _top_dicts(event.token)
        if event.finished:
            line["generated_text"] = self.generated_text()
            if self.details or event.finish_reason == FinishReason.ERROR:
                line["details"] = self._details(event, with_tokens=False)
            if event.error is not None:
                line["error"] = event.error
                line["code"] = event.error_status
        return line


class _OpenAIFormatter:
    """What OpenAI's chat and completions answers share: id, created, model, usage."""

    object_name = ""
    """The ``object`` of streamed chunks (and of completions answers)."""
    id_prefix = ""

    def __init__(self, model: str, *, logprobs: bool, include_usage: bool = False) -> None:
        self.id = f"{self.id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.index = 0
        """The choice this formatter builds (``n`` > 1: one formatter per choice, sharing id and created)."""
        self.model = model
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.tokens: list[Token] = []
        self.last: GenerationEvent | None = None

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
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
        case) is written from a template, as LMI's token line is."""
        token = event.token
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
            if event.error is not None:
                out["error"] = {"message": event.error, "code": event.error_status}
        return out

    def trailer(self, media_type: str, usage: dict[str, int] | None = None) -> bytes:
        """What ends a stream: the usage chunk when asked (``stream_options.include_usage``; ``usage``
        of all choices when there are several), then SSE's ``[DONE]``."""
        out = b""
        if self.include_usage and self.last is not None:
            usage = usage or self.usage(self.last)
            out += frame({**self._envelope(self.object_name, []), "usage": usage}, media_type)
        if media_type == SSE:
            out += b"data: [DONE]\n\n"
        return out


def choices_usage(formatters: list[_OpenAIFormatter]) -> dict[str, int]:
    """Usage of a request answered with several choices: the prompt once, every choice's tokens."""
    ends = [f.last for f in formatters if f.last is not None]
    prompt = ends[0].prompt_tokens if ends else 0
    completion = sum(e.generated_tokens for e in ends)
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
        model: str,
        *,
        logprobs: bool,
        include_usage: bool = False,
        tool_mode: ToolCallMode | None = None,
        reply: ReplyParser | None = None,
    ) -> None:
        super().__init__(model, logprobs=logprobs, include_usage=include_usage)
        self._sent_role = False
        self.tool_mode = tool_mode
        self.reply = reply
        """Splits reasoning and the model's own tool calls out of the text (None: the text as it is)."""
        self._auto_calls = 0
        self._text: list[str] = []  # a forced tool call's text so far

    def _logprob_entry(self, token: Token) -> dict[str, Any]:
        return {
            "token": token.text,
            "logprob": _lp(token.log_prob),
            "bytes": list(token.text.encode()),
            "top_logprobs": [
                {"token": t, "logprob": _lp(lp), "bytes": list(t.encode())}
                for _, t, lp in token.top_logprobs or []
            ],
        }

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
            "logprobs": {"content": [self._logprob_entry(t) for t in self.tokens]} if self.logprobs else None,
            "finish_reason": self._finish_reason(last.finish_reason, calls),
        }
        return {**self._envelope("chat.completion", [choice]), "usage": self.usage(last)}

    @staticmethod
    def _finish_reason(reason: FinishReason, calls: list[dict[str, Any]] | None) -> str:
        """OpenAI's: a reply that ended as a complete tool call finishes with ``tool_calls``."""
        if calls and reason in (FinishReason.EOS, FinishReason.STOP_SEQUENCE):
            return "tool_calls"
        return _CHAT_FINISH[reason]

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
                {"content": [self._logprob_entry(event.token)]}
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
    ``tokens``/``token_logprobs``/``top_logprobs``/``text_offset``."""

    object_name = "text_completion"
    id_prefix = "cmpl-"
    _text_field = ',"text":'
    _tail = ',"logprobs":null,"finish_reason":null}]}'

    def _plain(self) -> bool:
        return not self.echo and not self.logprobs

    def __init__(self, model: str, *, logprobs: bool, include_usage: bool = False, echo: str = "") -> None:
        super().__init__(model, logprobs=logprobs, include_usage=include_usage)
        self.echo = echo
        self._offset = len(echo)

    def _logprobs(self, tokens: list[Token]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offsets = []
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token.text)
        return {
            "tokens": [t.text for t in tokens],
            "token_logprobs": [_lp(t.log_prob) for t in tokens],
            "top_logprobs": [{text: _lp(lp) for _, text, lp in t.top_logprobs or []} for t in tokens],
            "text_offset": offsets,
        }

    def final_json(self, events: Iterable[GenerationEvent]) -> dict[str, Any]:
        last = self._collect(events)
        assert last.finish_reason is not None
        choice = {
            "index": self.index,
            "text": self.echo + "".join(t.text for t in self.tokens),
            "logprobs": self._logprobs(self.tokens),
            "finish_reason": _CHAT_FINISH[last.finish_reason],
        }
        return {**self._envelope(self.object_name, [choice]), "usage": self.usage(last)}

    def chunk(self, event: GenerationEvent) -> dict[str, Any]:
        tokens = [event.token] if event.token is not None else []
        text = "".join(t.text for t in tokens)
        if self.echo:
            text, self.echo = self.echo + text, ""
        choice = {
            "index": self.index,
            "text": text,
            "logprobs": self._logprobs(tokens),
            "finish_reason": _CHAT_FINISH[event.finish_reason] if event.finish_reason else None,
        }
        return self._finish(self._envelope(self.object_name, [choice]), event)
