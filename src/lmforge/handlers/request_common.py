"""What every request schema shares: the body decoder, the parsed request the default handler works
from, stop strings, sampling defaults and the 400s that name the field at fault.

The schemas themselves: LMI/TGI in :mod:`lmforge.handlers.requests`, OpenAI chat and completions in
:mod:`lmforge.handlers.openai_api`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import reprlib
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from lmforge.engines.protocol import SamplingParams, StructuredOutput
from lmforge.errors import BadRequestError
from lmforge.handlers.tool_calls import ToolCallMode

MAX_STOP_SEQUENCES = 16
MAX_TOP_N = 20

STRICT = ConfigDict(extra="forbid", strict=True)

PositiveInt = Annotated[int, Field(ge=1)]
StopList = Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]


Api = Literal["lmi", "chat", "completion"]


@dataclass(frozen=True)
class ParsedRequest:
    """What the default handler needs from a body, whichever schema it used."""

    api: Api
    """Which schema the body used, and so which schema the answer uses."""
    prompt: str
    params: SamplingParams
    stream: bool
    details: bool
    return_full_text: bool
    messages: list[dict[str, Any]] | None = None
    include_usage: bool = False
    logprobs: bool = False
    adapter: str | None = None
    """LMI: the adapter ``adapters`` names (none: the base model)."""
    model: str | None = None
    """OpenAI: ``model``, the served model's name or an adapter's (:mod:`lmforge.handlers.served`)."""
    length_field: str = "parameters.max_new_tokens"
    """The body field that set ``max_new_tokens``, for error messages (chat: ``max_tokens``, ...)."""
    structured_field: str = "response_format"
    """OpenAI: the body field the reply's grammar (``params.structured``) came from, for error messages
    (``response_format``, ``response_format.json_schema.schema`` or ``tools``)."""
    length_given: bool = True
    """False for a chat request that set no length: it may run to the end of the model's length."""
    prompt_ids: list[int] | None = None
    """A completions prompt given as token ids (``prompt`` is then empty)."""
    batch: tuple[str | list[int], ...] = ()
    """Completions with ``prompt`` as a list of prompts: each one, text or token ids (``prompt`` and
    ``prompt_ids`` are then empty); :meth:`each_prompt` splits the request by them."""
    prompt_index: int | None = None
    """This prompt's place in such a list (its errors name ``prompt.<i>``; choice ``i * n + j``)."""
    echo: bool = False
    """Completions: the answer's text starts with the prompt (and, with logprobs, its log-probs with
    the prompt's tokens: ``params.prompt_top_n``)."""
    echo_only: bool = False
    """Completions: ``echo`` with ``max_tokens: 0``, the prompt alone (the engine is asked for one
    token, to get the prompt's log-probs, and the token is dropped)."""
    tools: list[dict[str, Any]] | None = None
    """Chat: the tools, as the chat template receives them."""
    tool_mode: ToolCallMode | None = None
    """Chat: the reply is a forced tool call, read back as ``tool_calls``."""
    auto_tools: bool = False
    """Chat: the model may call tools (``tool_choice: "auto"``); the tool-call parser reads its reply."""
    n: int = 1
    """OpenAI: how many choices to generate."""
    openai_route: bool = False
    """It came on one of OpenAI's routes (not ``/invocations``): its ``model`` must be served (else
    vLLM's 404), and it streams SSE whatever ``Accept`` says."""

    def each_prompt(self) -> list[ParsedRequest]:
        """One request per prompt: this one, or for a list of prompts one per prompt, in order."""
        if not self.batch:
            return [self]
        return [
            dataclasses.replace(
                self,
                prompt=p if isinstance(p, str) else "",
                prompt_ids=None if isinstance(p, str) else p,
                batch=(),
                prompt_index=i,
            )
            for i, p in enumerate(self.batch)
        ]

    @property
    def chat(self) -> bool:
        return self.api == "chat"

    @property
    def openai_body(self) -> bool:
        """An OpenAI body (chat or completions), whichever route it came on: its ``model`` names the
        served model or an adapter, and it is answered in OpenAI's shapes."""
        return self.api != "lmi"


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


def validation_error(exc: ValidationError) -> BadRequestError:
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
    return (
        part.startswith(("function-", "constrained-"))
        or "[" in part
        or part in {"str", "int", "float", "bool"}
    )


def _preview(value: Any) -> str:
    """At most 60 characters of ``value`` for an error message, whatever its depth or size."""
    try:
        text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    except (RecursionError, ValueError, TypeError):
        # nested nearly as deep as the parser allowed: encoding it again (one stack frame deeper
        # per level, from deeper in the call stack) can exceed the recursion limit
        text = reprlib.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def stops(*fields: tuple[str, list[str] | str | None]) -> tuple[str, ...]:
    """Merge stop strings from ``(field name, value)`` pairs; errors name the field at fault."""
    out: list[str] = []
    for name, v in fields:
        if v is None:
            continue
        if v == "":  # a list's empty items are refused by the schema; an empty list asks for none
            raise BadRequestError(f"{name}: stop sequences must not be empty", param=name)
        out.extend([v] if isinstance(v, str) else v)
    if len(out) > MAX_STOP_SEQUENCES:
        names = " + ".join(name for name, v in fields if v is not None)
        raise BadRequestError(
            f"{names}: at most {MAX_STOP_SEQUENCES} stop sequences are allowed, got {len(out)}",
            param=next(name for name, v in fields if v is not None),
        )
    return tuple(dict.fromkeys(out))


def sampling(
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
    structured: StructuredOutput | None = None,
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
        top_n=top_n,
        ignore_eos=ignore_eos,
        logprobs=logprobs or top_n > 0,
        structured=structured,
    )
