"""FAKE tensorrt_llm.llmapi (tests only)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorrt_llm.builder import BuildConfig
from tensorrt_llm.models.modeling_utils import QuantConfig
from tensorrt_llm.quantization.mode import QuantAlgo
from tensorrt_llm.sampling_params import SamplingParams

__all__ = ["BuildConfig", "KvCacheConfig", "QuantAlgo", "QuantConfig", "SamplingParams"]


@dataclass
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True
