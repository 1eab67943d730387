"""The fused LoRA pass for float32 CPU steps (``lora_kernel.c``), loaded with ctypes.

A decode step gives each adapter one or a few rows, so the LoRA products of a layer are
matrix-vector products over factors that come from memory (78 MB a step for 8 rank-8 adapters on the
7 projections of SmolLM2-135M). :func:`add` does a layer's ``out[row] += (x[row] A^T)(s B^T)`` for
every row in one call that streams each adapter's factors once, in place of two batched BLAS products
(see docs/performance.md, "LoRA adapters on LMI-Dist"). It takes the stacked layouts of
:mod:`.lora_mixed` as they are. Its per-row sums run in one fixed order, so :mod:`.lora_mixed` runs every
adapter product of a float32 CPU step through it, decode and prefill rows alike: a request's deltas are
then the same bits alone or in a crowd.

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
#: the largest adapter rank the pass takes (the C side's MAX_RANK)
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


_opened: tuple[ctypes.PyDLL | None, str] | None = None


def library() -> tuple[ctypes.PyDLL | None, str]:
    """The C library (None where it was not built or does not load) and, if None, why."""
    global _opened
    if _opened is None:
        path = _library_path()
        if path is None:
            _opened = None, "not built: no C compiler"
        else:
            try:
                # PyDLL: a call keeps the GIL (a few to tens of us), which saves releasing and taking it
                # back per layer; the core's other threads wait that long
                _opened = ctypes.PyDLL(str(path)), ""
            except OSError as exc:
                _opened = None, f"cannot load {path.name}: {exc}"
    return _opened


def library_with(symbols: tuple[str, ...]) -> tuple[ctypes.PyDLL | None, str]:
    """The C library where it has every one of ``symbols`` (else None and why: not built, or built
    before they were added)."""
    lib, why = library()
    if lib is not None and not all(hasattr(lib, name) for name in symbols):
        return None, "the built library predates it: reinstall lmforge"
    return lib, why


Signature = tuple[Any, list[Any]]
"""A C function's ctypes (restype, argtypes)."""


def bind(lib: Any, signatures: dict[str, Signature]) -> None:
    """Set each named function's ctypes result and argument types."""
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def kernel_choice(env: str, choices: tuple[str, ...]) -> str:
    """Which kernel ``env`` asks for (``auto`` when unset), refused when it is not one of ``choices``."""
    wanted = os.environ.get(env, "auto").strip().lower() or "auto"
    if wanted not in choices:
        raise ValueError(f"{env}={wanted!r}: choose one of {', '.join(choices)}")
    return wanted


def _load() -> ctypes.PyDLL | None:
    global _lib, _fn, _loaded
    if _loaded:
        return _lib
    _loaded = True
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        log.info("lmi-dist: LoRA on PyTorch's batched products (%s=0)", ENV)
        return None
    lib, why = library()
    if lib is None:
        log.info("lmi-dist: LoRA on PyTorch's batched products (the fused pass: %s)", why)
        return None
    lib.lmforge_lora_pass.restype = ctypes.c_int
    lib.lmforge_lora_pass.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 8
    lib.lmforge_lora_isa.restype = ctypes.c_int
    lib.lmforge_lora_force_isa.argtypes = [ctypes.c_int]
    path_name = _ISA.get(lib.lmforge_lora_isa(), "?")
    log.info("lmi-dist: LoRA steps mixing adapters on the fused pass (%s)", path_name)
    _lib = lib
    _fn = lib.lmforge_lora_pass
    return lib


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether LoRA layers on ``device`` in ``dtype`` can use the fused pass: float32 on the CPU."""
    return device.type == "cpu" and dtype == torch.float32 and _load() is not None


class AdapterTable:
    """What the fused pass reads for one set of adapters (a step's, in the step's order): for every
    adapted layer, each adapter's factor addresses in its own host copy and its rank, as one int64
    ``[layers, k, 3]`` tensor. Built when the step's set changes (no factor is copied); holds the
    factors, so an adapter uninstalled while a step runs stays readable until the table goes."""

    def __init__(
        self,
        tables: list[dict[int, tuple[torch.Tensor, torch.Tensor]]],
        key: tuple[int, ...],
        shapes: list[tuple[int, int]],
    ) -> None:
        """``tables[i]``: adapted layer ``i``'s adapter id -> (A^T ``[in, r]``, ``(s B)^T`` ``[r, out]``)
        with ``shapes[i]`` = (in, out) of that layer; ``key``: the step's adapters, in order. Raises
        ValueError for factors the pass cannot read (checked once here, not at every call)."""
        entries: list[int] = []
        self.factors: list[tuple[torch.Tensor, torch.Tensor]] = []
        for table, (n_in, n_out) in zip(tables, shapes, strict=True):
            for adapter_id in key:
                found = table.get(adapter_id)  # None: it leaves the layer alone (or was cancelled)
                if found is None:
                    entries += (0, 0, 0)
                    continue
                at, bt = found
                rank = at.shape[1] if at.dim() == 2 else 0
                if not (
                    at.dtype == bt.dtype == torch.float32
                    and at.is_cpu
                    and bt.is_cpu
                    and at.is_contiguous()
                    and bt.is_contiguous()
                    and tuple(at.shape) == (n_in, rank)
                    and tuple(bt.shape) == (rank, n_out)
                    and 0 < rank <= MAX_RANK
                ):
                    raise ValueError(
                        f"adapter {adapter_id}: factors {tuple(at.shape)} / {tuple(bt.shape)} "
                        f"({at.dtype}) do not fit a {n_in} -> {n_out} layer for the fused LoRA pass"
                    )
                entries += (at.data_ptr(), bt.data_ptr(), rank)
                self.factors.append(found)
        self.key = key
        self.shapes = shapes
        self.layers = len(tables)
        self.table = torch.tensor(entries, dtype=torch.int64).view(self.layers, len(key), 3)
        self._address: int = self.table.data_ptr()
        self._stride = len(key) * 3 * 8

    def address(self, layer: int) -> int:
        """Where layer ``layer``'s ``[k, 3]`` entries start."""
        return self._address + layer * self._stride


