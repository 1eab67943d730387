"""A plan as the aligned text report ``lmforge plan`` prints."""

from __future__ import annotations

from lmforge.deploy.plan.model import GIB, DeployPlan
from lmforge.deploy.plan.timing import DOWNLOAD_BYTES_PER_S, TIMEOUT_MARGIN


def render_plan(self: DeployPlan) -> str:
    """A human-readable, aligned report of ``self``."""
    unit = "host" if self.on_host_memory else "per GPU"
    quant = f", {self.quantization}" if self.quantization else ""
    lines = [
        f"Plan for {self.model_dir} on {self.instance_type} ({self.instance})",
        f"  model        {self.architecture}, {_count(self.parameters)} parameters, {self.dtype}{quant}",
        f"  weights      {_count(self.weights_bytes, 'B')} ({self.weights_source})",
        f"  backend      rolling_batch={self.rolling_batch}, tensor parallel "
        f"{self.tensor_parallel_degree} x pipeline parallel {self.pipeline_parallel_degree}",
        f"  batch        {self.max_rolling_batch_size} sequences x {self.max_model_len} tokens "
        f"(max_model_len from {self.max_model_len_source})",
        "",
    ]
    share = f"{self.memory_per_gpu_gib:g} GiB x {self.memory_utilization:.2f}"
    rows = [
        ("weights", self.weights_per_gpu_bytes),
        (f"KV cache ({self.kv_tokens} tokens)", self.kv_per_gpu_bytes),
        ("runtime overhead", self.overhead_per_gpu_bytes),
        ("total", self.total_per_gpu_bytes),
        (f"available ({share})", self.available_per_gpu_bytes),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines.append(f"  {'host memory' if self.on_host_memory else 'memory per GPU':<{width}}{'GiB':>9}")
    lines.extend(f"  {label:<{width}}{value / GIB:>9.2f}" for label, value in rows)
    lines.append("")
    if self.fits:
        lines.append(
            f"  verdict: FITS ({(self.available_per_gpu_bytes - self.total_per_gpu_bytes) / GIB:.2f} "
            f"GiB {unit} to spare)"
        )
    elif self.total_per_gpu_bytes > self.available_per_gpu_bytes:
        short = (self.total_per_gpu_bytes - self.available_per_gpu_bytes) / GIB
        lines.append(f"  verdict: DOES NOT FIT ({short:.2f} GiB {unit} short)")
    else:
        lines.append("  verdict: NOT DEPLOYABLE (see the problems below)")
    lines.append(
        f"  at max_model_len={self.max_model_len}: max_rolling_batch_size <= "
        f"{self.max_rolling_batch_size_that_fits}; at max_rolling_batch_size="
        f"{self.max_rolling_batch_size}: max_model_len <= {self.max_model_len_that_fits}"
    )
    lines.append("")
    compile_part = f" + TensorRT-LLM build {self.compile_s:.0f} s" if self.compile_s else ""
    lines.append(
        f"  ContainerStartupHealthCheckTimeoutInSeconds = {self.health_check_timeout_s}  "
        f"(download {self.download_s:.0f} s + load {self.load_s:.0f} s + start {self.start_s:.0f} s"
        f"{compile_part}, +{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
    )
    lines.append(
        f"  ModelDataDownloadTimeoutInSeconds           = {self.download_timeout_s}  "
        f"({self.download_bytes / 1e9:.2f} GB at {DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s, "
        f"+{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
    )
    for title, items in (
        ("problems", self.problems),
        ("warnings", self.warnings),
        ("suggestions", self.suggestions),
    ):
        if items:
            lines.append("")
            lines.append(f"  {title}:")
            lines.extend(f"    - {item}" for item in items)
    return "\n".join(lines)


def _count(n: float, unit: str = "") -> str:
    """``8.03 B`` / ``0.91 M`` style (decimal prefixes), for parameters and bytes."""
    for scale, prefix in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()
