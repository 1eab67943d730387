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
