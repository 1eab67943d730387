"""The part of TensorRT-LLM's PyTorch-backend LLM API (releases 1.3 and 1.4) that lmforge uses, imported
in one place (the 1.2 engine API is :mod:`.api`).

Checked against the names recorded from the 1.3/1.4 sources in ``tests/fakes/trtllm_api_1.3.json``
(the fake in ``tests/fakes/trtllm13`` accepts only those). Facts from those sources that shape the calls:

- ``tensorrt_llm.LLM`` is the PyTorch backend (``TorchLlmArgs``); unknown keyword arguments are refused;
  ``backend="tensorrt"`` raises since the engine flow was removed;
- ``kv_cache_config=KvCacheConfig(free_gpu_memory_fraction, enable_block_reuse, dtype)``;
  ``cuda_graph_config=CudaGraphConfig(max_batch_size, enable_padding)`` (an alias of
  ``DecodeCudaGraphConfig`` in 1.3+; ``None`` turns CUDA graphs off);
  ``torch_compile_config=TorchCompileConfig(...)`` (``None``, the default, means eager);
- LoRA is ``lora_config=LoraConfig(lora_dir, max_lora_rank, max_loras, max_cpu_loras)`` (its home moved to
  ``tensorrt_llm._torch.peft.lora.config``; ``tensorrt_llm.lora_helper`` / ``lora_manager`` are older
  homes) and a per-request ``LoRARequest(name, id, path)``; ``enable_lora`` is ignored on this backend;
- ``AsyncLLM`` (``tensorrt_llm.llmapi``) subclasses ``LLM``, forces the Ray orchestrator and must be
  awaited (``setup_async()``) before use;
- speculative decoding is ``speculative_config=`` one of the ``DecodingBaseConfig`` subclasses
  (``tensorrt_llm.llmapi``): ``NGramDecodingConfig(max_draft_len, max_matching_ngram_size, is_keep_all,
  is_use_oldest, is_public_pool)`` (prompt lookup, no model) and ``DraftTargetDecodingConfig(max_draft_len,
  speculative_model)`` (a draft model folder; ``speculative_model_dir`` is its older alias); every one
  takes ``max_concurrency``, the batch size above which speculation is off (PyTorch backend only);
- ``generate_async(inputs, sampling_params, lora_request=..., streaming=True)`` returns one result,
  updated in place per step, with ``abort()``; ``finish_reason`` is stop / length / timeout / cancelled;
  log-probs come from the sampler (``SamplingParams.logprobs``), no ``gather_generation_logits`` needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmforge.engines.trtllm.api import TrtllmUnavailableError


@dataclass(frozen=True)
class TrtllmPtApi:
    LLM: Any
    AsyncLLM: Any
    """None where the release has no ``AsyncLLM``."""
    SamplingParams: Any
    KvCacheConfig: Any
    CudaGraphConfig: Any
    TorchCompileConfig: Any
    LoraConfig: Any
    LoRARequest: Any
    version: str
    NGramDecodingConfig: Any = None
    """Prompt-lookup speculation (``tensorrt_llm.llmapi``); None where the release has none."""
    DraftTargetDecodingConfig: Any = None
    """Draft-model speculation (``tensorrt_llm.llmapi``); None where the release has none."""


def load_pt_api() -> TrtllmPtApi:
    """TensorRT-LLM's PyTorch-backend classes; TrtllmUnavailableError with what to do when missing."""
    try:
        import tensorrt_llm
        from tensorrt_llm import LLM
        from tensorrt_llm.executor.request import LoRARequest
        from tensorrt_llm.llmapi import CudaGraphConfig, KvCacheConfig, SamplingParams, TorchCompileConfig

        LoraConfig = _lora_config_class()
    except ImportError as exc:
        raise TrtllmUnavailableError(
            f"option.rolling_batch=trtllm needs TensorRT-LLM >= 1.3 ({exc}): install it on a machine with "
            "an NVIDIA GPU (pip install 'lmforge[trtllm]'), or use the lmforge tensorrt-llm image"
        ) from None
    import tensorrt_llm.llmapi as llmapi

    return TrtllmPtApi(
        LLM=LLM,
        AsyncLLM=getattr(llmapi, "AsyncLLM", None),
        SamplingParams=SamplingParams,
        KvCacheConfig=KvCacheConfig,
        CudaGraphConfig=CudaGraphConfig,
        TorchCompileConfig=TorchCompileConfig,
        LoraConfig=LoraConfig,
        LoRARequest=LoRARequest,
        version=str(getattr(tensorrt_llm, "__version__", "unknown")),
        NGramDecodingConfig=getattr(llmapi, "NGramDecodingConfig", None),
        DraftTargetDecodingConfig=getattr(llmapi, "DraftTargetDecodingConfig", None),
    )


def _lora_config_class() -> Any:
    try:
        from tensorrt_llm._torch.peft.lora.config import LoraConfig
    except ImportError:
        try:
            from tensorrt_llm.lora_helper import LoraConfig
        except ImportError:  # its oldest home
            from tensorrt_llm.lora_manager import LoraConfig
    return LoraConfig
