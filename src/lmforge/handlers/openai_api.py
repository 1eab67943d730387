"""OpenAI request schemas: chat completions (``messages``) and completions (``prompt``).

Fields follow OpenAI's API; vLLM's sampling extras that tools built for vLLM send (``top_k``,
``repetition_penalty``, ``ignore_eos``, ...) are accepted where lmforge's engines honour them, and
accepted only at their neutral value where they do not (``min_tokens: 0``), so a request that
needs them gets a 400 naming the field instead of a silently different answer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmforge.engines.protocol import SamplingParams
from lmforge.errors import BadRequestError
from lmforge.handlers.request_common import (
    MAX_TOP_N,
    STRICT,
    ParsedRequest,
    PositiveInt,
    StopList,
    sampling,
    stops,
    validation_error,
)
from lmforge.handlers.tools import (
    Constraint,
    ResponseFormat,
    ToolChoice,
    Tools,
    response_format_constraint,
    template_tools,
    tool_plan,
)

#: OpenAI's default max_tokens for completions (chat has none: the model's remaining length)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: most choices (``n``) one request may ask for per prompt
MAX_CHOICES = 16
#: most choices one completions request may ask for in all: its prompts x ``n``, each its own engine
#: request (lm-eval-harness sends ``batch_size`` prompts in one request)
MAX_BATCH_CHOICES = 256

#: one completions prompt: its text, or its token ids
Prompt = str | list[int]


class TextPart(BaseModel):
    model_config = STRICT
    type: Literal["text"]
    text: str


class _CalledFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str


class _ToolCall(BaseModel):
    model_config = STRICT
    id: str
    type: Literal["function"]
    function: _CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] | None = None
    """None only for an assistant turn that made tool calls."""
    name: str | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)  # as vLLM joins text parts

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (tool-call arguments as objects, as Hugging Face's
        templates expect them)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": _args(c)}}
                for c in self.tool_calls
            ]
        return out


def _args(call: _ToolCall) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields chat and completions share: OpenAI's, then vLLM's extras. OpenAI's nullable fields take
    ``null`` as their default; fields for features lmforge does not serve yet (tools, structured
    output, ``min_p``, ...) are accepted only at the value that asks for nothing."""

    model_config = STRICT

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    """Any 64-bit seed, as OpenAI and vLLM take it; folded into lmforge's 0..2**63-1."""
    stop: StopList | str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = 1
    """Choices to generate for the prompt (each its own engine request; seeded ones use seed + i)."""
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = 0.0
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = 0.0
    logit_bias: (
        Annotated[
            dict[Annotated[str, Field(pattern=r"^[0-9]{1,9}$")], Annotated[float, Field(ge=-100, le=100)]],
            Field(max_length=1024),
        ]
        | None
    ) = None
    """Token id (as a string, as OpenAI's API has it) -> bias in [-100, 100] added to its logit."""
    user: str | None = None
    store: Literal[False] | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extras
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    ignore_eos: bool | None = False
    min_tokens: Annotated[int, Field(ge=0)] | None = 0
    skip_special_tokens: Literal[True] | None = True
    spaces_between_special_tokens: Literal[True] | None = True
    include_stop_str_in_output: Literal[False] | None = False
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=64)] | None = None

    def sampling_params(
        self, max_new_tokens: int, top_n: int, logprobs: bool, constraint: Constraint | None
    ) -> SamplingParams:
        """The engine's settings: OpenAI's default temperature is 1.0 (sampling); 0 asks for greedy."""
        for name in ("ignore_eos", "min_tokens"):
            if constraint is not None and getattr(self, name):
                raise BadRequestError(
                    f"{name} cannot be combined with {constraint.field}: a constrained reply ends "
                    "with the model's end-of-sequence token once it is complete",
                    param=name,
                )
        if self.min_tokens and self.min_tokens > max_new_tokens:
            raise BadRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({max_new_tokens})",
                param="min_tokens",
            )
        params = sampling(
            max_new_tokens=max_new_tokens,
            do_sample=None,
            temperature=self.temperature if self.temperature is not None else 1.0,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            seed=None if self.seed is None else self.seed % 2**63,
            stop=stops(("stop", self.stop)),
            top_n=top_n,
            logprobs=logprobs,
            ignore_eos=bool(self.ignore_eos),
            structured=constraint.output if constraint is not None else None,
        )
        return dataclasses.replace(
            params,
            min_new_tokens=self.min_tokens or 0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            min_p=self.min_p or 0.0,
            logit_bias=tuple(sorted((int(k), v) for k, v in (self.logit_bias or {}).items())),
            stop_token_ids=tuple(dict.fromkeys(self.stop_token_ids or ())),
        )

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise BadRequestError("stream_options is only allowed with stream=true", param="stream_options")


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: Tools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    max_new_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_N)] | None = 0


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    """OpenAI's four forms: a text, several texts, one prompt's token ids, several prompts' token ids
    (checked by :func:`completion_prompts`, whose errors name the prompt at fault)."""
    max_tokens: Annotated[int, Field(ge=0)] | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    """0 only with ``echo``: the prompt (and its log-probs) without generating, as lm-eval-harness's
    log-likelihood requests ask."""
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_N)] | None = None
    echo: bool | None = False
    # tools are a chat feature: completions accept them only at the value that asks for nothing
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None
    suffix: None = None
    best_of: Literal[1] | None = None


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """``messages`` as the chat template takes them (chat completions and ``/tokenize`` alike)."""
    for i, m in enumerate(messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise BadRequestError(
                f"messages.{i}.content is required (only an assistant turn with tool_calls may omit it)",
                param=f"messages.{i}.content",
            )
    return [m.for_template() for m in messages]


def parse_chat(body: dict[str, Any], default_max_new_tokens: int, auto_tools: bool = False) -> ParsedRequest:
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    req.check_stream_options()
    if req.top_logprobs and not req.logprobs:
        raise BadRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    messages = template_messages(req.messages)
    wants_format = req.response_format is not None and req.response_format.type != "text"
    if wants_format and req.tools and req.tool_choice != "none":
        raise BadRequestError("response_format cannot be combined with tools", param="response_format")
    mode, constraint = tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls, auto=auto_tools)
    constraint = constraint or response_format_constraint(req.response_format)
    max_new = req.max_completion_tokens or req.max_tokens or req.max_new_tokens or default_max_new_tokens
    fields = ("max_completion_tokens", "max_tokens", "max_new_tokens")
    length_field = next((n for n in fields if getattr(req, n)), "max_tokens")
    params = req.sampling_params(max_new, req.top_logprobs or 0, bool(req.logprobs), constraint)
    return ParsedRequest(
        api="chat",
        prompt="",
        params=params,
        stream=bool(req.stream),
        details=False,
        return_full_text=False,
        messages=messages,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=bool(req.logprobs),
        model=req.model or None,
        length_field=length_field,
        length_given=any(getattr(req, n) for n in fields),
        structured_field=constraint.field if constraint is not None else "response_format",
        tools=template_tools(req.tools),
        tool_mode=mode,
        auto_tools=bool(req.tools) and req.tool_choice in (None, "auto"),
        n=req.n or 1,
    )


def completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]], n: int
) -> tuple[Prompt, tuple[Prompt, ...]]:
    """A completions ``prompt`` as ``(the prompt, ())`` when it is one (a text, or one prompt's token
    ids), or ``("", every prompt)`` when it is a list of them (texts, or lists of ids; even a list of
    one), whose errors then name the prompt at fault (``prompt.2``), as the answer's choices do."""
    if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
        one: Prompt = prompt if isinstance(prompt, str) else [t for t in prompt if isinstance(t, int)]
        _check_prompt(one, "prompt")
        return one, ()
    if not prompt:
        raise BadRequestError("prompt must not be an empty list", param="prompt")
    if len(prompt) * n > MAX_BATCH_CHOICES:
        raise BadRequestError(
            f"prompt: {len(prompt)} prompts x n={n} is {len(prompt) * n} choices, more than the "
            f"{MAX_BATCH_CHOICES} one request may ask for; send the prompts in several requests",
            param="prompt",
        )
    batch: list[Prompt] = [p if isinstance(p, str) else list(p) for p in prompt if not isinstance(p, int)]
    for i, each in enumerate(batch):
        _check_prompt(each, f"prompt.{i}")
    return "", tuple(batch)


def _check_prompt(prompt: Prompt, field: str) -> None:
    if not prompt:
        raise BadRequestError(f"{field} must not be empty", param=field)
    if isinstance(prompt, list) and (bad := min(prompt)) < 0:
        raise BadRequestError(f"{field}: token id {bad} is negative", param=field)


def parse_completion(body: dict[str, Any]) -> ParsedRequest:
    if "prompt" not in body:
        raise BadRequestError("completions need 'prompt'", param="prompt")
    try:
        req = CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    req.check_stream_options()
    prompt, batch = completion_prompts(req.prompt, req.n or 1)
    max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    echo_only = max_tokens == 0
    if echo_only and not req.echo:
        raise BadRequestError(
            "max_tokens must be at least 1; 0 is only allowed with echo=true (the prompt and, with "
            "logprobs, its log-probs, without generating)",
            param="max_tokens",
        )
    top_n = req.logprobs or 0
    constraint = response_format_constraint(req.response_format)
    params = req.sampling_params(1 if echo_only else max_tokens, top_n, req.logprobs is not None, constraint)
    if req.echo and req.logprobs is not None:  # the answer starts with the prompt's tokens, scored
        params = dataclasses.replace(params, prompt_top_n=top_n)
    return ParsedRequest(
        api="completion",
        prompt=prompt if isinstance(prompt, str) else "",
        params=params,
        stream=bool(req.stream),
        details=False,
        return_full_text=False,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=req.logprobs is not None,
        model=req.model or None,
        length_field="max_tokens",
        structured_field=constraint.field if constraint is not None else "response_format",
        prompt_ids=prompt if isinstance(prompt, list) else None,
        batch=batch,
        echo=bool(req.echo),
        echo_only=echo_only,
        n=req.n or 1,
    )
