"""The memory model: weights (from safetensors headers or the architecture, re-priced for the compute
dtype and on-the-fly quantization), the KV cache per token and per GPU, the runtime overhead, and
what fits in the memory a GPU (or a CPU instance's host) offers."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import InstanceType
from lmforge.deploy.plan.model import GIB, MIB, Notes
from lmforge.engines.memory import kv_bytes_per_token
from lmforge.hf import (
    QUANT_SCALE_OVERHEAD_BITS,
    ModelFileError,
    ModelShape,
    TensorInfo,
    read_safetensors_header,
    weight_files,
)

#: Fixed per-GPU runtime cost: CUDA context (~0.5 GiB), NCCL/communication buffers, CUDA graphs
#: and the sampler's buffers. 1.5 GiB is what vLLM-style engines typically use beyond weights + KV.
OVERHEAD_FIXED_BYTES = int(1.5 * GIB)
#: Activations and temporary buffers of the forward pass, as a share of the GPU's weights.
OVERHEAD_WEIGHT_SHARE = 0.05
#: max_model_len when neither the configuration nor config.json gives one.
DEFAULT_MAX_MODEL_LEN = 4096
#: Share of a CPU instance's host memory a model server may use (the rest: OS, container, page cache).
CPU_HOST_USABLE_FRACTION = 0.85
#: Bytes per element of a floating-point compute dtype.
DTYPE_BYTES: dict[str, int] = {"fp16": 2, "bf16": 2, "fp32": 4}
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
    "w8a8": 8,  # lmforge's int8 (LMI-Dist quantizes at load; one scale per output channel)
    "smoothquant": 8,
    "fp8": 8,
    "bitsandbytes8": 8,
}
_FLOAT_DTYPES: dict[str, int] = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}
_UNQUANTIZED_NAME_PARTS = ("embed", "lm_head", "wte", "wpe", "norm")


@dataclass(frozen=True)
class Memory:
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


def memory(
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
) -> Memory:
    if instance.is_cpu:
        # one host, one memory pool: all ranks' shards and caches together
        weights = weights_bytes
        kv_per_token = kv_bytes_per_token(
            num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
            dtype_bytes=kv_bytes,
        )  # fmt: skip
        available = int(instance.host_memory_gib * GIB * CPU_HOST_USABLE_FRACTION)
    else:
        weights = math.ceil(weights_bytes / (tp * pp))
        layers = math.ceil(shape.num_layers / pp)
        heads = max(1, math.ceil(shape.num_kv_heads / tp))
        kv_per_token = kv_bytes_per_token(
            num_layers=layers, num_kv_heads=heads, head_dim=shape.head_dim, dtype_bytes=kv_bytes
        )
        available = int(instance.memory_per_gpu_gib * GIB * utilization)
    kv = kv_budget if kv_budget is not None else kv_per_token * batch * max_len
    overhead = OVERHEAD_FIXED_BYTES + int(OVERHEAD_WEIGHT_SHARE * weights)
    free = available - weights - overhead
    max_batch = max(0, free // (kv_per_token * max_len))
    max_model_len = max(0, free // (kv_per_token * batch))
    return Memory(
        weights, kv_per_token, kv, overhead, weights + kv + overhead, available, max_batch, max_model_len
    )


#: copies of a tied LM head's int8 matrix LMI-Dist's engine core holds (cpu_linear.quantize_int8):
#: fbgemm's prepacked one for the head's product and the int8 rows the embedding's lookup gathers
TIED_INT8_COPIES = 2


def _is_unquantized_name(name: str) -> bool:
    lowered = name.lower()
    return any(part in lowered for part in _UNQUANTIZED_NAME_PARTS)


def _is_head(name: str) -> bool:
    return "lm_head" in name.lower()


def weights_from_tensors(
    tensors: list[TensorInfo],
    act_bytes: int,
    runtime_bits: float | None,
    head_bits: float | None = None,
    tied_head: int = 0,
) -> int:
    """The weights' bytes: float tensors in the compute dtype, or at ``runtime_bits`` for the linear
    ones quantized at load (``head_bits``: the LM head too; a head tied to the embedding, ``tied_head``
    parameters, stays tied in int8 and the float embedding is released: :data:`TIED_INT8_COPIES` copies
    at ``head_bits``), the others as stored."""
    total = 0.0
    for t in tensors:
        if t.dtype in _FLOAT_DTYPES:
            if head_bits is not None and len(t.shape) == 2 and _is_head(t.name):
                total += t.numel * head_bits / 8
            elif runtime_bits is not None and len(t.shape) == 2 and not _is_unquantized_name(t.name):
                total += t.numel * runtime_bits / 8
            else:
                total += t.numel * act_bytes
        else:
            total += t.nbytes
    if head_bits is not None and not any(_is_head(t.name) for t in tensors):
        # the tied embedding, priced in the compute dtype above, becomes the int8 copies
        total += tied_head * (TIED_INT8_COPIES * head_bits / 8 - act_bytes)
    return math.ceil(total)


@dataclass(frozen=True)
class Precision:
    dtype: str
    """The compute dtype (fp16, bf16, fp32)."""
    act_bytes: int
    quantization: str | None
    """The checkpoint's quantization, or the on-the-fly one of option.quantize."""
    runtime_bits: float | None
    """Bits per quantized weight of an on-the-fly quantization."""
    head_bits: float | None = None
    """Bits per LM-head weight when the on-the-fly quantization takes the head too (LMI-Dist's w8a8:
    every linear layer; a head tied to the embedding stays tied in int8, held as
    :data:`TIED_INT8_COPIES` copies, and the float embedding is released)."""


