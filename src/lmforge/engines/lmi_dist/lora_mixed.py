"""A step with several LoRA adapters in one batch: every row gets its own adapter's delta, for all
adapters in one batched pass per layer.

The step's layout is worked out once, before the forward (:func:`plan`), and shared by every adapted
layer: the adapters present (``key``, in order of first appearance in the batch) and where each
one's token rows are. Except in the fused form, every layer's factors for that set are stacked on a
leading adapter axis, all in one buffer (:func:`build_stacks`): ``A^T`` as ``[k, in, r]`` and
``(s * B)^T`` as ``[k, r, out]`` (the layouts ``bmm`` reads fastest), ranks padded with zeros to the
largest. Then:

* fused form (a batched step on the CPU, at most ``lora_kernel.MAX_ROWS`` rows per adapter, where the
  C library is built): one call per layer of the fused pass (:mod:`.lora_kernel`), which reads each
  adapter's factors once, front to back, where its host copy keeps them, and adds every row's delta
  in place (no stacking, so a change of the step's set copies nothing; no gather, no scatter: it
  takes the rows' indices);
* batched form (the usual decode step, each adapter about as many rows as the others): the rows are
  gathered adapter by adapter into ``[k, m, in]`` (``m`` = the most rows of one adapter; a shorter
  adapter's extra slots repeat one of its rows and are zeroed after the first product), two ``bmm``
  give every row ``(x A^T)(s B^T)`` of its own adapter only, and the deltas are added back to their rows.
  Each adapter's factors are read once and no row computes another adapter's product (the stacked
  one-hot formulation this replaces did ``k`` times the work per row, and a mask and a product more per
  layer);
* segmented form (one adapter with far more rows than another: a long prompt beside decode rows): the
  rows sorted by adapter, one ``torch.nn.functional.grouped_mm`` per product over the jagged segments
  (PyTorch's kept grouped GEMM: a kernel on recent GPUs, a loop over the segments elsewhere).

When the rows already come adapter by adapter, with nothing else between them, the gather and the
scatter are skipped: always so for decode rows of distinct adapters, since ``key`` follows the batch.
The stacks are rebuilt (one copy of the adapters' factors, ~20 ms for 8 rank-8 adapters on
SmolLM2-135M) when the set or order of adapters changes, which happens as requests join or leave
(several times in a batch's life), not from step to step: transformers' scheduler lists its decoding
requests in arrival order. The fused form only makes a table of addresses then. Rows past the step's
tokens (padding) get nothing.

Where the C library is built and the layers are float32 on the CPU, every adapter product goes
through it, not only the fused form's: one adapter on every row (:func:`add_single`) and the batched
and segmented forms too (:func:`add_mixed` runs the pass over the step's stacks). The pass computes a
row's delta in one fixed order whatever else is in the step (``lora_kernel.c``), so a request's rows
get bit-identical deltas alone or in a crowd, prefilled or decoding. BLAS products do not: their
blocking, and so the order of a row's sums, may follow the number of rows, which is harmless on a float32
base (a rounding) but not on a quantized one: the next int8 layer's per-token activation scale, or an
int4 layer's bfloat16 cast, turns such a rounding into a whole quantization step. Elsewhere (CUDA,
bfloat16, no C compiler) the forms below keep PyTorch's products, equal to the row-by-row result only
to float32 rounding.

This is the gathered / segmented LoRA matmul that Punica (SGMV) and S-LoRA run as custom GPU
kernels: written with PyTorch's own batched and grouped GEMMs, so that one code path serves the CPU
and CUDA, plus a small C pass for the CPU decode step, where two batched BLAS calls per layer cost
about a third more than streaming the factors once (``bench/lora_step.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from lmforge.engines.lmi_dist import lora_kernel

Factors = tuple[torch.Tensor, torch.Tensor]
"""One adapter's factors of one layer: A^T ``[in, r]`` and ``(scaling * B)^T`` ``[r, out]``; or a
step's stack of them: A^T ``[k, in, r]`` and ``(scaling * B)^T`` ``[k, r, out]``."""

#: the batched form while its padded slots are at most this many times the adapted rows
BATCHED_MAX_WASTE = 2
#: stacked factor sets kept (a set is rebuilt when the step's adapters change)
STACKS_KEPT = 2


