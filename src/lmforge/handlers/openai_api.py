"""OpenAI request schemas: chat completions (``messages``) and completions (``prompt``).

Fields follow OpenAI's API; vLLM's sampling extras that tools built for vLLM send (``top_k``,
``repetition_penalty``, ``ignore_eos``, ...) are accepted where lmforge's engines honour them, and
accepted only at their neutral value where they do not (``min_tokens: 0``), so a request that
needs them gets a 400 naming the field instead of a silently different answer.
"""

from __future__ import annotations

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

#: OpenAI's default max_tokens for completions (chat has none: the model's remaining length)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class TextPart(BaseModel):
    model_config = STRICT
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
        return "\n".join(part.text for part in self.content)  # as vLLM joins text parts


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _TextFormat(BaseModel):
    model_config = STRICT
    type: Literal["text"]


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
    n: Literal[1] | None = 1
    frequency_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = 0.0
    presence_penalty: Annotated[float, Field(ge=0.0, le=0.0)] | None = 0.0
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    user: str | None = None
    store: Literal[False] | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None
    response_format: _TextFormat | None = None
    # vLLM's extras
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=0.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    ignore_eos: bool | None = False
    min_tokens: Literal[0] | None = 0
    skip_special_tokens: Literal[True] | None = True
    spaces_between_special_tokens: Literal[True] | None = True
    include_stop_str_in_output: Literal[False] | None = False
    stop_token_ids: Annotated[list[int], Field(max_length=0)] | None = None

    def sampling_params(self, max_new_tokens: int, top_n: int, logprobs: bool) -> SamplingParams:
        """The engine's settings: OpenAI's default temperature is 1.0 (sampling); 0 asks for greedy."""
        return sampling(
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
        )

    def check_stream_options(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise BadRequestError("stream_options is only allowed with stream=true", param="stream_options")


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    max_new_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_N)] | None = 0


class CompletionRequest(_Sampling):
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=1)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]],
            Field(min_length=1, max_length=1),
        ]
    )
    max_tokens: PositiveInt | None = COMPLETIONS_DEFAULT_MAX_TOKENS
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_N)] | None = None
    echo: bool | None = False
    suffix: None = None
    best_of: Literal[1] | None = None


def parse_chat(body: dict[str, Any], default_max_new_tokens: int) -> ParsedRequest:
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    req.check_stream_options()
    if req.top_logprobs and not req.logprobs:
        raise BadRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
    max_new = req.max_completion_tokens or req.max_tokens or req.max_new_tokens or default_max_new_tokens
    fields = ("max_completion_tokens", "max_tokens", "max_new_tokens")
    length_field = next((n for n in fields if getattr(req, n)), "max_tokens")
    params = req.sampling_params(max_new, req.top_logprobs or 0, bool(req.logprobs))
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
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
        adapter=req.model or None,
        length_field=length_field,
        length_given=any(getattr(req, n) for n in fields),
    )


def parse_completion(body: dict[str, Any]) -> ParsedRequest:
    if "prompt" not in body:
        raise BadRequestError("completions need 'prompt'", param="prompt")
    try:
        req = CompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    req.check_stream_options()
    prompt = req.prompt
    ids: list[int] | None = None
    text = ""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt[0], str):
        text = str(prompt[0])
    elif isinstance(prompt[0], list):  # one prompt of token ids, nested as OpenAI allows
        ids = [int(t) for t in prompt[0]]
    else:
        ids = [int(t) for t in prompt if isinstance(t, int)]
    if req.echo and ids is not None:
        raise BadRequestError("echo needs a text prompt (token ids cannot be echoed as text)", param="echo")
    top_n = req.logprobs or 0
    params = req.sampling_params(
        req.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS, top_n, req.logprobs is not None
    )
    return ParsedRequest(
        api="completion",
        prompt=text,
        params=params,
        stream=bool(req.stream),
        details=False,
        return_full_text=False,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        logprobs=req.logprobs is not None,
        adapter=req.model or None,
        length_field="max_tokens",
        prompt_ids=ids,
        echo=bool(req.echo),
    )
