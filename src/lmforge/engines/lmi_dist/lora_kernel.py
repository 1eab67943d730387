"""The fused LoRA pass for CPU decode steps (``lora_kernel.c``), loaded with ctypes.

A decode step gives each adapter one or a few rows, so the LoRA products of a layer are
matrix-vector products over factors that come from memory (78 MB a step for 8 rank-8 adapters on the
7 projections of SmolLM2-135M). :func:`add` does a layer's ``out[row] += (x[row] A^T)(s B^T)`` for
every row in one call that streams each adapter's factors once, in place of two batched BLAS products
(see docs/performance.md, "LoRA adapters on LMI-Dist"). It takes the stacked layouts of
:mod:`.lora_mixed` as they are.

The library is built with the package (setup.py) when a C compiler is there; without it, or with
``LMFORGE_LORA_KERNEL=0``, :func:`usable` is False and the layers keep PyTorch's products.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("lmforge.engines.lmi_dist")

ENV = "LMFORGE_LORA_KERNEL"
#: rows of one adapter up to which the pass is used: above, a BLAS product (a prompt being
#: prefilled) does more arithmetic per byte than the pass
MAX_ROWS = 16
#: the largest (padded) rank the pass takes (the C side's MAX_RANK)
MAX_RANK = 512

_ISA = {1: "portable C", 2: "AVX2+FMA"}
_lib: ctypes.PyDLL | None = None
_fn: Any = None
_loaded = False


def _library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_lora_kernel{suffix}"
        if path.is_file():
            return path
    return None


def _load() -> ctypes.PyDLL | None:
    global _lib, _fn, _loaded
    if _loaded:
        return _lib
    _loaded = True
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        log.info("lmi-dist: LoRA on PyTorch's batched products (%s=0)", ENV)
        return None
    path = _library_path()
    if path is None:
        log.info("lmi-dist: LoRA on PyTorch's batched products (the fused pass was not built: no C compiler)")
        return None
    try:
        # PyDLL: the call keeps the GIL, like a short PyTorch op, and skips releasing and taking it back
        lib = ctypes.PyDLL(str(path))
    except OSError as exc:
        log.warning("lmi-dist: LoRA on PyTorch's batched products (cannot load %s: %s)", path.name, exc)
        return None
    lib.lmforge_lora_pass.restype = ctypes.c_int
    lib.lmforge_lora_pass.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 9
    lib.lmforge_lora_isa.restype = ctypes.c_int
    lib.lmforge_lora_force_isa.argtypes = [ctypes.c_int]
    log.info("lmi-dist: LoRA decode steps on the fused pass (%s)", _ISA.get(lib.lmforge_lora_isa(), "?"))
    _lib = lib
    _fn = lib.lmforge_lora_pass
    return lib


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether LoRA layers on ``device`` in ``dtype`` can use the fused pass: float32 on the CPU."""
    return device.type == "cpu" and dtype == torch.float32 and _load() is not None


def add(
    x: torch.Tensor,
    out: torch.Tensor,
    factors: tuple[torch.Tensor, torch.Tensor],
    slots: int,
    rows: torch.Tensor | None,
) -> None:
    """``out[row] += (x[row] A^T)(s B^T)`` in place, for ``slots`` rows of each of the ``k`` adapters
    of ``factors`` (A^T ``[k, in, r]`` and ``(s B)^T`` ``[k, r, n]``, contiguous, as stacked by
    :func:`.lora_mixed.build_stacks`): slot ``s`` of adapter ``a`` is row ``rows[a * slots + s]`` (a
    contiguous int64 tensor; -1 for a padding slot, skipped), or ``a * slots + s`` without ``rows``.
    ``x`` ``[*, in]`` and ``out`` ``[*, n]`` are float32 CPU rows with unit column stride, and
    :func:`usable` said yes. The C side checks every row against both tensors."""
    at3, bt3 = factors
    k, n_in, rank = at3.shape
    n_out = bt3.shape[2]
    if x.stride(1) != 1 or out.stride(1) != 1 or x.shape[1] != n_in or out.shape[1] != n_out:
        raise ValueError(
            f"LoRA shapes disagree: x {tuple(x.shape)}, out {tuple(out.shape)}, A^T {tuple(at3.shape)}"
        )
    status = _fn(
        x.data_ptr(), out.data_ptr(), at3.data_ptr(), bt3.data_ptr(),
        None if rows is None else rows.data_ptr(),
        k, slots, n_in, n_out, rank, x.stride(0), out.stride(0), x.shape[0], out.shape[0],
    )  # fmt: skip
    if status == -2:
        raise ValueError(f"LoRA rows outside the step's {min(x.shape[0], out.shape[0])} rows")
    if status != 0:
        raise ValueError(f"the fused LoRA pass takes ranks up to {MAX_RANK}, not {rank}")


def force_portable(portable: bool) -> None:
    """Run the portable C loop even where AVX2+FMA is there (tests check both against each other)."""
    lib = _load()
    if lib is not None:
        lib.lmforge_lora_force_isa(1 if portable else 0)
