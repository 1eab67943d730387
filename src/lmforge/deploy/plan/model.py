"""The plan of one model on one instance type (what ``lmforge plan`` prints and ``lmforge deploy``
uses), and the error when no plan can be made. The plan is data; :mod:`lmforge.deploy.plan.render`
writes it as text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024**3
MIB = 1024**2


@dataclass
class Notes:
    """What the planning steps found, in the plan's words."""

    problems: list[str] = field(default_factory=list)
    """What makes the deployment impossible (the plan does not fit)."""
    warnings: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)


class PlanError(Exception):
    """The plan cannot be made (no or unreadable ``config.json``); the message says what to do."""


@dataclass(frozen=True)
class DeployPlan:
    """The memory and start-up plan of one model on one instance type (bytes unless named otherwise)."""

    model_dir: str
    model_config_path: str
    instance_type: str
    instance: str
    """The instance described in words."""
    accelerator: str
    gpu_count: int
    memory_per_gpu_gib: float
    on_host_memory: bool
    """True for CPU instances: one pool of host memory instead of GPUs."""
    rolling_batch: str
    dtype: str
    quantization: str | None
    tensor_parallel_degree: int
    pipeline_parallel_degree: int
    max_rolling_batch_size: int
    max_model_len: int
    max_model_len_source: str
    memory_utilization: float
    architecture: str
    parameters: int
    weights_bytes: int
    weights_source: str
    download_bytes: int
    kv_cache_dtype: str
    """``option.kv_cache_dtype`` as planned (``auto``: the compute dtype)."""
    kv_cache_bytes_per_element: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_tokens: int
    weights_per_gpu_bytes: int
    kv_per_gpu_bytes: int
    overhead_per_gpu_bytes: int
    total_per_gpu_bytes: int
    available_per_gpu_bytes: int
    max_rolling_batch_size_that_fits: int
    max_model_len_that_fits: int
    download_s: float
    load_s: float
    start_s: float
    compile_s: float
    quantize_s: float
    """LMI-Dist quantizing the weights at every start (``option.quantize`` on an unquantized folder)."""
    health_check_timeout_s: int
    """Suggested ContainerStartupHealthCheckTimeoutInSeconds."""
    download_timeout_s: int
    """Suggested ModelDataDownloadTimeoutInSeconds."""
    fits: bool
    problems: list[str]
    warnings: list[str]
    suggestions: list[str]
    suggested_instance: str | None

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (for ``lmforge plan --json``)."""
        return asdict(self)
