"""Per-request LoRA adapters inside LMI-Dist's continuous batch: the engine core's side (layers and
weights); which adapters are resident is decided by the frontend (:mod:`.lora_slots`).

transformers' continuous batching applies one adapter (PEFT's active one) to the whole batch. LMI-Dist
instead gives every request its own adapter, in the same forward pass:

* each adapted ``nn.Linear`` keeps its module and weights and gets a forward that adds, for every
  adapter present in the step, ``(x_rows @ A.T) @ (scaling * B).T`` to that adapter's token rows only
  (PEFT's formula with the scaling folded into B; greedy tokens equal PEFT's, which the tests check);
* which token rows belong to which adapter is computed once per step from the batch's requests (each
  carries its adapter id as a logits-processor kwarg) by :meth:`LoraLayers.on_batch`, called by the
  logits-processor list while transformers prepares the step's tensors;
* at most ``max_loras`` adapters are resident (installed in the layers) at once; a request for another
  adapter waits until a resident one is idle and is evicted (least recently used first). Loaded weights
  stay in host memory for up to ``max_cpu_loras`` adapters; others are read again from their
  safetensors file when needed.

Adapter ids are never reused, so a late step that still names an evicted or removed adapter finds no
weights and adds nothing (that request was cancelled); it can never pick up another adapter's weights.
"""

from __future__ import annotations

import logging
import time
import types
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmforge.engines.lmi_dist.cpu_linear import base_linear
from lmforge.errors import BadRequestError

if TYPE_CHECKING:
    from lmforge.engines.lmi_dist.ipc import AdapterRef

log = logging.getLogger("lmforge.engines.lmi_dist")

LORA_KWARG = "lmforge_lora"
_WEIGHTS_ATTR = "_lmforge_lora"
_PEFT_PREFIX = "base_model.model."

Factors = tuple[torch.Tensor, torch.Tensor]
"""(A [r, in], scaling * B [out, r]) of one layer."""


def _lora_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    out = base_linear(self, x)
    runtime: LoraLayers | None = getattr(self, "_lmforge_runtime", None)
    groups = runtime.groups if runtime is not None else ()
    if not groups:
        return out
    table: dict[int, Factors] = getattr(self, _WEIGHTS_ATTR)
    flat_x = x.reshape(-1, x.shape[-1])
    flat_out = out.view(-1, out.shape[-1])
    if groups[0][1] is not None and runtime is not None and flat_x.shape[0] == runtime.tokens:
        # Mixed batch: one pass for all adapters. x @ [A_1; A_2; ...].T gives every adapter's rank
        # block for every row; the mask keeps each row's own block (times its scaling), and the
        # product with [B_1 B_2 ...].T adds exactly that adapter's delta: 3 matmul-sized ops per
        # layer instead of 3 per adapter present.
        present = tuple(i for i in runtime.key if i in table)
        if not present:
            return out
        stack = _stack(self, table, present, runtime.key)
        a_cat, b_cat, cols = stack
        mask = runtime.onehot.index_select(1, cols)
        flat_out.addmm_((flat_x @ a_cat.t()) * mask, b_cat.t())
        return out
    for adapter_id, rows in groups:
        if rows is _LAZY_ROWS and runtime is not None:
            rows = torch.nonzero(runtime.per_token == adapter_id).squeeze(1).to(flat_x.device)
        factors = table.get(adapter_id)
        if factors is None:
            continue  # the adapter does not touch this layer (or was evicted after a cancel)
        a, b = factors
        if rows is None:
            flat_out.addmm_(flat_x @ a.t(), b.t())  # out += (x A^T) (s B)^T, accumulated in place
        else:
            flat_out.index_add_(0, rows, (flat_x.index_select(0, rows) @ a.t()) @ b.t())
    return out


_STACKS_KEPT = 8
_LAZY_ROWS = torch.empty(0, dtype=torch.long)
"""Marks a mixed step's groups: rows are computed only if the per-adapter path runs."""


