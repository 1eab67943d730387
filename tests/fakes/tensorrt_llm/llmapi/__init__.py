"""FAKE tensorrt_llm.llmapi (tests only)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class QuantAlgo(enum.StrEnum):
    FP8 = "FP8"
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    INT8 = "INT8"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    W8A8_SQ_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN"


@dataclass
class QuantConfig:
    quant_algo: QuantAlgo | None = None
    kv_cache_quant_algo: QuantAlgo | None = None
    group_size: int = 128
    smoothquant_val: float = 0.5


@dataclass
class PluginConfig:
    paged_kv_cache: bool = True
    context_fmha: bool = True
    use_paged_context_fmha: bool = False
    lora_plugin: str | None = None


@dataclass
class BuildConfig:
    max_input_len: int = 1024
    max_seq_len: int | None = None
    max_batch_size: int = 2048
    max_num_tokens: int = 8192
    max_beam_width: int = 1
    plugin_config: PluginConfig = field(default_factory=PluginConfig)


@dataclass
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    detokenize: bool = True
    end_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
