"""The smallest instance type of lmforge's table on which a model fits at the planned batch and length."""

from __future__ import annotations

from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import INSTANCES, NO_BF16_GPUS, InstanceType
from lmforge.deploy.plan.checks import GPU_BACKENDS, tp_compatible
from lmforge.deploy.plan.memory import CPU_HOST_USABLE_FRACTION, Memory, memory
from lmforge.deploy.plan.model import GIB, Notes
from lmforge.hf import ModelShape


def suggest_instance(
    shape: ModelShape,
    current: InstanceType,
    dtype: str,
    weights_bytes: int,
    kv_bytes: int,
    pp: int,
    batch: int,
    max_len: int,
    config: ServingConfig,
    kv_budget: int | None,
    current_tp: int,
) -> tuple[str, str] | None:
    """The smallest instance of the table (least accelerator memory, then fewest GPUs and vCPUs) where
    this model fits at the current batch and length, using all its GPUs: its name and a sentence."""
    cpu_plan = current.is_cpu and config.rolling_batch not in GPU_BACKENDS
    fitting: list[tuple[InstanceType, int, Memory]] = []
    for candidate in INSTANCES:
        if cpu_plan != candidate.is_cpu or not (candidate.is_cpu or candidate.is_supported_gpu):
            continue
        if dtype == "bf16" and candidate.accelerator in NO_BF16_GPUS:
            continue
        tp = 1 if candidate.is_cpu else candidate.gpu_count // pp
        if tp < 1 or not tp_compatible(shape, tp) or (candidate.name == current.name and tp == current_tp):
            continue
        mem = memory(
            shape,
            candidate,
            weights_bytes=weights_bytes,
            kv_bytes=kv_bytes,
            tp=tp,
            pp=pp,
            batch=batch,
            max_len=max_len,
            utilization=CPU_HOST_USABLE_FRACTION if candidate.is_cpu else config.gpu_memory_utilization,
            kv_budget=kv_budget,
        )
        if mem.fits:
            fitting.append((candidate, tp, mem))
    if not fitting:
        return None
    best, tp, mem = min(
        fitting,
        key=lambda item: (
            item[0].host_memory_gib if item[0].is_cpu else item[0].total_gpu_memory_gib,
            item[0].gpu_count,
            item[0].vcpus,
            item[0].host_memory_gib,
        ),
    )
    where = "of host memory" if best.is_cpu else "per GPU"
    parallel = "" if best.is_cpu or tp == 1 else f" with option.tensor_parallel_degree={tp}"
    if best.name == current.name:
        return best.name, (
            f"or set option.tensor_parallel_degree={tp} (or max) to use all {tp} GPUs: "
            f"{mem.total / GIB:.1f} of {mem.available / GIB:.1f} GiB per GPU"
        )
    return best.name, (
        f"or use instance {best.name}{parallel} ({best.describe()}): "
        f"{mem.total / GIB:.1f} of {mem.available / GIB:.1f} GiB {where}"
    )


def suggest(
    mem: Memory,
    *,
    shape: ModelShape,
    instance: InstanceType,
    config: ServingConfig,
    dtype: str,
    weights_bytes: int,
    kv_bytes: int,
    tp: int,
    pp: int,
    max_len: int,
    kv_budget: int | None,
    notes: Notes,
) -> str | None:
    """Ways to make a plan that does not fit fit (smaller batch or length, another instance); the
    suggested instance type, if any."""
    batch = config.max_rolling_batch_size
    suggestions = notes.suggestions
    if mem.weights + mem.overhead > mem.available:
        suggestions.append(
            f"the weights alone need {(mem.weights + mem.overhead) / GIB:.1f} GiB "
            f"{'of host memory' if instance.is_cpu else 'per GPU'}: "
            + ("use" if instance.is_cpu else "use more GPUs (option.tensor_parallel_degree),")
            + " a quantized checkpoint or a bigger instance"
        )
    elif not mem.fits:
        if mem.max_batch >= 1:
            suggestions.append(
                f"set option.max_rolling_batch_size={mem.max_batch} (keeps max_model_len={max_len})"
            )
        if mem.max_len >= 1:
            length = mem.max_len - mem.max_len % 256 if mem.max_len >= 256 else mem.max_len
            suggestions.append(f"or set option.max_model_len={length} (keeps max_rolling_batch_size={batch})")
    found = suggest_instance(
        shape, instance, dtype, weights_bytes, kv_bytes, pp, batch, max_len, config, kv_budget, tp
    )
    if found is None:
        return None
    suggestions.append(found[1])
    return found[0]
