"""Request schemas: LMI/TGI (``inputs``/``parameters``/``stream``) here, OpenAI chat and completions
in :mod:`lmforge.handlers.openai_api`; :func:`parse_request` picks one by route and body.

Validation is strict: a wrong type or an unknown parameter is a 400 that names the field
(``parameters.max_new_tokens``). TGI parameters that lmforge does not implement are accepted only at
their neutral value (``watermark: false``, ``best_of: 1``, ...), so LMI clients that send them keep
working, and a request that actually needs them is refused rather than silently changed.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from lmforge.errors import BadRequestError
from lmforge.handlers import openai_api
from lmforge.handlers.request_common import (
    MAX_TOP_N,
    STRICT,
    Api,
    ParsedRequest,
    PositiveInt,
    StopList,
    parse_body,
    sampling,
    stops,
    validation_error,
)

__all__ = ["ParsedRequest", "parse_body", "parse_request"]


class _Neutral(BaseModel):
    """TGI/LMI parameters lmforge accepts only at their no-op value."""

    model_config = STRICT

    watermark: Literal[False] | None = None
    decoder_input_details: Literal[False] | None = None
    truncate: None = None
    best_of: Literal[1] | None = None
    num_beams: Literal[1] | None = None
    n: Literal[1] | None = None
    typical_p: Annotated[float, Field(ge=1.0, le=1.0)] | None = None


class LmiParameters(_Neutral):
    max_new_tokens: PositiveInt | None = None
    do_sample: bool | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop_sequences: StopList | str | None = None
    stop: StopList | str | None = None
    details: bool = False
    return_full_text: bool = False
    top_n_tokens: Annotated[int, Field(ge=0, le=MAX_TOP_N)] = 0
    ignore_eos_token: bool = False
    ignore_eos: bool = False


class LmiRequest(BaseModel):
    model_config = STRICT

    inputs: Annotated[str, Field(min_length=1)]
    parameters: LmiParameters = Field(default_factory=LmiParameters)
    stream: bool = False
    adapters: str | Annotated[list[str], Field(min_length=1, max_length=1)] | None = None
    """LMI's adapter selection: a name (or a one-item list, one per input); "" = the base model."""


def parse_request(
    body: dict[str, Any],
    *,
    default_max_new_tokens: int,
    schema: Api | None = None,
    auto_tools: bool = False,
) -> ParsedRequest:
    """The request in ``body``: ``schema`` when its route takes one (OpenAI's routes:
    :attr:`lmforge.handlers.io.Input.api`); else (on ``/invocations``) chat when it has ``messages``,
    completions when it has ``prompt``, else LMI."""
    if schema == "chat" or (schema is None and "messages" in body):
        if "messages" not in body:
            raise BadRequestError("/v1/chat/completions needs 'messages'", param="messages")
        req = openai_api.parse_chat(body, default_max_new_tokens, auto_tools)
    elif schema == "completion" or ("prompt" in body and "inputs" not in body):
        req = openai_api.parse_completion(body)
    else:
        req = _parse_lmi(body, default_max_new_tokens)
    return dataclasses.replace(req, openai_route=True) if schema is not None else req


def _parse_lmi(body: dict[str, Any], default_max_new_tokens: int) -> ParsedRequest:
    if "inputs" not in body:
        keys = ", ".join(sorted(body)) or "none"
        raise BadRequestError(
            f"body needs 'inputs' (text) or 'messages' (chat); got keys: {keys}", param="inputs"
        )
    if isinstance(body["inputs"], list):
        raise BadRequestError(
            "inputs must be one string: rolling batch takes one prompt per request "
            "(send concurrent requests instead of a list)",
            param="inputs",
        )
    try:
        req = LmiRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    p = req.parameters
    params = sampling(
        max_new_tokens=p.max_new_tokens or default_max_new_tokens,
        do_sample=p.do_sample,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        repetition_penalty=p.repetition_penalty,
        seed=p.seed,
        stop=stops(("parameters.stop_sequences", p.stop_sequences), ("parameters.stop", p.stop)),
        top_n=p.top_n_tokens,
        logprobs=p.details,
        ignore_eos=p.ignore_eos_token or p.ignore_eos,
    )
    return ParsedRequest(
        api="lmi",
        prompt=req.inputs,
        params=params,
        stream=req.stream,
        details=p.details,
        return_full_text=p.return_full_text,
        adapter=(req.adapters[0] if isinstance(req.adapters, list) else req.adapters) or None,
    )
