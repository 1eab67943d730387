"""Tensor parallelism for LMI-Dist: one process per rank, the server process being rank 0.

transformers shards the model (``DistributedConfig(tp_plan="auto")``, gloo on CPU, NCCL on GPU) and
its continuous-batching manager keeps the ranks in step: rank 0 (the driver) owns the request queue
and broadcasts new requests and cancellations to the others every step. Follower ranks therefore
only load the same model, run the same loop and exit when rank 0 stops it (or dies).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from lmforge.process import free_port

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

CONFIG_ENV = "LMFORGE_LMI_DIST_CONFIG"


def tensor_parallel_size(config: ServingConfig) -> int:
    """``option.tensor_parallel_degree`` as a number: ``max`` = all visible GPUs (1 on a CPU)."""
    degree = config.tensor_parallel_degree
    if degree == "max":
        import torch

        return max(1, int(torch.cuda.device_count()))
    return int(degree)


class FollowerGroup:
    """Ranks 1..N-1 as child processes; sets this process up as rank 0."""

    def __init__(self, config: ServingConfig, world_size: int) -> None:
        common = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
        os.environ.update(common, RANK="0", LOCAL_RANK="0")
        child_env = {**os.environ, **common, CONFIG_ENV: config.model_dump_json()}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "lmforge.engines.lmi_dist.follower"],
                env={**child_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            )
            for rank in range(1, world_size)
        ]

    def failure(self) -> str | None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                return f"tensor-parallel rank {rank} exited with code {code}"
        return None

    def stop(self, timeout: float = 10.0) -> None:
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
