"""Tool calls on the vLLM engine, read by vLLM's own tool-call parsers.

With ``option.rolling_batch=vllm``, ``option.tool_call_parser`` names any parser vLLM registers
(``hermes``, ``llama3_json``, ``mistral``, ``pythonic``, ``granite``, ... as ``vllm serve
--tool-call-parser`` takes them): lmforge hands a complete chat reply to that parser's
``extract_tool_calls`` and sends back the calls it found. While the reply streams, text before the
parser's start marker (``tool_call_start_token``, for the parsers that have one) goes out as it comes;
a parser without such a marker gets the whole reply before anything is sent, since only it can tell
a call from an answer.

vLLM is imported here only when a server with that option starts (vLLM is already loaded then).
"""

from __future__ import annotations

import logging
from typing import Any

from lmforge.engines.protocol import Call
from lmforge.engines.text import partial_suffix
from lmforge.errors import LmforgeError

log = logging.getLogger("lmforge.engines.vllm")


def parser_class(name: str) -> Any:
    """vLLM's tool-parser class registered as ``name``; a clear error naming the option if none is."""
    from vllm.tool_parsers import ToolParserManager

    try:
        return ToolParserManager.get_tool_parser(name)
    except (KeyError, ValueError, ImportError) as exc:
        known = ", ".join(sorted(ToolParserManager.list_registered()))
        raise LmforgeError(
            f"option.tool_call_parser={name!r} is not a tool-call parser this vLLM has ({known})"
        ) from exc


class VllmToolCalls:
    """One chat reply's tool calls, read by a vLLM tool parser (a
    :class:`~lmforge.engines.protocol.CallSyntax`)."""

    def __init__(self, cls: Any, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        # the parsers read the request's tools (names, argument schemas) and tool_choice; the tools
        # passed lmforge's own checks already, so one vLLM's model refuses is left out, not refused
        body: dict[str, Any] = {"model": "lmforge", "messages": [], "tools": tools, "tool_choice": "auto"}
        try:
            self._request = ChatCompletionRequest.model_validate(body)
        except ValueError:
            log.debug("vLLM's request model refused the tools; its tool parser reads the reply without them")
            self._request = ChatCompletionRequest.model_validate({"model": "lmforge", "messages": []})
        self._parser = cls(tokenizer, self._request.tools)
        marker = getattr(cls, "tool_call_start_token", None)
        self._marker: str | None = marker if isinstance(marker, str) and marker else None

    def sendable(self, content: str, sent: int) -> int:
        if self._marker is None:
            return sent
        start = content.find(self._marker)
        return start if start >= 0 else len(content) - partial_suffix(content, self._marker)

    def extract(self, text: str) -> tuple[str, list[Call]] | None:
        info = self._parser.extract_tool_calls(text, self._request)
        if not info.tools_called or not info.tool_calls:
            return None
        calls = [(call.function.name, call.function.arguments or "{}") for call in info.tool_calls]
        return info.content or "", calls
