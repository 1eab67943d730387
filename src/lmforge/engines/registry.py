"""Backends lmforge knows, how to probe them, and how ``option.rolling_batch=auto`` chooses.

A backend is listed once here with the import that probes it and the class that implements it;
importing this module imports no engine library.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import Engine


class BackendUnavailableError(LmforgeError):
    kind = "model_error"


@dataclass(frozen=True)
class Backend:
    name: str
    engine_class: str | None
    """``module:Class`` of the implementation; None while the backend is not part of this release."""
    probe_modules: tuple[str, ...]
    extra: str

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.probe_modules)

    def available(self) -> bool:
        return self.engine_class is not None and self.installed()


BACKENDS: dict[str, Backend] = {
    "vllm": Backend("vllm", "lmforge.engines.vllm.engine:VllmEngine", ("vllm",), "vllm"),
    "trtllm": Backend("trtllm", "lmforge.engines.trtllm.engine:TrtllmEngine", ("tensorrt_llm",), "trtllm"),
    "lmi-dist": Backend(
        "lmi-dist", "lmforge.engines.lmi_dist.engine:LmiDistEngine", ("torch", "transformers"), "lmi-dist"
    ),
}

#: ``auto`` takes the first available backend in this order (fastest first).
AUTO_ORDER = ("trtllm", "vllm", "lmi-dist")


def select_backend(rolling_batch: str) -> Backend:
    if rolling_batch == "auto":
        for name in AUTO_ORDER:
            if BACKENDS[name].available():
                return BACKENDS[name]
        raise BackendUnavailableError(
            "option.rolling_batch=auto found no installed backend; "
            "install one, e.g. pip install 'lmforge[lmi-dist]'"
        )
    if rolling_batch == "disable":
        raise BackendUnavailableError(
            "option.rolling_batch=disable needs a custom handler: add a model.py with handle(inputs) to the "
            "model folder or set option.entryPoint"
        )
    backend = BACKENDS[rolling_batch]
    if backend.engine_class is None:
        raise BackendUnavailableError(
            f"option.rolling_batch={rolling_batch} is not available in this lmforge release; "
            "use lmi-dist or auto"
        )
    if not backend.installed():
        raise BackendUnavailableError(
            f"option.rolling_batch={rolling_batch} needs {', '.join(backend.probe_modules)}: "
            f"pip install 'lmforge[{backend.extra}]'"
        )
    return backend


def create_engine(config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> Engine:
    """The engine ``option.rolling_batch`` selects; ``extra_options`` are the ``option.*`` keys lmforge's
    schema does not know (a backend may take them, e.g. vLLM's own engine arguments)."""
    backend = select_backend(config.rolling_batch)
    assert backend.engine_class is not None
    module_name, _, class_name = backend.engine_class.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    engine: Engine = cls(config, dict(extra_options or {}))
    return engine
