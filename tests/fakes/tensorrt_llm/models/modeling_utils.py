"""FAKE tensorrt_llm.models.modeling_utils (tests only)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorrt_llm.quantization.mode import QuantAlgo


@dataclass
class QuantConfig:
    quant_algo: QuantAlgo | None = None
    kv_cache_quant_algo: QuantAlgo | None = None
    group_size: int = 128
    smoothquant_val: float = 0.5
