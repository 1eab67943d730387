"""The wire between LMI-Dist's frontend (the server process) and its engine core process.

Two ZeroMQ PUSH/PULL pipes over ``ipc://`` sockets in a private folder, both bound by the frontend:
``requests`` (frontend -> core) and ``outputs`` (core -> frontend); the frontend passes their
addresses and its configuration to the core in the environment (:data:`CONFIG_ENV`,
:data:`REQUESTS_ENV`, :data:`OUTPUTS_ENV`). Messages are msgspec structs in msgpack, tagged so one
decoder reads any of them, and typed all the way down: :func:`decode_to_core` and
:func:`decode_from_core` check every field and raise :class:`MalformedMessage`, naming the field,
for anything else. Token ids travel, never text: the frontend tokenizes, detokenizes and matches
stop strings; the core schedules, runs the model and samples.

* frontend -> core: :class:`Add` (a request: its prompt, its :class:`Sampling` settings, its
  adapter), :class:`Cancel`, :class:`Call` (one of the :class:`Method` calls: adapter installs and
  removals, prompt scores, the core's profiler; answered by a :class:`Reply` with the same id),
  :class:`Shutdown`;
* core -> frontend: :class:`Ready` (once loaded, with what the frontend must know of the model),
  :class:`Outputs` (every step's new tokens of every request that got one, in one message),
  :class:`Reply`, and :class:`Dead` (the generation loop or a tensor-parallel rank failed, or the
  core could not read a message; the core exits non-zero right after).

To extend the wire, add a field with a default at the end of a struct (they travel as arrays, so
the order is the format) or a new tagged struct to :data:`ToCore` / :data:`FromCore`; both ends
always come from one installation, so there is no older peer to stay compatible with.

This module imports neither torch nor transformers: the frontend side stays light.
"""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from lmforge.engines.protocol import SamplingParams, StructuredOutput

if TYPE_CHECKING:
    from collections.abc import Iterable

    from lmforge.adapters.spec import LoraAdapter

CONFIG_ENV = "LMFORGE_LMI_DIST_CORE_CONFIG"
"""The core's environment: the :class:`~lmforge.config.ServingConfig`, as JSON."""
REQUESTS_ENV = "LMFORGE_LMI_DIST_CORE_REQUESTS"
"""The core's environment: the ``ipc://`` address of the ``requests`` pipe (frontend -> core)."""
OUTPUTS_ENV = "LMFORGE_LMI_DIST_CORE_OUTPUTS"
"""The core's environment: the ``ipc://`` address of the ``outputs`` pipe (core -> frontend)."""

SOCKET_FOLDER_PREFIX = "lmforge-core-"


def socket_folder() -> str:
    """A new private folder for one core's two sockets (the frontend makes it and binds in it)."""
    return tempfile.mkdtemp(prefix=SOCKET_FOLDER_PREFIX)


def folder_of(address: str) -> str:
    """The folder of the ``ipc://`` socket ``address``."""
    return os.path.dirname(address.removeprefix("ipc://"))


