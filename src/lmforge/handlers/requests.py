"""Request schemas: LMI/TGI (``inputs``/``parameters``/``stream``) and OpenAI-style chat (``messages``).

Validation is strict: a wrong type or an unknown parameter is a 400 that names the field
(``parameters.max_new_tokens``). TGI parameters that lmforge does not implement are accepted only at
their neutral value (``watermark: false``, ``best_of: 1``, ...), so LMI clients that send them keep
working, and a request that actually needs them is refused rather than silently changed.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmforge.engines.protocol import SamplingParams
from lmforge.errors import BadRequestError

MAX_STOP_SEQUENCES = 16
MAX_TOP_N = 20

_STRICT = ConfigDict(extra="forbid", strict=True)

PositiveInt = Annotated[int, Field(ge=1)]
StopList = Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]


class _Neutral(BaseModel):
    """TGI/LMI parameters lmforge accepts only at their no-op value."""

    model_config = _STRICT

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
    model_config = _STRICT

    inputs: Annotated[str, Field(min_length=1)]
    parameters: LmiParameters = Field(default_factory=LmiParameters)
    stream: bool = False
    adapters: str | Annotated[list[str], Field(min_length=1, max_length=1)] | None = None
    """LMI's adapter selection: a name (or a one-item list, one per input); "" = the base model."""


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = _STRICT

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    model: str | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    max_new_tokens: PositiveInt | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: StopList | str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_N)] = 0
    n: Literal[1] = 1
    frequency_penalty: Annotated[float, Field(ge=0.0, le=0.0)] = 0.0
    presence_penalty: Annotated[float, Field(ge=0.0, le=0.0)] = 0.0
    user: str | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """What the default handler needs from a body, whichever schema it used."""

    chat: bool
    prompt: str
    params: SamplingParams
    stream: bool
    details: bool
    return_full_text: bool
    messages: list[dict[str, str]] | None = None
    include_usage: bool = False
    logprobs: bool = False
    adapter: str | None = None
    """The adapter named in the body (LMI ``adapters``; chat ``model`` when it names an adapter)."""
    length_field: str = "parameters.max_new_tokens"
    """The body field that set ``max_new_tokens``, for error messages (chat: ``max_tokens``, ...)."""


