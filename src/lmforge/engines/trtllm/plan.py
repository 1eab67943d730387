"""One TensorRT-LLM build plan from a model folder's configuration.

Every option that changes the compiled engine is collected here, checked, and turned into
TensorRT-LLM's build and quantization settings: shapes (``max_input_len``, ``max_seq_len``,
``max_batch_size``, ``max_num_tokens``, beam width), ``dtype``, quantization (``smoothquant`` with
alpha and per-token/per-channel scaling, ``awq``, ``fp8``, ``int8_wo``/``int4_wo``, plus the KV-cache
dtype), tensor/pipeline parallelism, paged KV cache, context FMHA and LoRA. Invalid combinations are
refused with one message listing every problem, before anything is downloaded or compiled.

The plan itself (:class:`BuildPlan`, its cache key and rendering) is in :mod:`.buildplan`, the
TensorRT-LLM-only options in :mod:`.options`; both are importable from here. The plan's
:meth:`BuildPlan.cache_key` hashes all of it together with the model id and revision, the
GPU architecture and the TensorRT-LLM version, so a changed option never reuses a stale engine (LMI
keys its cache on model + TP + PP only).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.trtllm.buildplan import PLAN_FILE, BuildPlan, BuildPlanError, read_plan
from lmforge.engines.trtllm.options import TrtllmOptions, parse_options

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

__all__ = [
    "FP8_MIN_SM",
    "KV_CACHE_ALGOS",
    "PINNED_VERSION",
    "PLAN_FILE",
    "QUANT_ALGOS",
    "BuildPlan",
    "BuildPlanError",
    "TrtllmOptions",
    "fingerprint",
    "gpu_arch",
    "installed_version",
    "make_plan",
    "parse_options",
    "read_plan",
]

PINNED_VERSION = "1.2.1"

#: option.quantize -> (TensorRT-LLM QuantAlgo, needs calibration data)
QUANT_ALGOS: dict[str, tuple[str, bool]] = {
    "smoothquant": ("W8A8_SQ_PER_TENSOR_PLUGIN", True),  # refined by the per-token/per-channel options
    "awq": ("W4A16_AWQ", True),
    "fp8": ("FP8", True),
    "int8_wo": ("W8A16", False),
    "int4_wo": ("W4A16", False),
}
KV_CACHE_ALGOS = {"auto": None, "fp8": "FP8", "int8": "INT8"}
_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
FP8_MIN_SM = 89  # Ada / Hopper and newer


def _model_config(config: ServingConfig) -> dict[str, Any]:
    folder = config.model_path
    if folder is None or not (folder / "config.json").is_file():
        return {}
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    pretrained = data.get("pretrained_config")
    if isinstance(pretrained, dict):  # a compiled engine folder: the model's shape is recorded here
        arch = pretrained.get("architecture")
        return {
            **pretrained,
            "architectures": [arch] if arch else None,
            "torch_dtype": pretrained.get("dtype"),
        }
    return data


def _dtype(config: ServingConfig, hf: Mapping[str, Any]) -> str:
    if config.dtype != "auto":
        return _DTYPES[config.dtype]
    declared = str(hf.get("torch_dtype") or hf.get("dtype") or "float16")
    return "float16" if declared == "float32" else declared  # TensorRT-LLM builds fp32 checkpoints in fp16


def gpu_arch() -> str | None:
    """``sm<major><minor>`` of GPU 0 when torch sees one (engines are not portable across arches)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm{major}{minor}"


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorrt-llm")
    except PackageNotFoundError:
        return None