@dataclass(frozen=True)
class StepLayout:
    """Where each adapter's rows are in one mixed step (the same for every layer)."""

    key: tuple[int, ...]
    """The adapter ids present, in order of first appearance: the order of the stacked factors."""
    stack_id: int
    """Names ``key`` with the installs of its adapters as of this step: the stacked factors are cached
    under it, so a set stacked before one of its adapters was (re)installed is never reused."""
    tokens: int
    """The step's token rows; rows past them are padding."""
    slots: int
    """Batched form: rows per adapter in the ``[k, slots, in]`` batch; 0 = segmented form."""
    index: torch.Tensor | None
    """The row of each slot (batched) or the adapted rows in adapter order (segmented); None when the
    rows already come in that order."""
    keep: torch.Tensor | None
    """Batched form with padded slots: ``[k, slots, 1]``, 0 for a padded slot."""
    offsets: torch.Tensor | None
    """Segmented form: the int32 end of each adapter's rows in ``index`` order."""
    fused: bool = False
    """The batched form on the fused pass (:mod:`.lora_kernel`) instead of ``bmm``."""
    rows: torch.Tensor | None = None
    """The fused pass's rows: ``index`` with -1 for a padded slot; None when the rows already come in
    order."""

    @cached_property
    def pass_rows(self) -> tuple[int, torch.Tensor | None]:
        """The batched or segmented form's rows as the C pass takes them (:func:`add_mixed` on a step
        that did not plan the fused form): slots per adapter and the row of each slot (-1: none), or
        None when slot ``s`` of adapter ``a`` is row ``a * slots + s``. Worked out at the step's first
        adapted layer, kept for the others."""
        if self.slots:
            if self.index is None:
                return self.slots, None
            rows = self.index if self.keep is None else self.index.masked_fill(self.keep.view(-1) == 0, -1)
            return self.slots, rows.to("cpu", torch.int64).contiguous()
        assert self.offsets is not None  # the segmented form
        ends = self.offsets.tolist()
        starts = [0, *ends[:-1]]
        slots = max(e - s for s, e in zip(starts, ends, strict=True))
        order = torch.arange(ends[-1]) if self.index is None else self.index.to("cpu", torch.int64)
        table = torch.full((len(ends), slots), -1, dtype=torch.int64)
        for a, (s, e) in enumerate(zip(starts, ends, strict=True)):
            table[a, : e - s] = order[s:e]
        return slots, table.view(-1)


