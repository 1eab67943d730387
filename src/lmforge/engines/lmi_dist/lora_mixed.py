"""A step with several LoRA adapters in one batch: every row gets its own adapter's delta, for all
adapters in one batched pass per layer.

The step's layout is worked out once, before the forward (:func:`plan`), and shared by every adapted
layer: the adapters present (``key``, in order of first appearance in the batch) and where each
one's token rows are. Each layer keeps its factors for that set stacked on a leading adapter axis
(:func:`stacks`): ``A^T`` as ``[k, in, r]`` and ``(s * B)^T`` as ``[k, r, out]`` (the layouts ``bmm``
reads fastest), ranks padded with zeros to the largest. Then:

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
A stack is rebuilt (one copy of its adapters' factors) when the set or order of adapters changes,
which happens as requests join or leave, not from step to step: transformers' scheduler lists its
decoding requests in arrival order. Rows past the step's tokens (padding) get nothing.

This is the gathered / segmented LoRA matmul that Punica (SGMV) and S-LoRA run as custom GPU
kernels, written with PyTorch's own batched and grouped GEMMs so that one code path serves the CPU
and CUDA.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Factors = tuple[torch.Tensor, torch.Tensor]
"""One adapter's factors of one layer: A ``[r, in]`` and ``(scaling * B)^T`` ``[r, out]``; or a
step's stack of them: A^T ``[k, in, r]`` and ``(scaling * B)^T`` ``[k, r, out]``."""

#: the batched form while its padded slots are at most this many times the adapted rows
BATCHED_MAX_WASTE = 2
#: stacked factor sets kept per layer (a set is rebuilt when the step's adapters change)
STACKS_KEPT = 2


@dataclass(frozen=True)
class StepLayout:
    """Where each adapter's rows are in one mixed step (the same for every layer)."""

    key: tuple[int, ...]
    """The adapter ids present, in order of first appearance: the order of the stacked factors."""
    stack_id: int
    """Names ``key`` with the installs of its adapters as of this step: a layer's stacked factors are
    cached under it, so a set stacked before one of its adapters was (re)installed is never reused."""
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


def plan(ids: list[int], lengths: list[int], stack_id: int, device: torch.device) -> StepLayout:
    """The layout of a step whose requests (in batch order) have adapter ``ids[i]`` (0 = none) and
    ``lengths[i]`` token rows; at least two adapters, or one adapter and base rows."""
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
        if identity and slots * len(key) == adapted:
            return StepLayout(key, stack_id, start, slots, None, None, None)
        index: list[int] = []
        keep: list[float] = []
        for i in key:
            mine = rows[i]
            pad = slots - len(mine)
            index += mine + [mine[0]] * pad
            keep += [1.0] * len(mine) + [0.0] * pad
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


_MISSING = object()


def stacks(linear: torch.nn.Module, table: dict[int, Factors], step: StepLayout) -> Factors | None:
    """``linear``'s factors for the step's adapters: ``[k, in, r]`` and ``[k, r, out]`` (zeros for an
    adapter that does not touch this layer); None when none does. Cached per ``step.stack_id``.

    Runs on the generation thread while installs and uninstalls change ``table`` and drop cached sets
    (:func:`forget_stacks`) on another: every dict operation here is a single atomic one."""
    cache: OrderedDict[int, Factors | None] | None = linear.__dict__.get("_lmforge_stacks")
    if cache is None:
        cache = linear.__dict__.setdefault("_lmforge_stacks", OrderedDict())
    entry: Any = cache.get(step.stack_id, _MISSING)
    if entry is not _MISSING:
        try:
            cache.move_to_end(step.stack_id)
        except KeyError:  # dropped meanwhile by an uninstall: still right for this step
            pass
        return entry  # type: ignore[no-any-return]
    found = [f for f in (table.get(i) for i in step.key) if f is not None]
    if found:
        a0, bt0 = found[0]
        # ranks padded with zeros to a multiple of 16 bytes: grouped_mm wants 16-byte aligned strides
        align = max(1, 16 // a0.element_size())
        rank = -(-max(a.shape[0] for a, _ in found) // align) * align
        blocks_a, blocks_b = [], []
        for adapter_id in step.key:
            factors = table.get(adapter_id)
            if factors is None:  # this adapter leaves the layer alone
                blocks_a.append(a0.new_zeros(a0.shape[1], rank))
                blocks_b.append(bt0.new_zeros(rank, bt0.shape[1]))
                continue
            a, bt = factors
            pad = rank - a.shape[0]
            blocks_a.append(F.pad(a.t(), (0, pad)) if pad else a.t())
            blocks_b.append(F.pad(bt, (0, 0, 0, pad)) if pad else bt)
        entry = (torch.stack(blocks_a), torch.stack(blocks_b))  # one copy each (a set change, not a step)
    else:
        entry = None
    cache[step.stack_id] = entry
    while len(cache) > STACKS_KEPT:
        with contextlib.suppress(KeyError):
            cache.popitem(last=False)
    return entry  # type: ignore[no-any-return]


def forget_stacks(linear: torch.nn.Module) -> None:
    """Drop ``linear``'s stacked sets (an adapter left: they would only hold memory)."""
    cache: Any = linear.__dict__.get("_lmforge_stacks")
    if cache is not None:
        for stack_id in list(cache):
            cache.pop(stack_id, None)


def add_mixed(flat_x: torch.Tensor, flat_out: torch.Tensor, step: StepLayout, factors: Factors) -> None:
    """``flat_out[row] += (flat_x[row] A^T)(s B^T)`` of each adapted row's own adapter, in place."""
    at3, bt3 = factors
    if flat_x.shape[0] < step.tokens:
        raise RuntimeError(f"LoRA step of {step.tokens} token rows got a {flat_x.shape[0]}-row input")
    x = flat_x if flat_x.shape[0] == step.tokens else flat_x[: step.tokens]
    out = flat_out if flat_out.shape[0] == step.tokens else flat_out[: step.tokens]
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