def make_plan(
    config: ServingConfig,
    extra_options: Mapping[str, str],
    *,
    arch: str | None = None,
    trtllm_version: str | None = None,
    device_count: int | None = None,
) -> BuildPlan:
    """The build plan for ``config``; :class:`BuildPlanError` lists every problem at once."""
    opts, problems = parse_options(extra_options)
    hf = _model_config(config)
    model_id = str(config.model_id or config.model_dir or "")
    if not model_id:
        problems.append("no model: set option.model_id or put the weights in the model folder")

    tp = _tensor_parallel(config.tensor_parallel_degree, device_count)
    pp = config.pipeline_parallel_degree
    heads = hf.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        problems.append(
            f"option.tensor_parallel_degree={tp} does not divide the model's {heads} attention heads"
        )
    layers = hf.get("num_hidden_layers")
    if isinstance(layers, int) and pp > layers:
        problems.append(f"option.pipeline_parallel_degree={pp} is more than the model's {layers} layers")

    max_position = hf.get("max_position_embeddings")
    if config.max_model_len is not None:
        max_seq = config.max_model_len
    elif config.max_output_len is not None:
        max_seq = (config.max_input_len or 1024) + config.max_output_len
    else:
        max_seq = int(max_position) if isinstance(max_position, int) else 2048
    # LMI's default prompt limit is 1024 tokens; never more than half of a shorter sequence
    max_input = config.max_input_len or min(1024, max(1, max_seq // 2))
    if max_input >= max_seq:
        problems.append(
            f"option.max_input_len={max_input} leaves no room to generate within max_seq_len={max_seq} "
            "(raise option.max_model_len or lower option.max_input_len)"
        )
    if isinstance(max_position, int) and max_seq > max_position:
        problems.append(
            f"max_seq_len={max_seq} is more than the model's max_position_embeddings={max_position} "
            "(TensorRT-LLM builds use the checkpoint's own RoPE settings: extend them in its config.json)"
        )
    if opts.max_num_tokens < max_input and not opts.use_paged_context_fmha:
        problems.append(
            f"option.max_num_tokens={opts.max_num_tokens} is less than option.max_input_len={max_input}: a "
            "long prompt would not fit one step (enable option.use_paged_context_fmha for chunked context)"
        )

    dtype = _dtype(config, hf)
    quant_algo: str | None = None
    sq_alpha: float | None = None
    awq_block: int | None = None
    calib: int | None = None
    method = (config.quantize or "").lower() or None
    if method is not None:
        if method == "nvfp4":
            problems.append(
                "option.quantize=nvfp4 needs TensorRT-LLM >= 1.3 (ModelOpt NVFP4 checkpoints); this "
                "TensorRT-LLM builds TensorRT engines"
            )
        elif method not in QUANT_ALGOS:
            close = difflib.get_close_matches(method, list(QUANT_ALGOS), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(
                f"option.quantize={method!r} is not one of {', '.join(QUANT_ALGOS)} for TensorRT-LLM{hint}"
            )
        else:
            quant_algo, needs_calibration = QUANT_ALGOS[method]
            calib = opts.calib_size if needs_calibration else None
            if dtype == "float32":
                problems.append(f"option.quantize={method} needs option.dtype fp16 or bf16, not fp32")
    if method == "smoothquant":
        if not 0.0 <= opts.smoothquant_alpha <= 1.0:
            problems.append(f"option.smoothquant_alpha={opts.smoothquant_alpha} must be between 0 and 1")
        sq_alpha = opts.smoothquant_alpha
        quant_algo = _smoothquant_algo(opts.smoothquant_per_channel, opts.smoothquant_per_token)
    elif opts.smoothquant_per_token or opts.smoothquant_per_channel:
        problems.append(
            "option.smoothquant_per_token / smoothquant_per_channel need option.quantize=smoothquant"
        )
    if method == "awq":
        if opts.awq_block_size not in (64, 128):
            problems.append(f"option.awq_block_size={opts.awq_block_size} must be 64 or 128")
        awq_block = opts.awq_block_size
    if opts.kv_cache_dtype not in KV_CACHE_ALGOS:
        problems.append(
            f"option.kv_cache_dtype={opts.kv_cache_dtype!r} must be one of {', '.join(KV_CACHE_ALGOS)}"
        )
    kv_algo = KV_CACHE_ALGOS.get(opts.kv_cache_dtype)
    fp8_used = method == "fp8" or kv_algo == "FP8"
    if fp8_used and arch is not None and int(arch.removeprefix("sm")) < FP8_MIN_SM:
        problems.append(f"FP8 needs a GPU of sm{FP8_MIN_SM} or newer (Ada, Hopper); this one is {arch}")
    if config.enable_lora and method in ("smoothquant", "fp8"):
        problems.append(
            f"LoRA adapters cannot be combined with option.quantize={method} in TensorRT-LLM builds"
        )
    if opts.max_beam_width > 1 and config.enable_lora:
        problems.append("beam search (option.max_beam_width > 1) cannot be combined with LoRA")
    if opts.enable_kv_cache_reuse and not opts.use_paged_context_fmha:
        problems.append("option.enable_kv_cache_reuse needs option.use_paged_context_fmha=true")
    if not 0.0 < opts.kv_cache_free_gpu_mem_fraction <= 1.0:
        problems.append("option.kv_cache_free_gpu_mem_fraction must be in (0, 1]")
    if problems:
        raise BuildPlanError("invalid TensorRT-LLM build plan:\n  " + "\n  ".join(problems))
    architectures = hf.get("architectures") or ["unknown"]
    return BuildPlan(
        model_id=model_id,
        revision=config.revision,
        model_fingerprint=fingerprint(config.model_path),
        trust_remote_code=config.trust_remote_code,
        architecture=str(architectures[0]),
        dtype=dtype,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        max_batch_size=config.max_rolling_batch_size,
        max_input_len=max_input,
        max_seq_len=max_seq,
        max_num_tokens=opts.max_num_tokens,
        max_beam_width=opts.max_beam_width,
        quant_algo=quant_algo,
        kv_cache_quant_algo=kv_algo,
        smoothquant_alpha=sq_alpha,
        awq_block_size=awq_block,
        calib_size=calib,
        paged_kv_cache=True,
        context_fmha=opts.enable_context_fmha,
        paged_context_fmha=opts.use_paged_context_fmha,
        use_custom_all_reduce=opts.use_custom_all_reduce,
        lora=config.enable_lora,
        max_lora_rank=config.max_lora_rank if config.enable_lora else None,
        max_loras=config.max_loras if config.enable_lora else None,
        gpu_arch=arch,
        trtllm_version=trtllm_version or installed_version() or PINNED_VERSION,
        runtime={
            "kv_cache_free_gpu_mem_fraction": opts.kv_cache_free_gpu_mem_fraction,
            "enable_kv_cache_reuse": opts.enable_kv_cache_reuse,
        },
    )


def fingerprint(folder: Path | None) -> str | None:
    """config.json's bytes plus every weight file's name, size and mtime, hashed; None without a folder."""
    if folder is None or not folder.is_dir():
        return None
    digest = hashlib.sha256()
    config = folder / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for path in sorted(folder.glob("*")):
        if path.suffix in (".safetensors", ".bin", ".pt", ".engine") or path.name.endswith(".index.json"):
            info = path.stat()
            digest.update(f"{path.name}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _smoothquant_algo(per_channel: bool, per_token: bool) -> str:
    """TensorRT-LLM's QuantAlgo name for SmoothQuant with these scaling granularities."""
    if not per_channel and not per_token:
        return "W8A8_SQ_PER_TENSOR_PLUGIN"
    channel = "PER_CHANNEL" if per_channel else "PER_TENSOR"
    token = "PER_TOKEN" if per_token else "PER_TENSOR"
    return f"W8A8_SQ_{channel}_{token}_PLUGIN"


def _tensor_parallel(value: int | str, device_count: int | None) -> int:
    if value != "max":
        return int(value)
    return device_count if device_count is not None else _device_count()  # every visible GPU


def _device_count() -> int:
    try:
        import torch
    except ImportError:
        return 1
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
