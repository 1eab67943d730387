"""The one interface between the handler layer and every engine.

An engine is started once, then serves many concurrent :meth:`Engine.generate` streams:

* ``generate(request)`` is an async generator of :class:`GenerationEvent`. Each event carries at most
  one new token. The last event has ``finish_reason`` set; nothing follows it. Errors that belong to
  one request (the engine is fine) end that stream with ``finish_reason=ERROR`` and ``error`` set;
  validation errors raise *before* the first event: a :class:`FieldError` when a request field is at
  fault, named by its :class:`RequestField` id (the handler layer names it as the client's API does).
* Closing the generator early (the consumer stops iterating, is cancelled, or calls ``aclose()``)
  aborts the request in the engine and frees its slot: that is how the server aborts a request (a
  client that disconnects), there is no separate abort call. A stream that the engine itself cancels
  (vLLM's ``abort``, TensorRT-LLM's ``cancelled``) ends with ``finish_reason=ABORT``.
* ``check_health()`` raises :class:`lmforge.errors.EngineDeadError` once the engine cannot serve.
* ``stats()`` is the engine's :class:`EngineStats` (``/metrics``).
* ``shutdown()`` stops the engine; in-flight streams end with an error event.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lmforge.errors import BadRequestError

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter


class FinishReason(enum.StrEnum):
    """Why a sequence ended, in LMI's vocabulary (plus ``stop_sequence`` kept apart from EOS)."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    ABORT = "abort"
    ERROR = "error"


class RequestField(enum.StrEnum):
    """A request field an engine may refuse, by a neutral id: the name of the :class:`GenerationRequest`
    or :class:`SamplingParams` attribute it sets, not LMI's name for it nor OpenAI's. The handler layer
    names it as the client's API does (:mod:`lmforge.handlers.fields`: ``MAX_NEW_TOKENS`` is LMI's
    ``parameters.max_new_tokens``, a chat request's ``max_tokens`` or ``max_completion_tokens``)."""

    PROMPT = "prompt"
    MAX_NEW_TOKENS = "max_new_tokens"
    MIN_NEW_TOKENS = "min_new_tokens"
    TEMPERATURE = "temperature"
    TOP_K = "top_k"
    TOP_P = "top_p"
    MIN_P = "min_p"
    REPETITION_PENALTY = "repetition_penalty"
    PRESENCE_PENALTY = "presence_penalty"
    FREQUENCY_PENALTY = "frequency_penalty"
    SEED = "seed"
    TOP_N = "top_n"
    PROMPT_TOP_N = "prompt_top_n"
    LOGIT_BIAS = "logit_bias"
    STOP_TOKEN_IDS = "stop_token_ids"
    STRUCTURED = "structured"
    PARAMS = "params"
    """The sampling settings as a whole: an engine's refusal that names no one field."""


class FieldError(BadRequestError):
    """A request an engine refuses (400) for one of its fields, named by its :class:`RequestField` id.

    The message is given in parts: text, and fields wherever the text names one (each stands for the
    field's name in the client's API). ``param`` and ``message`` show the neutral ids until the handler
    layer names them for the client (:meth:`named`, through :func:`lmforge.handlers.fields.in_client_terms`).
    """

    def __init__(self, field: RequestField, *parts: str | RequestField) -> None:
        self.field = field
        self.parts = parts
        super().__init__(_render(parts, str), param=field.value)

    def named(self, name_of: Callable[[RequestField], str | None]) -> BadRequestError:
        """The error in a client's terms: ``name_of`` gives a field's name in its API (None where the API
        has no such field: the text then keeps the neutral id, and the error names no ``param``)."""

        def name(f: RequestField) -> str:
            return name_of(f) or f.value

        return BadRequestError(_render(self.parts, name), param=name_of(self.field))


