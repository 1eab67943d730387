"""Linear layers on prepacked oneDNN weights, for LMI-Dist on a CPU.

On a CPU the linear layers are most of a decode step (55-63 % of the engine core on SmolLM2-135M at
concurrency 32, py-spy). PyTorch's ``F.linear`` multiplies by the weight as stored; oneDNN can first
reorder ("prepack") a weight into the blocked layout its matrix kernels read best, once, and then
every step reads that layout. For all the linear layers of SmolLM2-135M on this machine's AVX2 core
that is 1.1x faster at 1 row, 1.7x at 8 and 1.4x at 32 (``bench/cpu_linear.py``), most of it in the
49 k-row LM head.

:func:`prepack` gives the float32 ``nn.Linear`` layers of a model on the CPU a prepacked copy of
their weight and a forward that uses it, from 256 k elements up (below, the ~12 us fixed cost of the
call outweighs the gain). The original weight is then released, unless something else holds it (a
tied LM head shares the input embedding's). Results equal ``F.linear``'s to float32 rounding (the
kernels sum in another order).
"""

from __future__ import annotations

import logging
import types
import warnings
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger("lmforge.engines.lmi_dist")

_PACKED = "_lmforge_packed"
#: weights smaller than this (in elements) stay with F.linear: a prepacked call costs ~12 us more of
#: fixed overhead, which a small matrix never wins back (1.4-4x slower below 400 k elements at 1-8
#: rows); from 256 k elements up, packing every layer of SmolLM2-135M measured as fast as packing all
MIN_ELEMENTS = 1 << 18


def base_linear(linear: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear``'s own output (no adapters): on its prepacked weight when it has one."""
    int8 = getattr(linear, _INT8, None)
    if int8 is not None:
        return int8(x, linear.bias)
    packed = getattr(linear, _PACKED, None)
    if packed is None:
        return F.linear(x, linear.weight, linear.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")  # type: ignore[no-any-return]


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, getattr(self, _PACKED), self.bias, "none", [], "")  # type: ignore[no-any-return]


def supported(model: torch.nn.Module) -> bool:
    """Whether :func:`prepack` applies: a float32 model on the CPU, with oneDNN in this PyTorch."""
    param = next(model.parameters())
    return bool(
        param.device.type == "cpu"
        and param.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def prepack(model: torch.nn.Module, rows_hint: int) -> int:
    """Prepack every linear layer of ``model`` for about ``rows_hint`` rows per call; returns how
    many were packed (0 when :func:`supported` says no)."""
    if not supported(model):
        return 0
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    shared: Any = embedding.weight if embedding is not None else None
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or hasattr(module, _PACKED):
                continue
            if module.weight.numel() < MIN_ELEMENTS:
                continue
            weight = module.weight
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), max(1, rows_hint))
            setattr(module, _PACKED, packed)
            module.forward = types.MethodType(_packed_forward, module)  # type: ignore[method-assign]
            if weight is not shared:  # the prepacked copy replaces it
                weight.data = torch.empty(0, dtype=weight.dtype)
            count += 1
    log.info("lmi-dist: %d linear layers on prepacked oneDNN weights", count)
    return count


# --- W8A8 int8 -------------------------------------------------------------------------------------
#
# Int8 weights (per output channel) times int8 activations (per token, quantized at each call), as
# compressed-tensors' W8A8 scheme declares them, on fbgemm's int8 GEMM. bench/quant_kernels.py measured
# the candidates on this CPU (bench/results/quant-kernels.json): fbgemm's dynamic linear is the fastest
# int8 kernel, but it quantizes its input with one scale for the whole batch, so a request's tokens
# would depend on the other requests in it. Each row is therefore divided by its own largest magnitude
# first and one constant row (-1, 1, 0, ...) is appended: the batch's range is then always exactly
# [-1, 1], fbgemm picks the same quantization parameters for every call, and each row is quantized by
# its own scale in effect (per token: 255 levels over [-max|x|, max|x|]); the output rows are
# multiplied back. Integer sums are exact, so a row's output has the same bits alone and in any batch.
# oneDNN's qlinear (per-token uint8 in, float out) and torch._int_mm were 1.5-3x slower at one row.
#
# Private PyTorch API (a reach-in): torch.ops.quantized.linear_prepack / linear_dynamic and
# torch._make_per_channel_quantized_tensor, tested with torch 2.13.0 (x86 quantized engine).

