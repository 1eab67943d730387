"""vLLM's worker processes end without a last walk over their heap (a vLLM plugin).

vLLM's CPU platform spawns its workers (:mod:`.process_start`), and a spawned process ends through
the interpreter's normal exit: after the exit handlers, CPython runs a last full garbage collection
over every object the process made (torch's, vLLM's, the model's: about a million) and then tears the
modules down, work whose memory the kernel takes back anyway. Here that was about 1.4 CPU-s and 1.4 s
of every vLLM server's stop (SIGTERM to exit: 2.8-3.1 s before, 1.4-1.5 s after; the server waits for
its workers). The engine core, forked, already ends with ``os._exit``; lmforge's own processes end with
:func:`lmforge.process.exit_process`.

:func:`register` (the ``lmforge_exit_freeze`` entry point of ``vllm.general_plugins``, which vLLM
loads in each of its processes) adds :func:`gc.freeze` as an exit handler where :data:`ENV` is ``1``
(lmforge's vLLM engine sets it for the processes it starts). Freezing moves the objects out of the
collector's view without turning it off, so exit handlers that run after it (vLLM's, torch's) run as
before, and the final collection walks only what was made after the freeze. Exit codes do not change;
what goes unrun is ``__del__`` of garbage caught in a reference cycle at exit, whose memory and file
descriptors the kernel reclaims. This module must stay cheap to import, like :mod:`.lora_fix`.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os

log = logging.getLogger("vllm.plugins.lmforge_exit_freeze")

PLUGIN_NAME = "lmforge_exit_freeze"
ENV = "LMFORGE_VLLM_EXIT_FREEZE"
"""``1``: vLLM's processes freeze their heap at exit (set by lmforge for the vLLM it runs)."""


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    if os.environ.get(ENV) == "1":
        atexit.register(gc.freeze)
        log.info("lmforge: this vLLM process freezes its heap at exit")
