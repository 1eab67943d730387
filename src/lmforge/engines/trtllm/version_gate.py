"""Which TensorRT-LLM path serves ``option.rolling_batch=trtllm``, decided by the installed release.

TensorRT-LLM removed its TensorRT engine flow after 1.2 (upstream's migration guide
``docs/source/legacy/tensorrt-backend-removal.md``, PRs #15767 / #15907 / #15918, July 2026): no
``trtllm-build``, no ``tensorrt_llm._tensorrt_engine.LLM``, ``LLM(backend="tensorrt")`` raises. So:

- **pytorch** (TensorRT-LLM >= 1.3): the PyTorch-backend ``tensorrt_llm.LLM`` loads a Hugging Face
  folder directly; nothing is built at load (start-up cost is CUDA-graph capture and optional
  ``torch.compile``); the ahead-of-time step is ModelOpt quantization into an HF-style checkpoint
  (:mod:`.quantize`). Served by :class:`.pytorch_backend.TrtllmPytorchEngine`.
- **engine** (TensorRT-LLM <= 1.2): the TensorRT engine build, JIT or AOT, unchanged
  (:class:`.engine.TrtllmEngine`).

The version is read without importing TensorRT-LLM (importing it initialises CUDA and takes seconds):
the installed distribution's metadata, else the ``__version__`` line of the package's own files.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

    from lmforge.config import ServingConfig

TrtllmPath = Literal["pytorch", "engine"]

#: the first release without the TensorRT engine flow
PYTORCH_ONLY_FROM = (1, 3)
#: what the lmforge ``tensorrt-llm`` image pins (the PyTorch path)
PINNED_PYTORCH = "1.3.0rc29"

_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a TensorRT-LLM version string (``1.3.0rc29`` -> ``(1, 3)``)."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a TensorRT-LLM version: {version!r} (expected e.g. 1.3.0 or 1.2.1)")
    return int(match.group(1)), int(match.group(2))


def path_for(version: str) -> TrtllmPath:
    return "pytorch" if release(version) >= PYTORCH_ONLY_FROM else "engine"


def installed_version() -> str | None:
    """The installed TensorRT-LLM's version without importing it, or None when it is not installed."""
    try:
        return importlib.metadata.version("tensorrt-llm")
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in ("version.py", "__init__.py"):
            try:
                match = _VERSION_LINE.search((Path(folder) / name).read_text())
            except OSError:
                continue
            if match:
                return match.group(1)
    return None


@dataclass(frozen=True)
class PathChoice:
    path: TrtllmPath
    version: str
    installed: bool
    reason: str

    def describe(self) -> str:
        where = (
            f"TensorRT-LLM {self.version} installed"
            if self.installed
            else (f"TensorRT-LLM not installed here; planning for {self.version}")
        )
        name = "PyTorch-backend path" if self.path == "pytorch" else "TensorRT engine path"
        return f"{name} ({where}: {self.reason})"


def choose(version: str | None = None) -> PathChoice:
    """The path for ``version`` (default: the installed release, else the ``tensorrt-llm`` image's pin)."""
    installed = installed_version()
    planned = version or installed
    is_installed = version is None and installed is not None
    if planned is None:
        planned = PINNED_PYTORCH
    path = path_for(planned)
    if path == "pytorch":
        reason = (
            "1.3 and later have no TensorRT engine builder; tensorrt_llm.LLM loads the Hugging Face "
            "checkpoint and `lmforge compile` quantizes with ModelOpt"
        )
    else:
        reason = (
            "1.2 and earlier build TensorRT engines (JIT at start or `lmforge compile`); the "
            "tensorrt-llm-1.2 image keeps this path for LMI-era engine artifacts"
        )
    if planned == PINNED_PYTORCH and not is_installed and version is None:
        reason = f"the tensorrt-llm image pins {PINNED_PYTORCH}; " + reason
    return PathChoice(path, planned, is_installed, reason)


def create_engine(config: ServingConfig, extra_options: Mapping[str, str] | None = None) -> Any:
    """The registry's entry for ``trtllm``: the engine of the path the installed release takes."""
    choice = choose()
    if choice.path == "engine":
        from lmforge.engines.trtllm.engine import TrtllmEngine

        return TrtllmEngine(config, extra_options)
    from lmforge.engines.trtllm.pytorch_backend import TrtllmPytorchEngine

    return TrtllmPytorchEngine(config, extra_options)
