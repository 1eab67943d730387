from __future__ import annotations

import pytest

from lmforge.errors import BadRequestError
from lmforge.handlers.requests import parse_body, parse_request


def parse(body: dict[str, object]):  # type: ignore[no-untyped-def]
    return parse_request(body, default_max_new_tokens=30)


def test_lmi_defaults() -> None:
    req = parse({"inputs": "hi"})
    assert not req.chat and not req.stream and not req.details
    assert req.params.max_new_tokens == 30
    assert not req.params.do_sample


def test_lmi_sampling_rules() -> None:
    assert parse({"inputs": "x", "parameters": {"temperature": 0.7}}).params.do_sample
    assert not parse({"inputs": "x", "parameters": {"temperature": 0.7, "do_sample": False}}).params.do_sample
    assert not parse({"inputs": "x", "parameters": {"temperature": 0, "do_sample": True}}).params.do_sample
    p = parse({"inputs": "x", "parameters": {"do_sample": True, "top_k": 5, "top_p": 0.5, "seed": 3}}).params
    assert (p.do_sample, p.top_k, p.top_p, p.seed, p.temperature) == (True, 5, 0.5, 3, 1.0)


def test_stop_sequences_merge_and_dedupe() -> None:
    p = parse({"inputs": "x", "parameters": {"stop_sequences": ["a", "b"], "stop": "a"}}).params
    assert p.stop == ("a", "b")


def test_neutral_tgi_params_accepted_only_when_neutral() -> None:
    parse({"inputs": "x", "parameters": {"watermark": False, "decoder_input_details": False, "best_of": 1}})
    with pytest.raises(BadRequestError) as err:
        parse({"inputs": "x", "parameters": {"best_of": 2}})
    assert err.value.param == "parameters.best_of"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"inputs": "x", "parameters": {"max_new_tokens": "5"}}, "parameters.max_new_tokens", "integer"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 1.5}}, "parameters.max_new_tokens", "integer"),
        ({"inputs": "x", "parameters": {"top_k": -2}}, "parameters.top_k", "greater than or equal"),
        ({"inputs": "x", "parameters": {"nope": 1}}, "parameters.nope", "not a supported parameter"),
        ({"inputs": "x", "parameters": []}, "parameters", "dictionary"),
        ({"inputs": "x", "parameters": {"stop": [""]}}, "parameters.stop.0", "at least 1"),
        ({"inputs": "x", "parameters": {"stop": ["a"] * 17}}, "parameters.stop", "at most 16"),
        ({"inputs": "x", "stream": 1}, "stream", "boolean"),
        ({"input": "x"}, "inputs", "'inputs'"),
        ({"messages": "hi"}, "messages", "list"),
        ({"messages": [{"role": "user"}]}, "messages.0.content", "required"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 17}, "n", "16"),
        (
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
            "logprobs=true",
        ),
    ],
)
def test_errors_name_the_field(body: dict[str, object], param: str, words: str) -> None:
    with pytest.raises(BadRequestError) as err:
        parse(body)
    assert err.value.param == param
    assert words in err.value.message


def test_chat_defaults_follow_openai() -> None:
    req = parse(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ]
        }
    )
    assert req.chat
    assert req.messages == [{"role": "user", "content": "a\nb"}]
    assert req.params.do_sample and req.params.temperature == 1.0
    greedy = parse({"messages": [{"role": "user", "content": "x"}], "temperature": 0, "max_tokens": 7})
    assert not greedy.params.do_sample and greedy.params.max_new_tokens == 7


def test_parse_body() -> None:
    assert parse_body(b'{"inputs": "a"}', "application/json; charset=utf-8") == {"inputs": "a"}
    assert parse_body(b"plain", "text/plain") == {"inputs": "plain"}
    for raw, ctype in [
        (b"{", None),
        (b"1", "application/json"),
        (b"\xff", "application/json"),
        (b"\xff", "text/plain"),
    ]:
        with pytest.raises(BadRequestError) as err:
            parse_body(raw, ctype)
        assert err.value.param == "body"


def test_a_field_nested_as_deep_as_the_parser_allows_is_a_400_naming_it() -> None:
    """The deepest body ``json.loads`` still accepts: showing the bad value in the message must not
    recurse past the limit (it was a 424 RecursionError, found under load by tests/integration)."""
    import sys

    deep: object = "x"
    for _ in range(sys.getrecursionlimit() * 2):  # deeper than any recursive encoder can walk
        deep = [deep]
    with pytest.raises(BadRequestError) as err:
        parse({"inputs": "x", "adapters": deep})
    assert err.value.param == "adapters" and "(got [[[" in err.value.message


def test_lmi_names_an_adapter_and_openai_a_model() -> None:
    """LMI's ``adapters`` names an adapter; OpenAI's ``model`` may name the served model or an adapter
    (which of the two is the handler's to tell): each is kept in a field of its own."""
    lmi = parse({"inputs": "x", "adapters": ["a1"]})
    assert (lmi.adapter, lmi.model) == ("a1", None)
    for body in (
        {"messages": [{"role": "user", "content": "x"}], "model": "a1"},
        {"prompt": "x", "model": "a1"},
    ):
        openai = parse(body)
        assert (openai.adapter, openai.model) == (None, "a1")
