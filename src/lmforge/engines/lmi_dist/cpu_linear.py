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

import functools
import logging
import threading
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
    int8 = getattr(linear, _INT8, None) or getattr(linear, _INT4, None)
    if int8 is not None:
        return int8(x, linear.bias)  # type: ignore[no-any-return]
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
# compressed-tensors' W8A8 scheme declares them. bench/quant_kernels.py measured the candidates on this
# CPU (bench/results/quant-kernels.json); two are used, chosen once per process by
# :func:`.int8_kernel.kernel` and logged:
#
# * lmforge's own kernel (int8_kernel.c), where the CPU has AVX-512 VNNI and torch one thread: the
#   weight packed once in its loop's order, each row quantized by its own scale, exact int32 sums,
#   about twice fbgemm's speed at a decode step's few rows, and on AMX tiles from 8 rows up where the
#   CPU has them (the same sums); a row's output equals a PyTorch reference bit for bit, alone or in
#   any batch.
# * fbgemm's dynamic linear elsewhere (it spreads a product over torch's threads). It quantizes its
#   input with one scale for the whole batch, so a request's tokens would depend on the other requests
#   in it. Each row is therefore divided by its own largest magnitude first and one constant row (-1, 1,
#   0, ...) is appended: the batch's range is then always exactly [-1, 1], fbgemm picks the same
#   quantization parameters for every call, and each row is quantized by its own scale in effect (per
#   token: 255 levels over [-max|x|, max|x|]); the output rows are multiplied back. Integer sums are
#   exact, so a row's output has the same bits alone and in any batch.
#
# oneDNN's qlinear (per-token uint8 in, float out) and torch._int_mm were 1.5-3x slower than fbgemm at
# one row. Private PyTorch API of the fbgemm way (a reach-in): torch.ops.quantized.linear_prepack /
# linear_dynamic and torch._make_per_channel_quantized_tensor, tested with torch 2.13.0 (x86 quantized
# engine).

_INT8 = "_lmforge_int8"
#: a Linear's per-output-channel float32 weight scale (out x 1), set when its weight holds int8 values
#: read from a W8A8 checkpoint (the fused q/k/v and gate/up layers concatenate them)
W_SCALE = "_lmforge_w_scale"


class Int8Weight:
    """A linear layer's int8 weight, packed once for the kernel :func:`.int8_kernel.kernel` chose
    (lmforge's own, or fbgemm's), and its call (see the notes above)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        from lmforge.engines.lmi_dist import int8_kernel

        out_features, in_features = q.shape
        self.in_features = in_features
        self.out_features = out_features
        own = int8_kernel.kernel()
        self.own = own.pack(q, scale) if own is not None else None
        if self.own is not None:
            self.nbytes = self.own.nbytes
            return
        zero = torch.zeros(out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated (pytorch#184982): named in
            warnings.simplefilter("ignore", UserWarning)  # the reach-in table, checked at start
            qw = torch._make_per_channel_quantized_tensor(q.contiguous(), scale.reshape(-1).double(), zero, 0)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.nbytes = q.numel() + scale.numel() * 4
        self.sentinel = torch.zeros(1, in_features)
        self.sentinel[0, 0], self.sentinel[0, 1] = -1.0, 1.0

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        bias = _float32_bias(bias)
        if self.own is not None:
            y = self.own(rows if rows.stride(-1) == 1 else rows.contiguous(), bias)
        else:
            y = self._fbgemm(rows, bias)
        y = y.view(*shape[:-1], self.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _fbgemm(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        scaling = _scaling()
        if scaling is not None and rows.stride(-1) == 1:
            return scaling.call(rows, self.packed, bias)
        # the same operations in PyTorch (no C library)
        magnitude = rows.abs().amax(-1, keepdim=True).clamp_(min=1e-30)
        scaled = torch.cat((rows / magnitude, self.sentinel))
        y = torch.ops.quantized.linear_dynamic(scaled, self.packed, False)
        y = y[: rows.shape[0]].mul_(magnitude)
        return y.add_(bias) if bias is not None else y


def _float32_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """A layer's bias as the C kernels read it: float32 and contiguous, None when absent or empty."""
    if bias is None or not bias.numel():
        return None
    return bias if bias.dtype == torch.float32 and bias.is_contiguous() else bias.float().contiguous()


