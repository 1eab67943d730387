"""Reading a chat reply's text as it streams: the model's reasoning (``option.reasoning_parser``) and
the tool calls it chose to make (``tool_choice: "auto"`` with ``option.enable_auto_tool_choice`` and
``option.tool_call_parser``), split out of the plain content.

Both are model-family conventions, so each is a small parser named as vLLM and LMI name them:

* reasoning: ``deepseek_r1`` (the reply starts inside the reasoning, which ends at ``</think>``; the
  chat template opened it), ``qwen3`` (reasoning only when the reply opens with ``<think>``).
* tool calls: ``hermes`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks after
  optional text: Hermes, Qwen 2.5/3, SmolLM3, ...), ``llama3_json`` (a reply that is one or more JSON
  objects ``{"name": ..., "parameters": {...}}``, separated by ``;``, optionally after
  ``<|python_tag|>``: Llama 3.1+).

Streaming holds back only what could still turn into a tool call (the tail that may be the start of
``<tool_call>``, or a reply whose first character may open a JSON call), so plain answers stream
token by token; the calls themselves are sent whole once the reply is complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lmforge.engines.protocol import Call, CallSyntax
from lmforge.engines.text import partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


def _call(obj: Any, arg_keys: tuple[str, ...]) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args: Any = next((obj[k] for k in arg_keys if k in obj), {})
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def extract_calls(parser: str, text: str) -> tuple[str, list[Call]] | None:
    """(the content around the calls, the calls) when ``text`` holds tool calls in ``parser``'s
    syntax, else None (the text is a plain answer, or calls that do not parse, returned as text)."""
    if parser == "hermes":
        start = text.find(CALL_OPEN)
        if start < 0:
            return None
        calls: list[Call] = []
        rest = text[start:]
        while rest.startswith(CALL_OPEN):
            end = rest.find(CALL_CLOSE)
            body = rest[len(CALL_OPEN) : end if end >= 0 else len(rest)]
            try:
                call = _call(json.loads(body), ("arguments", "parameters"))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
            rest = rest[end + len(CALL_CLOSE) :].lstrip() if end >= 0 else ""
        return text[:start], calls
    # llama3_json
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    if not body.startswith("{"):
        return None
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except ValueError:
            return None
        call = _call(obj, ("parameters", "arguments"))
        if call is None:
            return None
        calls.append(call)
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
    return "", calls


@dataclass(frozen=True)
class BuiltinCalls:
    """A built-in tool-call syntax (``hermes``, ``llama3_json``: ``BUILTIN_TOOL_PARSERS`` in
    :mod:`lmforge.config.schema`) as a :class:`CallSyntax`."""

    name: str

    def sendable(self, content: str, sent: int) -> int:
        if self.name == "hermes":
            start = content.find(CALL_OPEN)
            return start if start >= 0 else len(content) - partial_suffix(content, CALL_OPEN)
        head = content.lstrip()
        if not head or head.startswith("{") or PYTHON_TAG.startswith(head) or head.startswith(PYTHON_TAG):
            return sent  # undecided, or a JSON call: hold
        return len(content)

    def extract(self, text: str) -> tuple[str, list[Call]] | None:
        return extract_calls(self.name, text)


@dataclass
class ReplyParser:
    """One reply's splitter. ``feed`` each token's text and send what it returns; ``finish`` at the end
    returns the last parts and the calls (None when the reply made none)."""

    reasoning: str | None = None
    tools: str | CallSyntax | None = None
    """A built-in syntax's name (:class:`BuiltinCalls`) or an engine's own (vLLM's parsers)."""
    _text: str = ""
    _thinking: bool = field(init=False)
    _think_checked: bool = field(init=False)
    _reasoning_start: int = 0
    _reasoning_sent: int = 0
    _content_start: int = 0
    _after_reasoning: bool = False
    _content_sent: int = 0

    def __post_init__(self) -> None:
        tools = self.tools
        self._calls: CallSyntax | None = BuiltinCalls(tools) if isinstance(tools, str) else tools
        self._thinking = self.reasoning == "deepseek_r1"
        self._think_checked = self.reasoning != "qwen3"

    def feed(self, text: str) -> dict[str, str]:
        self._text += text
        return self._advance(final=False)

    def finish(self) -> tuple[dict[str, str], list[Call] | None]:
        parts = self._advance(final=True)
        if self._calls is None:
            return parts, None
        content = self._text[self._content_start :]
        found = self._calls.extract(content)
        if found is None:
            parts["content"] = parts.get("content", "") + content[self._content_sent :]
            return _nonempty(parts), None
        before, calls = found
        if len(before) > self._content_sent:
            parts["content"] = parts.get("content", "") + before[self._content_sent :]
        return _nonempty(parts), calls

    def whole(self, text: str) -> tuple[str | None, str, list[Call] | None]:
        """(reasoning, content, calls) of a complete reply."""
        self.feed(text)
        self.finish()
        reasoning = None
        if self.reasoning is not None and self._reasoning_sent > self._reasoning_start:
            reasoning = self._text[self._reasoning_start : self._reasoning_sent].strip()
        content = self._text[self._content_start :]
        calls = None
        if self._calls is not None:
            found = self._calls.extract(content)
            if found is not None:
                content, calls = found
        return reasoning, content, calls

    # ------------------------------------------------------------------ internals

    def _advance(self, final: bool) -> dict[str, str]:
        parts: dict[str, str] = {}
        text = self._text
        if not self._think_checked:  # qwen3: reasoning only when the reply opens with <think>
            head = text.lstrip()
            if head.startswith(THINK_OPEN):
                self._thinking, self._think_checked = True, True
                self._reasoning_start = self._reasoning_sent = text.index(THINK_OPEN) + len(THINK_OPEN)
            elif final or not THINK_OPEN.startswith(head):
                self._think_checked = True
            else:
                return parts  # could still be <think>
        if self._thinking:
            if self._reasoning_sent == 0 and text.startswith(THINK_OPEN):  # opened by the model itself
                self._reasoning_start = self._reasoning_sent = len(THINK_OPEN)
            elif self._reasoning_sent == 0 and THINK_OPEN.startswith(text) and not final:
                return parts  # may be the model opening <think> itself
            end = text.find(THINK_CLOSE, self._reasoning_sent)
            if end < 0:
                stop = len(text) if final else len(text) - partial_suffix(text, THINK_CLOSE)
                if stop > self._reasoning_sent:
                    parts["reasoning_content"] = text[self._reasoning_sent : stop]
                    self._reasoning_sent = stop
                return parts
            if end > self._reasoning_sent:
                parts["reasoning_content"] = text[self._reasoning_sent : end]
            self._reasoning_sent = end
            self._thinking = False
            self._content_start = end + len(THINK_CLOSE)
            self._after_reasoning = True
        if self._after_reasoning and self._content_sent == 0:
            # the answer after the reasoning usually starts with blank lines: not part of it
            while self._content_start < len(text) and text[self._content_start] in "\r\n":
                self._content_start += 1
        content = text[self._content_start :]
        safe = len(content)
        if self._calls is not None:
            if final:
                return parts  # finish() decides between text and calls
            safe = max(self._calls.sendable(content, self._content_sent), self._content_sent)
        if safe > self._content_sent:
            parts["content"] = content[self._content_sent : safe]
            self._content_sent = safe
        return parts


def _nonempty(parts: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in parts.items() if v}
