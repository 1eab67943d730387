"""The wire between LMI-Dist's frontend (the server process) and its engine core process.

Two ZeroMQ PUSH/PULL pipes over ``ipc://`` sockets in a private folder, both bound by the frontend:
``requests`` (frontend -> core) and ``outputs`` (core -> frontend); the frontend passes their
addresses and its configuration to the core in the environment (:data:`CONFIG_ENV`,
:data:`REQUESTS_ENV`, :data:`OUTPUTS_ENV`). Messages are msgspec structs in
msgpack, tagged so one decoder reads any of them. Token ids travel, never text: the frontend
tokenizes, detokenizes and matches stop strings; the core schedules, runs the model and samples.

* frontend -> core: :class:`Add` (a request, with its sampling settings as JSON), :class:`Cancel`,
  :class:`Call` (LoRA adapter work and statistics, answered by a :class:`Reply` with the same id),
  :class:`Shutdown`;
* core -> frontend: :class:`Ready` (once loaded, with what the frontend must know of the model),
  :class:`Outputs` (every step's new tokens of every request that got one, in one message),
  :class:`Reply`, and :class:`Dead` (the generation loop or a tensor-parallel rank failed; the core
  exits non-zero right after).

This module imports neither torch nor transformers: the frontend side stays light.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from lmforge.engines.protocol import SamplingParams, StructuredOutput

if TYPE_CHECKING:
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


class Add(msgspec.Struct, tag="add", array_like=True):
    rid: str
    """The core's id of this submission (unique for the core's lifetime)."""
    prompt: list[int]
    params: str
    """:func:`encode_params` of the request's SamplingParams."""
    ends: list[int]
    """Token ids that end the request (EOS unless ignored, plus its stop token ids)."""
    lora: int = 0
    """The adapter's int id, 0 for the base model."""


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    rid: str


class Call(msgspec.Struct, tag="call", array_like=True):
    call_id: int
    method: str
    """A method of the core's call table (``install``, ``uninstall``, ``preload``, ``forget``, ``stats``,
    ``score_prompt``)."""
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


class Outputs(msgspec.Struct, tag="outputs", array_like=True):
    items: list[Out]


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
    vocab_size: int
    plan: dict[str, Any]
    """The KV-cache plan (:class:`.sizing.KvCachePlan` as a dict)."""
    lora_layers: dict[str, tuple[int, int]]
    pid: int
    world: int = 1
    """Tensor-parallel ranks (the core is rank 0)."""


class Dead(msgspec.Struct, tag="dead", array_like=True):
    reason: str


ToCore = Add | Cancel | Call | Shutdown
FromCore = Outputs | Reply | Ready | Dead

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
to_core = msgspec.msgpack.Decoder(ToCore)  # type: ignore[arg-type]
from_core = msgspec.msgpack.Decoder(FromCore)  # type: ignore[arg-type]


def encode_params(params: SamplingParams) -> str:
    """A request's sampling settings as canonical JSON (what the core's sampler reads per row)."""
    data = asdict(params)
    data["stop"] = list(params.stop)  # stop strings are the frontend's: carried only for completeness
    return json.dumps(data, sort_keys=True)


def decode_params(raw: str) -> SamplingParams:
    data = json.loads(raw)
    data["stop"] = tuple(data["stop"])
    data["logit_bias"] = tuple((int(t), float(b)) for t, b in data.get("logit_bias", ()))
    data["stop_token_ids"] = tuple(data.get("stop_token_ids", ()))
    if data.get("structured") is not None:
        data["structured"] = StructuredOutput(**data["structured"])
    return SamplingParams(**data)


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
