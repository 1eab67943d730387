"""Reasoning and tool-call parsing of chat replies: the streamed parts add up to the whole reply however
the text is cut into tokens, plain answers stream without delay, and calls are read as the model
family writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers.reply_parsing import ReplyParser, extract_calls

HERMES = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
HERMES_TWO = (
    '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
    '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
)
LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "b", "parameters": {}}'
)
R1 = "The user wants a greeting.\nSo: hello.</think>\n\nHello there!"
QWEN = (
    "<think>\nweather needs a tool\n</think>\n\n"
    '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
)


def stream(parser: ReplyParser, text: str, cut: int) -> tuple[dict[str, str], list[Any] | None]:
    """Feed ``text`` in pieces of ``cut`` characters; the joined parts and the calls."""
    joined: dict[str, str] = {}
    for i in range(0, len(text), cut):
        for key, value in parser.feed(text[i : i + cut]).items():
            joined[key] = joined.get(key, "") + value
    last, calls = parser.finish()
    for key, value in last.items():
        joined[key] = joined.get(key, "") + value
    return joined, calls


@pytest.mark.parametrize(
    ("reasoning", "tools", "text", "want"),
    [
        (None, "hermes", HERMES, (None, "Let me check.\n", [("get_weather", '{"city": "Rome"}')])),
        (None, "hermes", HERMES_TWO, (None, "", [("a", '{"x": 1}'), ("b", "{}")])),
        (None, "hermes", "No tools <tool_ needed.", (None, "No tools <tool_ needed.", None)),
        (
            None,
            "hermes",
            "<tool_call>{not json}</tool_call>",
            (None, "<tool_call>{not json}</tool_call>", None),
        ),
        (None, "llama3_json", LLAMA, (None, "", [("get_weather", '{"city": "Rome"}'), ("b", "{}")])),
        (None, "llama3_json", "Rome is sunny {really}.", (None, "Rome is sunny {really}.", None)),
        (None, "llama3_json", '{"no": "name"}', (None, '{"no": "name"}', None)),
        ("deepseek_r1", None, R1, ("The user wants a greeting.\nSo: hello.", "Hello there!", None)),
        ("deepseek_r1", None, "<think>hm</think>ok", ("hm", "ok", None)),
        ("qwen3", "hermes", QWEN, ("weather needs a tool", "", [("get_weather", "{}")])),
        ("qwen3", None, "Just an answer, <think> later.", (None, "Just an answer, <think> later.", None)),
    ],
)
def test_streamed_parts_add_up_to_the_whole_reply(
    reasoning: str | None, tools: str | None, text: str, want: tuple[Any, ...]
) -> None:
    assert ReplyParser(reasoning, tools).whole(text) == want
    for cut in (1, 2, 3, 7, len(text)):
        joined, calls = stream(ReplyParser(reasoning, tools), text, cut)
        assert calls == want[2], cut
        assert joined.get("content", "") == want[1], (cut, joined)
        assert joined.get("reasoning_content", "").strip() == (want[0] or ""), (cut, joined)


def test_plain_answers_stream_token_by_token() -> None:
    hermes = ReplyParser(None, "hermes")
    assert hermes.feed("Hello") == {"content": "Hello"}
    assert hermes.feed(" <tool") == {"content": " "}  # "<tool" may open a call: held
    assert hermes.feed("kit>") == {"content": "<toolkit>"}
    llama = ReplyParser(None, "llama3_json")
    assert llama.feed("  ") == {}  # undecided until the first character
    assert llama.feed("Sunny") == {"content": "  Sunny"}
    r1 = ReplyParser("deepseek_r1", None)
    assert r1.feed("thinking</th") == {"reasoning_content": "thinking"}
    assert r1.feed("ink>Yes") == {"content": "Yes"}


def test_extract_calls_refuses_what_is_not_a_call() -> None:
    assert extract_calls("hermes", "plain") is None
    assert extract_calls("hermes", '<tool_call>{"arguments": {}}</tool_call>') is None
    assert extract_calls("llama3_json", '{"name": "f", "parameters": {}} trailing') is None
    assert extract_calls("hermes", '<tool_call>{"name": "f", "arguments": "{}"}') == ("", [("f", "{}")])


def _events(pieces: list[str]) -> list[GenerationEvent]:
    out = [GenerationEvent(Token(i, p, -0.5), 3, i + 1) for i, p in enumerate(pieces)]
    out[-1].finish_reason = FinishReason.EOS
    return out


def test_the_chat_formatter_sends_reasoning_and_auto_calls_as_openai_does() -> None:
    pieces = [
        "<think>",
        "tool",
        "</think>",
        "\n<tool_",
        'call>{"name": "f", "arguments": {"a": 1}}</tool_call>',
    ]
    whole = ofmt.ChatFormatter("m", logprobs=False, reply=ReplyParser("qwen3", "hermes")).final_json(
        _events(pieces)
    )
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "tool" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'} and call["id"].startswith("call_")

    streamer = ofmt.ChatFormatter("m", logprobs=False, reply=ReplyParser("qwen3", "hermes"))
    chunks = [streamer.chunk(e)["choices"][0] for e in _events(pieces)]
    assert "".join(c["delta"].get("reasoning_content", "") for c in chunks) == "tool"
    assert all(not c["delta"].get("content") for c in chunks)
    assert [c["finish_reason"] for c in chunks][-1] == "tool_calls"
    calls = chunks[-1]["delta"]["tool_calls"]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "f", {"a": 1})
    ]
    plain = ofmt.ChatFormatter("m", logprobs=False, reply=ReplyParser(None, "hermes")).final_json(
        _events(["Hi", "!"])
    )
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"}
    assert plain["choices"][0]["finish_reason"] == "stop"
