"""How long vLLM-CPU's processes busy-wait for the next message before they sleep (a vLLM plugin).

vLLM's engine core and its worker pass every step through shared-memory queues. A process waiting for
the next message keeps polling (``sched_yield`` in a loop) for one second after the last message it
read, and only then sleeps until the writer wakes it (``SpinCondition`` in
``vllm.distributed.device_communicators.shm_broadcast``, vLLM 0.32.0). On a GPU machine that costs one
of many cores. On a CPU machine the worker polls on the core its model threads are pinned to, and with
requests less than a second apart it never sleeps: measured here with the tiny model, 46 requests of
8 tokens, 0.3 s apart, cost the worker 15.2 CPU-s in 15 s, for under a second of model work. That core
is then not free for anything else on the machine (on SageMaker, everything else in the container).

:func:`register` (the ``lmforge_cpu_idle_wait`` entry point of ``vllm.general_plugins``, so vLLM runs
it in each of its processes) shortens the poll to :data:`DEFAULT_SPIN_MS` on vLLM's CPU platform: while
the engine is generating, the next step's message comes within that time and nothing changes; after a
longer pause the reader sleeps and the writer's wake-up (a ZeroMQ message, tens of microseconds) costs
less than any CPU prefill. With it the same 46 requests cost the worker 1.6 CPU-s.
``LMFORGE_VLLM_CPU_SPIN_MS`` sets another limit (``1000`` is vLLM's own behaviour). Where vLLM's class
has changed shape, nothing is patched. This module must stay cheap to import, like :mod:`.lora_fix`.

A sleeping reader must not miss its wake-up. vLLM's wake-up is best effort: the writer's ZeroMQ PUB socket
has a send high-water mark of 1 and silently drops a notification while the one before it is still
queued, so a reader asleep when that happens sleeps until its periodic recheck of the shared memory
(``SHM_READER_RECHECK_INTERVAL_MS``, 5 s; vllm-project/vllm#45224). With vLLM's one-second poll a reader
is never asleep while the engine is generating, so vLLM's own server rarely sees it. With a 10 ms poll a
reader goes to sleep during a step that takes longer than that (a wave of prefills, a step slowed by
the frontend and the client sharing the cores) and was then stuck for 5 s: every stream of a
concurrency-64 run stopped at once, a sixth of the run's requests had a TPOT of ~90 ms against ~8, and
throughput halved (issue 60; measured with ``vllm bench serve``, the stalls were 5.05 s long and became
0.80 s with the recheck set to 777 ms). So for as long as vLLM's own poll would still be polling (its
``busy_loop_s``, one second after the last read) the reader sleeps in naps of the same limit and looks
at the shared memory after each: a lost notification costs at most one nap, and a reader idle for longer
than that second sleeps as vLLM's does, until it is woken.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from lmforge.engines.vllm.cpu_plugin import on_cpu

log = logging.getLogger("vllm.plugins.lmforge_cpu_idle_wait")

PLUGIN_NAME = "lmforge_cpu_idle_wait"
ENV = "LMFORGE_VLLM_CPU_SPIN_MS"
DEFAULT_SPIN_MS = 10.0
"""Milliseconds a vLLM-CPU process keeps polling for the next message before it sleeps."""
_PATCHED = "__lmforge_caps_busy_wait__"
_WINDOW = "_lmforge_poll_window_s"
"""Where a capped reader keeps vLLM's own busy-wait window: while within it, the reader sleeps in naps."""
_MIN_NAP_MS = 1


def spin_seconds(environ: dict[str, str] | None = None) -> float:
    """The limit in seconds: ``LMFORGE_VLLM_CPU_SPIN_MS`` when it is a number >= 0, else the default."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_SPIN_MS
    except ValueError:
        log.warning("lmforge: %s=%r is not a number of milliseconds; using %g", ENV, raw, DEFAULT_SPIN_MS)
        value = DEFAULT_SPIN_MS
    return max(value, 0.0) / 1000.0


def apply(seconds: float) -> bool:
    """Cap the busy wait of every reader made from now on in this process, with naps for the rest of
    vLLM's own window; True when in place."""
    from vllm.distributed.device_communicators import shm_broadcast

    cls: Any = getattr(shm_broadcast, "SpinCondition", None)
    if cls is None or not hasattr(cls, "wait"):
        return False
    init = cls.__init__
    if getattr(init, _PATCHED, None) is not None:
        setattr(init, _PATCHED, seconds)
        return True

    @functools.wraps(init)
    def capped(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        limit = getattr(capped, _PATCHED)
        busy = getattr(self, "busy_loop_s", None)
        if getattr(self, "is_reader", False) and isinstance(busy, (int, float)) and limit < busy:
            setattr(self, _WINDOW, busy)
            self.busy_loop_s = limit

    setattr(capped, _PATCHED, seconds)
    cls.__init__ = capped
    if not getattr(cls.wait, _PATCHED, False):
        cls.wait = _napping(cls.wait)
    return True


def _napping(wait: Any) -> Any:
    """vLLM's ``SpinCondition.wait``, with the sleep of a capped reader bounded to one nap (the cap,
    at least 1 ms) while vLLM's own window since its last read lasts."""

    @functools.wraps(wait)
    def napping(self: Any, timeout_ms: int | None = None) -> None:
        window = getattr(self, _WINDOW, None)
        if window is not None and time.monotonic() <= self.last_read + window:
            nap = max(int(self.busy_loop_s * 1000), _MIN_NAP_MS)
            timeout_ms = nap if timeout_ms is None else min(timeout_ms, nap)
        wait(self, timeout_ms)

    setattr(napping, _PATCHED, True)
    return napping


def register() -> None:
    """The ``vllm.general_plugins`` entry point: on vLLM's CPU platform, cap the busy wait."""
    on_cpu(log, _cap, "cap vLLM's busy wait")


def _cap() -> None:
    seconds = spin_seconds()
    if apply(seconds):
        log.info(
            "lmforge: vLLM's message queues poll for at most %g ms before sleeping (in naps for vLLM's "
            "first second)",
            seconds * 1e3,
        )
    else:
        log.info("lmforge: vLLM's SpinCondition is not the one this plugin knows; busy wait left as is")
