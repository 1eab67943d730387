"""The TensorRT-LLM >= 1.3 backend: the PyTorch-backend ``tensorrt_llm.LLM`` (or ``AsyncLLM``).

Start-up makes the plan (:func:`.quantplan.make_quant_plan`: bad options fail before any work), finds
the folder to load (:func:`.quantize.ensure_checkpoint`: a quantized checkpoint as it is, the model
folder, or a ModelOpt quantization made now and cached, once per key across processes) and creates the
LLM with ``KvCacheConfig``, ``CudaGraphConfig`` (or none), ``TorchCompileConfig`` (``option.torch_compile``)
and, for ``option.enable_lora``, a ``LoraConfig``, for ``option.speculative_config`` (or LMI's
``option.speculative_draft_model``) TensorRT-LLM's own speculative config (:func:`speculative_config`);
nothing is compiled, the start-up cost is TensorRT-LLM
capturing CUDA graphs. ``option.trtllm_async_llm=true`` makes an ``AsyncLLM`` instead (Ray orchestrator)
and awaits its ``setup_async()``.

Requests, streaming, cancellation, log-probs, finish reasons and per-request ``LoRARequest`` are the 1.2
backend's (:class:`.engine.TrtllmEngine`, whose generate loop is the same on both APIs); the sampling
fields the PyTorch sampler takes natively (``min_tokens``, presence / frequency penalties, ``min_p``,
``stop_token_ids``) are passed through here instead of being refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.protocol import RequestField
from lmforge.engines.trtllm.engine import TrtllmEngine, not_supported
from lmforge.errors import NotReadyError

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import SamplingParams
    from lmforge.engines.trtllm.pt_api import TrtllmPtApi
    from lmforge.engines.trtllm.quantplan import QuantPlan

log = logging.getLogger("lmforge.engines.trtllm")


def adapter_dirs(config: ServingConfig) -> list[str]:
    """The adapters shipped in the model folder's ``adapters/`` (TensorRT-LLM reads their target modules
    from them; without any it reserves LoRA memory for every module)."""
    folder = config.model_path
    root = folder / "adapters" if folder is not None else None
    if root is None or not root.is_dir():
        return []
    return sorted(str(p) for p in root.iterdir() if (p / "adapter_config.json").is_file())


def llm_kwargs(api: TrtllmPtApi, plan: QuantPlan, checkpoint: Path, config: ServingConfig) -> dict[str, Any]:
    """Keyword arguments of ``LLM(...)`` / ``AsyncLLM(...)`` that serve ``plan`` from ``checkpoint``."""
    runtime = plan.runtime
    kwargs: dict[str, Any] = {
        "model": str(checkpoint),
        "tokenizer": str(checkpoint),
        "dtype": plan.dtype,
        "tensor_parallel_size": plan.tensor_parallel,
        "pipeline_parallel_size": plan.pipeline_parallel,
        "trust_remote_code": plan.trust_remote_code,
        "max_batch_size": runtime["max_batch_size"],
        "max_num_tokens": runtime["max_num_tokens"],
        "kv_cache_config": api.KvCacheConfig(
            free_gpu_memory_fraction=runtime["kv_cache_free_gpu_mem_fraction"],
            enable_block_reuse=runtime["enable_kv_cache_reuse"],
        ),
        # None turns CUDA graphs off (TensorRT-LLM's default is on, up to batch 128)
        "cuda_graph_config": api.CudaGraphConfig(
            max_batch_size=runtime["cuda_graph_max_batch_size"], enable_padding=runtime["cuda_graph_padding"]
        )
        if runtime["cuda_graph"]
        else None,
    }
    if runtime["max_seq_len"] is not None:
        kwargs["max_seq_len"] = runtime["max_seq_len"]
    if runtime["max_input_len"] is not None:
        kwargs["max_input_len"] = runtime["max_input_len"]
    if runtime["torch_compile"]:
        kwargs["torch_compile_config"] = api.TorchCompileConfig()
    if config.speculation is not None:
        kwargs["speculative_config"] = speculative_config(api, config)
    if config.enable_lora:
        kwargs["lora_config"] = api.LoraConfig(
            lora_dir=adapter_dirs(config),
            max_lora_rank=config.max_lora_rank,
            max_loras=config.max_loras,
            max_cpu_loras=config.max_cpu_loras or config.max_loras,
        )
    return kwargs


def speculative_config(api: TrtllmPtApi, config: ServingConfig) -> Any:
    """``option.speculative_config`` (vLLM's words, :mod:`lmforge.config.speculative`) as TensorRT-LLM's
    own: ``ngram`` is ``NGramDecodingConfig`` (``num_speculative_tokens`` -> ``max_draft_len``,
    ``prompt_lookup_max`` -> ``max_matching_ngram_size``; TensorRT-LLM tries every n-gram size up to it,
    so ``prompt_lookup_min`` has no counterpart and is left to it), ``draft_model`` is
    ``DraftTargetDecodingConfig`` (``model`` -> ``speculative_model``, a relative folder taken relative
    to the model folder); ``disable_by_batch_size`` is ``max_concurrency`` for both. A release without
    the class is refused here, naming the option."""
    from lmforge.config.speculative import draft_folder
    from lmforge.errors import LmforgeError

    spec = config.speculation
    assert spec is not None
    common: dict[str, Any] = {"max_draft_len": spec.num_speculative_tokens}
    if spec.disable_by_batch_size is not None:
        common["max_concurrency"] = spec.disable_by_batch_size
    if spec.method == "ngram":
        cls, name = api.NGramDecodingConfig, "NGramDecodingConfig"
        # the latest match first (is_use_oldest=False), as LMI-Dist's and vLLM's prompt lookup do
        fields = {"max_matching_ngram_size": spec.prompt_lookup_max, "is_use_oldest": False, **common}
    else:
        assert spec.model is not None
        cls, name = api.DraftTargetDecodingConfig, "DraftTargetDecodingConfig"
        fields = {"speculative_model": str(draft_folder(spec.model, config.model_dir)), **common}
    if cls is None:
        raise LmforgeError(
            f"option.speculative_config ({spec.method}): TensorRT-LLM {api.version} has no {name}; "
            "LMI-Dist (option.rolling_batch=lmi-dist) serves it"
        )
    return cls(**fields)


def _max_model_len(plan: QuantPlan, config: ServingConfig) -> int:
    from lmforge.engines.trtllm.plan import _model_config

    if plan.runtime["max_seq_len"] is not None:
        return int(plan.runtime["max_seq_len"])
    declared = _model_config(config).get("max_position_embeddings")
    return int(declared) if isinstance(declared, int) else 2048


class TrtllmPytorchEngine(TrtllmEngine):
    name = "trtllm"

    def __init__(
        self,
        config: ServingConfig,
        extra_options: Mapping[str, str] | None = None,
        *,
        api: TrtllmPtApi | None = None,
    ) -> None:
        super().__init__(config, extra_options)
        self._api = api
        self.quant_plan: QuantPlan | None = None
        self.checkpoint: Path | None = None

    async def start(self) -> None:
        from lmforge.engines.trtllm.plan import gpu_arch
        from lmforge.engines.trtllm.pt_api import load_pt_api
        from lmforge.engines.trtllm.quantize import ensure_checkpoint
        from lmforge.engines.trtllm.quantplan import make_quant_plan

        started = time.monotonic()
        api: TrtllmPtApi = self._api or load_pt_api()
        self._api = api
        plan = make_quant_plan(self.config, self.extra_options, arch=gpu_arch(), trtllm_version=api.version)
        self.quant_plan = plan
        folder = self.config.model_path
        if folder is None:
            raise NotReadyError(f"option.model_id={self.config.model_id!r} is not a local folder")
        checkpoint = await asyncio.to_thread(
            ensure_checkpoint, plan, folder, timeout_s=float(self.config.model_loading_timeout)
        )
        self.checkpoint = checkpoint
        kwargs = llm_kwargs(api, plan, checkpoint, self.config)
        if plan.runtime["async_llm"]:
            if api.AsyncLLM is None:
                raise NotReadyError(
                    f"option.trtllm_async_llm=true needs TensorRT-LLM's AsyncLLM; {api.version} has none"
                )
            llm = await asyncio.to_thread(api.AsyncLLM, **kwargs)
            await llm.setup_async()  # AsyncLLM serves nothing before its workers are set up
        else:
            llm = await asyncio.to_thread(api.LLM, **kwargs)
        self._llm = llm
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer, str(checkpoint))
        if self._tokenizer.eos_token_id is not None:
            self._eos_ids = {int(self._tokenizer.eos_token_id)}
        self.max_model_len = _max_model_len(plan, self.config)
        self.max_input_len = plan.runtime["max_input_len"]
        self.max_lora_rank = self.config.max_lora_rank if self.config.enable_lora else None
        self.load_seconds = time.monotonic() - started
        log.info(
            "TensorRT-LLM %s (PyTorch backend%s) ready in %.1f s (%s)",
            api.version,
            ", AsyncLLM" if plan.runtime["async_llm"] else "",
            self.load_seconds,
            checkpoint,
        )

    def _sampling_params(self, params: SamplingParams) -> Any:
        assert self._api is not None
        if params.logit_bias:
            raise not_supported(RequestField.LOGIT_BIAS)
        if params.structured is not None:
            raise not_supported(RequestField.STRUCTURED)
        sampled = params.do_sample
        return self._api.SamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature if sampled else 0.0,  # 0: greedy
            top_k=(params.top_k or None) if sampled else None,
            top_p=params.top_p if sampled else None,
            min_p=(params.min_p or None) if sampled else None,
            repetition_penalty=params.repetition_penalty,
            presence_penalty=params.presence_penalty or None,
            frequency_penalty=params.frequency_penalty or None,
            min_tokens=params.min_new_tokens or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            seed=params.seed,
            ignore_eos=params.ignore_eos,
            logprobs=max(1, params.top_n),
            detokenize=False,
        )

    def _token(self, tid: int, logprobs: list[Any], index: int, params: SamplingParams) -> Any:
        token = super()._token(tid, logprobs, index, params)
        if tid in params.stop_token_ids:  # ends the reply as EOS does: its text is not returned
            token.special = True
        return token