class _Scaling:
    """The per-token scaling around fbgemm's product in two C calls (``lmforge_int8_scale_rows`` and
    ``lmforge_int8_unscale_rows`` of the C library, lora_kernel.c), the same float32 operations as
    :class:`Int8Weight`'s PyTorch path, into a buffer per thread and input width that grows to the
    largest batch seen (fbgemm reads it before the next call of the thread overwrites it)."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        lib.lmforge_int8_scale_rows.restype = None
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.lmforge_int8_scale_rows.argtypes = [ptr, i64, i64, i64, ptr, ptr]
        lib.lmforge_int8_unscale_rows.restype = None
        lib.lmforge_int8_unscale_rows.argtypes = [ptr, i64, i64, ptr, ptr]
        self._scale = lib.lmforge_int8_scale_rows
        self._unscale = lib.lmforge_int8_unscale_rows
        self._local = threading.local()

    def _buffers(self, n: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        table: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = getattr(self._local, "table", None)
        if table is None:
            table = self._local.table = {}
        found = table.get(width)
        if found is None or found[0].shape[0] <= n:
            rows = max(n + 1, 2 * found[0].shape[0] if found is not None else 64)
            found = table[width] = torch.empty(rows, width), torch.empty(rows)
        return found

    def call(self, rows: torch.Tensor, packed: Any, bias: torch.Tensor | None) -> torch.Tensor:
        n, width = rows.shape
        buf, mags = self._buffers(n, width)
        self._scale(rows.data_ptr(), n, width, rows.stride(0), buf.data_ptr(), mags.data_ptr())
        y = torch.ops.quantized.linear_dynamic(buf[: n + 1], packed, False)
        self._unscale(y.data_ptr(), n, y.shape[1], mags.data_ptr(), None if bias is None else bias.data_ptr())
        return y[:n]


@functools.cache
def _scaling() -> _Scaling | None:
    """The C scaling, loaded once; None where the C library is not there or predates these calls
    (PyTorch's operations then)."""
    from lmforge.engines.lmi_dist import lora_kernel

    lib, why = lora_kernel.library()
    if lib is not None and not hasattr(lib, "lmforge_int8_unscale_rows"):
        lib, why = None, "the built library predates it: reinstall lmforge"
    log.info(
        "lmi-dist: W8A8 per-token scaling on %s", "the C library" if lib is not None else f"PyTorch ({why})"
    )
    return _Scaling(lib) if lib is not None else None


def _int8_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return getattr(self, _INT8)(x, self.bias)  # type: ignore[no-any-return]


class Int8Embedding:
    """An input embedding on int8 rows with one float32 scale per row (the matrix of an int8 LM head
    tied to it): a lookup gathers the rows and multiplies each by its scale, in ``dtype``, which is
    exactly the dequantized matrix's rows (``q * scale``, as compressed-tensors decompresses it)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
        if q.dim() != 2 or scale.numel() != q.shape[0]:
            raise ValueError(f"int8 embedding of shape {list(q.shape)} with {scale.numel()} row scales")
        self.q = q.contiguous()
        self.scale = scale.reshape(-1, 1).to(dtype).contiguous()
        self.dtype = dtype
        self.nbytes = q.numel() + self.scale.numel() * self.scale.element_size()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = self.q.index_select(0, flat).to(self.dtype).mul_(self.scale.index_select(0, flat))
        return rows.view(*ids.shape, self.q.shape[1])


def _int8_embedding_forward(self: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    return getattr(self, _INT8)(ids)  # type: ignore[no-any-return]


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
    bytes, the embedding's included).

    An input embedding tied to a head quantized here becomes an :class:`Int8Embedding` on the head's
    int8 matrix (with the checkpoint's scales for the embedding, when it carries :data:`W_SCALE`), so
    one int8 matrix serves both and the float one is released; an untied embedding that carries
    :data:`W_SCALE` (int8 values of a checkpoint) gets its own; any other stays float."""
    from lmforge.engines.lmi_dist import int8_kernel
    from lmforge.reachins import TORCH_INT8, check

    if int8_kernel.kernel() is None:  # fbgemm's products (the choice is logged there, at load)
        check(TORCH_INT8)
        if not int8_supported():
            raise RuntimeError("this PyTorch has no x86 int8 kernels (torch.backends.quantized: x86)")
        torch.backends.quantized.engine = "x86"
        _scaling()  # the C library loaded (and its choice logged) at load, not in the first step
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    shared: Any = embedding.weight if embedding is not None else None
    count = nbytes = 0
    tied: tuple[torch.Tensor, torch.Tensor] | None = None  # the int8 head's (q, scale) of a tied embedding
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
            if weight is shared:
                tied = q, scale.float()
            else:
                weight.data = torch.empty(0, dtype=weight.dtype)
            count += 1
            nbytes += packed.nbytes
        own = getattr(embedding, W_SCALE, None)  # a checkpoint's int8 embedding (its own rows' scales)
        found = "float32"
        if isinstance(embedding, torch.nn.Embedding) and (own is not None or tied is not None):
            if own is not None and tied is None:  # int8 values loaded as floats: round them back
                q, scale = embedding.weight.detach().round().clamp_(-128, 127).to(torch.int8), own
            else:
                assert tied is not None
                q, scale = tied[0], own if own is not None else tied[1]
            lookup = Int8Embedding(q, scale.float(), embedding.weight.dtype)
            setattr(embedding, _INT8, lookup)
            embedding.forward = types.MethodType(_int8_embedding_forward, embedding)  # type: ignore[method-assign]
            embedding.weight.data = torch.empty(0, dtype=embedding.weight.dtype)
            nbytes += lookup.nbytes
            found = "int8 rows" + (" (tied to the int8 LM head)" if tied is not None else "")
    log.info(
        "lmi-dist: %d linear layers on int8 weights (W8A8, %.1f MiB), the input embedding on %s",
        count,
        nbytes / 2**20,
        found,
    )
    return count, nbytes


# --- W4A16 int4 weight-only (GPTQ) ------------------------------------------------------------------
#
# Int4 weights (symmetric, one scale per group of input channels, as compressed-tensors' W4A16 scheme
# declares them) times bfloat16 activations, on PyTorch's CPU int4 kernel: the weight is packed once
# (``_convert_weight_to_int4pack_for_cpu``, values 0..15 that the kernel shifts back by 8) and each call
# is ``_weight_int4pack_mm_for_cpu`` with one (scale, 0) pair per group and output channel, the input
# cast to bfloat16 and the output back to float32. bench/quant_kernels_int4.py measured it
# (bench/results/quant-kernels-int4.json): with bfloat16 activations 2.5-3.2x faster than fp32 at one
# row and 0.8-1.2x at 32; with float32 activations the same kernel takes a slow path, 5-50x *slower*
# than fp32, and unpacking to float32 at each call is 1.5-4x slower. The rounding to bfloat16 (input,
# scales, output) costs ~0.3 % of a layer's output, a third of the W8A8 kernel's. A row's output has
# the same bits alone and in a batch (measured), so a request's answer does not depend on its crowd.
#
# That kernel runs about as fast as float32 at 32 rows, so where the CPU has AVX-512 BF16 the layers run
# on lmforge's own instead (int4_kernel.c: the int4 weight unpacked in registers, vdpbf16ps products
# with float32 sums, a float32 output; the same bfloat16 rounding of the input). On an AMD EPYC with
# AVX-512 (2026-12-04, one thread, SmolLM2-135M's shapes, weights streamed; bench/quant_kernels_int4.py)
# it was 1.8-2.0x PyTorch's kernel at 32 rows and 1.0-1.9x at one row (over oneDNN's prepacked float32:
# 1.7-1.9x and 3.9-6.9x), with half its error (a float32 output, float32 scales).
#
# Private PyTorch API (a reach-in): torch.ops.aten._convert_weight_to_int4pack_for_cpu and
# _weight_int4pack_mm_for_cpu, tested with torch 2.13.0.

_INT4 = "_lmforge_int4"


class Int4Weight:
    """A linear layer's int4 weight, packed once for the kernel :func:`.int4_kernel.kernel` chose
    (lmforge's own, with bfloat16 activations, where the CPU has AVX-512 BF16 and the layout fits;
    else PyTorch's CPU int4 kernel), and its call."""

    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        group_size: int,
        dtype: torch.dtype = torch.bfloat16,
        *,
        own_kernel: bool = True,
    ) -> None:
        """``own_kernel=False`` keeps PyTorch's kernel where lmforge's would run (the benchmark of the
        kernels compares the two)."""
        from lmforge.engines.lmi_dist import int4_kernel

        out_features, in_features = q.shape
        if in_features % group_size:
            raise ValueError(f"in_features {in_features} is not a multiple of the group size {group_size}")
        self.in_features = in_features
        self.out_features = out_features
        # float32 activations: PyTorch's exact (slow) path
        own = int4_kernel.kernel() if own_kernel and dtype == torch.bfloat16 else None
        fits = own is not None and own.fits(out_features, in_features, group_size)
        self.own = own.pack(q, scale, group_size) if own is not None and fits else None
        if self.own is not None:
            self.nbytes = self.own.nbytes
            return
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            (q.to(torch.int32) + 8).contiguous(), 1
        )
        scale = scale.reshape(out_features, in_features // group_size).to(dtype)
        self.scales_and_zeros = torch.stack((scale.t(), torch.zeros_like(scale.t())), -1).contiguous()
        self.group_size = group_size
        self.dtype = dtype
        self.nbytes = self.packed.numel() * self.packed.element_size() + scale.numel() * scale.element_size()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if self.own is not None:
            if rows.dtype != torch.float32 or rows.stride(-1) != 1:
                rows = rows.float().contiguous()
            y = self.own(rows, _float32_bias(bias)).view(*shape[:-1], self.out_features)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        if rows.dtype != self.dtype:
            rows = rows.to(self.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.contiguous(), self.packed, self.group_size, self.scales_and_zeros
        )
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        if bias is not None and bias.numel():
            y.add_(bias)
        return y.view(*shape[:-1], self.out_features)


def _int4_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return getattr(self, _INT4)(x, self.bias)  # type: ignore[no-any-return]


def quantize_int4(model: torch.nn.Module) -> tuple[int, int]:
    """The ``nn.Linear`` layers of ``model`` that carry :data:`W_SCALE` (a W4A16 checkpoint's int4
    values in ``weight``, their scales out x groups; the fused q/k/v and gate/up layers concatenate
    them) on :class:`Int4Weight`, the group size being in_features / groups; the layers the checkpoint
    left in float stay as they are. Returns (layers, int4 bytes)."""
    from lmforge.reachins import TORCH_INT4, check

    check(TORCH_INT4)
    count = nbytes = 0
    with torch.no_grad():
        for module in model.modules():
            scale = getattr(module, W_SCALE, None)
            if not isinstance(module, torch.nn.Linear) or scale is None or hasattr(module, _INT4):
                continue
            if not module.weight.numel():  # replaced by a fused layer (lean_layers), which has its own
                continue
            q = module.weight.detach().round().clamp_(-8, 7).to(torch.int8)
            packed = Int4Weight(q, scale.float(), module.in_features // scale.shape[1])
            setattr(module, _INT4, packed)
            module.forward = types.MethodType(_int4_forward, module)  # type: ignore[method-assign]
            module.weight.data = torch.empty(0, dtype=module.weight.dtype)
            count += 1
            nbytes += packed.nbytes
    log.info("lmi-dist: %d linear layers on int4 weights (W4A16, %.1f MiB)", count, nbytes / 2**20)
    return count, nbytes
