"""The PyTorch profiler inside LMI-Dist's engine core, started and stopped on request.

The model runs in the core process (:mod:`.core`), so a profiler in the server process or a benchmark
sees none of its work. ``LmiDistEngine.start_profile()`` asks the core to start the profiler (all
threads: the steps run on transformers' generation thread) and ``stop_profile(path)`` to stop it;
the core then writes operator tables to the file given and returns a summary: wall time, device-busy
time (the sum of the device kernels' time), PyTorch operators run, kernel launches and stream syncs.
On CUDA, ``device_busy_s / wall_s`` is the share of the time the GPU computes; the rest is host work
it waits for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


class CoreProfiler:
    """One profiling window at a time: :meth:`start`, then :meth:`stop` with the file to write."""

    def __init__(self) -> None:
        self._prof: Any = None
        self._t0 = 0.0

    def start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if self._prof is not None:
            raise LmforgeError("the engine core's profiler is already running")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        options: dict[str, Any] = {}
        try:  # record the generation thread's operators too, not only the caller's
            from torch._C._profiler import _ExperimentalConfig

            options["experimental_config"] = _ExperimentalConfig(profile_all_threads=True)
        except (ImportError, TypeError):
            pass
        prof = profile(activities=activities, with_stack=True, **options)
        prof.__enter__()
        self._prof, self._t0 = prof, time.perf_counter()

    def stop(self, path: str) -> dict[str, Any]:
        import torch

        prof = self._prof
        if prof is None:
            raise LmforgeError("the engine core's profiler is not running")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall = time.perf_counter() - self._t0
        prof.__exit__(None, None, None)
        self._prof = None
        events = prof.key_averages()
        summary = {
            "wall_s": wall,
            "device_busy_s": sum(e.self_device_time_total for e in events) / 1e6,
            "aten_ops": sum(e.count for e in events if e.key.startswith("aten::")),
            "kernel_launches": sum(e.count for e in events if e.key in _LAUNCHES),
            "stream_syncs": sum(
                e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize")
            ),
        }
        summary["busy_share"] = summary["device_busy_s"] / wall if wall > 0 else 0.0
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tables = [
            json.dumps(summary),
            "operators by host time",
            events.table(sort_by="self_cpu_time_total", row_limit=60),
        ]
        if torch.cuda.is_available():
            by_device = events.table(sort_by="self_device_time_total", row_limit=40)
            tables += ["operators by device time", by_device]
        tables += [
            "host time by stack",
            prof.key_averages(group_by_stack_n=6).table(sort_by="self_cpu_time_total", row_limit=40),
        ]
        out.write_text("\n\n".join(tables))
        return summary
