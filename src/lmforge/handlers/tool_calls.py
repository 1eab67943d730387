"""A forced tool call read back from the generated text: the OpenAI ``tool_calls`` of a reply whose
grammar :func:`lmforge.handlers.tools.tool_plan` chose.

Its own module, below both the parsed request (:mod:`lmforge.handlers.request_common` carries the
mode) and the tool schemas (:mod:`lmforge.handlers.tools` chooses it), so neither imports the other.
"""

from __future__ import annotations

import json
import uuid
from typing import Any


class ToolCallMode:
    """How a forced tool call is read from the text: ``named`` = the text is that function's
    arguments; None = the text is a JSON array of ``{"name", "parameters"}``."""

    def __init__(self, named: str | None) -> None:
        self.named = named
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """OpenAI ``tool_calls`` from the complete text (None if it is not complete JSON: the reply
        was cut short by max_tokens or a stop string)."""
        if self.named is not None:
            return [self._call(0, self.named, text)]
        try:
            items = json.loads(text)
        except ValueError:
            return None
        if not isinstance(items, list):
            return None
        return [
            self._call(i, str(item.get("name")), json.dumps(item.get("parameters"), ensure_ascii=False))
            for i, item in enumerate(items)
            if isinstance(item, dict)
        ]

    def _call(self, index: int, name: str, arguments: str) -> dict[str, Any]:
        call_id = self.call_id if index == 0 else f"{self.call_id}_{index}"
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
