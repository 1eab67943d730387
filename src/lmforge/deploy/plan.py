"""``lmforge plan``: will this model and configuration fit this SageMaker instance, and how long to wait.

The plan reads the model's Hugging Face ``config.json`` (never the tensors) and sizes, per GPU:

* **weights**: the exact sum of tensor sizes from the ``*.safetensors`` headers when the weight files
  are local (re-priced for ``option.dtype`` / an on-the-fly ``option.quantize``), else the parameter
  count derived from the architecture x bytes per parameter; split over tensor x pipeline parallel.
* **KV cache**: ``2 x layers x kv_heads x head_dim x bytes`` per token, with the KV heads split over
  the tensor-parallel ranks (at least one per GPU: fewer heads than ranks are replicated) and the
  layers over the pipeline stages, for ``max_rolling_batch_size x max_model_len`` tokens.
* **runtime overhead**: :data:`OVERHEAD_FIXED_BYTES` (CUDA context, NCCL buffers, CUDA graphs) plus
  :data:`OVERHEAD_WEIGHT_SHARE` of the GPU's weights (activations and temporary buffers).

The sum is compared with ``memory per GPU x option.gpu_memory_utilization``. CPU instances are planned
against host memory (:data:`CPU_HOST_USABLE_FRACTION` of it), as one pool.

It also suggests SageMaker's two start-up timeouts from assumed transfer rates (constants below).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import (
    FP8_GPUS,
    INSTANCES,
    NO_BF16_GPUS,
    UNSUPPORTED_ACCELERATORS,
    InstanceType,
    get_instance,
)

GIB = 1024**3
MIB = 1024**2

#: Fixed per-GPU runtime cost: CUDA context (~0.5 GiB), NCCL/communication buffers, CUDA graphs
#: and the sampler's buffers. 1.5 GiB is what vLLM-style engines typically use beyond weights + KV.
OVERHEAD_FIXED_BYTES = int(1.5 * GIB)
#: Activations and temporary buffers of the forward pass, as a share of the GPU's weights.
OVERHEAD_WEIGHT_SHARE = 0.05
#: Share of a CPU instance's host memory a model server may use (the rest: OS, container, page cache).
CPU_HOST_USABLE_FRACTION = 0.85
#: Extra bits per quantized weight for the group scales and zero points (group size 128: one fp16
#: scale + one packed 4-bit zero per 128 weights is ~0.16 bits; rounded up).
QUANT_SCALE_OVERHEAD_BITS = 0.25

#: Assumed S3 -> instance download throughput, bytes/s. Conservative: aws-cli/boto3 class speed
#: (s5cmd reaches GB/s, a single boto3 stream often much less).
DOWNLOAD_BYTES_PER_S = 150e6
#: Assumed weight load throughput from local disk into GPU memory, bytes/s (plain safetensors loaders
#: measure ~1 GB/s; halved for EBS-backed volumes and sharded loads).
LOAD_BYTES_PER_S = 500e6
#: Fixed start-up cost per backend: container start, Python imports, engine processes, KV-cache
#: profiling. vLLM captures CUDA graphs unless enforce_eager (its eager start on 2 CPU cores measured
#: 40-70 s); ``auto`` is costed as vLLM, which it picks when installed.
STARTUP_FIXED_S = 30.0
ENGINE_START_S = {"lmi-dist": 30.0, "vllm": 90.0, "auto": 90.0, "trtllm": 60.0}
VLLM_EAGER_START_S = 60.0
#: TensorRT-LLM just-in-time engine build: a base cost plus a cost per billion parameters; anchored on
#: LMI's note that a 70B model takes about 7 minutes or more (120 + 4 x 70 = 400 s).
TRT_COMPILE_BASE_S = 120.0
TRT_COMPILE_S_PER_BILLION_PARAMS = 4.0
#: Margin applied to the estimated times before rounding.
TIMEOUT_MARGIN = 1.25
#: SageMaker's accepted range for ContainerStartupHealthCheckTimeoutInSeconds and
#: ModelDataDownloadTimeoutInSeconds.
TIMEOUT_MIN_S = 60
TIMEOUT_MAX_S = 3600
#: max_model_len when neither the configuration nor config.json gives one.
DEFAULT_MAX_MODEL_LEN = 4096

#: Bytes per element of a floating-point compute dtype.
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4}
_HF_DTYPES: dict[str, str] = {
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
}
#: option.quantize -> bits per quantized (linear-layer) weight.
RUNTIME_QUANT_BITS: dict[str, float] = {
    "awq": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "awq_marlin": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "gptq": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "gptq_marlin": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "int4_wo": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "bitsandbytes": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "bitsandbytes4": 4 + QUANT_SCALE_OVERHEAD_BITS,
    "int8_wo": 8,
    "smoothquant": 8,
    "fp8": 8,
    "bitsandbytes8": 8,
}
# Feed-forward blocks with two matrices (up, down) instead of three (gate, up, down).
_NON_GATED_MODEL_TYPES = frozenset(
    {
        "gpt2",
        "gpt_neox",
        "gptj",
        "opt",
        "bloom",
        "falcon",
        "gpt_bigcode",
        "starcoder2",
        "phi",
        "mpt",
        "codegen",
    }
)
_FLOAT_DTYPES: dict[str, int] = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_UNQUANTIZED_NAME_PARTS = ("embed", "lm_head", "wte", "wpe", "norm")
_MAX_HEADER_BYTES = 100 * MIB
_GPU_BACKENDS = frozenset({"vllm", "trtllm"})


class PlanError(Exception):
    """The plan cannot be made (no or unreadable ``config.json``); the message says what to do."""


# --- the model's shape ---------------------------------------------------------------------------


def _first(data: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        value = data.get(key)
        if value is not None:
            return value
    return None


def _int(data: dict[str, Any], *keys: str) -> int | None:
    value = _first(data, *keys)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from ``config.json``."""

    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int
    """Routed experts per MoE layer; 0 for a dense model."""
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    dense_layers: int
    """Leading layers with a dense feed-forward block in an MoE model (DeepSeek's first_k_dense_replace)."""
    max_position_embeddings: int | None
    checkpoint_dtype: str | None
    """fp16/bf16/fp32 from torch_dtype/dtype, None when absent."""
    quant_method: str | None
    """The checkpoint's own quantization (quantization_config), None when unquantized."""
    quant_bits: float | None
    """Bits per quantized weight of the checkpoint's quantization, scales included."""
    latent_attention: bool
    """DeepSeek-style multi-head latent attention (the KV estimate is then approximate)."""

    @classmethod
    def from_config(cls, data: dict[str, Any]) -> ModelShape:
        """Read a Hugging Face ``config.json`` dict; raises PlanError when a needed key is missing."""
        pretrained = data.get("pretrained_config")
        if isinstance(pretrained, dict):  # a compiled TensorRT-LLM engine folder records the shape here
            data = {
                **pretrained,
                "torch_dtype": pretrained.get("dtype"),
                "architectures": [pretrained.get("architecture")],
            }
        outer = data
        text = data.get("text_config")
        if isinstance(text, dict) and _first(data, "hidden_size", "n_embd", "d_model") is None:
            data = {**{k: v for k, v in outer.items() if k != "text_config"}, **text}
        hidden = _int(data, "hidden_size", "n_embd", "d_model")
        layers = _int(data, "num_hidden_layers", "n_layer", "num_layers")
        heads = _int(data, "num_attention_heads", "n_head", "num_heads")
        vocab = _int(data, "vocab_size")
        missing = [
            name
            for name, value in (
                ("hidden_size", hidden),
                ("num_hidden_layers", layers),
                ("num_attention_heads", heads),
                ("vocab_size", vocab),
            )
            if not value
        ]
        if missing or hidden is None or layers is None or heads is None or vocab is None:
            raise PlanError(f"config.json lacks {', '.join(missing)}: is it a transformer model's config?")
        kv_heads = _int(data, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
        if kv_heads is None:
            kv_heads = 1 if data.get("multi_query") is True else heads
        head_dim = _int(data, "head_dim") or hidden // heads
        intermediate = _int(data, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden
        experts = _int(data, "num_local_experts", "num_experts", "n_routed_experts") or 0
        moe_inter = _int(data, "moe_intermediate_size") or intermediate
        shared = _int(data, "shared_expert_intermediate_size") or 0
        n_shared = _int(data, "n_shared_experts") or 0
        if not shared and n_shared:
            shared = n_shared * moe_inter
        dense_layers = min(_int(data, "first_k_dense_replace") or 0, layers) if experts else 0
        architectures = outer.get("architectures")
        arch = str(architectures[0]) if isinstance(architectures, list) and architectures else "unknown"
        raw_dtype = _first(data, "torch_dtype", "dtype")
        checkpoint_dtype = _HF_DTYPES.get(str(raw_dtype).lower()) if raw_dtype is not None else None
        method, bits = _checkpoint_quantization(_first(data, "quantization_config"))
        return cls(
            architecture=arch,
            model_type=str(data.get("model_type", "")),
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=vocab,
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            num_experts=experts,
            moe_intermediate_size=moe_inter,
            shared_expert_intermediate_size=shared,
            dense_layers=dense_layers,
            max_position_embeddings=_int(data, "max_position_embeddings", "n_positions", "seq_length"),
            checkpoint_dtype=checkpoint_dtype,
            quant_method=method,
            quant_bits=bits,
            latent_attention="kv_lora_rank" in data,
        )

    @property
    def gated_mlp(self) -> bool:
        """True when each feed-forward block has three matrices (SwiGLU-style)."""
        return self.model_type not in _NON_GATED_MODEL_TYPES

    def linear_parameters(self) -> int:
        """Parameters of the attention and feed-forward matrices (the ones quantization shrinks)."""
        h = self.hidden_size
        attention = 2 * h * self.num_heads * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim
        matrices = 3 if self.gated_mlp else 2
        dense_mlp = matrices * h * self.intermediate_size
        if not self.num_experts:
            return self.num_layers * (attention + dense_mlp)
        moe_mlp = (
            self.num_experts * matrices * h * self.moe_intermediate_size
            + h * self.num_experts  # router
            + 3 * h * self.shared_expert_intermediate_size
        )
        moe_layers = self.num_layers - self.dense_layers
        return self.num_layers * attention + self.dense_layers * dense_mlp + moe_layers * moe_mlp

    def other_parameters(self) -> int:
        """Embeddings, output head and norms (kept in the compute dtype by quantization)."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return embeddings + norms

    def parameters(self) -> int:
        """All parameters, from the architecture."""
        return self.linear_parameters() + self.other_parameters()


def _checkpoint_quantization(qc: Any) -> tuple[str | None, float | None]:
    if not isinstance(qc, dict):
        return None, None
    method = str(qc.get("quant_method", "unknown")).lower()
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = qc.get("bits", qc.get("w_bit", 4))
        return method, float(bits if isinstance(bits, int | float) else 4) + QUANT_SCALE_OVERHEAD_BITS
    if method == "fp8":
        return method, 8.0
    if method == "bitsandbytes":
        if qc.get("load_in_8bit"):
            return method, 8.0
        return method, 4 + QUANT_SCALE_OVERHEAD_BITS
    if method == "mxfp4":
        return method, 4 + QUANT_SCALE_OVERHEAD_BITS
    return method, None


# --- safetensors headers -------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, from its header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def read_safetensors_header(path: Path) -> list[TensorInfo]:
    """The tensors listed in a ``.safetensors`` file's header; the tensor data is not read.

    The format: an 8-byte little-endian header length, then that many bytes of JSON mapping each
    tensor name to its dtype, shape and ``data_offsets`` (begin, end) in the data section.
    """
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise PlanError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_HEADER_BYTES:
                raise PlanError(f"{path}: not a safetensors file (header of {length} bytes)")
            header = json.loads(f.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: unreadable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise PlanError(f"{path}: the safetensors header is not a JSON object")
    out: list[TensorInfo] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            out.append(
                TensorInfo(name, str(info["dtype"]), tuple(int(d) for d in info["shape"]), end - begin)
            )
        except (KeyError, TypeError, ValueError):
            raise PlanError(f"{path}: malformed safetensors header entry {name!r}") from None
    return out


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a model folder: those of the index when there is one, else every
    ``*.safetensors`` file except Mistral's duplicate ``consolidated*`` copies."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            weight_map = {}
        if isinstance(weight_map, dict) and weight_map:
            names = sorted({str(v) for v in weight_map.values()})
            return [folder / n for n in names if (folder / n).is_file()]
    files = sorted(folder.glob("*.safetensors"))
    return [f for f in files if not f.name.startswith("consolidated")] or files


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeployPlan:
    """The memory and start-up plan of one model on one instance type (bytes unless named otherwise)."""

    model_dir: str
    model_config_path: str
    instance_type: str
    instance: str
    """The instance described in words."""
    accelerator: str
    gpu_count: int
    memory_per_gpu_gib: float
    on_host_memory: bool
    """True for CPU instances: one pool of host memory instead of GPUs."""
    rolling_batch: str
    dtype: str
    quantization: str | None
    tensor_parallel_degree: int
    pipeline_parallel_degree: int
    max_rolling_batch_size: int
    max_model_len: int
    max_model_len_source: str
    memory_utilization: float
    architecture: str
    parameters: int
    weights_bytes: int
    weights_source: str
    download_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_tokens: int
    weights_per_gpu_bytes: int
    kv_per_gpu_bytes: int
    overhead_per_gpu_bytes: int
    total_per_gpu_bytes: int
    available_per_gpu_bytes: int
    max_rolling_batch_size_that_fits: int
    max_model_len_that_fits: int
    download_s: float
    load_s: float
    start_s: float
    compile_s: float
    health_check_timeout_s: int
    """Suggested ContainerStartupHealthCheckTimeoutInSeconds."""
    download_timeout_s: int
    """Suggested ModelDataDownloadTimeoutInSeconds."""
    fits: bool
    problems: list[str]
    warnings: list[str]
    suggestions: list[str]
    suggested_instance: str | None

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (for ``lmforge plan --json``)."""
        return asdict(self)

    def render(self) -> str:
        """A human-readable, aligned report."""
        unit = "host" if self.on_host_memory else "per GPU"
        quant = f", {self.quantization}" if self.quantization else ""
        lines = [
            f"Plan for {self.model_dir} on {self.instance_type} ({self.instance})",
            f"  model        {self.architecture}, {_count(self.parameters)} parameters, {self.dtype}{quant}",
            f"  weights      {_count(self.weights_bytes, 'B')} ({self.weights_source})",
            f"  backend      rolling_batch={self.rolling_batch}, tensor parallel "
            f"{self.tensor_parallel_degree} x pipeline parallel {self.pipeline_parallel_degree}",
            f"  batch        {self.max_rolling_batch_size} sequences x {self.max_model_len} tokens "
            f"(max_model_len from {self.max_model_len_source})",
            "",
        ]
        share = f"{self.memory_per_gpu_gib:g} GiB x {self.memory_utilization:.2f}"
        rows = [
            ("weights", self.weights_per_gpu_bytes),
            (f"KV cache ({self.kv_tokens} tokens)", self.kv_per_gpu_bytes),
            ("runtime overhead", self.overhead_per_gpu_bytes),
            ("total", self.total_per_gpu_bytes),
            (f"available ({share})", self.available_per_gpu_bytes),
        ]
        width = max(len(label) for label, _ in rows) + 2
        lines.append(f"  {'host memory' if self.on_host_memory else 'memory per GPU':<{width}}{'GiB':>9}")
        lines.extend(f"  {label:<{width}}{value / GIB:>9.2f}" for label, value in rows)
        lines.append("")
        if self.fits:
            lines.append(
                f"  verdict: FITS ({(self.available_per_gpu_bytes - self.total_per_gpu_bytes) / GIB:.2f} "
                f"GiB {unit} to spare)"
            )
        elif self.total_per_gpu_bytes > self.available_per_gpu_bytes:
            short = (self.total_per_gpu_bytes - self.available_per_gpu_bytes) / GIB
            lines.append(f"  verdict: DOES NOT FIT ({short:.2f} GiB {unit} short)")
        else:
            lines.append("  verdict: NOT DEPLOYABLE (see the problems below)")
        lines.append(
            f"  at max_model_len={self.max_model_len}: max_rolling_batch_size <= "
            f"{self.max_rolling_batch_size_that_fits}; at max_rolling_batch_size="
            f"{self.max_rolling_batch_size}: max_model_len <= {self.max_model_len_that_fits}"
        )
        lines.append("")
        compile_part = f" + TensorRT-LLM build {self.compile_s:.0f} s" if self.compile_s else ""
        lines.append(
            f"  ContainerStartupHealthCheckTimeoutInSeconds = {self.health_check_timeout_s}  "
            f"(download {self.download_s:.0f} s + load {self.load_s:.0f} s + start {self.start_s:.0f} s"
            f"{compile_part}, +{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
        )
        lines.append(
            f"  ModelDataDownloadTimeoutInSeconds           = {self.download_timeout_s}  "
            f"({self.download_bytes / 1e9:.2f} GB at {DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s, "
            f"+{(TIMEOUT_MARGIN - 1) * 100:.0f}%)"
        )
        for title, items in (
            ("problems", self.problems),
            ("warnings", self.warnings),
            ("suggestions", self.suggestions),
        ):
            if items:
                lines.append("")
                lines.append(f"  {title}:")
                lines.extend(f"    - {item}" for item in items)
        return "\n".join(lines)


@dataclass(frozen=True)
class _Memory:
    weights: int
    kv_per_token: int
    kv: int
    overhead: int
    total: int
    available: int
    max_batch: int
    max_len: int

    @property
    def fits(self) -> bool:
        return self.total <= self.available


def _memory(
    shape: ModelShape,
    instance: InstanceType,
    *,
    weights_bytes: int,
    kv_bytes: int,
    tp: int,
    pp: int,
    batch: int,
    max_len: int,
    utilization: float,
    kv_budget: int | None,
) -> _Memory:
    if instance.is_cpu:
        # one host, one memory pool: all ranks' shards and caches together
        weights = weights_bytes
        kv_per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * kv_bytes
        available = int(instance.host_memory_gib * GIB * CPU_HOST_USABLE_FRACTION)
    else:
        weights = math.ceil(weights_bytes / (tp * pp))
        layers = math.ceil(shape.num_layers / pp)
        heads = max(1, math.ceil(shape.num_kv_heads / tp))
        kv_per_token = 2 * layers * heads * shape.head_dim * kv_bytes
        available = int(instance.memory_per_gpu_gib * GIB * utilization)
    kv = kv_budget if kv_budget is not None else kv_per_token * batch * max_len
    overhead = OVERHEAD_FIXED_BYTES + int(OVERHEAD_WEIGHT_SHARE * weights)
    free = available - weights - overhead
    max_batch = max(0, free // (kv_per_token * max_len))
    max_model_len = max(0, free // (kv_per_token * batch))
    return _Memory(
        weights, kv_per_token, kv, overhead, weights + kv + overhead, available, max_batch, max_model_len
    )


def _find_model_config(model_dir: Path, config: ServingConfig, explicit: Path | None) -> Path:
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(explicit)
    if config.model_path is not None:
        candidates.append(config.model_path / "config.json")
    candidates.append(model_dir / "config.json")
    for path in candidates:
        if path.is_file():
            return path
    if explicit is not None:
        raise PlanError(f"--model-config {explicit}: no such file")
    where = f"option.model_id={config.model_id}" if config.model_id else str(model_dir)
    raise PlanError(
        f"no config.json found for {where}: the weights are not local, so pass the model's Hugging Face "
        "config.json with --model-config PATH"
    )


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object")
    return data


def _compute_dtype(config: ServingConfig, shape: ModelShape, instance: InstanceType) -> str:
    if config.dtype != "auto":
        return config.dtype
    dtype = shape.checkpoint_dtype or "fp16"
    # GPU backends (vLLM's rule) run fp32 checkpoints in fp16 under dtype=auto
    if dtype == "fp32" and not instance.is_cpu:
        return "fp16"
    return dtype


def _is_unquantized_name(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in _UNQUANTIZED_NAME_PARTS)


def _weights_from_tensors(tensors: list[TensorInfo], act_bytes: int, runtime_bits: float | None) -> int:
    total = 0.0
    for t in tensors:
        if t.dtype in _FLOAT_DTYPES:
            if runtime_bits is not None and len(t.shape) == 2 and not _is_unquantized_name(t.name):
                total += t.numel * runtime_bits / 8
            else:
                total += t.numel * act_bytes
        else:
            total += t.nbytes
    return math.ceil(total)


def _round_timeout(seconds: float) -> int:
    rounded = math.ceil(seconds * TIMEOUT_MARGIN / 60) * 60
    return min(TIMEOUT_MAX_S, max(TIMEOUT_MIN_S, rounded))


def _is_compiled_trt(folder: Path | None, config_json: dict[str, Any]) -> bool:
    """A TensorRT-LLM engine folder (the backend's own test), or LMI's older Triton model repository."""
    from lmforge.engines.trtllm.compile import is_compiled

    if "build_config" in config_json:
        return True
    if folder is None or not folder.is_dir():
        return False
    return is_compiled(folder) or any(folder.glob("*/config.pbtxt"))


def _divisors_up_to(n: int, limit: int) -> list[int]:
    return [d for d in range(1, max(1, limit) + 1) if n % d == 0]


def _tp_compatible(shape: ModelShape, tp: int) -> bool:
    kv = shape.num_kv_heads
    return shape.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def make_plan(
    model_dir: Path,
    config: ServingConfig,
    instance_type: str,
    *,
    model_config_path: Path | None = None,
) -> DeployPlan:
    """Plan ``config`` (the model in ``model_dir``) on ``instance_type``.

    ``config.json`` comes from ``model_config_path`` when given, else the local weights folder
    (``config.model_path``), else ``model_dir``. Raises ``ValueError`` for an unknown instance type and
    :class:`PlanError` when no usable ``config.json`` is found.
    """
    instance = get_instance(instance_type)
    config_path = _find_model_config(Path(model_dir), config, model_config_path)
    config_json = _load_json(config_path)
    shape = ModelShape.from_config(config_json)
    problems: list[str] = []
    warnings: list[str] = []
    suggestions: list[str] = []

    # --- dtype and quantization
    dtype = _compute_dtype(config, shape, instance)
    act_bytes = DTYPE_BYTES[dtype]
    quantization = shape.quant_method
    runtime_bits: float | None = None
    if config.quantize:
        method = config.quantize.strip().lower()
        if shape.quant_method is not None:
            if method.split("_")[0] != shape.quant_method.split("_")[0]:
                warnings.append(
                    f"option.quantize={config.quantize} but the checkpoint is already quantized with "
                    f"{shape.quant_method}; planned with the checkpoint's sizes"
                )
        elif method in RUNTIME_QUANT_BITS:
            runtime_bits = RUNTIME_QUANT_BITS[method]
            quantization = method
        else:
            warnings.append(f"option.quantize={config.quantize}: unknown method, planned unquantized")
    elif shape.quant_method is not None and shape.quant_bits is None:
        warnings.append(f"quantization {shape.quant_method}: unknown size, planned as unquantized")

    # --- weights
    weights_folder = config.model_path
    files = weight_files(weights_folder) if weights_folder is not None and weights_folder.is_dir() else []
    tensors: list[TensorInfo] | None = None
    if files:
        try:
            tensors = [t for f in files for t in read_safetensors_header(f)]
        except PlanError as exc:
            warnings.append(f"{exc}; weights estimated from config.json instead")
    if tensors:
        weights_bytes = _weights_from_tensors(tensors, act_bytes, runtime_bits)
        download_bytes = sum(f.stat().st_size for f in files)
        weights_source = f"safetensors headers of {len(files)} file(s)"
        parameters = shape.parameters() if shape.quant_method else sum(t.numel for t in tensors)
    else:
        bits = runtime_bits or shape.quant_bits
        linear_bytes = shape.linear_parameters() * (bits / 8 if bits else act_bytes)
        weights_bytes = math.ceil(linear_bytes + shape.other_parameters() * act_bytes)
        checkpoint_bytes = DTYPE_BYTES.get(shape.checkpoint_dtype or "", act_bytes)
        download_bytes = (
            weights_bytes if shape.quant_bits else math.ceil(shape.parameters() * checkpoint_bytes)
        )
        weights_source = "estimated from config.json"
        parameters = shape.parameters()

    # --- sequence length
    if config.max_model_len is not None:
        max_len, len_source = config.max_model_len, "option.max_model_len"
    elif config.max_input_len is not None and config.max_output_len is not None:
        max_len = config.max_input_len + config.max_output_len
        len_source = "option.max_input_len + option.max_output_len"
    elif shape.max_position_embeddings:
        max_len, len_source = shape.max_position_embeddings, "config.json max_position_embeddings"
    else:
        max_len, len_source = DEFAULT_MAX_MODEL_LEN, "an assumed default"
        warnings.append(
            f"no max_model_len anywhere: assumed {DEFAULT_MAX_MODEL_LEN}; set option.max_model_len"
        )
    if (
        shape.max_position_embeddings
        and max_len > shape.max_position_embeddings
        and config.rope_scaling is None
    ):
        warnings.append(
            f"max_model_len {max_len} is more than the model's max_position_embeddings "
            f"({shape.max_position_embeddings})"
        )

    # --- parallelism and backend checks
    rolling_batch = config.rolling_batch
    if config.tensor_parallel_degree == "max":
        tp = instance.gpu_count if instance.gpu_count and not instance.is_cpu else 1
    else:
        tp = config.tensor_parallel_degree
    pp = config.pipeline_parallel_degree
    if instance.accelerator in UNSUPPORTED_ACCELERATORS:
        problems.append(
            f"{instance.name} has {instance.accelerator} accelerators, which lmforge's GPU backends do not "
            "support (they need the LMI NeuronX container); choose an NVIDIA GPU instance (ml.g5, g6, g6e, "
            "p4d, p5)"
        )
    if instance.is_cpu:
        if rolling_batch in _GPU_BACKENDS:
            problems.append(
                f"option.rolling_batch={rolling_batch} needs an NVIDIA GPU, but {instance.name} is a CPU "
                "instance; use a GPU instance, or rolling_batch=lmi-dist to run on the CPU"
            )
        else:
            warnings.append(
                f"{instance.name} is a CPU instance: planned against host memory "
                f"({instance.host_memory_gib:g} GiB x {CPU_HOST_USABLE_FRACTION}); expect low throughput"
            )
        if tp * pp > instance.vcpus:
            warnings.append(f"{tp * pp} ranks on {instance.vcpus} vCPUs")
    elif tp * pp > instance.gpu_count:
        problems.append(
            f"option.tensor_parallel_degree ({tp}) x option.pipeline_parallel_degree ({pp}) = {tp * pp} "
            f"is more than the {instance.gpu_count} GPU(s) of {instance.name}"
        )
    elif tp * pp < instance.gpu_count and instance.is_supported_gpu:
        warnings.append(
            f"uses {tp * pp} of the {instance.gpu_count} GPUs of {instance.name}; "
            "option.tensor_parallel_degree=max would use them all"
        )
    if shape.num_heads % tp:
        good = _divisors_up_to(shape.num_heads, max(instance.gpu_count, 1))
        problems.append(
            f"num_attention_heads ({shape.num_heads}) is not divisible by option.tensor_parallel_degree "
            f"({tp}); use one of {', '.join(map(str, good))}"
        )
    elif shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        problems.append(
            f"num_key_value_heads ({shape.num_kv_heads}) and option.tensor_parallel_degree ({tp}) must "
            "divide one another"
        )
    elif tp > shape.num_kv_heads:
        warnings.append(
            f"{shape.num_kv_heads} KV heads over {tp} GPUs: each KV head is replicated on "
            f"{tp // shape.num_kv_heads} GPUs"
        )
    if pp > shape.num_layers:
        problems.append(
            f"option.pipeline_parallel_degree ({pp}) is more than the {shape.num_layers} layers of the model"
        )
    if instance.accelerator in NO_BF16_GPUS and dtype == "bf16":
        warnings.append(
            f"{instance.accelerator} GPUs have no bf16: set option.dtype=fp16 (vLLM refuses bf16 there)"
        )
    if quantization == "fp8" and instance.is_supported_gpu and instance.accelerator not in FP8_GPUS:
        warnings.append(
            f"{instance.accelerator} GPUs have no fp8 tensor cores: fp8 runs as weight-only there"
        )
    if shape.latent_attention:
        warnings.append("multi-head latent attention: the KV-cache estimate is approximate (an upper bound)")

    # --- memory
    kv_budget: int | None = None
    if config.kv_cache_memory_mb is not None:
        if rolling_batch in ("lmi-dist", "auto"):
            kv_budget = config.kv_cache_memory_mb * MIB
        else:
            warnings.append(f"option.kv_cache_memory_mb is read by lmi-dist only; {rolling_batch} ignores it")
    utilization = CPU_HOST_USABLE_FRACTION if instance.is_cpu else config.gpu_memory_utilization
    batch = config.max_rolling_batch_size
    mem = _memory(
        shape,
        instance,
        weights_bytes=weights_bytes,
        kv_bytes=act_bytes,
        tp=tp,
        pp=pp,
        batch=batch,
        max_len=max_len,
        utilization=utilization,
        kv_budget=kv_budget,
    )
    if kv_budget is not None and kv_budget < mem.kv_per_token * batch * max_len:
        warnings.append(
            f"option.kv_cache_memory_mb holds {kv_budget // mem.kv_per_token} tokens, fewer than "
            f"{batch} x {max_len}: long requests will wait for room"
        )
    fits = mem.fits and not problems

    # --- suggestions
    suggested: str | None = None
    if not fits:
        if mem.weights + mem.overhead > mem.available:
            suggestions.append(
                f"the weights alone need {(mem.weights + mem.overhead) / GIB:.1f} GiB "
                f"{'of host memory' if instance.is_cpu else 'per GPU'}: "
                + ("use" if instance.is_cpu else "use more GPUs (option.tensor_parallel_degree),")
                + " a quantized checkpoint or a bigger instance"
            )
        elif not mem.fits:
            if mem.max_batch >= 1:
                suggestions.append(
                    f"set option.max_rolling_batch_size={mem.max_batch} (keeps max_model_len={max_len})"
                )
            if mem.max_len >= 1:
                length = mem.max_len - mem.max_len % 256 if mem.max_len >= 256 else mem.max_len
                suggestions.append(
                    f"or set option.max_model_len={length} (keeps max_rolling_batch_size={batch})"
                )
        found = _suggest_instance(
            shape, instance, dtype, weights_bytes, act_bytes, pp, batch, max_len, config, kv_budget, tp
        )
        if found is not None:
            suggested = found[0]
            suggestions.append(found[1])

    # --- timings
    download_s = download_bytes / DOWNLOAD_BYTES_PER_S
    load_s = weights_bytes / LOAD_BYTES_PER_S
    start_s = ENGINE_START_S.get(rolling_batch, STARTUP_FIXED_S)
    if rolling_batch in ("vllm", "auto") and config.enforce_eager:
        start_s = VLLM_EAGER_START_S
    compile_s = 0.0
    if rolling_batch == "trtllm" and not _is_compiled_trt(weights_folder, config_json):
        compile_s = TRT_COMPILE_BASE_S + TRT_COMPILE_S_PER_BILLION_PARAMS * parameters / 1e9
        warnings.append(
            f"TensorRT-LLM will compile the model at start-up (estimated {compile_s:.0f} s); compile ahead "
            "of time and deploy the engine to skip it"
        )
    health = _round_timeout(download_s + load_s + compile_s + start_s)
    if (download_s + load_s + compile_s + start_s) * TIMEOUT_MARGIN > TIMEOUT_MAX_S:
        warnings.append(
            f"start-up may take longer than SageMaker's {TIMEOUT_MAX_S} s limit: use faster storage "
            "(uncompressed S3 prefix, s5cmd) or an ahead-of-time compiled model"
        )
    if load_s + start_s > config.model_loading_timeout:
        warnings.append(
            f"option.model_loading_timeout ({config.model_loading_timeout} s) may be too short for loading "
            f"(estimated {load_s + start_s:.0f} s)"
        )

    return DeployPlan(
        model_dir=str(model_dir),
        model_config_path=str(config_path),
        instance_type=instance.name,
        instance=instance.describe(),
        accelerator=instance.accelerator,
        gpu_count=instance.gpu_count,
        memory_per_gpu_gib=instance.host_memory_gib if instance.is_cpu else instance.memory_per_gpu_gib,
        on_host_memory=instance.is_cpu,
        rolling_batch=rolling_batch,
        dtype=dtype,
        quantization=quantization,
        tensor_parallel_degree=tp,
        pipeline_parallel_degree=pp,
        max_rolling_batch_size=batch,
        max_model_len=max_len,
        max_model_len_source=len_source,
        memory_utilization=utilization,
        architecture=shape.architecture,
        parameters=parameters,
        weights_bytes=weights_bytes,
        weights_source=weights_source,
        download_bytes=download_bytes,
        kv_bytes_per_token=2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * act_bytes,
        kv_bytes_per_token_per_gpu=mem.kv_per_token,
        kv_tokens=batch * max_len if kv_budget is None else kv_budget // mem.kv_per_token,
        weights_per_gpu_bytes=mem.weights,
        kv_per_gpu_bytes=mem.kv,
        overhead_per_gpu_bytes=mem.overhead,
        total_per_gpu_bytes=mem.total,
        available_per_gpu_bytes=mem.available,
        max_rolling_batch_size_that_fits=mem.max_batch,
        max_model_len_that_fits=mem.max_len,
        download_s=round(download_s, 1),
        load_s=round(load_s, 1),
        start_s=round(start_s, 1),
        compile_s=round(compile_s, 1),
        health_check_timeout_s=health,
        download_timeout_s=_round_timeout(download_s),
        fits=fits,
        problems=problems,
        warnings=warnings,
        suggestions=suggestions,
        suggested_instance=suggested,
    )


def _suggest_instance(
    shape: ModelShape,
    current: InstanceType,
    dtype: str,
    weights_bytes: int,
    act_bytes: int,
    pp: int,
    batch: int,
    max_len: int,
    config: ServingConfig,
    kv_budget: int | None,
    current_tp: int,
) -> tuple[str, str] | None:
    """The smallest instance of the table (least accelerator memory, then fewest GPUs and vCPUs) where
    this model fits at the current batch and length, using all its GPUs: its name and a sentence."""
    cpu_plan = current.is_cpu and config.rolling_batch not in _GPU_BACKENDS
    fitting: list[tuple[InstanceType, int, _Memory]] = []
    for candidate in INSTANCES:
        if cpu_plan != candidate.is_cpu or not (candidate.is_cpu or candidate.is_supported_gpu):
            continue
        if dtype == "bf16" and candidate.accelerator in NO_BF16_GPUS:
            continue
        tp = 1 if candidate.is_cpu else candidate.gpu_count // pp
        if tp < 1 or not _tp_compatible(shape, tp) or (candidate.name == current.name and tp == current_tp):
            continue
        mem = _memory(
            shape,
            candidate,
            weights_bytes=weights_bytes,
            kv_bytes=act_bytes,
            tp=tp,
            pp=pp,
            batch=batch,
            max_len=max_len,
            utilization=CPU_HOST_USABLE_FRACTION if candidate.is_cpu else config.gpu_memory_utilization,
            kv_budget=kv_budget,
        )
        if mem.fits:
            fitting.append((candidate, tp, mem))
    if not fitting:
        return None
    best, tp, mem = min(
        fitting,
        key=lambda item: (
            item[0].host_memory_gib if item[0].is_cpu else item[0].total_gpu_memory_gib,
            item[0].gpu_count,
            item[0].vcpus,
            item[0].host_memory_gib,
        ),
    )
    where = "of host memory" if best.is_cpu else "per GPU"
    parallel = "" if best.is_cpu or tp == 1 else f" with option.tensor_parallel_degree={tp}"
    if best.name == current.name:
        return best.name, (
            f"or set option.tensor_parallel_degree={tp} (or max) to use all {tp} GPUs: "
            f"{mem.total / GIB:.1f} of {mem.available / GIB:.1f} GiB per GPU"
        )
    return best.name, (
        f"or use instance {best.name}{parallel} ({best.describe()}): "
        f"{mem.total / GIB:.1f} of {mem.available / GIB:.1f} GiB {where}"
    )


def _count(n: float, unit: str = "") -> str:
    """``8.03 B`` / ``0.91 M`` style (decimal prefixes), for parameters and bytes."""
    for scale, prefix in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.0f} {unit}".rstrip()
