"""The handler layer (our djl-python): the default handler and user ``model.py`` handlers.

:func:`create_handler` picks one from the config; every handler has the same small surface
(:class:`Handler`), which is all the model server uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lmforge.handlers.io import Input, Output

if TYPE_CHECKING:
    from lmforge.config import ResolvedConfig
    from lmforge.engines.protocol import EngineStats

__all__ = ["Handler", "Input", "Output", "create_handler"]


class Handler(Protocol):
    name: str

    async def start(self) -> None: ...

    async def handle(self, inputs: Input) -> Output: ...

    def check_health(self) -> None: ...

    def stats(self) -> EngineStats | None:
        """The engine's gauges and counters for ``/metrics`` (None: a user handler, no engine of ours)."""

    async def shutdown(self) -> None: ...


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
