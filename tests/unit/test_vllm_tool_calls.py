"""``option.tool_call_parser`` on the vLLM engine: vLLM's own tool-parser classes read the reply
(:mod:`lmforge.engines.vllm.tool_calls`), directly and through the in-process HTTP contract on a
scripted engine that borrows :meth:`VllmEngine.tool_call_syntax`. vLLM itself is imported (its
parsers), no vLLM engine is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmforge.errors import LmforgeError
from lmforge.handlers.reply_parsing import ReplyParser
from lmforge.testing.scripted import ScriptedEngine
from tests.shared_vllm import needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm, pytest.mark.xdist_group("vllm-unit")]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def _syntax(name: str, tokenizer: Any) -> Any:
    from lmforge.engines.vllm.tool_calls import VllmToolCalls, parser_class

    return VllmToolCalls(parser_class(name), tokenizer, [WEATHER])


def _streamed(parser: ReplyParser, text: str, step: int = 3) -> tuple[str, Any]:
    sent = "".join(parser.feed(text[i : i + step]).get("content", "") for i in range(0, len(text), step))
    parts, calls = parser.finish()
    return sent + parts.get("content", ""), calls


def test_pythonic_calls_and_plain_answers(tokenizer: Any) -> None:
    pythonic = _syntax("pythonic", tokenizer)
    said = "[get_weather(city='Rome'), get_weather(city=\"Oslo\")]"
    content, calls = pythonic.extract(said)
    assert content == ""
    assert [(name, json.loads(args)) for name, args in calls] == [
        ("get_weather", {"city": "Rome"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert pythonic.extract("It is sunny in Rome.") is None
    # no start marker: nothing streams before the reply is complete, then it is content or calls
    assert pythonic.sendable("It is sunny", 0) == 0
    assert _streamed(ReplyParser(None, _syntax("pythonic", tokenizer)), "It is sunny in Rome.") == (
        "It is sunny in Rome.",
        None,
    )
    text, calls = _streamed(ReplyParser(None, _syntax("pythonic", tokenizer)), said)
    assert text == "" and [c[0] for c in calls] == ["get_weather", "get_weather"]


def test_vllm_hermes_streams_the_text_before_its_marker(tokenizer: Any) -> None:
    hermes = _syntax("hermes", tokenizer)
    said = 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert hermes.sendable("Let me look.<tool", 0) == len("Let me look.")
    text, calls = _streamed(ReplyParser(None, hermes), said)
    assert text == "Let me look."
    assert calls == [("get_weather", '{"city": "Rome"}')]


def test_unknown_parser_names_vllms_parsers() -> None:
    from lmforge.engines.vllm.tool_calls import parser_class

    with pytest.raises(LmforgeError, match=r"option.tool_call_parser='nope'.*pythonic"):
        parser_class("nope")


def test_through_the_server(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default handler asks the engine for its syntax: with VllmEngine's, a pythonic reply comes
    back as tool_calls, whole and streamed."""
    from lmforge.engines.vllm.engine import VllmEngine
    from tests.unit.test_http_contract import Served, _sse_objects, run

    monkeypatch.setattr(ScriptedEngine, "tool_call_syntax", VllmEngine.tool_call_syntax)
    properties = (
        "option.rolling_batch=vllm\noption.enable_auto_tool_choice=true\noption.tool_call_parser=pythonic\n"
    )

    async def scenario(srv: Served) -> None:
        srv.engine.reply = "[get_weather(city='Rome')]"
        body = {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": [WEATHER]}
        choice = (await srv.client.post("/v1/chat/completions", json=body)).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
        chunks = _sse_objects(await srv.client.post("/v1/chat/completions", json={**body, "stream": True}))
        streamed = [t for c in chunks if c["choices"] for t in c["choices"][0]["delta"].get("tool_calls", [])]
        assert [t["function"]["name"] for t in streamed] == ["get_weather"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        srv.engine.reply = "It is sunny in Rome."
        plain = (await srv.client.post("/v1/chat/completions", json=body)).json()["choices"][0]
        assert plain["message"]["content"] == "It is sunny in Rome."
        assert plain["finish_reason"] != "tool_calls"

    run(tiny_model, scenario, properties=properties)
