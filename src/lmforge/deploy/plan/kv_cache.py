"""``option.kv_cache_dtype``: the bytes per KV-cache element the plan counts, by the values each backend
takes. ``auto`` (or none) is the compute dtype, as every backend keeps it; the fp8 and int8 ones are one
byte. A value the backend does not take is a problem naming the option and its choices (the start would
refuse it, or, for LMI-Dist, which keeps its cache in the compute dtype whatever is asked, serve a cache
bigger than the one asked for)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import InstanceType
from lmforge.deploy.plan.model import Notes

#: vLLM 0.32 on CPU: ``CPUAttentionBackend.supported_kv_cache_dtypes`` (None: the compute dtype)
VLLM_CPU: dict[str, int | None] = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
#: vLLM 0.32 on a GPU: the cache dtypes lmforge sizes (``vllm.config.cache.CacheDType``)
VLLM_GPU: dict[str, int | None] = {
    "auto": None, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
    "fp8_per_token_head": 1, "int8_per_token_head": 1,
}  # fmt: skip
#: vLLM 0.32's other GPU cache dtypes (sub-byte or MLA-specific): taken, sized here as the compute
#: dtype (an upper bound), with a warning
VLLM_GPU_UNSIZED = (
    "fp8_ds_mla", "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
    "turboquant_3bit_nc", "ultraquant_4bit", "int4_per_token_head", "nvfp4", "nvfp4_4over6",
)  # fmt: skip
#: TensorRT-LLM: :data:`lmforge.engines.trtllm.plan.KV_CACHE_ALGOS` (engines, <= 1.2) and fp8 of
#: :data:`lmforge.engines.trtllm.quantplan.KV_METHODS` (>= 1.3)
TRTLLM: dict[str, int | None] = {"auto": None, "fp8": 1, "int8": 1}
#: TensorRT-LLM >= 1.3's nvfp4 cache (4 bits and block scales): taken, sized as the compute dtype
TRTLLM_UNSIZED = ("nvfp4",)
#: LMI-Dist keeps its cache in the compute dtype: it takes ``auto`` only
LMI_DIST: dict[str, int | None] = {"auto": None}


@dataclass(frozen=True)
class KvCache:
    dtype: str
    """``auto`` or the option's value, as the backend names it."""
    bytes: int
    """Bytes per element."""


def option_value(extra_options: Mapping[str, str]) -> str | None:
    """``option.kv_cache_dtype`` (or its vLLM spelling ``option.kv-cache-dtype``), None when unset."""
    value = extra_options.get("kv_cache_dtype", extra_options.get("kv-cache-dtype"))
    return None if value is None else value.strip()


def _choices(
    config: ServingConfig, instance: InstanceType
) -> tuple[str, dict[str, int | None], tuple[str, ...]]:
    """The backend's name, the values it takes that the plan sizes, and those it takes that the plan
    does not size, for the backend ``option.rolling_batch`` names (``auto``: vLLM's, which lmforge's
    images serve when it is installed)."""
    backend = config.rolling_batch
    if backend == "lmi-dist":
        return "LMI-Dist", LMI_DIST, ()
    if backend == "trtllm":
        return "TensorRT-LLM", TRTLLM, TRTLLM_UNSIZED
    if instance.is_cpu:
        return "vLLM on CPU", VLLM_CPU, ()
    return "vLLM", VLLM_GPU, VLLM_GPU_UNSIZED


def kv_cache(
    config: ServingConfig,
    extra_options: Mapping[str, str],
    instance: InstanceType,
    compute_bytes: int,
    notes: Notes,
) -> KvCache:
    """The KV cache's element size for ``option.kv_cache_dtype`` on this backend and instance; a value
    it does not take is a problem (and is planned in the compute dtype)."""
    raw = option_value(extra_options)
    if raw is None or raw.lower() == "auto":
        return KvCache("auto", compute_bytes)
    value = raw.lower()
    if config.rolling_batch == "disable":
        notes.warnings.append(
            f"option.kv_cache_dtype={raw}: option.rolling_batch=disable keeps no KV cache of its own; ignored"
        )
        return KvCache("auto", compute_bytes)
    backend, table, unsized = _choices(config, instance)
    if value in table:
        size = table[value]
        return KvCache(value, compute_bytes if size is None else size)
    if value in unsized:
        notes.warnings.append(
            f"option.kv_cache_dtype={raw}: {backend} takes it, lmforge's plan does not know its size; the "
            "KV cache is planned in the compute dtype (an upper bound)"
        )
        return KvCache(value, compute_bytes)
    why = (
        "LMI-Dist keeps its KV cache in the compute dtype (option.dtype) and reads no other; for a "
        "one-byte fp8 cache serve with option.rolling_batch=vllm"
        if table is LMI_DIST
        else f"{backend} does not take it"
    )
    choices = ", ".join([*table, *unsized])
    notes.problems.append(f"option.kv_cache_dtype={raw}: {why}; choose one of: {choices}")
    return KvCache("auto", compute_bytes)
