"""A plan as the aligned text report ``lmforge plan`` prints."""

from __future__ import annotations

from lmforge.deploy.plan.model import GIB, DeployPlan
from lmforge.deploy.plan.timing import DOWNLOAD_BYTES_PER_S, TIMEOUT_MARGIN


def render_plan(plan: DeployPlan) -> str:
    """A human-readable, aligned report of ``plan`` (what ``lmforge plan`` and ``lmforge deploy`` print)."""
    unit = "host" if plan.on_host_memory else "per GPU"
    quant = f", {plan.quantization}" if plan.quantization else ""
    lines = [
        f"Plan for {plan.model_dir} on {plan.instance_type} ({plan.instance})",
        f"  model        {plan.architecture}, {_count(plan.parameters)} parameters, {plan.dtype}{quant}",
        f"  weights      {_count(plan.weights_bytes, 'B')} ({plan.weights_source})",
        f"  backend      rolling_batch={plan.rolling_batch}, tensor parallel "
        f"{plan.tensor_parallel_degree} x pipeline parallel {plan.pipeline_parallel_degree}",
        f"  batch        {plan.max_rolling_batch_size} sequences x {plan.max_model_len} tokens "
        f"(max_model_len from {plan.max_model_len_source})",
        "",
    ]
    share = f"{plan.memory_per_gpu_gib:g} GiB x {plan.memory_utilization:.2f}"
    rows = [
        ("weights", plan.weights_per_gpu_bytes),
        (f"KV cache ({plan.kv_tokens} tokens, {_kv_dtype(plan)})", plan.kv_per_gpu_bytes),
        ("runtime overhead", plan.overhead_per_gpu_bytes),
        ("total", plan.total_per_gpu_bytes),
        (f"available ({share})", plan.available_per_gpu_bytes),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines.append(f"  {'host memory' if plan.on_host_memory else 'memory per GPU':<{width}}{'GiB':>9}")
    lines.extend(f"  {label:<{width}}{value / GIB:>9.2f}" for label, value in rows)
    lines.append("")
    if plan.fits:
        lines.append(
            f"  verdict: FITS ({(plan.available_per_gpu_bytes - plan.total_per_gpu_bytes) / GIB:.2f} "
            f"GiB {unit} to spare)"
        )
    elif plan.total_per_gpu_bytes > plan.available_per_gpu_bytes:
        short = (plan.total_per_gpu_bytes - plan.available_per_gpu_bytes) / GIB
        lines.append(f"  verdict: DOES NOT FIT ({short:.2f} GiB {unit} short)")
    else:
        lines.append("  verdict: NOT DEPLOYABLE (see the problems below)")
    lines.append(
        f"  at max_model_len={plan.max_model_len}: max_rolling_batch_size <= "
        f"{plan.max_rolling_batch_size_that_fits}; at max_rolling_batch_size="
        f"{plan.max_rolling_batch_size}: max_model_len <= {plan.max_model_len_that_fits}"
    )
    lines.append("")
    compile_part = f" + TensorRT-LLM build {plan.compile_s:.0f} s" if plan.compile_s else ""
    if plan.quantize_s:
        compile_part += f" + quantize at load {plan.quantize_s:.0f} s"
    lines.append(
        f"  ContainerStartupHealthCheckTimeoutInSeconds = {plan.health_check_timeout_s}  "
        f"(download {plan.download_s:.0f} s + load {plan.load_s:.0f} s + start {plan.start_s:.0f} s"
        f"{compile_part}, +{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
    )
    lines.append(
        f"  ModelDataDownloadTimeoutInSeconds           = {plan.download_timeout_s}  "
        f"({plan.download_bytes / 1e9:.2f} GB at {DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s, "
        f"+{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
    )
    for title, items in (
        ("problems", plan.problems),
        ("warnings", plan.warnings),
        ("suggestions", plan.suggestions),
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


def _kv_dtype(plan: DeployPlan) -> str:
    """The KV cache's element: ``option.kv_cache_dtype`` when set, else the compute dtype."""
    if plan.kv_cache_dtype == "auto":
        return plan.dtype
    return f"{plan.kv_cache_dtype}, {plan.kv_cache_bytes_per_element} B"
