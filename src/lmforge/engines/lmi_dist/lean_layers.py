"""A leaner forward for Llama-family decoder layers, for LMI-Dist's engine core.

transformers' decoder layer is written for every use (training, generate, output capture): one step
of SmolLM2-135M at 32 decode rows runs ~4,300 eager ops, and with one PyTorch thread their dispatch
and Python cost ~27 ms of a ~167 ms step (torch.profiler: op time 140 ms). :func:`install` gives each
supported layer a forward that computes the same function with about half the ops:

* RMSNorm as one ``torch.rms_norm`` call instead of seven (pow, mean, add, rsqrt, two muls, casts);
* the attention and MLP blocks inline, without their module calls; the linear layers stay module
  calls, so prepacked weights (:mod:`.cpu_linear`) and LoRA forwards (:mod:`.lora`) apply unchanged;
* rotary embedding as ``x * cos + roll(x, half) * signed_sin``, the signed sine made once per step
  (transformers slices, negates and concatenates for every layer and both of q and k);
* SiLU and the gate product in place;
* with ``fuse`` (no LoRA, which adapts the projections one by one), q/k/v as one linear layer and
  gate/up as another, as vLLM's Llama does: 4 matrix products per layer instead of 7, and the small
  k/v products (576 x 192 on SmolLM2-135M, too small to prepack alone) join the prepacked q.

The results equal transformers' to float32 rounding (tests/unit/test_lean_layers.py compares them).
Only the layer classes in :data:`SUPPORTED` with full attention (no sliding window) are changed; any
other model keeps transformers' forward.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import torch
import torch.nn.functional as F

from lmforge.engines.lmi_dist.cpu_linear import W_SCALE

log = logging.getLogger("lmforge.engines.lmi_dist")

#: decoder layers whose forward is Llama's (pre-norm RMSNorm, rotary on q and k, SiLU-gated MLP)
SUPPORTED = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"})
_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm"})

_QKV = "_lmforge_qkv"
_GATE_UP = "_lmforge_gate_up"

_rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
"""(the step's sin as passed in, cos unsqueezed, signed sin unsqueezed): made at the first layer of a
forward pass, reused by the others (they get the same tensors)."""


def _rope(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    global _rotary
    cached = _rotary
    if cached is not None and cached[0] is sin:
        return cached[1], cached[2]
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    mine = (sin, cos.unsqueeze(1), signed.unsqueeze(1))
    _rotary = mine
    return mine[1], mine[2]


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin``: ``roll`` puts the second half first, and the
    signed sine negates it (the two halves of a RoPE sine are equal)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def _norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def _attention(attn: Any) -> Any:
    """The attention function the layer's own forward would call (looked up per call, as it does)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    eager = getattr(sys.modules[type(attn).__module__], "eager_attention_forward", None)
    return ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, eager)


def _forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    attn: Any = self.self_attn
    mlp: Any = self.mlp
    shape = (*hidden_states.shape[:-1], -1, attn.head_dim)
    x = _norm(self.input_layernorm, hidden_states)
    qkv = getattr(attn, _QKV, None)
    if qkv is not None:
        q, k, v = qkv(x).split(qkv.sizes, dim=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    q, k, v = q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)
    assert position_embeddings is not None
    cos, signed_sin = _rope(*position_embeddings)
    q, k = _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, attn.layer_idx)
    out, _ = _attention(attn)(
        attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling,
        position_ids=position_ids, use_cache=use_cache, **kwargs,
    )  # fmt: skip
    hidden_states = hidden_states + attn.o_proj(out.reshape(*shape[:-2], -1))
    x = _norm(self.post_attention_layernorm, hidden_states)
    gate_up = getattr(mlp, _GATE_UP, None)
    if gate_up is not None:
        gate, up = gate_up(x).split(gate_up.sizes, dim=-1)
        gate = F.silu(gate)
    else:
        gate, up = F.silu(mlp.gate_proj(x), inplace=True), mlp.up_proj(x)
    return hidden_states + mlp.down_proj(gate.mul_(up))


def supported(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` computes exactly what :func:`_forward` does."""
    if type(layer).__name__ not in SUPPORTED:
        return False
    attn: Any = getattr(layer, "self_attn", None)
    mlp: Any = getattr(layer, "mlp", None)
    if attn is None or mlp is None or not all(hasattr(attn, n) for n in ("head_dim", "scaling", "config")):
        return False
    window = getattr(attn, "sliding_window", getattr(attn.config, "sliding_window", None))
    norms = (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None))
    return (
        window is None
        and getattr(attn.config, "hidden_act", None) == "silu"
        and all(type(n).__name__ in _NORMS for n in norms)
        and not any(hasattr(attn, n) for n in ("q_norm", "k_norm"))
    )


def _fused(*linears: torch.nn.Linear) -> torch.nn.Linear:
    """One linear layer computing ``linears`` side by side (its output split by ``.sizes``)."""
    first = linears[0]
    bias = first.bias is not None
    out = torch.nn.Linear(
        first.in_features,
        sum(m.out_features for m in linears),
        bias=bias,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        out.weight.copy_(torch.cat([m.weight for m in linears]))
        if bias:
            out.bias.copy_(torch.cat([m.bias for m in linears]))  # type: ignore[misc]
    out.requires_grad_(False)
    out.sizes = [m.out_features for m in linears]  # type: ignore[assignment]
    scales = [getattr(m, W_SCALE, None) for m in linears]
    if all(s is not None for s in scales):  # int8 values of a W8A8 checkpoint: their scales, side by side
        setattr(out, W_SCALE, torch.cat(scales))  # type: ignore[arg-type]
    return out


def install(model: torch.nn.Module, fuse: bool = False) -> int:
    """Give every supported decoder layer of ``model`` the lean forward; returns how many. With
    ``fuse``, q/k/v and gate/up also become one linear layer each (before prepacking)."""
    count = 0
    for module in model.modules():
        if "forward" not in vars(module) and supported(module):
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]
            if fuse:
                attn: Any = module.self_attn
                mlp: Any = module.mlp
                parts = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
                setattr(attn, _QKV, _fused(*parts[0]))
                setattr(mlp, _GATE_UP, _fused(*parts[1]))
                for linear in (*parts[0], *parts[1]):  # the fused copy replaces them
                    linear.weight.data = linear.weight.new_empty(0)
                    if linear.bias is not None:
                        linear.bias.data = linear.bias.new_empty(0)
            count += 1
    if count:
        log.info("lmi-dist: %d decoder layers on the lean forward", count)
    return count
