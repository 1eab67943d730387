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


@dataclass(kw_only=True)
class _DecodingBaseConfig:
    max_draft_len: int | None = None
    speculative_model: str | None = None
    max_concurrency: int | None = None


@dataclass(kw_only=True)
class NGramDecodingConfig(_DecodingBaseConfig):
    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    def __post_init__(self) -> None:  # as the real validator
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        if self.max_matching_ngram_size <= 0:
            raise ValueError("max_matching_ngram_size must be a positive integer")


@dataclass(kw_only=True)
class DraftTargetDecodingConfig(_DecodingBaseConfig):
    def __post_init__(self) -> None:  # as the real validator
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("speculative_model must be specified for DraftTarget")


from tensorrt_llm.llmapi.llm import LLM, AsyncLLM, CompletionOutput, RequestOutput  # noqa: E402

__all__ = [
    "LLM",
    "AsyncLLM",
    "CompletionOutput",
    "CudaGraphConfig",
    "DraftTargetDecodingConfig",
    "KvCacheConfig",
    "NGramDecodingConfig",
    "RequestOutput",
    "SamplingParams",
    "TorchCompileConfig",
]
