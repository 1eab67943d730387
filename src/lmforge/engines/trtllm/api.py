"""The part of TensorRT-LLM's Python LLM API (release 1.2) that lmforge uses, imported in one place.

Every name lmforge calls is resolved here, so the boundary is small and a test can stand a fake in
for it (``tests/fakes/tensorrt_llm``, checked against the signatures recorded from the release's
source in ``tests/fakes/trtllm_api.json``). Facts from the 1.2 source that shape the calls:

- the TensorRT engine flavour of ``LLM`` (which builds, saves and loads engines) is
  ``tensorrt_llm._tensorrt_engine.LLM``; ``tensorrt_llm.LLM`` is the PyTorch flavour since 1.0;
- ``build_config`` wins over the LLM's own shape arguments; LoRA sizes go in ``lora_config``;
- per-token log-probs need ``gather_generation_logits=True`` on the LLM;
- ``SamplingParams.max_tokens`` defaults to 32, so it is always set; ``seed`` is the seed's name;
- ``generate_async`` must be called inside the running event loop; its result is one object,
  updated in place per streamed step, with ``finish_reason`` in stop / length / timeout / cancelled.
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
    LoraConfig: Any
    LoRARequest: Any
    version: str


def load_api() -> TrtllmApi:
    """TensorRT-LLM's classes; TrtllmUnavailableError with what to do when it cannot be imported."""
    try:
        import tensorrt_llm
        from tensorrt_llm._tensorrt_engine import LLM
        from tensorrt_llm.builder import BuildConfig
        from tensorrt_llm.executor.request import LoRARequest
        from tensorrt_llm.llmapi import KvCacheConfig
        from tensorrt_llm.models.modeling_utils import QuantConfig
        from tensorrt_llm.quantization.mode import QuantAlgo
        from tensorrt_llm.sampling_params import SamplingParams

        try:
            from tensorrt_llm.lora_helper import LoraConfig
        except ImportError:  # its older home
            from tensorrt_llm.lora_manager import LoraConfig
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
        LoraConfig=LoraConfig,
        LoRARequest=LoRARequest,
        version=str(getattr(tensorrt_llm, "__version__", "unknown")),
    )
