"""What the planner checks beyond memory: the parallel degrees against the instance and the model's
heads and layers, the backend against the accelerator."""

from __future__ import annotations

from lmforge.config.schema import ServingConfig
from lmforge.deploy.images import CPU_FLAVOURS
from lmforge.deploy.instances import FP8_GPUS, NO_BF16_GPUS, UNSUPPORTED_ACCELERATORS, InstanceType
from lmforge.deploy.plan.memory import CPU_HOST_USABLE_FRACTION
from lmforge.deploy.plan.model import Notes
from lmforge.hf import ModelShape

#: backends with no image for CPU instances (lmforge's images decide: lmforge.deploy.images)
GPU_BACKENDS = frozenset({"vllm", "trtllm", "lmi-dist"}) - frozenset(CPU_FLAVOURS)


def divisors_up_to(n: int, limit: int) -> list[int]:
    return [d for d in range(1, max(1, limit) + 1) if n % d == 0]


def tp_compatible(shape: ModelShape, tp: int) -> bool:
    kv = shape.num_kv_heads
    return shape.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def parallelism(
    config: ServingConfig,
    instance: InstanceType,
    shape: ModelShape,
    dtype: str,
    quantization: str | None,
    notes: Notes,
) -> tuple[int, int]:
    """(tensor parallel, pipeline parallel) degrees, with what is wrong or odd about them, the backend
    and the dtype on this instance."""
    rolling_batch = config.rolling_batch
    if config.tensor_parallel_degree == "max":
        tp = instance.gpu_count if instance.gpu_count and not instance.is_cpu else 1
    else:
        tp = config.tensor_parallel_degree
    pp = config.pipeline_parallel_degree
    if instance.accelerator in UNSUPPORTED_ACCELERATORS:
        notes.problems.append(
            f"{instance.name} has {instance.accelerator} accelerators, which lmforge's GPU backends do not "
            "support (they need the LMI NeuronX container); choose an NVIDIA GPU instance (ml.g5, g6, g6e, "
            "p4d, p5)"
        )
    if instance.is_cpu:
        if rolling_batch in GPU_BACKENDS:
            notes.problems.append(
                f"option.rolling_batch={rolling_batch} needs an NVIDIA GPU, but {instance.name} is a CPU "
                "instance; use a GPU instance, or rolling_batch=lmi-dist to run on the CPU"
            )
        else:
            notes.warnings.append(
                f"{instance.name} is a CPU instance: planned against host memory "
                f"({instance.host_memory_gib:g} GiB x {CPU_HOST_USABLE_FRACTION}); expect low throughput"
            )
        if tp * pp > instance.vcpus:
            notes.warnings.append(f"{tp * pp} ranks on {instance.vcpus} vCPUs")
    elif tp * pp > instance.gpu_count:
        notes.problems.append(
            f"option.tensor_parallel_degree ({tp}) x option.pipeline_parallel_degree ({pp}) = {tp * pp} "
            f"is more than the {instance.gpu_count} GPU(s) of {instance.name}"
        )
    elif tp * pp < instance.gpu_count and instance.is_supported_gpu:
        notes.warnings.append(
            f"uses {tp * pp} of the {instance.gpu_count} GPUs of {instance.name}; "
            "option.tensor_parallel_degree=max would use them all"
        )
    if shape.num_heads % tp:
        good = divisors_up_to(shape.num_heads, max(instance.gpu_count, 1))
        notes.problems.append(
            f"num_attention_heads ({shape.num_heads}) is not divisible by option.tensor_parallel_degree "
            f"({tp}); use one of {', '.join(map(str, good))}"
        )
    elif shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        notes.problems.append(
            f"num_key_value_heads ({shape.num_kv_heads}) and option.tensor_parallel_degree ({tp}) must "
            "divide one another"
        )
    elif tp > shape.num_kv_heads:
        notes.warnings.append(
            f"{shape.num_kv_heads} KV heads over {tp} GPUs: each KV head is replicated on "
            f"{tp // shape.num_kv_heads} GPUs"
        )
    if pp > shape.num_layers:
        notes.problems.append(
            f"option.pipeline_parallel_degree ({pp}) is more than the {shape.num_layers} layers of the model"
        )
    if instance.accelerator in NO_BF16_GPUS and dtype == "bf16":
        notes.warnings.append(
            f"{instance.accelerator} GPUs have no bf16: set option.dtype=fp16 (vLLM refuses bf16 there)"
        )
    if quantization == "fp8" and instance.is_supported_gpu and instance.accelerator not in FP8_GPUS:
        notes.warnings.append(
            f"{instance.accelerator} GPUs have no fp8 tensor cores: fp8 runs as weight-only there"
        )
    if shape.latent_attention:
        notes.warnings.append(
            "multi-head latent attention: the KV-cache estimate is approximate (an upper bound)"
        )

    return tp, pp