def _stack(
    linear: torch.nn.Linear, table: dict[int, Factors], present: tuple[int, ...], key: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[A_i] stacked on the rank axis, [s_i B_i] on
    theirs, and for every stacked rank column the index of its adapter in ``key`` (cached per set)."""
    cache: OrderedDict[tuple[tuple[int, ...], tuple[int, ...]], Any] = linear.__dict__.setdefault(
        "_lmforge_stacks", OrderedDict()
    )
    entry = cache.get((present, key))
    if entry is not None:
        return entry  # type: ignore[no-any-return]
    a_cat = torch.cat([table[i][0] for i in present], dim=0)
    b_cat = torch.cat([table[i][1] for i in present], dim=1)
    cols = torch.cat(
        [torch.full((table[i][0].shape[0],), key.index(i), dtype=torch.long) for i in present]
    ).to(a_cat.device)
    entry = (a_cat, b_cat, cols)
    cache[(present, key)] = entry
    while len(cache) > _STACKS_KEPT:
        cache.popitem(last=False)
    return entry


class LoraLayers:
    """The engine core's side: the model's adaptable layers, the adapters installed in them, the
    host-memory cache of adapter weights, and each step's rows per adapter."""

    def __init__(self, model: torch.nn.Module, max_cpu_loras: int) -> None:
        self.model = model
        self.max_cpu_loras = max(max_cpu_loras, 1)
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.groups: tuple[tuple[int, torch.Tensor | None], ...] = ()
        """Set on the generation thread before each forward: (adapter id, token rows or None = all)."""
        self.key: tuple[int, ...] = ()
        """The adapter ids present in the step (sorted), for a mixed step."""
        self.onehot = torch.zeros(0, 0)
        """[tokens, len(key)]: 1 where a token row belongs to ``key[j]``, for a mixed step."""
        self.tokens = 0
        self.per_token = torch.zeros(0, dtype=torch.long)
        """The adapter id of every token row of a mixed step."""
        self._linears: dict[str, torch.nn.Linear] = {
            name: mod
            for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and not name.endswith("lm_head")
        }
        self._patched: set[str] = set()
        self._host: OrderedDict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self.last_load_ms = 0.0

    def layers(self) -> dict[str, tuple[int, int]]:
        return {name: (m.in_features, m.out_features) for name, m in self._linears.items()}

    def stats(self) -> dict[str, float]:
        return {"lora_host_cached": float(len(self._host))}

    # ------------------------------------------------------------------ generation thread

    def on_batch(self, requests_in_batch: list[Any]) -> None:
        """Group the step's token rows by adapter (called before the step's forward)."""
        ids: list[int] = []
        lengths: list[int] = []
        for future in requests_in_batch:
            ids.append(int(future.state.logit_processor_kwargs.get(LORA_KWARG, 0)))
            lengths.append(int(future.query_length))
        present = {i for i in ids if i > 0}
        if not present:
            self.groups = ()
            return
        if len(present) == 1 and 0 not in ids:
            self.groups = ((present.pop(), None),)
            return
        per_token = torch.repeat_interleave(torch.tensor(ids), torch.tensor(lengths))
        key = tuple(sorted(present))
        # rows per adapter only for the (rare) per-adapter path; the stacked path needs the one-hot only
        groups = [(adapter_id, _LAZY_ROWS) for adapter_id in key]
        self.per_token = per_token
        self.key = key
        self.tokens = int(per_token.numel())
        self.onehot = (per_token.unsqueeze(1) == torch.tensor(key).unsqueeze(0)).to(self.device, self.dtype)
        self.groups = tuple(groups)

    # ------------------------------------------------------------------ loading (the core's calls)

    def check(self, adapter: AdapterRef) -> None:
        """Refuse an adapter for layers this model does not have (a 400 naming ``src``)."""
        missing = [module for module in adapter.modules if module not in self._linears]
        if missing:
            raise BadRequestError(
                f"adapter {adapter.name!r} targets unknown layers {missing[:5]}", param="src"
            )

    def _read(self, adapter: AdapterRef) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        from safetensors.torch import load_file

        raw = load_file(str(Path(adapter.path) / "adapter_model.safetensors"), device="cpu")
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for module in adapter.modules:
            key = _PEFT_PREFIX + module if _PEFT_PREFIX + module + ".lora_A.weight" in raw else module
            a = raw[f"{key}.lora_A.weight"].to(self.dtype)
            b = raw[f"{key}.lora_B.weight"].to(self.dtype)
            factors[module] = (a, b)
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
        for module_name, (a, b) in weights.items():
            linear = self._linears[module_name]
            if module_name not in self._patched:
                setattr(linear, _WEIGHTS_ATTR, {})
                linear._lmforge_runtime = self  # type: ignore[assignment]
                linear.forward = types.MethodType(_lora_forward, linear)  # type: ignore[method-assign]
                self._patched.add(module_name)
            table: dict[int, Factors] = getattr(linear, _WEIGHTS_ATTR)
            table[adapter.int_id] = (
                a.to(self.device, non_blocking=True),
                (b * adapter.scaling).to(self.device, non_blocking=True),
            )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_load_ms = (time.perf_counter() - started) * 1000

    def uninstall(self, adapter_id: int) -> None:
        for name in self._patched:
            getattr(self._linears[name], _WEIGHTS_ATTR).pop(adapter_id, None)
