"""LMI-Dist's own W4A16 int4 linear kernel (``int4_kernel.c``, AVX-512 BF16), loaded with ctypes.

:func:`kernel` says whether :class:`lmforge.engines.lmi_dist.cpu_linear.Int4Weight` runs on it or on
PyTorch's CPU int4 kernel, once per process, and logs the choice with its reason: this kernel where the
CPU has AVX-512 BF16 (vdpbf16ps) and the engine runs its products on one thread (it is
single-threaded; PyTorch's spreads a product over its threads), PyTorch's elsewhere.
``LMFORGE_INT4_KERNEL`` (``auto``, ``c`` or ``torch``) overrides it (``c`` where the CPU cannot run it
is refused at load). Both give each row the output of its own input only, and one process uses one of
them for every layer and batch, so a request's answer does not depend on its crowd.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Any

import torch

from lmforge.engines.lmi_dist.lora_kernel import Signature, bind

log = logging.getLogger("lmforge.engines.lmi_dist")

ENV = "LMFORGE_INT4_KERNEL"
CHOICES = ("auto", "c", "torch")
TILE_K = 32
"""Inputs per block of the packed layout: k and the group size must be multiples of it."""
MAX_GROUP = 256
_PTR, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES: dict[str, Signature] = {
    "lmforge_int4_packed_bytes": (_I64, [_I64, _I64]),
    "lmforge_int4_pack": (_I32, [_PTR, _I64, _I64, _PTR]),
    "lmforge_int4_linear": (None, [_PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR]),
    "lmforge_int4_usable": (_I32, []),
}


class Kernel:
    """The C library's int4 calls, typed, with a bfloat16 row scratch per thread."""

    def __init__(self, lib: Any) -> None:
        bind(lib, _SIGNATURES)
        self._lib = lib
        self._linear = lib.lmforge_int4_linear
        self._local = threading.local()

    def usable(self) -> bool:
        """Whether this CPU can run it (AVX-512 F, BW and BF16)."""
        return bool(self._lib.lmforge_int4_usable())

    @staticmethod
    def fits(n: int, k: int, group: int) -> bool:
        """Whether an n x k weight in groups of ``group`` inputs has the layout this kernel takes."""
        return n > 0 and k % TILE_K == 0 and group % TILE_K == 0 and group <= MAX_GROUP and k % group == 0

    def pack(self, q: torch.Tensor, scale: torch.Tensor, group: int) -> PackedInt4:
        return PackedInt4(self, q, scale, group)

    def scratch(self, rows: int, k: int) -> torch.Tensor:
        """This thread's bfloat16 row buffer for rows x k, grown to the largest
        call seen; a call uses it before the thread's next call."""
        found: torch.Tensor | None = getattr(self._local, "buffer", None)
        need = rows * k * 2  # rows x k bfloat16
        if found is None or found.numel() < need:
            found = self._local.buffer = torch.empty(
                max(need, 2 * found.numel() if found is not None else 1 << 16), dtype=torch.uint8
            )
        return found


class PackedInt4:
    """One n x k int4 weight (-8..7, one float32 scale per ``group`` inputs and output channel) packed
    for ``lmforge_int4_linear``."""

    def __init__(self, kernel: Kernel, q: torch.Tensor, scale: torch.Tensor, group: int) -> None:
        n, k = q.shape
        if q.dtype != torch.int8 or q.dim() != 2 or not Kernel.fits(n, k, group):
            raise ValueError(f"int4 weight {list(q.shape)} ({q.dtype}) in groups of {group}")
        if int(q.min()) < -8 or int(q.max()) > 7:
            raise ValueError("int4 weight values outside -8..7")
        groups = k // group
        scale = scale.reshape(n, groups).float()
        self.kernel = kernel
        self.n, self.k, self.group = n, k, group
        lib = kernel._lib
        self.weight = torch.empty(lib.lmforge_int4_packed_bytes(n, k), dtype=torch.uint8)
        if not lib.lmforge_int4_pack(q.contiguous().data_ptr(), n, k, self.weight.data_ptr()):
            raise ValueError(f"int4 weight {list(q.shape)}: k is not a multiple of {TILE_K}")
        np_ = (n + 15) // 16 * 16
        self.scale_t = torch.zeros(groups, np_)
        self.scale_t[:, :n] = scale.t()
        self.nbytes = self.weight.numel() + self.scale_t.numel() * 4

    def __call__(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``rows`` (float32, m x k, unit column stride) times the weight: m x n float32."""
        m = rows.shape[0]
        y = torch.empty(m, self.n)
        if not m:
            return y
        xb = self.kernel.scratch(m, self.k)
        self.kernel._linear(
            rows.data_ptr(), m, self.k, rows.stride(0), self.weight.data_ptr(), self.scale_t.data_ptr(),
            self.group, None if bias is None else bias.data_ptr(), self.n, y.data_ptr(), xb.data_ptr(),
        )  # fmt: skip
        return y


@functools.cache
def kernel() -> Kernel | None:
    """The C kernel when :class:`~lmforge.engines.lmi_dist.cpu_linear.Int4Weight` is to use it (see
    the module's notes), else None (PyTorch's int4 kernel); decided and logged once."""
    from lmforge.engines.lmi_dist import lora_kernel

    wanted = lora_kernel.kernel_choice(ENV, CHOICES)
    lib, why = lora_kernel.library_with(tuple(_SIGNATURES))
    found = Kernel(lib) if lib is not None else None
    if found is not None and not found.usable():
        found, why = None, "this CPU has no AVX-512 BF16"
    if wanted == "c" and found is None:
        raise RuntimeError(f"{ENV}=c: lmforge's int4 kernel cannot run here ({why})")
    if wanted == "torch":
        found, why = None, f"{ENV}=torch"
    elif found is not None and wanted == "auto" and torch.get_num_threads() != 1:
        found, why = None, f"{torch.get_num_threads()} threads: PyTorch's kernel uses them all, this one one"
    if found is None:
        log.info("lmi-dist: W4A16 products on PyTorch's int4 kernel (lmforge's int4 kernel: %s)", why)
    else:
        log.info("lmi-dist: W4A16 products on lmforge's int4 kernel (AVX-512 BF16)")
    return found