def compute_dtype(config: ServingConfig, shape: ModelShape, instance: InstanceType) -> str:
    """The dtype the model computes in: ``option.dtype``, or under ``auto`` the checkpoint's."""
    if config.dtype != "auto":
        return config.dtype
    dtype = shape.checkpoint_dtype or "fp16"
    # GPU backends (vLLM's rule) run fp32 checkpoints in fp16 under dtype=auto
    if dtype == "fp32" and not instance.is_cpu:
        return "fp16"
    return dtype


def precision(config: ServingConfig, shape: ModelShape, instance: InstanceType, notes: Notes) -> Precision:
    """The compute dtype and the quantization the weights are priced with."""
    dtype = compute_dtype(config, shape, instance)
    quantization = shape.quant_method
    runtime_bits: float | None = None
    if config.quantize:
        method = config.quantize.strip().lower()
        if shape.quant_method is not None:
            if method.split("_")[0] != shape.quant_method.split("_")[0]:
                notes.warnings.append(
                    f"option.quantize={config.quantize} but the checkpoint is already quantized with "
                    f"{shape.quant_method}; planned with the checkpoint's sizes"
                )
        elif method in RUNTIME_QUANT_BITS:
            runtime_bits = RUNTIME_QUANT_BITS[method]
            quantization = method
        else:
            notes.warnings.append(f"option.quantize={config.quantize}: unknown method, planned unquantized")
    elif shape.quant_method is not None and shape.quant_bits is None:
        notes.warnings.append(f"quantization {shape.quant_method}: unknown size, planned as unquantized")
    # LMI-Dist quantizes every linear layer at load, the LM head included (cpu_linear.quantize_int8)
    head_bits = runtime_bits if quantization == "w8a8" and config.rolling_batch == "lmi-dist" else None
    return Precision(dtype, DTYPE_BYTES[dtype], quantization, runtime_bits, head_bits)


@dataclass(frozen=True)
class Weights:
    bytes: int
    download_bytes: int
    source: str
    parameters: int


def size_weights(config: ServingConfig, shape: ModelShape, prec: Precision, notes: Notes) -> Weights:
    """The weights' size: exact from the safetensors headers of local weights, else from config.json."""
    weights_folder = config.model_path
    files = weight_files(weights_folder) if weights_folder is not None and weights_folder.is_dir() else []
    tensors: list[TensorInfo] | None = None
    if files:
        try:
            tensors = [t for f in files for t in read_safetensors_header(f)]
        except ModelFileError as exc:
            notes.warnings.append(f"{exc}; weights estimated from config.json instead")
    act_bytes = prec.act_bytes
    if tensors:
        return Weights(
            bytes=weights_from_tensors(
                tensors,
                act_bytes,
                prec.runtime_bits,
                prec.head_bits,
                shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0,
            ),
            download_bytes=sum(f.stat().st_size for f in files),
            source=f"safetensors headers of {len(files)} file(s)",
            parameters=shape.parameters() if shape.quant_method else sum(t.numel for t in tensors),
        )
    bits = prec.runtime_bits or shape.quant_bits
    linear_bytes = shape.linear_parameters() * (bits / 8 if bits else act_bytes)
    other_bytes: float = shape.other_parameters() * act_bytes
    if prec.head_bits is not None:  # the head quantized in place; a tied embedding becomes that matrix
        head = shape.vocab_size * shape.hidden_size
        copies = TIED_INT8_COPIES if shape.tie_word_embeddings else 1
        other_bytes += head * (copies * prec.head_bits / 8 - act_bytes)
    weights_bytes = math.ceil(linear_bytes + other_bytes)
    checkpoint_bytes = DTYPE_BYTES.get(shape.checkpoint_dtype or "", act_bytes)
    download_bytes = weights_bytes if shape.quant_bits else math.ceil(shape.parameters() * checkpoint_bytes)
    return Weights(weights_bytes, download_bytes, "estimated from config.json", shape.parameters())


def sequence_length(config: ServingConfig, shape: ModelShape, notes: Notes) -> tuple[int, str]:
    """max_model_len and where it came from."""
    if config.max_model_len is not None:
        max_len, source = config.max_model_len, "option.max_model_len"
    elif config.max_input_len is not None and config.max_output_len is not None:
        max_len = config.max_input_len + config.max_output_len
        source = "option.max_input_len + option.max_output_len"
    elif shape.max_position_embeddings:
        max_len, source = shape.max_position_embeddings, "config.json max_position_embeddings"
    else:
        max_len, source = DEFAULT_MAX_MODEL_LEN, "an assumed default"
        notes.warnings.append(
            f"no max_model_len anywhere: assumed {DEFAULT_MAX_MODEL_LEN}; set option.max_model_len"
        )
    if (
        shape.max_position_embeddings
        and max_len > shape.max_position_embeddings
        and config.rope_scaling is None
    ):
        notes.warnings.append(
            f"max_model_len {max_len} is more than the model's max_position_embeddings "
            f"({shape.max_position_embeddings})"
        )
    return max_len, source


def kv_budget(config: ServingConfig, notes: Notes) -> int | None:
    """option.kv_cache_memory_mb in bytes where the backend reads it (lmi-dist), else None."""
    if config.kv_cache_memory_mb is None:
        return None
    if config.rolling_batch in ("lmi-dist", "auto"):
        return config.kv_cache_memory_mb * MIB
    notes.warnings.append(
        f"option.kv_cache_memory_mb is read by lmi-dist only; {config.rolling_batch} ignores it"
    )
    return None