def remove_socket_folder(folder: str) -> None:
    """Remove ``folder`` if it is one :func:`socket_folder` made. The frontend does it when it closes
    the core; a core whose server was killed (and so never closed it) does it on its way out, so a
    SIGKILLed server leaves nothing in the temp dir."""
    if os.path.basename(folder).startswith(SOCKET_FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


RUNNING, FINISHED, FAILED, REJECTED = 0, 1, 2, 3
""":attr:`Out.status` values. REJECTED: refused before it ran (a 400, e.g. a schema that cannot compile)."""


class Sampling(msgspec.Struct, frozen=True, array_like=True):
    """What the engine core needs of a request's :class:`~lmforge.engines.protocol.SamplingParams`:
    decoded (and type-checked) once when the :class:`Add` arrives, then read by the sampler every step
    as it is (:mod:`.sampler`), and by the core for the request's length and end tokens.

    The frontend keeps the rest (:data:`FRONTEND_ONLY`): stop strings, whether the sampled token's
    log-prob is wanted (the core always reports it), and the prompt's log-probs (a :class:`Call`)."""

    max_new_tokens: int
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_new_tokens: int = 0
    seed: int | None = None
    top_n: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    structured: StructuredOutput | None = None

    @classmethod
    def of(cls, params: SamplingParams) -> Sampling:
        """The core's part of ``params`` (already validated by the handler), with each value of the
        wire's type (an int temperature becomes a float, ...)."""
        return cls(
            max_new_tokens=int(params.max_new_tokens),
            do_sample=bool(params.do_sample),
            temperature=float(params.temperature),
            top_k=int(params.top_k),
            top_p=float(params.top_p),
            min_p=float(params.min_p),
            repetition_penalty=float(params.repetition_penalty),
            presence_penalty=float(params.presence_penalty),
            frequency_penalty=float(params.frequency_penalty),
            logit_bias=tuple((int(t), float(b)) for t, b in params.logit_bias),
            min_new_tokens=int(params.min_new_tokens),
            seed=None if params.seed is None else int(params.seed),
            top_n=int(params.top_n),
            ignore_eos=bool(params.ignore_eos),
            stop_token_ids=tuple(int(t) for t in params.stop_token_ids),
            structured=params.structured,
        )

    def end_ids(self, eos_ids: Iterable[int]) -> list[int]:
        """The token ids that end the request: the model's ``eos_ids`` unless it ignores them, then
        its own stop token ids."""
        return [*([] if self.ignore_eos else sorted(set(eos_ids))), *self.stop_token_ids]


FRONTEND_ONLY = frozenset({"stop", "logprobs", "prompt_top_n"})
"""The :class:`~lmforge.engines.protocol.SamplingParams` fields that :class:`Sampling` leaves out."""


class Add(msgspec.Struct, tag="add", array_like=True):
    rid: str
    """The core's id of this submission (unique for the core's lifetime)."""
    prompt: list[int]
    sampling: Sampling
    lora: int = 0
    """The adapter's int id, 0 for the base model."""


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    rid: str


class Method(enum.StrEnum):
    """The calls the core answers (:attr:`Call.method`); each member says what its :attr:`Call.args`
    hold and what its :attr:`Reply.value` is."""

    INSTALL = "install"
    """``adapter`` (:meth:`AdapterRef.to_wire`): check it fits the model's layers, then put its
    factors in them (its requests may run from then on); ``{"load_ms": float}``."""
    PRELOAD = "preload"
    """``adapter``: check it, then read its factors into host memory only; ``{"load_ms": float}``."""
    UNINSTALL = "uninstall"
    """``adapter_id``: take its factors out of the layers (its host copy stays); None."""
    FORGET = "forget"
    """``adapter_id``: drop its host copy (it was removed); None."""
    SCORE_PROMPT = "score_prompt"
    """``ids``, ``top_n``, ``adapter`` (an int id, 0 for the base model): the prompt's log-probs,
    ``[(id, log-prob, [(id, log-prob), ...]), ...]`` (:mod:`.prompt_scores`)."""
    PROFILE_START = "profile_start"
    """No args: start the core's PyTorch profiler (:mod:`.profiling`); None."""
    PROFILE_STOP = "profile_stop"
    """``path``: stop it and write its tables there; its summary (a dict)."""


class Call(msgspec.Struct, tag="call", array_like=True):
    call_id: int
    method: Method
    args: dict[str, Any]


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


class Out(msgspec.Struct, array_like=True):
    """One request's news from one step."""

    rid: str
    tokens: list[int]
    logprobs: list[float]
    """The model's log-prob of each new token (before any grammar or sampling settings)."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per new token, the top-n alternatives (id, log-prob) when the request asked for them."""
    status: int = RUNNING
    error: str | None = None
    param: str | None = None
    """The request field a REJECTED request is refused for."""


SpeculationCounts = tuple[int, int, int, int, int, int]
"""The core's speculation counters since it started: draft tokens proposed, accepted, tokens emitted by
speculating steps, request-steps that speculated, steps that did not because the batch was too large,
and steps paused because the proposer's drafts were mostly rejected
(:class:`.speculative.SpeculationStats`)."""


class Outputs(msgspec.Struct, tag="outputs", array_like=True):
    items: list[Out]
    speculation: SpeculationCounts | None = None
    """With speculative decoding on, the core's counters (:data:`SpeculationCounts`)."""


class Reply(msgspec.Struct, tag="reply", array_like=True):
    call_id: int
    value: Any = None
    error: str | None = None
    kind: str | None = None
    """The error's kind in :data:`lmforge.errors.ERROR_TABLE` (``bad_request``, ...)."""
    param: str | None = None


class Ready(msgspec.Struct, tag="ready", array_like=True):
    max_model_len: int
    eos_ids: list[int]
    lora_layers: dict[str, tuple[int, int]]
    """Each adaptable module's (input, output) sizes (empty without LoRA)."""
    pid: int
    world: int = 1
    """Tensor-parallel ranks (the core is rank 0)."""


class Dead(msgspec.Struct, tag="dead", array_like=True):
    reason: str


ToCore = Add | Cancel | Call | Shutdown
FromCore = Outputs | Reply | Ready | Dead


class MalformedMessage(ValueError):
    """A message that is not one of the wire's structs (a field of the wrong type, an unknown tag or
    method, not msgpack at all); the text names the pipe and the field."""


_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
_to_core = msgspec.msgpack.Decoder(ToCore)  # type: ignore[arg-type]
_from_core = msgspec.msgpack.Decoder(FromCore)  # type: ignore[arg-type]


def decode_to_core(raw: bytes | memoryview) -> Add | Cancel | Call | Shutdown:
    """A message on the ``requests`` pipe (frontend -> core)."""
    try:
        return _to_core.decode(raw)  # type: ignore[no-any-return]
    except msgspec.DecodeError as err:
        raise MalformedMessage(f"a malformed message from the frontend: {err}") from err


def decode_from_core(raw: bytes | memoryview) -> Outputs | Reply | Ready | Dead:
    """A message on the ``outputs`` pipe (core -> frontend)."""
    try:
        return _from_core.decode(raw)  # type: ignore[no-any-return]
    except msgspec.DecodeError as err:
        raise MalformedMessage(f"a malformed message from the engine core: {err}") from err


@dataclass(frozen=True)
class AdapterRef:
    """What the engine core needs of a registered adapter (sent over the frontend-core wire)."""

    int_id: int
    name: str
    path: str
    scaling: float
    modules: tuple[str, ...]

    @classmethod
    def of(cls, adapter: LoraAdapter) -> AdapterRef:
        return cls(
            adapter.int_id,
            adapter.name,
            str(adapter.path),
            adapter.scaling,
            tuple(layer.module for layer in adapter.layers),
        )

    def to_wire(self) -> dict[str, Any]:
        return {**asdict(self), "modules": list(self.modules)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> AdapterRef:
        return cls(**{**data, "modules": tuple(data["modules"])})
