"""The shape of a Hugging Face model, read from its ``config.json`` (never the tensors): what the
deployment planner (:mod:`lmforge.deploy.plan`) sizes memory from. Reads the text config of
multimodal models and the ``pretrained_config`` a compiled TensorRT-LLM engine folder records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmforge.hf.errors import ModelFileError

#: Extra bits per quantized weight for the group scales and zero points (group size 128: one fp16
#: scale + one packed 4-bit zero per 128 weights is ~0.16 bits; rounded up).
QUANT_SCALE_OVERHEAD_BITS = 0.25

#: Hugging Face ``torch_dtype`` spellings -> lmforge's dtype names.
HF_DTYPES: dict[str, str] = {
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
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
        """Read a Hugging Face ``config.json`` dict; ModelFileError when a needed key is missing."""
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
            raise ModelFileError(
                f"config.json lacks {', '.join(missing)}: is it a transformer model's config?"
            )
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
        checkpoint_dtype = HF_DTYPES.get(str(raw_dtype).lower()) if raw_dtype is not None else None
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
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    return method, None


def _compressed_tensors(qc: dict[str, Any]) -> tuple[str, float | None]:
    """A compressed-tensors ``quantization_config``: lmforge's method name for the schemes it serves
    (w8a8, gptq), else ``compressed-tensors``; bits per quantized weight from its one config group for
    the linear layers (the scales: float32, as ``lmforge compile`` writes them, one per output channel
    or per group)."""
    from lmforge.quantize import QuantizeError, checkpoint_scheme, config_groups

    try:
        method = checkpoint_scheme(qc)
    except QuantizeError:
        method = "compressed-tensors"
    group, embedding, count = config_groups(qc)  # a W8A8 tied embedding's group beside the linear one
    if count != 1 + (embedding is not None):
        group = None
    weights = group.get("weights") if isinstance(group, dict) else None
    bits = weights.get("num_bits") if isinstance(weights, dict) else None
    if not isinstance(weights, dict) or not isinstance(bits, int | float):
        return method, None
    size = weights.get("group_size")
    return method, float(bits) + (32 / size if isinstance(size, int) and size > 0 else 0.0)
