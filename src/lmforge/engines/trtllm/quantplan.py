"""The TensorRT-LLM >= 1.3 plan: what ModelOpt quantizes (if anything) and how the PyTorch backend runs.

On TensorRT-LLM 1.3 and later nothing is compiled: ``tensorrt_llm.LLM`` loads a Hugging Face folder and
captures CUDA graphs at start. The one ahead-of-time step is quantization with NVIDIA ModelOpt
(``option.quantize``: fp8, nvfp4, awq, smoothquant, int8_wo; ``option.kv_cache_dtype``: fp8, nvfp4) into
a Hugging Face-style checkpoint with ``hf_quant_config.json``, which ``LLM(model=...)`` loads directly.

:class:`QuantPlan` is that plan as data. Its :meth:`QuantPlan.cache_key` covers what changes the
checkpoint (model and revision, ModelOpt recipe, KV-cache format, calibration set and size, TensorRT-LLM
version); tensor parallelism, the GPU and the runtime settings are recorded but do not change it (the
checkpoint is sharded when it is loaded).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.trtllm.buildplan import BuildPlanError
from lmforge.engines.trtllm.pt_options import parse_pt_options

if TYPE_CHECKING:
    from collections.abc import Mapping

    from lmforge.config import ServingConfig

QUANT_PLAN_FILE = "lmforge-trtllm-quant-plan.json"

#: option.quantize -> (ModelOpt preset in modelopt.torch.quantization, quant_algo the checkpoint records,
#: calibrates, the oldest GPU that runs it)
QUANT_METHODS: dict[str, tuple[str, str, bool, int | None]] = {
    "fp8": ("FP8_DEFAULT_CFG", "FP8", True, 89),
    "nvfp4": ("NVFP4_DEFAULT_CFG", "NVFP4", True, 100),
    "awq": ("INT4_AWQ_CFG", "W4A16_AWQ", True, None),
    "smoothquant": ("INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL", True, None),
    "int8_wo": ("INT8_WEIGHT_ONLY_CFG", "W8A16", False, None),
}
#: option.kv_cache_dtype -> (ModelOpt KV preset, kv_cache_quant_algo, the oldest GPU)
KV_METHODS: dict[str, tuple[str, str, int]] = {
    "fp8": ("FP8_KV_CFG", "FP8", 89),
    "nvfp4": ("NVFP4_KV_CFG", "NVFP4", 100),
}
_DTYPES = {"auto": "auto", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_RECORDED_ONLY = ("tensor_parallel", "pipeline_parallel", "gpu_arch", "runtime")


@dataclass(frozen=True)
class QuantPlan:
    model_id: str
    revision: str | None
    model_fingerprint: str | None
    trust_remote_code: bool
    architecture: str
    dtype: str
    quantize: str | None
    modelopt_config: str | None
    quant_algo: str | None
    kv_cache_dtype: str
    kv_modelopt_config: str | None
    kv_cache_quant_algo: str | None
    calib_size: int | None
    calib_seq_len: int | None
    calib_dataset: str | None
    calib_sha256: str | None
    trtllm_version: str
    tensor_parallel: int
    pipeline_parallel: int
    gpu_arch: str | None
    runtime: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def quantizes(self) -> bool:
        """Whether there is anything to do ahead of time (weights or KV cache quantized)."""
        return self.quant_algo is not None or self.kv_cache_quant_algo is not None

    def build_fields(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in _RECORDED_ONLY:
            out.pop(name)
        return out

    def cache_key(self) -> str:
        canonical = json.dumps(self.build_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "cache_key": self.cache_key()}

    def render(self) -> str:
        runtime = self.runtime
        graphs = (
            f"on, batch sizes up to {runtime['cuda_graph_max_batch_size']}"
            + (", padded" if runtime["cuda_graph_padding"] else "")
            if runtime["cuda_graph"]
            else "off"
        )
        if self.quantizes:
            weights = (
                f"{self.quant_algo} (ModelOpt {self.modelopt_config})" if self.quant_algo else "unchanged"
            )
            calib = f"{self.calib_size} prompts x {self.calib_seq_len} tokens from {self.calib_dataset}"
        else:
            weights = "none: nothing to do ahead of time, LLM(model=...) loads the folder as it is"
            calib = "none"
        kv = (
            f"{self.kv_cache_quant_algo} (ModelOpt {self.kv_modelopt_config})"
            if self.kv_cache_quant_algo
            else "auto"
        )
        rows = [
            ("model", self.model_id + (f" @ {self.revision}" if self.revision else "")),
            ("architecture", self.architecture),
            ("dtype", self.dtype),
            ("quantization", weights),
            ("KV cache", kv),
            ("calibration", calib),
            ("parallel", f"tensor {self.tensor_parallel} x pipeline {self.pipeline_parallel} (at load)"),
            (
                "start-up",
                f"CUDA graphs {graphs}; torch.compile {'on' if runtime['torch_compile'] else 'off'}",
            ),
            ("GPU arch", self.gpu_arch or "the serving machine's"),
            (
                "TensorRT-LLM",
                f"{self.trtllm_version} (PyTorch backend{', AsyncLLM' if runtime['async_llm'] else ''})",
            ),
            ("cache key", self.cache_key()),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows) + "\n"


def checkpoint_quantization(folder: Path) -> tuple[str | None, str | None] | None:
    """(quant_algo, kv_cache_quant_algo) of a ModelOpt checkpoint (``hf_quant_config.json``), else None."""
    try:
        data = json.loads((folder / "hf_quant_config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = data.get("quantization") if isinstance(data, dict) else None
    if not isinstance(quant, dict):
        return None
    return quant.get("quant_algo"), quant.get("kv_cache_quant_algo")


def _min_sm(problems: list[str], what: str, need: int | None, arch: str | None) -> None:
    if need is not None and arch is not None and int(arch.removeprefix("sm")) < need:
        problems.append(f"{what} needs a GPU of sm{need} or newer; this one is {arch}")


def make_quant_plan(
    config: ServingConfig,
    extra_options: Mapping[str, str],
    *,
    arch: str | None = None,
    trtllm_version: str,
    device_count: int | None = None,
) -> QuantPlan:
    """The >= 1.3 plan for ``config``; :class:`BuildPlanError` lists every problem at once."""
    from lmforge.engines.trtllm.plan import _model_config, _tensor_parallel, fingerprint
    from lmforge.quantize import calibration

    opts, problems = parse_pt_options(extra_options)
    hf = _model_config(config)
    model_id = str(config.model_id or config.model_dir or "")
    if not model_id:
        problems.append("no model: set option.model_id or put the weights in the model folder")
    tp = _tensor_parallel(config.tensor_parallel_degree, device_count)
    heads = hf.get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        problems.append(
            f"option.tensor_parallel_degree={tp} does not divide the model's {heads} attention heads"
        )
    method = (config.quantize or "").lower() or None
    preset = algo = None
    calibrates = False
    if method is not None and method not in QUANT_METHODS:
        if method == "int4_wo":
            problems.append(
                "option.quantize=int4_wo has no ModelOpt preset on TensorRT-LLM >= 1.3; use awq (INT4 "
                "weights with AWQ scales)"
            )
        else:
            close = difflib.get_close_matches(method, list(QUANT_METHODS), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(
                f"option.quantize={method!r} is not one of {', '.join(QUANT_METHODS)} for TensorRT-LLM "
                f">= 1.3{hint}"
            )
    elif method is not None:
        preset, algo, calibrates, need = QUANT_METHODS[method]
        _min_sm(problems, f"option.quantize={method}", need, arch)
    kv_preset = kv_algo = None
    if opts.kv_cache_dtype in KV_METHODS:
        kv_preset, kv_algo, need_kv = KV_METHODS[opts.kv_cache_dtype]
        calibrates = True
        _min_sm(problems, f"option.kv_cache_dtype={opts.kv_cache_dtype}", need_kv, arch)
    elif opts.kv_cache_dtype != "auto":
        problems.append(
            f"option.kv_cache_dtype={opts.kv_cache_dtype!r} must be one of auto, {', '.join(KV_METHODS)} on "
            "TensorRT-LLM >= 1.3 (ModelOpt's KV-cache presets)"
        )
    calib_label = calib_sha = None
    if calibrates:
        try:
            calib_label, count, calib_sha = calibration.fingerprint(opts.calib_dataset)
            calib_label = f"{calib_label}, {count} prompts"
        except calibration.CalibrationError as exc:
            problems.append(str(exc))
    elif opts.calib_dataset:
        problems.append(f"option.calib_dataset is set but nothing calibrates (option.quantize={method})")
    if not 0.0 < opts.kv_cache_free_gpu_mem_fraction <= 1.0:
        problems.append("option.kv_cache_free_gpu_mem_fraction must be in (0, 1]")
    graph_batch = opts.cuda_graph_max_batch_size or config.max_rolling_batch_size
    if graph_batch > config.max_rolling_batch_size:
        problems.append(
            f"option.cuda_graph_max_batch_size={graph_batch} is more than option.max_rolling_batch_size="
            f"{config.max_rolling_batch_size}: no batch is ever that large"
        )
    if problems:
        raise BuildPlanError("invalid TensorRT-LLM plan:\n  " + "\n  ".join(problems))
    if config.max_model_len is not None:
        max_seq: int | None = config.max_model_len
    elif config.max_output_len is not None:
        max_seq = (config.max_input_len or 1024) + config.max_output_len
    else:
        max_seq = None  # the model's own (TensorRT-LLM reads max_position_embeddings)
    return QuantPlan(
        model_id=model_id,
        revision=config.revision,
        model_fingerprint=fingerprint(config.model_path),
        trust_remote_code=config.trust_remote_code,
        architecture=str((hf.get("architectures") or ["unknown"])[0]),
        dtype=_DTYPES[config.dtype],
        quantize=method,
        modelopt_config=preset,
        quant_algo=algo,
        kv_cache_dtype=opts.kv_cache_dtype,
        kv_modelopt_config=kv_preset,
        kv_cache_quant_algo=kv_algo,
        calib_size=opts.calib_size if calibrates else None,
        calib_seq_len=opts.calib_seq_len if calibrates else None,
        calib_dataset=calib_label,
        calib_sha256=calib_sha,
        trtllm_version=trtllm_version,
        tensor_parallel=tp,
        pipeline_parallel=config.pipeline_parallel_degree,
        gpu_arch=arch,
        runtime={
            "max_batch_size": config.max_rolling_batch_size,
            "max_num_tokens": opts.max_num_tokens,
            "max_seq_len": max_seq,
            "max_input_len": config.max_input_len,
            "kv_cache_free_gpu_mem_fraction": opts.kv_cache_free_gpu_mem_fraction,
            "enable_kv_cache_reuse": opts.enable_kv_cache_reuse,
            "cuda_graph": opts.cuda_graph,
            "cuda_graph_max_batch_size": graph_batch,
            "cuda_graph_padding": opts.cuda_graph_padding,
            "torch_compile": opts.torch_compile,
            "async_llm": opts.trtllm_async_llm,
            "calib_source": opts.calib_dataset,
        },
    )
