"""LMI-Dist's own W8A8 int8 linear kernel (``int8_kernel.c``, AVX-512 VNNI), loaded with ctypes.

:func:`kernel` says whether :class:`lmforge.engines.lmi_dist.cpu_linear.Int8Weight` runs on it or on
fbgemm, once per process, and logs the choice with its reason: this kernel where the CPU has AVX-512
VNNI and the engine runs its products on one thread (it is single-threaded: fbgemm spreads a product
over the threads PyTorch has), fbgemm elsewhere. ``LMFORGE_INT8_KERNEL`` (``auto``, ``c`` or
``fbgemm``) overrides it; ``c`` on a CPU without VNNI runs the portable C loop (slow, exact: tests
compare the two paths). Both give each row the output of its own input only.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Any

import torch

log = logging.getLogger("lmforge.engines.lmi_dist")

ENV = "LMFORGE_INT8_KERNEL"
CHOICES = ("auto", "c", "fbgemm")
_ISA = {1: "portable C", 2: "AVX-512 VNNI"}
_SYMBOLS = (
    "lmforge_int8_pack",
    "lmforge_int8_linear",
    "lmforge_int8_isa",
    "lmforge_int8_amx",
    "lmforge_int8_scratch_bytes",
)


class Kernel:
    """The C library's int8 calls, typed, with scratch rows per thread."""

    def __init__(self, lib: Any) -> None:
        from lmforge.engines.lmi_dist.lora_kernel import bind

        ptr, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        bind(
            lib,
            {
                "lmforge_int8_packed_bytes": (i64, [i64, i64]),
                "lmforge_int8_pack": (None, [ptr, i64, i64, ptr, ptr]),
                "lmforge_int8_linear": (None, [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, i64, ptr, ptr, ptr]),
                "lmforge_int8_isa": (i32, []),
                "lmforge_int8_force_portable": (None, [i32]),
                "lmforge_int8_amx": (i32, []),
                "lmforge_int8_force_no_amx": (None, [i32]),
                "lmforge_int8_scratch_bytes": (i64, [i64, i64]),
            },
        )
        self._lib = lib
        self._linear = lib.lmforge_int8_linear
        self._local = threading.local()

    def isa(self) -> str:
        return _ISA.get(self._lib.lmforge_int8_isa(), "?")

    def amx(self) -> bool:
        """Whether batches of 8 rows and more run on AMX (tdpbusd; the same sums as the VNNI loop)."""
        return bool(self._lib.lmforge_int8_amx())

    def force_no_amx(self, no: bool) -> None:
        """Keep every batch on the VNNI loop (tests compare the two paths bit for bit)."""
        self._lib.lmforge_int8_force_no_amx(1 if no else 0)

    def force_portable(self, portable: bool) -> None:
        """Run the portable C loop even where VNNI is there (tests check both paths bit for bit)."""
        self._lib.lmforge_int8_force_portable(1 if portable else 0)

    def pack(self, q: torch.Tensor, scale: torch.Tensor) -> PackedInt8:
        return PackedInt8(self, q, scale)

    def scratch(self, rows: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's quantized-row buffer (what ``lmforge_int8_linear`` needs for rows x k) and row
        scales (rows floats), grown to the largest call seen; a call uses them before the thread's next
        call."""
        found: tuple[torch.Tensor, torch.Tensor] | None = getattr(self._local, "buffers", None)
        need = (rows + 15) // 16 * 16 * ((k + 3) // 4 * 4)  # lmforge_int8_scratch_bytes
        if found is None or found[0].numel() < need or found[1].numel() < rows:
            size = max(need, 2 * found[0].numel() if found is not None else 1 << 16)
            found = self._local.buffers = (
                torch.empty(size, dtype=torch.uint8),
                torch.empty(max(rows, 2 * found[1].numel() if found is not None else 64)),
            )
        return found


class PackedInt8:
    """One n x k int8 weight (per-output-channel float32 scales) packed for ``lmforge_int8_linear``."""

    def __init__(self, kernel: Kernel, q: torch.Tensor, scale: torch.Tensor) -> None:
        if q.dtype != torch.int8 or q.dim() != 2 or scale.numel() != q.shape[0]:
            raise ValueError(f"int8 weight {list(q.shape)} ({q.dtype}) with {scale.numel()} scales")
        self.kernel = kernel
        self.n, self.k = q.shape
        self.kp = (self.k + 3) // 4 * 4
        q = q.contiguous()
        lib = kernel._lib
        self.weight = torch.empty(lib.lmforge_int8_packed_bytes(self.n, self.k), dtype=torch.int8)
        self.comp = torch.empty((self.n + 63) // 64 * 64, dtype=torch.int32)
        lib.lmforge_int8_pack(q.data_ptr(), self.n, self.k, self.weight.data_ptr(), self.comp.data_ptr())
        self.scale = scale.reshape(-1).float().contiguous()
        self.nbytes = self.weight.numel() + self.comp.numel() * 4 + self.scale.numel() * 4

    def __call__(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``rows`` (float32, m x k, unit column stride) times the weight: m x n float32."""
        m = rows.shape[0]
        y = torch.empty(m, self.n)
        if not m:
            return y
        xq, xs = self.kernel.scratch(m, self.k)
        self.kernel._linear(
            rows.data_ptr(), m, self.k, rows.stride(0), self.weight.data_ptr(), self.comp.data_ptr(),
            self.scale.data_ptr(), None if bias is None else bias.data_ptr(), self.n, y.data_ptr(),
            xq.data_ptr(), xs.data_ptr(),
        )  # fmt: skip
        return y


@functools.cache
def kernel() -> Kernel | None:
    """The C kernel when :class:`~lmforge.engines.lmi_dist.cpu_linear.Int8Weight` is to use it (see
    the module's notes), else None (fbgemm); decided and logged once."""
    from lmforge.engines.lmi_dist import lora_kernel

    wanted = lora_kernel.kernel_choice(ENV, CHOICES)
    lib, why = lora_kernel.library_with(_SYMBOLS)
    found = Kernel(lib) if lib is not None else None
    if wanted == "fbgemm":
        found, why = None, f"{ENV}=fbgemm"
    elif found is not None and wanted == "auto":
        if found.isa() != _ISA[2]:
            found, why = None, "this CPU has no AVX-512 VNNI"
        elif torch.get_num_threads() != 1:
            found, why = None, f"{torch.get_num_threads()} threads: fbgemm uses them all, this kernel one"
    if found is None:
        log.info("lmi-dist: W8A8 products on fbgemm (lmforge's int8 kernel: %s)", why)
    else:
        amx = ", AMX from 8 rows" if found.amx() else ""
        log.info("lmi-dist: W8A8 products on lmforge's int8 kernel (%s%s)", found.isa(), amx)
    return found
