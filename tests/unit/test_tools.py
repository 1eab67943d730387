"""Tool calling and structured output, the pure pieces: what a request asks the engine for, and how
a forced tool call is read back (whole and streamed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.errors import BadRequestError
from lmforge.handlers import openai_formatters as ofmt
from lmforge.handlers.requests import parse_request
from tests.openai_checks import ANSWER_SCHEMA, TIME, WEATHER

USER = [{"role": "user", "content": "hi"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(**body: Any) -> Any:
    return parse_request({"messages": USER, **body}, default_max_new_tokens=16, schema="chat")


def test_response_format_becomes_the_engines_grammar() -> None:
    assert chat().params.structured is None
    assert chat(response_format={"type": "text"}).params.structured is None
    obj = chat(response_format={"type": "json_object"}).params.structured
    assert obj is not None and obj.kind == "json_object"
    fmt_ = {"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER_SCHEMA, "strict": True}}
    req = chat(response_format=fmt_)
    s = req.params.structured
    assert s is not None and s.kind == "json_schema" and json.loads(s.schema) == ANSWER_SCHEMA
    assert req.structured_field == "response_format.json_schema.schema"  # what a 400 for it names
    assert chat(tools=[WEATHER], tool_choice="required").structured_field == "tools"
    # the completions route takes it too
    done = parse_request(
        {"prompt": "x", "response_format": fmt_}, default_max_new_tokens=16, schema="completion"
    )
    assert done.params.structured == s


def test_a_named_tool_constrains_the_reply_to_its_arguments() -> None:
    req = chat(tools=[WEATHER, TIME], tool_choice=NAMED)
    assert req.tool_mode is not None and req.tool_mode.named == "get_weather"
    assert req.params.structured is not None
    assert json.loads(req.params.structured.schema) == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert req.tools is not None and req.tools[0]["function"]["name"] == "get_weather"


def test_required_asks_for_an_array_of_calls() -> None:
    req = chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert req.tool_mode is not None and req.tool_mode.named is None
    assert req.params.structured is not None
    schema = json.loads(req.params.structured.schema)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [alt["properties"]["name"]["enum"] for alt in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert "maxItems" not in json.loads(
        chat(tools=[WEATHER], tool_choice="required").params.structured.schema
    )


def test_tool_choice_none_is_a_plain_reply_with_the_tools_rendered() -> None:
    req = chat(tools=[WEATHER], tool_choice="none")
    assert req.tool_mode is None and req.params.structured is None and req.tools is not None


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [WEATHER]}, "tool_choice", "auto"),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "required"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "x",
        ),
        ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools", "unique"),
        ({"tools": []}, "tools", ""),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools", "pattern"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}},
            "schema",
            "",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", ""),
        ({"response_format": {"type": "yaml"}}, "response_format", ""),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "response_format"),
        (
            {"response_format": {"type": "json_object"}, "tools": [WEATHER], "tool_choice": NAMED},
            "response_format",
            "",
        ),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(BadRequestError) as err:
        chat(**body)
    assert err.value.status == 400
    assert param in (err.value.param or ""), err.value.message
    assert words in err.value.message


def test_history_with_tool_calls_is_rendered_with_arguments_as_objects() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "21"},
    ]
    req = parse_request({"messages": messages}, default_max_new_tokens=8, schema="chat")
    assert req.messages is not None
    assert req.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"}
    assert req.messages[2] == {"role": "tool", "content": "21", "tool_call_id": "c1"}
    with pytest.raises(BadRequestError) as err:
        parse_request({"messages": [{"role": "user"}]}, default_max_new_tokens=8, schema="chat")
    assert err.value.param == "messages.0.content"


def _events(pieces: list[str], reason: FinishReason) -> list[GenerationEvent]:
    out = [GenerationEvent(Token(i, p, -0.5), 3, i + 1) for i, p in enumerate(pieces)]
    out[-1].finish_reason = reason
    return out


def test_a_named_call_is_read_whole_and_streamed_as_argument_deltas() -> None:
    mode = chat(tools=[WEATHER], tool_choice=NAMED).tool_mode
    pieces = ['{"city"', ':"Rome",', '"unit":"celsius"}', ""]
    whole = ofmt.ChatFormatter("m", logprobs=False, tool_mode=mode).final_json(
        _events(pieces, FinishReason.EOS)
    )
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": "".join(pieces)}
    assert call["id"].startswith("call_") and call["type"] == "function"

    streamer = ofmt.ChatFormatter("m", logprobs=False, tool_mode=mode)
    chunks = [streamer.chunk(e) for e in _events(pieces, FinishReason.EOS)]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and "content" not in deltas[0]
    assert deltas[0]["tool_calls"][0] == {
        "index": 0,
        **call,
        "function": {"name": "get_weather", "arguments": pieces[0]},
    }
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas) == "".join(pieces)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "tool_calls"]
    cut = ofmt.ChatFormatter("m", logprobs=False, tool_mode=mode).final_json(
        _events(pieces[:2], FinishReason.LENGTH)
    )
    assert cut["choices"][0]["finish_reason"] == "length"


def test_required_calls_are_sent_whole_once_the_array_is_complete() -> None:
    mode = chat(tools=[WEATHER, TIME], tool_choice="required").tool_mode
    text = json.dumps(
        [{"name": "get_time", "parameters": {"zone": "UTC"}}, {"name": "get_weather", "parameters": {}}]
    )
    pieces = [text[:10], text[10:30], text[30:], ""]
    streamer = ofmt.ChatFormatter("m", logprobs=False, tool_mode=mode)
    chunks = [streamer.chunk(e) for e in _events(pieces, FinishReason.EOS)]
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks[:-1])
    calls = chunks[-1]["choices"][0]["delta"]["tool_calls"]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "get_time", {"zone": "UTC"}),
        (1, "get_weather", {}),
    ]
    assert len({c["id"] for c in calls}) == 2 and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # cut short by max_tokens: no calls to read, the partial text comes back as text
    short = ofmt.ChatFormatter("m", logprobs=False, tool_mode=mode).final_json(
        _events(pieces[:2], FinishReason.LENGTH)
    )
    assert short["choices"][0]["message"]["content"] == text[:30]
    assert short["choices"][0]["finish_reason"] == "length"
