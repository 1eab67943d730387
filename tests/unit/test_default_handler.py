"""DefaultHandler's stream framing when an engine misbehaves mid-stream.

A scripted test double stands in for the engine here: these failures (an exception or a stream that
stops after the status line was sent) cannot be provoked on demand in a real engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from lmforge.config import load_config
from lmforge.engines.protocol import FinishReason, GenerationEvent, GenerationRequest, Token
from lmforge.handlers.default import DefaultHandler
from lmforge.handlers.io import Input


class CharTokenizer:
    """A character a token: all the handler asks of a tokenizer for a plain prompt."""

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [ord(c) for c in text]


class ScriptedEngine:
    """Test double: yields the given tokens, then raises ``fail`` or simply stops."""

    name = "scripted"
    tokenizer = CharTokenizer()
    model_name = "scripted"
    max_model_len = 0

    def tool_call_syntax(self, name: str, tools: list[dict[str, Any]]) -> None:
        return None

    def __init__(self, texts: list[str], fail: Exception | None) -> None:
        self.texts = texts
        self.fail = fail
        self.closed = False

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        try:
            for i, text in enumerate(self.texts):
                yield GenerationEvent(Token(i, text, -1.0), 2, i + 1)
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


def run(engine: ScriptedEngine, tmp_path: Path, body: dict[str, Any]) -> list[dict[str, Any]]:
    handler = DefaultHandler(load_config(tmp_path, env={}).config, engine)  # type: ignore[arg-type]

    async def go() -> list[bytes]:
        out = await handler.handle(
            Input({"content-type": "application/json"}, {"data": json.dumps(body).encode()})
        )
        assert out.stream is not None
        return [chunk async for chunk in out.stream]  # type: ignore[union-attr]

    chunks = asyncio.run(go())
    return [json.loads(line) for chunk in chunks for line in chunk.decode().splitlines() if line]


def test_exception_after_first_token_ends_the_stream_with_an_error_line(tmp_path: Path) -> None:
    engine = ScriptedEngine(["a", "b"], RuntimeError("device lost"))
    lines = run(engine, tmp_path, {"inputs": "x", "stream": True})
    assert [ln["token"]["text"] for ln in lines[:2]] == ["a", "b"]
    last = lines[-1]
    assert last["token"] is None
    assert last["code"] == 424
    assert "RuntimeError: device lost" in last["error"]
    assert last["details"]["finish_reason"] == "error"
    assert last["generated_text"] == "ab"
    assert engine.closed


def test_stream_without_final_event_is_reported(tmp_path: Path) -> None:
    lines = run(ScriptedEngine(["a"], None), tmp_path, {"inputs": "x", "stream": True})
    assert lines[-1]["details"]["finish_reason"] == FinishReason.ERROR.value
    assert "without a final event" in lines[-1]["error"]
