"""The client's name for each request field an engine may refuse: the one mapping from the engines'
neutral ids (:class:`lmforge.engines.protocol.RequestField`) to the fields of LMI, OpenAI chat and
OpenAI completions bodies.

An engine raises :class:`~lmforge.engines.protocol.FieldError` with neutral ids; the default handler
turns it into the 400 the client reads (:func:`in_client_terms`): ``param`` and the message name the
field as the client sent it (``parameters.max_new_tokens`` / ``max_tokens`` / ``max_completion_tokens``,
``inputs`` / ``messages`` / ``prompt``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lmforge.engines.protocol import FieldError, RequestField
from lmforge.errors import BadRequestError

if TYPE_CHECKING:
    from lmforge.handlers.request_common import Api, ParsedRequest

F = RequestField

#: fields that OpenAI's chat and completions bodies share, named alike (vLLM's extras included)
_OPENAI: dict[RequestField, str | None] = {
    F.TEMPERATURE: "temperature",
    F.TOP_K: "top_k",
    F.TOP_P: "top_p",
    F.MIN_P: "min_p",
    F.REPETITION_PENALTY: "repetition_penalty",
    F.PRESENCE_PENALTY: "presence_penalty",
    F.FREQUENCY_PENALTY: "frequency_penalty",
    F.SEED: "seed",
    F.MIN_NEW_TOKENS: "min_tokens",
    F.LOGIT_BIAS: "logit_bias",
    F.STOP_TOKEN_IDS: "stop_token_ids",
    F.PARAMS: None,
}

#: API -> neutral field -> the body field that sets it; None: the API has no such field (the error then
#: names no ``param``). ``MAX_NEW_TOKENS`` and ``STRUCTURED`` are the request's own
#: (:attr:`ParsedRequest.length_field`, :attr:`ParsedRequest.structured_field`): see :func:`client_name`.
NAMES: Mapping[Api, Mapping[RequestField, str | None]] = {
    "lmi": {
        F.PROMPT: "inputs",
        F.TEMPERATURE: "parameters.temperature",
        F.TOP_K: "parameters.top_k",
        F.TOP_P: "parameters.top_p",
        F.REPETITION_PENALTY: "parameters.repetition_penalty",
        F.SEED: "parameters.seed",
        F.TOP_N: "parameters.top_n_tokens",
        F.PARAMS: "parameters",
        # not in LMI's schema: an LMI request never sets them
        F.MIN_NEW_TOKENS: None,
        F.MIN_P: None,
        F.PRESENCE_PENALTY: None,
        F.FREQUENCY_PENALTY: None,
        F.LOGIT_BIAS: None,
        F.STOP_TOKEN_IDS: None,
        F.PROMPT_TOP_N: None,
    },
    "chat": {
        **_OPENAI,
        F.PROMPT: "messages",
        F.TOP_N: "top_logprobs",
        F.PROMPT_TOP_N: None,
    },
    "completion": {
        **_OPENAI,
        F.PROMPT: "prompt",
        F.TOP_N: "logprobs",
        F.PROMPT_TOP_N: "echo",
    },
}


def client_name(field: RequestField, req: ParsedRequest) -> str | None:
    """``field``'s name in ``req``'s body (None where its API has no such field)."""
    if field is RequestField.MAX_NEW_TOKENS:
        return req.length_field
    if field is RequestField.STRUCTURED:
        return req.structured_field if req.openai_body else None
    name = NAMES[req.api][field]
    if field is RequestField.PROMPT and req.prompt_index is not None:
        return f"{name}.{req.prompt_index}"  # one of a list of prompts
    return name


def in_client_terms(err: FieldError, req: ParsedRequest) -> BadRequestError:
    """An engine's refusal as the client reads it: ``param`` and message name its API's fields; the
    refusal of one of a list of prompts says which (``prompt.2: ...``)."""
    named = err.named(lambda field: client_name(field, req))
    where = client_name(RequestField.PROMPT, req) if req.prompt_index is not None else None
    if where is None or where in named.message:
        return named
    return BadRequestError(f"{where}: {named.message}", param=named.param)