def parse_body(raw: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a request body: JSON object, or plain text taken as ``inputs``."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    if ctype.startswith("text/"):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequestError(f"body is not valid UTF-8 text: {exc}", param="body") from None
        return {"inputs": text}
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"body is not valid UTF-8: {exc}", param="body") from None
    except json.JSONDecodeError as exc:
        raise BadRequestError(
            f"body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", param="body"
        ) from None
    except RecursionError:
        raise BadRequestError(
            "body is nested too deeply (arrays or objects inside each other)", param="body"
        ) from None
    except ValueError:  # an integer longer than Python converts (a guard against quadratic-time parsing)
        raise BadRequestError(
            f"body has a number with more than {sys.get_int_max_str_digits()} digits", param="body"
        ) from None
    if not isinstance(data, dict):
        raise BadRequestError(
            f"body must be a JSON object with 'inputs' or 'messages', got {type(data).__name__}",
            param="body",
        )
    where = _lone_surrogate(data)
    if where is not None:
        raise BadRequestError(
            f"{where}: text is not valid Unicode (an unpaired surrogate such as \\ud800)", param=where
        )
    return data


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(data: Any) -> str | None:
    """The path of the first string in ``data`` (or of the object whose key) has an unpaired UTF-16
    surrogate, which JSON escapes (and Python's decoder) let through but no tokenizer can encode."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:  # iterative: the body may be nested as deep as the JSON parser allows
        path, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and _SURROGATE.search(value):
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                if not key.isascii() and _SURROGATE.search(key):
                    return path or "body"
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def _validation_error(exc: ValidationError) -> BadRequestError:
    problems = []
    first_param = None
    for err in exc.errors(include_url=False):
        parts = [str(p) for p in err["loc"]]
        # the last element of an unknown-field error is the client's own key: keep it as sent
        key = parts.pop() if err["type"] == "extra_forbidden" and parts else None
        # pydantic names union members in loc (e.g. "list[...]"); keep the field path only
        loc = ".".join(p for p in parts if not _is_union_tag(p))
        if key is not None:
            loc = f"{loc}.{key}" if loc else key
        first_param = first_param or loc or "body"
        got = err.get("input")
        shown = "" if err["type"] in {"missing", "extra_forbidden"} else f" (got {_preview(got)})"
        msg = "is not a supported parameter" if err["type"] == "extra_forbidden" else err["msg"]
        problems.append(f"{loc or 'body'}: {msg}{shown}")
    return BadRequestError("; ".join(dict.fromkeys(problems)), param=first_param)


def _is_union_tag(part: str) -> bool:
    return part.startswith("function-") or "[" in part or part in {"str", "int", "float", "bool"}


def _preview(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _stops(*fields: tuple[str, list[str] | str | None]) -> tuple[str, ...]:
    """Merge stop strings from ``(field name, value)`` pairs; errors name the field at fault."""
    out: list[str] = []
    for name, v in fields:
        if v is None:
            continue
        if not v:  # "" (a list's empty items are refused by the schema)
            raise BadRequestError(f"{name}: stop sequences must not be empty", param=name)
        out.extend([v] if isinstance(v, str) else v)
    if len(out) > MAX_STOP_SEQUENCES:
        names = " + ".join(name for name, v in fields if v is not None)
        raise BadRequestError(
            f"{names}: at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(out)}",
            param=next(name for name, v in fields if v is not None),
        )
    return tuple(dict.fromkeys(out))


def _sampling(
    *,
    max_new_tokens: int,
    do_sample: bool | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    repetition_penalty: float | None,
    seed: int | None,
    stop: tuple[str, ...],
    top_n: int,
    ignore_eos: bool,
    logprobs: bool,
) -> SamplingParams:
    # LMI semantics: sampling when asked (do_sample) or, if unsaid, when a temperature > 0 is given.
    sample = do_sample if do_sample is not None else (temperature is not None and temperature > 0)
    if temperature == 0:
        sample = False
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        do_sample=sample,
        temperature=temperature if temperature else 1.0,
        top_k=max(top_k or 0, 0),
        top_p=top_p if top_p is not None else 1.0,
        repetition_penalty=repetition_penalty or 1.0,
        seed=seed,
        stop=stop,
        top_n_logprobs=top_n,
        ignore_eos=ignore_eos,
        logprobs=logprobs or top_n > 0,
    )


def parse_request(body: dict[str, Any], *, default_max_new_tokens: int) -> ParsedRequest:
    if "messages" in body:
        return _parse_chat(body, default_max_new_tokens)
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
        raise _validation_error(exc) from None
    p = req.parameters
    params = _sampling(
        max_new_tokens=p.max_new_tokens or default_max_new_tokens,
        do_sample=p.do_sample,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        repetition_penalty=p.repetition_penalty,
        seed=p.seed,
        stop=_stops(("parameters.stop_sequences", p.stop_sequences), ("parameters.stop", p.stop)),
        top_n=p.top_n_tokens,
        logprobs=p.details,
        ignore_eos=p.ignore_eos_token or p.ignore_eos,
    )
    return ParsedRequest(
        chat=False,
        prompt=req.inputs,
        params=params,
        stream=req.stream,
        details=p.details,
        return_full_text=p.return_full_text,
        adapter=(req.adapters[0] if isinstance(req.adapters, list) else req.adapters) or None,
    )


def _parse_chat(body: dict[str, Any], default_max_new_tokens: int) -> ParsedRequest:
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if req.top_logprobs and not req.logprobs:
        raise BadRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    max_new = req.max_completion_tokens or req.max_tokens or req.max_new_tokens or default_max_new_tokens
    fields = ("max_completion_tokens", "max_tokens", "max_new_tokens")
    length_field = next((n for n in fields if getattr(req, n)), "max_tokens")
    params = _sampling(
        max_new_tokens=max_new,
        do_sample=None,
        # OpenAI's default temperature is 1.0 (sampling); temperature=0 asks for greedy decoding.
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_k=req.top_k,
        top_p=req.top_p,
        repetition_penalty=req.repetition_penalty,
        seed=req.seed,
        stop=_stops(("stop", req.stop)),
        top_n=req.top_logprobs,
        logprobs=req.logprobs,
        ignore_eos=False,
    )
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    return ParsedRequest(
        chat=True,
        prompt="",
        params=params,
        stream=req.stream,
        details=False,
        return_full_text=False,
        messages=messages,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=req.logprobs,
        adapter=req.model or None,
        length_field=length_field,
    )