def add(
    x: torch.Tensor,
    out: torch.Tensor,
    adapters: AdapterTable,
    layer: int,
    slots: int,
    rows: torch.Tensor | None,
) -> None:
    """``out[row] += (x[row] A^T)(s B^T)`` in place, for ``slots`` rows of each adapter of
    ``adapters`` on adapted layer ``layer`` (an adapter that leaves the layer alone adds nothing):
    slot ``s`` of the ``a``-th adapter is row ``rows[a * slots + s]`` (a contiguous int64 tensor; -1
    for a padding slot, skipped), or ``a * slots + s`` without ``rows``. ``x`` ``[*, in]`` and ``out``
    ``[*, n]`` are that layer's float32 CPU input and output rows, with unit column stride. The C side
    checks every row against both tensors, and every rank, before it writes anything."""
    k = len(adapters.key)
    if not (x.dtype is torch.float32 and out.dtype is torch.float32 and x.is_cpu and out.is_cpu):
        raise ValueError(f"the fused LoRA pass takes float32 CPU rows, not {x.dtype} on {x.device}")
    if (
        x.dim() != 2
        or out.dim() != 2
        or x.stride(1) != 1
        or out.stride(1) != 1
        or layer >= adapters.layers
        or (x.shape[1], out.shape[1]) != adapters.shapes[layer]
    ):
        raise ValueError(f"LoRA rows {tuple(x.shape)} -> {tuple(out.shape)} do not fit adapted layer {layer}")
    if rows is not None and (
        rows.dtype is not torch.int64
        or not rows.is_cpu
        or rows.numel() != k * slots
        or not rows.is_contiguous()
    ):
        raise ValueError(f"rows must be a contiguous int64 CPU tensor of {k} x {slots} entries")
    status = _fn(
        x.data_ptr(), out.data_ptr(), adapters.address(layer), None if rows is None else rows.data_ptr(),
        k, slots, x.shape[1], out.shape[1], x.stride(0), out.stride(0), x.shape[0], out.shape[0],
    )  # fmt: skip
    if status == -2:
        raise ValueError(f"LoRA rows outside the step's {min(x.shape[0], out.shape[0])} rows")
    if status != 0:
        raise ValueError(f"the fused LoRA pass takes ranks 1 to {MAX_RANK}")


def isa() -> str | None:
    """Which code path the pass runs on this CPU ("AVX2+FMA" or "portable C"); None when not built."""
    lib = _load()
    return None if lib is None else _ISA.get(lib.lmforge_lora_isa(), "?")


def force_portable(portable: bool) -> None:
    """Run the portable C loop even where AVX2+FMA is there (tests check both against each other)."""
    lib = _load()
    if lib is not None:
        lib.lmforge_lora_force_isa(1 if portable else 0)