def _render(parts: tuple[str | RequestField, ...], name: Callable[[RequestField], str]) -> str:
    return "".join(name(p) if isinstance(p, RequestField) else p for p in parts)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """An engine's gauges and counters, as ``/metrics`` reports them (``lmforge_engine_<name>``)."""

    running: int
    """Requests in the running batch."""
    waiting: int
    """Requests admitted and waiting for a place in the batch (or for an adapter slot)."""
    requests_total: int
    aborted_total: int
    """Requests whose stream was closed before its final event (a client that went away)."""
    tokens_total: int
    """Tokens generated and sent (those after a stop string are not)."""
    healthy: bool
    extra: Mapping[str, float] = field(default_factory=dict)
    """An engine's own gauges and counters (LMI-Dist's LoRA slots: ``lora_resident``, ...); a name that
    ends in ``_total`` is a counter."""

    def metrics(self) -> dict[str, float]:
        """Every gauge and counter by its ``/metrics`` name (without the ``lmforge_engine_`` prefix)."""
        return {
            "running": float(self.running),
            "waiting": float(self.waiting),
            "requests_total": float(self.requests_total),
            "aborted_total": float(self.aborted_total),
            "tokens_total": float(self.tokens_total),
            "healthy": float(self.healthy),
            **self.extra,
        }


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A grammar the generated text must follow (OpenAI's ``response_format``, forced tool calls)."""

    kind: str
    """``json_object`` (any JSON object) or ``json_schema`` (``schema``)."""
    schema: str = ""
    """The JSON schema, as JSON text (``json_schema`` only)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request generation settings, already validated by the handler."""

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Stop strings; the text is cut before the first match and the match is not returned."""
    top_n: int = 0
    """How many alternative tokens (with log-probs) to report per generated token."""
    ignore_eos: bool = False
    logprobs: bool = True
    """Whether the sampled token's log-prob is wanted. Engines for which it costs (vLLM computes and
    ships it every step) leave ``Token.log_prob`` NaN (``null`` on the wire) when it is not."""
    structured: StructuredOutput | None = None
    """Constrain the text to a grammar; log-probs stay the model's own (before the constraint)."""
    min_new_tokens: int = 0
    """End-of-sequence tokens cannot end the reply before this many tokens (OpenAI/vLLM ``min_tokens``)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the reply already contains (OpenAI's definition)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the reply already contains it."""
    min_p: float = 0.0
    """Sampling keeps only tokens at least ``min_p`` times as likely as the most likely one."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before the choice."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end the reply as EOS does (even with ``ignore_eos``); their text is not returned."""
    prompt_top_n: int | None = None
    """None: no prompt log-probs. N >= 0: the first event carries every prompt token's log-prob with
    its N most likely alternatives (:attr:`GenerationEvent.prompt_logprobs`); an engine that cannot
    compute them refuses the request with a 400 naming ``echo``."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt: list[int]
    """The prompt's token ids: the handler layer tokenizes text (:mod:`lmforge.handlers.prompt`), an
    engine never does."""
    params: SamplingParams
    adapter: LoraAdapter | None = None
    """The LoRA adapter to apply (registered with :meth:`LoraEngine.add_adapter`), None for the base model."""


@dataclass(slots=True)
class Token:
    id: int
    text: str
    log_prob: float
    special: bool = False
    top_logprobs: list[tuple[int, float]] | None = None
    """The most likely alternatives as (id, log-prob), when the request asked for them: ids only, the
    handler layer names them as its API does (:class:`lmforge.handlers.logprobs.TokenText`)."""


@dataclass(slots=True)
class GenerationEvent:
    token: Token | None
    """The new token, or None on a final event that brings no token (abort, error)."""
    prompt_tokens: int
    generated_tokens: int
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_status: int | None = None
    """HTTP status matching ``error`` (from :data:`lmforge.errors.ERROR_TABLE`)."""
    prompt_logprobs: list[Token] | None = None
    """On the first event when ``SamplingParams.prompt_top_n`` asks: one token per prompt token,
    the first with a NaN log-prob and no alternatives (nothing precedes it)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


Call = tuple[str, str]
"""A tool call read from a reply: (function name, arguments as JSON text)."""


class CallSyntax(Protocol):
    """A model family's tool-call syntax, read from one chat reply's text (``option.tool_call_parser``
    with ``tool_choice: "auto"``). lmforge reads ``hermes`` and ``llama3_json`` itself on every engine
    (:mod:`lmforge.handlers.reply_parsing`); an engine may bring its own
    (:meth:`Engine.tool_call_syntax`)."""

    def sendable(self, content: str, sent: int) -> int:
        """How much of the reply's ``content`` so far may stream as plain text now (the rest may still
        turn into a call); ``sent`` is how much already went out."""

    def extract(self, text: str) -> tuple[str, list[Call]] | None:
        """(the text before the calls, the calls) when the complete reply ``text`` makes tool calls,
        else None (a plain answer)."""


@runtime_checkable
class Engine(Protocol):
    """What the handler layer needs from a backend. See the module docstring for the contract."""

    name: str

    max_model_len: int
    """Prompt + generated tokens one sequence may hold, known once the engine has started (0 before)."""

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``apply_chat_template``, ``decode``)."""

    @property
    def model_name(self) -> str: ...

    def tool_call_syntax(self, name: str, tools: list[dict[str, Any]]) -> CallSyntax | None:
        """The engine's own reader of ``option.tool_call_parser`` ``name`` for one chat reply whose
        request offered ``tools``; None: lmforge's built-in one (:mod:`lmforge.handlers.reply_parsing`)."""

    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]: ...

    def check_health(self) -> None: ...

    def stats(self) -> EngineStats:
        """Gauges and counters for ``/metrics``."""

    async def shutdown(self) -> None: ...


@runtime_checkable
class LoraEngine(Engine, Protocol):
    """An engine that serves LoRA adapters (``option.enable_lora=true``).

    Requests for different adapters (and the base model) share one running batch. The registry in
    :mod:`lmforge.adapters` checks an adapter (names, sources, ``adapter_config.json`` against
    :meth:`lora_layers`) before ``add_adapter`` sees it.
    """

    def lora_layers(self) -> dict[str, tuple[int, int]]:
        """Every linear layer an adapter may target: full module name -> (in_features, out_features)."""

    async def add_adapter(self, adapter: LoraAdapter) -> None:
        """Make ``adapter`` usable by requests (load or prepare it); raise LmforgeError if it cannot be."""

    async def remove_adapter(self, adapter: LoraAdapter) -> None:
        """Forget ``adapter``. Requests already running with it finish with it; new ones cannot use it."""
