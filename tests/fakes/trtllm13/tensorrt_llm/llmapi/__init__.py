"""FAKE tensorrt_llm.llmapi (tests only): the 1.3 configuration classes lmforge passes to ``LLM``."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorrt_llm.sampling_params import SamplingParams


@dataclass(kw_only=True)
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    dtype: str = "auto"


@dataclass(kw_only=True)
class CudaGraphConfig:  # DecodeCudaGraphConfig in 1.3+; CudaGraphConfig is its alias
    batch_sizes: list[int] | None = None
    max_batch_size: int = 0
    enable_padding: bool = False
    mode: str = "decode"


@dataclass(kw_only=True)
class TorchCompileConfig:
    enable_fullgraph: bool = True
    enable_inductor: bool = False
    enable_piecewise_cuda_graph: bool = False
    capture_num_tokens: list[int] | None = field(default=None)
    enable_userbuffers: bool = True
    max_num_streams: int = 3


from tensorrt_llm.llmapi.llm import LLM, AsyncLLM, CompletionOutput, RequestOutput  # noqa: E402

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "CudaGraphConfig",
    "KvCacheConfig",
    "RequestOutput",
    "SamplingParams",
    "TorchCompileConfig",
]
