"""Per-request LoRA adapters inside LMI-Dist's continuous batch: the engine core's side (layers and
weights); which adapters are resident is decided by the frontend (:mod:`.lora_slots`).

transformers' continuous batching applies one adapter (PEFT's active one) to the whole batch. LMI-Dist
instead gives every request its own adapter, in the same forward pass:

* each adapted ``nn.Linear`` keeps its module and weights and gets a forward that adds, for every
  token row with an adapter, ``(x_row @ A.T) @ (scaling * B).T`` of that row's adapter (PEFT's
  formula with the scaling folded into B; greedy tokens equal PEFT's, which the tests check): for a
  step with one adapter on every row, two matmuls over all rows; for a step mixing adapters (or
  adapters and base rows), one batched pass over all of them (:mod:`.lora_mixed`);
* which token rows belong to which adapter is worked out once per step from the batch's requests
  (each carries its adapter id as a logits-processor kwarg) by :meth:`LoraLayers.on_batch`, called by
  the logits-processor list while transformers prepares the step's tensors, and shared by all layers;
* at most ``max_loras`` adapters are resident (installed in the layers) at once; a request for another
  adapter waits until a resident one is idle and is evicted (least recently used first). Loaded weights
  stay in host memory for up to ``max_cpu_loras`` adapters; others are read again from their
  safetensors file when needed.

Adapter ids are never reused, so a late step that still names an evicted or removed adapter finds no
weights and adds nothing (that request was cancelled); it can never pick up another adapter's weights.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import types
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmforge.engines.lmi_dist import lora_kernel
from lmforge.engines.lmi_dist.cpu_linear import base_linear
from lmforge.engines.lmi_dist.lora_mixed import (
    STACKS_KEPT,
    Factors,
    StepLayout,
    add_mixed,
    add_single,
    build_stacks,
    flat_blocks,
    plan,
    step_key,
)
from lmforge.engines.lmi_dist.sampler import LORA_KWARG
from lmforge.errors import BadRequestError

if TYPE_CHECKING:
    from lmforge.engines.lmi_dist.ipc import AdapterRef

log = logging.getLogger("lmforge.engines.lmi_dist")

_WEIGHTS_ATTR = "_lmforge_lora"
_SLOT_ATTR = "_lmforge_lora_slot"
_PEFT_PREFIX = "base_model.model."
#: adapter sets remembered by :meth:`LoraLayers._stack_id` (a forgotten one gets a new number)
_STACK_IDS_KEPT = 64
#: the fused pass's tables kept (small: three integers per adapter and adapted layer)
_TABLES_KEPT = 8


def _lora_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = base_linear(self, x)
    runtime: LoraLayers | None = getattr(self, "_lmforge_runtime", None)
    if runtime is None:
        return out
    single, step = runtime.single, runtime.step
    scoring = runtime.scoring.__dict__.get("adapter")
    if scoring is not None:  # a prompt-scoring pass, on its own thread: one adapter (0: none) on every row
        single, step = scoring or None, None
    table: dict[int, Factors] = getattr(self, _WEIGHTS_ATTR)
    if single is not None:  # one adapter for every row
        factors = table.get(single)
        if factors is not None:  # None: it does not touch this layer (or was evicted after a cancel)
            # out += (x A^T) (s B)^T in place, with the per-row sums of a mixed step where the pass runs
            add_single(x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1]), factors, runtime.fused)
        return out
    if step is not None:  # adapters mixed in the step (or with base rows)
        slot = getattr(self, _SLOT_ATTR)
        flat_x, flat_out = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        # a layer first adapted after the step's set was laid out: no adapter of the step touches it
        if step.fused:
            adapters = runtime.adapters
            if adapters is not None and slot < adapters.layers:
                lora_kernel.add(flat_x, flat_out, adapters, slot, step.slots, step.rows)
            return out
        stacked = runtime.stacked
        factors = stacked[slot] if slot < len(stacked) else None
        if factors is not None:
            add_mixed(flat_x, flat_out, step, factors, runtime.fused)
    return out


class LoraLayers:
    """The engine core's side: the model's adaptable layers, the adapters installed in them, the
    host-memory cache of adapter weights, and each step's rows per adapter."""

    def __init__(self, model: torch.nn.Module, max_cpu_loras: int) -> None:
        self.model = model
        self.max_cpu_loras = max(max_cpu_loras, 1)
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.single: int | None = None
        """Set on the generation thread before each forward: the adapter of every row, when one is."""
        self.fused = lora_kernel.usable(self.device, self.dtype)
        """Whether steps mixing adapters use the fused LoRA pass (:mod:`.lora_kernel`) when few rows
        each and PyTorch runs on one thread."""
        self.scoring = threading.local()
        """``adapter``, set on the thread of a prompt-scoring pass (:mod:`.prompt_scores`): the adapter id
        (0: none) its rows take, in place of the running step's ``single``/``step``, which that thread
        never touches (the generation thread may lay out the next step meanwhile)."""
        self.step: StepLayout | None = None
        """Set with ``single``: where each adapter's rows are, when a step mixes adapters (or base rows)."""
        self.stacked: list[Factors | None] = []
        """Set with ``step`` when it is not fused: each adapted layer's stacked factors for the step's
        adapters (by the layer's slot, its index in ``_patched``)."""
        self.adapters: lora_kernel.AdapterTable | None = None
        """Set with ``step`` when it is fused: where the step's adapters keep their factors, per
        adapted layer."""
        self._tables: OrderedDict[int, lora_kernel.AdapterTable] = OrderedDict()
        """Stack id -> the fused pass's table for that set of adapters (the last few sets)."""
        self._installs: dict[int, int] = {}
        """Adapter id -> the count of installs when it was installed (its stacked factors' version)."""
        self._serial = itertools.count(1)
        """Numbers installs and adapter sets (never reused; ``next`` is atomic across threads)."""
        self._stack_ids: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], int] = OrderedDict()
        self._stacks: OrderedDict[int, tuple[tuple[int, ...], list[Factors | None], torch.Tensor | None]]
        self._stacks = OrderedDict()
        """Stack id -> (its adapters, the stacked factors of every adapted layer, their buffer): the
        last few sets."""
        self._linears: dict[str, torch.nn.Linear] = {
            name: mod
            for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head")
        }
        self._patched: list[str] = []
        """The adapted layers, in the order they were first adapted (a layer's slot is its index)."""
        self._host: OrderedDict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self.last_load_ms = 0.0

    def layers(self) -> dict[str, tuple[int, int]]:
        return {name: (m.in_features, m.out_features) for name, m in self._linears.items()}

    def stats(self) -> dict[str, float]:
        return {"lora_host_cached": float(len(self._host))}

    # ------------------------------------------------------------------ generation thread

    def on_batch(self, requests_in_batch: list[Any]) -> None:
        """Work out the step's rows per adapter (called before the step's forward)."""
        ids: list[int] = []
        lengths: list[int] = []
        for future in requests_in_batch:
            ids.append(int(future.state.logit_processor_kwargs.get(LORA_KWARG, 0)))
            lengths.append(int(future.query_length))
        present = {i for i in ids if i > 0}
        if not present or (len(present) == 1 and 0 not in ids):
            self.step = None
            self.single = present.pop() if present else None
            return
        self.single = None
        key = step_key(ids)
        stack_id = self._stack_id(key)
        # the pass runs on one thread: with more, PyTorch's batched products spread over them and
        # win (SmolLM2-135M, 8 adapters, 2 threads: +9.5 ms a step against the pass's +10.7 ms)
        step = plan(ids, lengths, stack_id, self.device, self.fused and torch.get_num_threads() == 1)
        if step.fused:
            self.adapters = self._table(stack_id, key)
        else:
            self.stacked = self._stacked(stack_id, key)
        self.step = step

    def _table(self, stack_id: int, key: tuple[int, ...]) -> lora_kernel.AdapterTable:
        """The fused pass's table for ``key`` as installed now (see ``_stack_id``): addresses only,
        so a step whose set changes (a request joins or leaves) copies no factors."""
        cached = self._tables.get(stack_id)
        if cached is not None:
            with contextlib.suppress(KeyError):  # dropped meanwhile by an uninstall
                self._tables.move_to_end(stack_id)
            return cached
        linears = [self._linears[name] for name in list(self._patched)]
        table = lora_kernel.AdapterTable(
            [getattr(linear, _WEIGHTS_ATTR) for linear in linears],
            key,
            [(linear.in_features, linear.out_features) for linear in linears],
        )
        self._tables[stack_id] = table
        while len(self._tables) > _TABLES_KEPT:
            with contextlib.suppress(KeyError):
                self._tables.popitem(last=False)
        return table

    def _stacked(self, stack_id: int, key: tuple[int, ...]) -> list[Factors | None]:
        """The adapted layers' factors for ``key`` stacked, as installed now (see ``_stack_id``)."""
        cached = self._stacks.get(stack_id)
        if cached is not None:
            with contextlib.suppress(KeyError):  # dropped meanwhile by an uninstall
                self._stacks.move_to_end(stack_id)
            return cached[1]
        tables = [getattr(self._linears[name], _WEIGHTS_ATTR) for name in list(self._patched)]
        spare = None
        if len(self._stacks) >= STACKS_KEPT:  # the oldest set goes; the new one is built in its buffer
            with contextlib.suppress(KeyError):
                spare = self._stacks.popitem(last=False)[1][2]
        stacked, flat = build_stacks(tables, key, spare)
        self._stacks[stack_id] = (key, stacked, flat)
        return stacked

    def _stack_id(self, key: tuple[int, ...]) -> int:
        """A number for ``key`` as installed now (a new one once any of its adapters is reinstalled)."""
        versions = tuple(self._installs.get(i, -1) for i in key)
        stack_id = self._stack_ids.get((key, versions))
        if stack_id is not None:
            self._stack_ids.move_to_end((key, versions))
        else:
            stack_id = self._stack_ids[(key, versions)] = next(self._serial)
            while len(self._stack_ids) > _STACK_IDS_KEPT:
                self._stack_ids.popitem(last=False)
        return stack_id

    # ------------------------------------------------------------------ loading (the core's calls)

    def check(self, adapter: AdapterRef) -> None:
        """Refuse an adapter for layers this model does not have (a 400 naming ``src``)."""
        missing = [module for module in adapter.modules if module not in self._linears]
        if missing:
            raise BadRequestError(
                f"adapter {adapter.name!r} targets unknown layers {missing[:5]}", param="src"
            )

    def _read(self, adapter: AdapterRef) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module -> (A^T ``[in, r]``, ``(scaling * B)^T`` ``[r, out]``), all in one host buffer
        (:func:`flat_blocks`): A is transposed and B scaled and transposed once here, not at each
        install (the layouts the fused pass and the stacks read)."""
        from safetensors.torch import load_file

        raw = load_file(str(Path(adapter.path) / "adapter_model.safetensors"), device="cpu")
        pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for module in adapter.modules:
            key = _PEFT_PREFIX + module if _PEFT_PREFIX + module + ".lora_A.weight" in raw else module
            pairs[module] = (raw[f"{key}.lora_A.weight"], raw[f"{key}.lora_B.weight"])
        shapes: list[tuple[int, ...]] = []
        for a, b in pairs.values():
            shapes += [(a.shape[1], a.shape[0]), (b.shape[1], b.shape[0])]
        blocks = iter(flat_blocks(shapes, self.dtype, torch.device("cpu"))[0])
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for module, (a, b) in pairs.items():
            a_host, bt_host = next(blocks), next(blocks)
            a_host.copy_(a.t())
            bt_host.copy_(b.t()).mul_(adapter.scaling)
            factors[module] = (a_host, bt_host)
        return factors

    def host_weights(self, adapter: AdapterRef) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The adapter's factors in host memory (read from disk when not cached)."""
        cached = self._host.get(adapter.int_id)
        if cached is not None:
            self._host.move_to_end(adapter.int_id)
            return cached
        weights = self._read(adapter)
        self._host[adapter.int_id] = weights
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
        return weights

    def forget(self, adapter_id: int) -> None:
        """Drop an adapter's host copy (it was removed)."""
        self._host.pop(adapter_id, None)

    def install(self, adapter: AdapterRef) -> None:
        """Put the adapter's factors in its layers (its requests may run from now on)."""
        started = time.perf_counter()
        weights = self.host_weights(adapter)
        on_device = weights
        if self.device.type != "cpu":  # one buffer on the device too (the host copy serves the CPU)
            shapes = [t.shape for pair in weights.values() for t in pair]
            blocks = iter(flat_blocks(shapes, self.dtype, self.device)[0])
            on_device = {
                name: (next(blocks).copy_(a, non_blocking=True), next(blocks).copy_(bt, non_blocking=True))
                for name, (a, bt) in weights.items()
            }
        for module_name, factors in on_device.items():
            linear = self._linears[module_name]
            if module_name not in self._patched:
                setattr(linear, _WEIGHTS_ATTR, {})
                setattr(linear, _SLOT_ATTR, len(self._patched))
                linear._lmforge_runtime = self  # type: ignore[assignment]
                linear.forward = types.MethodType(_lora_forward, linear)  # type: ignore[method-assign]
                self._patched.append(module_name)
            table: dict[int, Factors] = getattr(linear, _WEIGHTS_ATTR)
            table[adapter.int_id] = factors
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._installs[adapter.int_id] = next(self._serial)  # only now may a step stack it
        self.last_load_ms = (time.perf_counter() - started) * 1000

    def uninstall(self, adapter_id: int) -> None:
        self._installs.pop(adapter_id, None)
        for name in list(self._patched):
            getattr(self._linears[name], _WEIGHTS_ATTR).pop(adapter_id, None)
        for stack_id, (key, _, _) in list(self._stacks.items()):
            if adapter_id in key:  # it would only hold memory (a step in flight keeps its own reference)
                self._stacks.pop(stack_id, None)
        for stack_id, table in list(self._tables.items()):
            if adapter_id in table.key:  # the same: the table holds the adapter's factors
                self._tables.pop(stack_id, None)