def plan(
    ids: list[int], lengths: list[int], stack_id: int, device: torch.device, fused: bool = False
) -> StepLayout:
    """The layout of a step whose requests (in batch order) have adapter ``ids[i]`` (0 = none) and
    ``lengths[i]`` token rows; at least two adapters, or one adapter and base rows. With ``fused``
    (the fused pass is there, :func:`lora_kernel.usable`), a batched step of at most
    ``lora_kernel.MAX_ROWS`` rows per adapter takes it."""
    rows: dict[int, list[int]] = {}
    start = 0
    for adapter_id, length in zip(ids, lengths, strict=True):
        if adapter_id > 0:
            rows.setdefault(adapter_id, []).extend(range(start, start + length))
        start += length
    key = tuple(rows)  # first appearance: decode rows of distinct adapters need no gather
    counts = [len(rows[i]) for i in key]
    adapted = sum(counts)
    slots = max(counts)
    in_order = [r for i in key for r in rows[i]]
    identity = in_order == list(range(start))
    if len(key) * slots <= BATCHED_MAX_WASTE * adapted:
        fused = fused and slots <= lora_kernel.MAX_ROWS
        if identity and slots * len(key) == adapted:
            return StepLayout(key, stack_id, start, slots, None, None, None, fused)
        index: list[int] = []
        keep: list[float] = []
        for i in key:
            mine = rows[i]
            pad = slots - len(mine)
            index += mine + [mine[0]] * pad
            keep += [1.0] * len(mine) + [0.0] * pad
        if fused:
            rows_t = torch.tensor([r if k else -1 for r, k in zip(index, keep, strict=True)])
            return StepLayout(key, stack_id, start, slots, None, None, None, True, rows_t)
        keep_t = None
        if len(index) > adapted:
            keep_t = torch.tensor(keep).view(len(key), slots, 1).to(device)
        return StepLayout(key, stack_id, start, slots, torch.tensor(index).to(device), keep_t, None)
    offsets = torch.tensor(counts, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    index_t = None if identity else torch.tensor(in_order).to(device)
    return StepLayout(key, stack_id, start, 0, index_t, None, offsets)


def step_key(ids: list[int]) -> tuple[int, ...]:
    """The adapters of a step's requests in order of first appearance (the stacks' order)."""
    return tuple(dict.fromkeys(i for i in ids if i > 0))


#: where each block of a flat buffer starts: a multiple of 64 bytes (a cache line; grouped_mm wants
#: 16-byte aligned starts)
_BLOCK_ALIGN_BYTES = 64


def flat_blocks(
    shapes: list[tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device,
    reuse: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Uninitialised tensors of ``shapes``, all views of one buffer (each aligned to 64 bytes), and
    that buffer: ``reuse`` when it is large enough (of the same dtype and device), else a new one.

    LoRA factors are many small matrices read once per step, at memory speed: in one buffer, a set
    of them is at least 2 MiB for any real model, so the CPU allocator can back it with transparent
    huge pages (the engine core runs with ``THP_MEM_ALLOC_ENABLE=1``); the 4 KiB pages of separate
    allocations cost about a fifth more time per step in TLB misses (SmolLM2-135M, 8 mixed adapters)."""
    align = max(1, _BLOCK_ALIGN_BYTES // torch.empty(0, dtype=dtype).element_size())
    sizes = [math.prod(shape) for shape in shapes]
    starts, total = [], 0
    for size in sizes:
        starts.append(total)
        total += -(-size // align) * align
    if reuse is not None and reuse.numel() >= total and reuse.dtype == dtype and reuse.device == device:
        flat = reuse
    else:
        flat = torch.empty(max(total, 1), dtype=dtype, device=device)
    views = [
        flat[start : start + size].view(shape)
        for start, size, shape in zip(starts, sizes, shapes, strict=True)
    ]
    return views, flat


def build_stacks(
    tables: list[dict[int, Factors]], key: tuple[int, ...], reuse: torch.Tensor | None = None
) -> tuple[list[Factors | None], torch.Tensor | None]:
    """Every adapted layer's factors for the adapters of ``key``: per layer (``tables[i]`` is its
    adapter id -> factors), A^T ``[k, in, r]`` and ``(s B)^T`` ``[k, r, out]`` with zeros for an
    adapter that leaves the layer alone, or None when none of them touches it. Ranks are padded with
    zeros to the largest of the layer, a multiple of 16 bytes (grouped_mm wants aligned strides).
    All in one buffer (:func:`flat_blocks`; ``reuse``, a set's buffer no step uses any more, when it is
    large enough: a fresh one would be page-faulted in again), built when a step's set of adapters
    changes, which is returned too (None when no layer is touched). Where the C pass can read them
    (float32 on the CPU), each layer's stack gets its table for the pass too (:func:`add_mixed`).

    Runs on the generation thread while installs and uninstalls change the tables on another: each
    table is read with single (atomic) dict operations, and an adapter found missing counts as one
    that leaves the layer alone (its requests were cancelled)."""
    plans: list[tuple[list[Factors | None], int] | None] = []
    shapes: list[tuple[int, ...]] = []
    like: torch.Tensor | None = None
    for table in tables:
        found = [table.get(i) for i in key]
        present = [f for f in found if f is not None]
        if not present:
            plans.append(None)
            continue
        at0, bt0 = present[0]
        like = at0
        align = max(1, 16 // at0.element_size())
        rank = -(-max(at.shape[1] for at, _ in present) // align) * align
        plans.append((found, rank))
        shapes += [(len(key), at0.shape[0], rank), (len(key), rank, bt0.shape[1])]
    if like is None:
        return [None] * len(tables), None
    views, flat = flat_blocks(shapes, like.dtype, like.device, reuse)
    kernel = lora_kernel.usable(like.device, like.dtype)
    blocks = iter(views)
    stacked: list[Factors | None] = []
    for entry in plans:
        if entry is None:
            stacked.append(None)
            continue
        found, rank = entry
        at3, bt3 = next(blocks), next(blocks)
        for j, factors in enumerate(found):
            if factors is None:
                at3[j].zero_()
                bt3[j].zero_()
                continue
            at, bt = factors
            r = at.shape[1]
            at3[j, :, :r].copy_(at)
            bt3[j, :r].copy_(bt)
            if r < rank:
                at3[j, :, r:].zero_()
                bt3[j, r:].zero_()
        stacked.append((at3, bt3))
        if kernel and rank <= lora_kernel.MAX_RANK:
            n_in, n_out = at3.shape[1], bt3.shape[2]
            stack = {j: (at3[j], bt3[j]) for j, f in enumerate(found) if f is not None}
            _STACK_TABLES[at3] = lora_kernel.AdapterTable([stack], tuple(range(len(key))), [(n_in, n_out)])
    return stacked, flat


_STACK_TABLES = WeakIdKeyDictionary()
"""A stack's A^T ``[k, in, r]`` -> the C pass's table of that layer's stacked factors (a zero entry for an
adapter that leaves the layer alone), made with the stack; it goes with the stack."""
_SINGLE_TABLES = WeakIdKeyDictionary()
"""An adapter's A^T ``[in, r]`` of one layer -> the C pass's table of that one adapter; made at its first
step alone, it goes with the adapter's factors (it holds their addresses, not the tensors)."""


def add_single(flat_x: torch.Tensor, flat_out: torch.Tensor, factors: Factors, kernel: bool) -> None:
    """``flat_out += (flat_x A^T)(s B^T)`` in place, one adapter on every row: on the C pass with
    ``kernel`` (the layers' :attr:`LoraLayers.fused`: float32 on the CPU, library built), the same
    per-row sums as a step mixing adapters; else (or for a rank past the pass's ``MAX_RANK``) two BLAS
    products."""
    at, bt = factors
    if not kernel or at.shape[1] > lora_kernel.MAX_RANK:
        flat_out.addmm_(flat_x @ at, bt)  # as fast as the pass for one row, faster for more
        return
    table = _SINGLE_TABLES.get(at)
    if table is None:
        table = lora_kernel.AdapterTable([{0: factors}], (0,), [(at.shape[0], bt.shape[1])])
        table.factors = []  # the caller holds them through each call; a reference would keep the key
        _SINGLE_TABLES[at] = table
    lora_kernel.add(_unit_columns(flat_x), flat_out, table, 0, flat_x.shape[0], None)


def _unit_columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` as the C pass reads rows: columns 4 bytes apart (a layer's input nearly always is)."""
    return x if x.stride(1) == 1 else x.contiguous()


def add_mixed(
    flat_x: torch.Tensor, flat_out: torch.Tensor, step: StepLayout, factors: Factors, kernel: bool
) -> None:
    """``flat_out[row] += (flat_x[row] A^T)(s B^T)`` of each adapted row's own adapter, in place: with
    ``kernel`` (as for :func:`add_single`), on the C pass over the stacks, in either form (a rank padded
    with zeros changes no bit of the pass's sums); else on PyTorch's batched or grouped products."""
    at3, bt3 = factors
    if flat_x.shape[0] < step.tokens:
        raise RuntimeError(f"LoRA step of {step.tokens} token rows got a {flat_x.shape[0]}-row input")
    x = flat_x if flat_x.shape[0] == step.tokens else flat_x[: step.tokens]
    out = flat_out if flat_out.shape[0] == step.tokens else flat_out[: step.tokens]
    table = _STACK_TABLES.get(at3) if kernel else None
    if table is not None:
        lora_kernel.add(_unit_columns(x), out, table, 0, *step.pass_rows)
        return
    xs = x if step.index is None else x.index_select(0, step.index)
    if step.slots:
        k = len(step.key)
        h = torch.bmm(xs.view(k, step.slots, x.shape[1]), at3)
        if step.keep is not None:
            h.mul_(step.keep)
        if step.index is None:
            out.view(k, step.slots, out.shape[1]).baddbmm_(h, bt3)
        else:
            out.index_add_(0, step.index, torch.bmm(h, bt3).view(-1, out.shape[1]))
        return
    if xs.data_ptr() % 16:
        xs = xs.clone()  # grouped_mm wants a 16-byte aligned start
    delta = F.grouped_mm(F.grouped_mm(xs, at3, offs=step.offsets), bt3, offs=step.offsets)
    if step.index is None:
        out.add_(delta)
    else:
        out.index_add_(0, step.index, delta)
