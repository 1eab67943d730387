"""The handler layer (our djl-python): the default handler and user ``model.py`` handlers.

:func:`create_handler` picks one from the config. Every handler has the same small surface
(:class:`Handler`: ``/ping`` and the invocations); a handler that serves more says so by implementing a
capability protocol (:class:`ListsModels`, :class:`ServesTokenizer`, :class:`ServesAdapters`), and the
model server routes those paths to it only then. That is all the model server uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lmforge.handlers.io import Input, Output

if TYPE_CHECKING:
    from lmforge.adapters.registry import AdapterRegistry
    from lmforge.config import ResolvedConfig
    from lmforge.engines.protocol import EngineStats

__all__ = [
    "Handler",
    "Input",
    "ListsModels",
    "Output",
    "ServesAdapters",
    "ServesTokenizer",
    "create_handler",
]


class Handler(Protocol):
    name: str

    async def start(self) -> None: ...

    async def handle(self, inputs: Input) -> Output: ...

    def check_health(self) -> None: ...

    def stats(self) -> EngineStats | None:
        """The engine's gauges and counters for ``/metrics`` (None: a user handler, no engine of ours)."""

    async def shutdown(self) -> None: ...


@runtime_checkable
class ListsModels(Protocol):
    """A handler that answers OpenAI's ``GET /v1/models``."""

    def models(self) -> dict[str, Any]:
        """The served model and its adapters, in OpenAI's list shape."""


@runtime_checkable
class ServesTokenizer(Protocol):
    """A handler that answers vLLM's tokenizer routes on its engine's tokenizer."""

    def tokenize(self, raw: bytes) -> dict[str, Any]:
        """``POST /tokenize`` with the request body ``raw``."""

    def detokenize(self, raw: bytes) -> dict[str, Any]:
        """``POST /detokenize`` with the request body ``raw``."""

    def tokenizer_info(self) -> dict[str, Any]:
        """``GET /tokenizer_info``."""


@runtime_checkable
class ServesAdapters(Protocol):
    """A handler that answers the adapter management API (LMI's and SageMaker's)."""

    adapters: AdapterRegistry | None
    """The adapters it serves; None when LoRA is off (the API then refuses, naming
    ``option.enable_lora``)."""

    def model_names(self) -> set[str]:
        """The names LMI's ``/models/{model}/adapters`` accepts for the served model."""


def create_handler(resolved: ResolvedConfig) -> Handler:
    """A user handler when the model folder has ``model.py`` or ``option.entryPoint`` is set, else the
    default handler on the engine that ``option.rolling_batch`` selects."""
    from lmforge.handlers.custom import CustomHandler, find_entry_point, load_module

    config = resolved.config
    entry_point = find_entry_point(config.model_dir, config.entry_point)
    if entry_point is not None:
        module = load_module(config.model_dir, entry_point)
        if callable(getattr(module, "handle", None)):
            return CustomHandler(module, handler_properties(resolved), entry_point)
        if config.entry_point:
            from lmforge.handlers.custom import HandlerLoadError

            raise HandlerLoadError(f"option.entryPoint={entry_point} has no handle(inputs) function")
    from lmforge.engines.registry import create_engine
    from lmforge.handlers.default import DefaultHandler

    return DefaultHandler(config, create_engine(config, resolved.extra_options))


def handler_properties(resolved: ResolvedConfig) -> dict[str, str]:
    """The properties LMI hands to a handler's initialize call: option keys without ``option.``."""
    config = resolved.config
    props: dict[str, str] = {}
    for key, value in config.model_dump(exclude={"model_dir"}).items():
        if value is not None:
            props[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if config.entry_point:
        props["entryPoint"] = config.entry_point
    props.update(resolved.extra_options)
    if config.model_dir is not None:
        props["model_dir"] = str(config.model_dir)
    return props
