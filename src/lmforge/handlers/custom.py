"""User handlers: ``model.py`` (or ``option.entryPoint``) with an LMI-style ``handle(inputs)``.

The file is loaded under a private module name, so a user module called ``model``, ``serving`` or
``handlers`` never shadows (or is shadowed by) lmforge's own packages; the model folder is appended
to ``sys.path`` (not prepended) so the handler's sibling modules import without hiding installed
packages. ``djl_python`` is provided as an alias of :mod:`lmforge.handlers.io` when the real package
is absent, so ``from djl_python import Input, Output`` works unchanged.

As in LMI, the first call is an empty ``Input`` carrying the model's properties (``initialize``).
Synchronous handlers run in a worker thread; ``async def handle`` runs on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import logging
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.errors import LmforgeError, ModelError, NotReadyError
from lmforge.handlers.io import Input, Output

if TYPE_CHECKING:
    from lmforge.engines.protocol import EngineStats

log = logging.getLogger("lmforge.handlers.custom")


class HandlerLoadError(LmforgeError):
    kind = "model_error"


def install_djl_python_alias() -> None:
    """Make ``import djl_python`` resolve to lmforge's Input/Output when djl_python is not installed."""
    if "djl_python" in sys.modules or importlib.util.find_spec("djl_python") is not None:
        return
    from lmforge.handlers import io

    pkg = types.ModuleType("djl_python")
    pkg.__path__ = []
    pkg.Input = io.Input  # type: ignore[attr-defined]
    pkg.Output = io.Output  # type: ignore[attr-defined]
    for sub in ("inputs", "outputs"):
        mod = types.ModuleType(f"djl_python.{sub}")
        mod.Input = io.Input  # type: ignore[attr-defined]
        mod.Output = io.Output  # type: ignore[attr-defined]
        sys.modules[f"djl_python.{sub}"] = mod
        setattr(pkg, sub, mod)
    sys.modules["djl_python"] = pkg


def find_entry_point(model_dir: Path | None, entry_point: str | None) -> str | None:
    """The configured entry point, else ``model.py`` when the model folder has one."""
    if entry_point:
        return entry_point
    if model_dir is not None and (model_dir / "model.py").is_file():
        return "model.py"
    return None


def load_module(model_dir: Path | None, entry_point: str) -> types.ModuleType:
    install_djl_python_alias()
    if entry_point.endswith(".py"):
        if model_dir is None:
            raise HandlerLoadError(f"option.entryPoint={entry_point} needs a model folder")
        root = model_dir.resolve()
        path = (root / entry_point).resolve()
        if not path.is_relative_to(root):
            raise HandlerLoadError(f"option.entryPoint={entry_point} points outside the model folder")
        if not path.is_file():
            raise HandlerLoadError(f"option.entryPoint={entry_point}: no such file in {root}")
        if str(root) not in sys.path:
            sys.path.append(str(root))
        name = "lmforge_user_handler_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise HandlerLoadError(f"{entry_point} failed to import: {type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(entry_point)
    except Exception as exc:
        raise HandlerLoadError(
            f"option.entryPoint={entry_point} failed to import: {type(exc).__name__}: {exc}"
        ) from exc


class CustomHandler:
    """Runs a user module's ``handle(inputs)``."""

    name = "custom"

    def __init__(self, module: types.ModuleType, properties: dict[str, str], entry_point: str) -> None:
        handle = getattr(module, "handle", None)
        if not callable(handle):
            raise HandlerLoadError(f"{entry_point} has no handle(inputs) function")
        self._handle = handle
        self._properties = properties
        self._entry_point = entry_point
        self._ready = False

    async def _call(self, inputs: Input) -> Any:
        if inspect.iscoroutinefunction(self._handle):
            return await self._handle(inputs)
        result = await asyncio.to_thread(self._handle, inputs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def start(self) -> None:
        try:
            await self._call(Input(properties=self._properties))
        except LmforgeError:
            raise
        except Exception as exc:
            raise HandlerLoadError(
                f"{self._entry_point} failed to initialize: {type(exc).__name__}: {exc}"
            ) from exc
        self._ready = True

    def check_health(self) -> None:
        if not self._ready:
            raise NotReadyError("the custom handler is not initialized")

    def stats(self) -> EngineStats | None:
        return None

    async def shutdown(self) -> None:
        self._ready = False

    async def handle(self, inputs: Input) -> Output:
        result = await self._call(inputs)
        if result is None:
            return Output()
        if isinstance(result, Output):
            return result
        if hasattr(result, "code") and hasattr(result, "content"):  # a real djl_python.Output
            return _from_foreign_output(result)
        raise ModelError(f"handle() returned {type(result).__name__}; it must return an Output")


def _from_foreign_output(result: Any) -> Output:
    """Copy a real ``djl_python.Output`` (when that package is installed) into ours."""
    out = Output(code=int(result.code), message=str(getattr(result, "message", "")))
    for key, value in dict(getattr(result, "properties", None) or {}).items():
        out.add_property(str(key), str(value))
    content = result.content
    values = content.values() if isinstance(content, dict) else getattr(content, "values", content)
    for item in values or []:
        out.add(item)
    return out
