"""The part of TensorRT-LLM's Python LLM API (release 1.2) that lmforge uses, imported in one place.

Every name lmforge calls is resolved here, so the boundary is small and a test can stand a fake in
for it (``tests/fakes/tensorrt_llm``, checked against the signatures recorded from the release's
source in ``tests/fakes/trtllm_api.json``). The TensorRT engine flavour of ``LLM`` (the one that
builds and loads engines) lives in ``tensorrt_llm._tensorrt_engine`` since 1.0, where
``tensorrt_llm.LLM`` became the PyTorch flavour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmforge.errors import LmforgeError


class TrtllmUnavailableError(LmforgeError):
    kind = "model_error"


@dataclass(frozen=True)
class TrtllmApi:
    LLM: Any
    SamplingParams: Any
    BuildConfig: Any
    QuantConfig: Any
    QuantAlgo: Any
    KvCacheConfig: Any
    LoRARequest: Any
    version: str


def load_api() -> TrtllmApi:
    """TensorRT-LLM's classes; TrtllmUnavailableError with what to do when it cannot be imported."""
    try:
        import tensorrt_llm
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.executor.request import LoRARequest
        from tensorrt_llm.llmapi import BuildConfig, KvCacheConfig, QuantAlgo, QuantConfig, SamplingParams
    except ImportError as exc:
        raise TrtllmUnavailableError(
            f"option.rolling_batch=trtllm needs TensorRT-LLM ({exc}): install it on a machine with an NVIDIA "
            "GPU and access to NVIDIA's package index (pip install 'lmforge[trtllm]' "
            "--extra-index-url https://pypi.nvidia.com), or use the lmforge tensorrt-llm image"
        ) from None
    return TrtllmApi(
        LLM=LLM,
        SamplingParams=SamplingParams,
        BuildConfig=BuildConfig,
        QuantConfig=QuantConfig,
        QuantAlgo=QuantAlgo,
        KvCacheConfig=KvCacheConfig,
        LoRARequest=LoRARequest,
        version=str(getattr(tensorrt_llm, "__version__", "unknown")),
    )
