"""Engines refuse requests by neutral field ids; the handler layer names the fields as each API does."""

from __future__ import annotations

from typing import Any

import pytest

from lmforge.config import ServingConfig
from lmforge.engines.limits import check_request_size
from lmforge.engines.protocol import FieldError, RequestField
from lmforge.handlers.fields import NAMES, client_name, in_client_terms
from lmforge.handlers.requests import parse_request

CHAT = "chat"
COMPLETIONS = "completion"


def parsed(schema: str | None, **body: Any) -> Any:
    """``body`` parsed as the route with that body schema parses it (None: ``/invocations``)."""
    return parse_request(body, default_max_new_tokens=16, schema=schema)  # type: ignore[arg-type]


LMI = parsed(None, inputs="x")
CHAT_REQ = parsed(CHAT, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=5)
COMPLETION = parsed(COMPLETIONS, prompt="x")


def size_error(prompt_len: int, max_new: int, **config: Any) -> FieldError:
    with pytest.raises(FieldError) as err:
        check_request_size(ServingConfig(**config), prompt_len, max_new, max_model_len=100)
    return err.value


def test_every_api_names_every_field_or_says_it_has_none() -> None:
    from_request = {RequestField.MAX_NEW_TOKENS, RequestField.STRUCTURED}
    for api, names in NAMES.items():
        assert set(names) == set(RequestField) - from_request, api
    for req in (LMI, CHAT_REQ, COMPLETION):
        for field in RequestField:
            client_name(field, req)  # no field is left unnamed (KeyError)


def test_the_prompt_and_the_length_are_named_as_the_client_sent_them() -> None:
    too_long = size_error(120, 10)  # the prompt alone is longer than the model
    assert (too_long.field, too_long.param) == (RequestField.PROMPT, "prompt")
    answers = {req.api: in_client_terms(too_long, req) for req in (LMI, CHAT_REQ, COMPLETION)}
    assert {api: err.param for api, err in answers.items()} == {
        "lmi": "inputs",
        "chat": "messages",
        "completion": "prompt",
    }
    assert "plus max_completion_tokens (10)" in answers["chat"].message
    assert "plus parameters.max_new_tokens (10)" in answers["lmi"].message
    over = size_error(10, 95)
    assert in_client_terms(over, CHAT_REQ).param == "max_completion_tokens"
    assert in_client_terms(over, COMPLETION).param == "max_tokens"
    capped = in_client_terms(size_error(10, 20, max_output_len=8), CHAT_REQ)
    assert capped.message == "max_completion_tokens=20 is more than option.max_output_len=8"
    empty = size_error(0, 1)
    assert in_client_terms(empty, COMPLETION).message == "prompt must not be empty"
    assert in_client_terms(empty, LMI).message == "inputs must not be empty"


def test_unnamed_errors_show_neutral_ids_and_missing_fields_name_no_param() -> None:
    err = FieldError(RequestField.PROMPT_TOP_N, RequestField.PROMPT_TOP_N, " is not supported")
    assert (err.param, err.message) == ("prompt_top_n", "prompt_top_n is not supported")
    assert in_client_terms(err, COMPLETION).to_dict()["param"] == "echo"
    chat = in_client_terms(err, CHAT_REQ)  # chat has no echo: no param, the text keeps the id
    assert (chat.param, chat.message) == (None, "prompt_top_n is not supported")
    structured = FieldError(RequestField.STRUCTURED, RequestField.STRUCTURED, " is not supported")
    tools = parsed(CHAT, messages=[{"role": "user", "content": "hi"}], tools=[_TOOL], tool_choice="required")
    assert in_client_terms(structured, tools).message == "tools is not supported"
    assert in_client_terms(structured, COMPLETION).param == "response_format"


_TOOL = {"type": "function", "function": {"name": "f"}}
