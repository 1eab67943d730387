"""vLLM's KV cache on a CPU, sized by lmforge as it sizes LMI-Dist's.

Left alone, vLLM-CPU reserves ``gpu_memory_utilization`` (0.9) of the NUMA node's memory and refuses
to start when that much is not free ("Available memory on node 0 ... is less than desired CPU memory
utilization"): on a shared 24 GiB machine the example model did not start. When the user sets none of
``option.kv_cache_memory_mb``, ``option.gpu_memory_utilization`` and ``VLLM_CPU_KVCACHE_SPACE``,
lmforge passes vLLM an explicit ``kv_cache_memory_bytes``: room for ``max_rolling_batch_size``
sequences of ``max_model_len`` tokens, capped at a share of the memory available now, less the
weights. When ``max_model_len`` is not set and the model's full context does not fit, it is lowered to
what fits (and said so); when it is set and does not fit, starting fails naming the options to change.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.memory import DEFAULT_MEMORY_SHARE, available_memory_bytes, kv_bytes_per_token
from lmforge.errors import LmforgeError
from lmforge.hf.config import ModelShape

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

#: vLLM-CPU's KV block size; max_model_len is lowered to a multiple of it.
BLOCK_TOKENS = 16
#: The model's context when config.json gives none.
FALLBACK_CONTEXT = 2048


class CpuCacheError(LmforgeError):
    kind = "model_error"


@dataclass(frozen=True)
class CpuCachePlan:
    kv_cache_bytes: int
    max_model_len: int
    note: str
    """One line for the log: what was chosen and why."""


def _weights_bytes(model_dir: Path | None) -> int:
    if model_dir is None or not model_dir.is_dir():
        return 0
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) or sum(
        f.stat().st_size for f in model_dir.glob("*.bin")
    )


def plan_cpu_cache(
    shape: ModelShape,
    *,
    dtype_bytes: int,
    max_model_len: int | None,
    max_num_seqs: int,
    model_dir: Path | None = None,
    available_bytes: int | None = None,
) -> CpuCachePlan:
    per_token = kv_bytes_per_token(
        num_layers=shape.num_layers,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype_bytes=dtype_bytes,
    )
    context = shape.max_position_embeddings or FALLBACK_CONTEXT
    length = max_model_len or context
    avail = available_memory_bytes() if available_bytes is None else available_bytes
    budget = int(max(0, avail - _weights_bytes(model_dir)) * DEFAULT_MEMORY_SHARE)
    wanted = per_token * length * max_num_seqs
    kv = min(wanted, budget)
    fits = kv // per_token
    if fits < length:
        if max_model_len is not None:
            need_mb = math.ceil(per_token * length / 2**20)
            raise CpuCacheError(
                f"vLLM's KV cache on this CPU can take {budget // 2**20} MiB "
                f"({DEFAULT_MEMORY_SHARE:.0%} of the memory available, less the weights): {fits} tokens, "
                f"less than one sequence of "
                f"option.max_model_len={max_model_len}; lower option.max_model_len or give "
                f"option.kv_cache_memory_mb >= {need_mb}"
            )
        length = fits // BLOCK_TOKENS * BLOCK_TOKENS
        if length < BLOCK_TOKENS:
            raise CpuCacheError(
                f"vLLM's KV cache on this CPU can take {budget // 2**20} MiB, not even {BLOCK_TOKENS} tokens "
                f"of this model ({per_token} bytes each): free memory, or set option.kv_cache_memory_mb"
            )
        kv = per_token * length
    note = (
        f"KV cache {kv / 2**20:.0f} MiB for {kv // per_token} tokens ({max_num_seqs} x {length} wanted, "
        f"capped at {DEFAULT_MEMORY_SHARE:.0%} of {avail / 2**30:.1f} GiB available less the weights)"
    )
    if length < (max_model_len or context):
        note += f"; max_model_len lowered from the model's {context} to {length} to fit"
    return CpuCachePlan(kv_cache_bytes=kv, max_model_len=length, note=note)


#: Options (``option.<name>``) and environment variables with which the user sizes vLLM's cache.
USER_SIZING_OPTIONS = ("kv_cache_memory_mb", "gpu_memory_utilization")
USER_SIZING_ENV = "VLLM_CPU_KVCACHE_SPACE"
_DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "float32": 4, "float16": 2, "bfloat16": 2}


def _dtype_bytes(config: ServingConfig, shape: ModelShape | None, extra_options: Mapping[str, str]) -> int:
    kv_dtype = extra_options.get("kv_cache_dtype", extra_options.get("kv-cache-dtype", "auto"))
    if kv_dtype.startswith("fp8"):
        return 1
    if config.dtype != "auto":
        return _DTYPE_BYTES[config.dtype]
    checkpoint = shape.checkpoint_dtype if shape is not None else None
    return _DTYPE_BYTES.get(checkpoint or "", 4)


def cpu_cache_kwargs(
    config: ServingConfig,
    kwargs: Mapping[str, Any],
    extra_options: Mapping[str, str],
    *,
    environ: Mapping[str, str] | None = None,
    available_bytes: int | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Engine arguments that size vLLM's CPU KV cache, and a line for the log saying what was chosen.

    Nothing (``{}``, None) when the user sized it (:data:`USER_SIZING_OPTIONS`, ``VLLM_CPU_KVCACHE_SPACE``).
    Raises :class:`CpuCacheError` when ``option.max_model_len`` cannot fit."""
    env = os.environ if environ is None else environ
    if any(name in config.model_fields_set for name in USER_SIZING_OPTIONS) or env.get(USER_SIZING_ENV):
        return {}, None
    model_dir = config.model_path
    shape = None
    if model_dir is not None and (Path(model_dir) / "config.json").is_file():
        try:
            data = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
            shape = ModelShape.from_config(data)
        except (OSError, ValueError, LmforgeError):
            shape = None
    if shape is None:
        # no readable config.json (a hub id vLLM will fetch): a share of the memory, unsized per model
        avail = available_memory_bytes() if available_bytes is None else available_bytes
        kv = int(avail * DEFAULT_MEMORY_SHARE)
        return {"kv_cache_memory_bytes": kv}, (
            f"KV cache {kv / 2**20:.0f} MiB "
            f"({DEFAULT_MEMORY_SHARE:.0%} of {avail / 2**30:.1f} GiB available; "
            "the model's config.json was not readable before loading)"
        )
    plan = plan_cpu_cache(
        shape,
        dtype_bytes=_dtype_bytes(config, shape, extra_options),
        max_model_len=kwargs.get("max_model_len"),
        max_num_seqs=int(kwargs.get("max_num_seqs", config.max_rolling_batch_size)),
        model_dir=Path(model_dir) if model_dir is not None else None,
        available_bytes=available_bytes,
    )
    return {"kv_cache_memory_bytes": plan.kv_cache_bytes, "max_model_len": plan.max_model_len}, plan.note
