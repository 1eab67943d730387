"""The one interface between the handler layer and every engine.

An engine is started once, then serves many concurrent :meth:`Engine.generate` streams:

* ``generate(request)`` is an async generator of :class:`GenerationEvent`. Each event carries at most
  one new token. The last event has ``finish_reason`` set; nothing follows it. Errors that belong to
  one request (the engine is fine) end that stream with ``finish_reason=ERROR`` and ``error`` set;
  validation errors raise :class:`lmforge.errors.BadRequestError` *before* the first event.
* Closing the generator early (the consumer stops iterating, is cancelled, or calls ``aclose()``)
  aborts the request in the engine and frees its slot: callers never need a separate abort call.
* ``abort(request_id)`` is idempotent; the aborted stream ends with ``finish_reason=ABORT``.
* ``check_health()`` raises :class:`lmforge.errors.EngineDeadError` once the engine cannot serve.
* ``shutdown()`` stops the engine; in-flight streams end with an error event.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lmforge.adapters.spec import LoraAdapter


class FinishReason(enum.StrEnum):
    """Why a sequence ended, in LMI's vocabulary (plus ``stop_sequence`` kept apart from EOS)."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A grammar the generated text must follow (OpenAI's ``response_format``, forced tool calls)."""

    kind: str
    """``json_object`` (any JSON object) or ``json_schema`` (``schema``)."""
    schema: str = ""
    """The JSON schema, as JSON text (``json_schema`` only)."""
    param: str = "response_format"
    """The request field the constraint came from, named by a 400 when it cannot be used."""


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
    top_n_logprobs: int = 0
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
    prompt_logprobs: int | None = None
    """None: no prompt log-probs. N >= 0: the first event carries every prompt token's log-prob with
    its N most likely alternatives (:attr:`GenerationEvent.prompt_logprobs`); an engine that cannot
    compute them refuses the request with a 400 naming ``echo``."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt: str | list[int]
    """Text (tokenized by the engine) or token ids."""
    params: SamplingParams
    add_special_tokens: bool = True
    """Whether the tokenizer adds BOS and friends; False for prompts rendered by a chat template."""
    adapter: LoraAdapter | None = None
    """The LoRA adapter to apply (registered with :meth:`LoraEngine.add_adapter`), None for the base model."""


@dataclass(slots=True)
class Token:
    id: int
    text: str
    log_prob: float
    special: bool = False
    top_logprobs: list[tuple[int, str, float]] | None = None


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
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_logprobs: list[Token] | None = None
    """On the first event when ``SamplingParams.prompt_logprobs`` asks: one token per prompt token,
    the first with a NaN log-prob and no alternatives (nothing precedes it)."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@runtime_checkable
class Engine(Protocol):
    """What the handler layer needs from a backend. See the module docstring for the contract."""

    name: str

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``apply_chat_template``, ``decode``)."""

    @property
    def model_name(self) -> str: ...

    async def start(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def check_health(self) -> None: ...

    def stats(self) -> dict[str, float]:
        """Gauges and counters for ``/metrics`` (``running``, ``waiting``, ...)."""

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