_INT8 = "_lmforge_int8"
#: a Linear's per-output-channel float32 weight scale (out x 1), set when its weight holds int8 values
#: read from a W8A8 checkpoint (the fused q/k/v and gate/up layers concatenate them)
W_SCALE = "_lmforge_w_scale"


class Int8Weight:
    """A linear layer's int8 weight prepacked for fbgemm, and its call (see the notes above)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        out_features, in_features = q.shape
        zero = torch.zeros(out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated (pytorch#184982): named in
            warnings.simplefilter("ignore", UserWarning)  # the reach-in table, checked at start
            qw = torch._make_per_channel_quantized_tensor(q.contiguous(), scale.reshape(-1).double(), zero, 0)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.in_features = in_features
        self.out_features = out_features
        self.nbytes = q.numel() + scale.numel() * 4
        self.sentinel = torch.zeros(1, in_features)
        self.sentinel[0, 0], self.sentinel[0, 1] = -1.0, 1.0

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        magnitude = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
        y = torch.ops.quantized.linear_dynamic(
            torch.cat((rows / magnitude, self.sentinel)), self.packed, False
        )
        y = y[: rows.shape[0]].mul_(magnitude)
        if bias is not None and bias.numel():
            y.add_(bias)
        return y.view(*shape[:-1], self.out_features).to(x.dtype)


def _int8_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return getattr(self, _INT8)(x, self.bias)  # type: ignore[no-any-return]


def int8_supported() -> bool:
    """Whether this PyTorch has the x86 int8 kernels :class:`Int8Weight` uses."""
    return "x86" in torch.backends.quantized.supported_engines and hasattr(
        torch, "_make_per_channel_quantized_tensor"
    )


def quantize_int8(model: torch.nn.Module, rtn: Any, *, checkpoint: bool = False) -> tuple[int, int]:
    """The ``nn.Linear`` layers of ``model`` on int8 weights: with ``checkpoint``, those that carry
    :data:`W_SCALE` (a W8A8 checkpoint's int8 values and scales; the layers it left in float, such as
    an LM head vLLM must read, stay float), else every one, the LM head included, quantized here with
    ``rtn(weight) -> (int8, scale)`` (:func:`lmforge.quantize.w8a8.rtn_int8`). Returns (layers, int8
    bytes). A weight shared with the input embedding stays for the embedding."""
    from lmforge.reachins import TORCH_INT8, check

    check(TORCH_INT8)
    if not int8_supported():
        raise RuntimeError("this PyTorch has no x86 int8 kernels (torch.backends.quantized: x86)")
    torch.backends.quantized.engine = "x86"
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    shared: Any = embedding.weight if embedding is not None else None
    count = nbytes = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear) or hasattr(module, _INT8) or not module.weight.numel():
                continue
            weight = module.weight
            scale = getattr(module, W_SCALE, None)
            if checkpoint and scale is None:
                continue
            if scale is not None:
                q = weight.detach().round().clamp_(-128, 127).to(torch.int8)
            else:
                q, scale = rtn(weight)
            packed = Int8Weight(q, scale.float())
            setattr(module, _INT8, packed)
            module.forward = types.MethodType(_int8_forward, module)  # type: ignore[method-assign]
            if weight is not shared:
                weight.data = torch.empty(0, dtype=weight.dtype)
            count += 1
            nbytes += packed.nbytes
    log.info("lmi-dist: %d linear layers on int8 weights (W8A8, %.1f MiB)", count, nbytes / 2**20)
    return count, nbytes
