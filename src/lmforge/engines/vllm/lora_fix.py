"""Work-around for vLLM-CPU's LoRA row aliasing (vllm-project/vllm#49656, #48421; vLLM 0.32.0 and earlier).

The bug: vLLM marks a token row that uses no adapter (a base-model request) with the LoRA slot index
``-1``. The GPU kernels skip such rows. The CPU platform's PyTorch fallback ops
(``vllm.lora.ops.torch_ops``: ``bgmv_shrink``, ``bgmv_expand``, ``bgmv_expand_slice`` and the ``sgmv_*``
ops built on them) gather the slot weights with that index as it is, and ``-1`` is ordinary negative
indexing in PyTorch: the row gets the *last* slot's adapter. So when base-model requests share a
step with LoRA requests, base rows come out with an adapter's delta (even a removed adapter's: vLLM does
not clear a slot's weights when it frees it). Batches of base requests only take a shortcut in the
prefill, but their decode steps go through the same ops.

The fix, applied by :func:`register`:

* ``register`` is a ``vllm.general_plugins`` entry point (``pyproject.toml``), so vLLM calls it in every
  one of its processes (API server, engine core, workers): patching the server process alone would
  leave the worker process, which runs the model, unfixed;
* it acts only on vLLM's CPU platform, and only when a probe of vLLM's own ``bgmv_shrink`` shows the
  aliasing (a one-row call with index -1 against two slots, microseconds): once upstream ships a fix,
  the probe comes back clean and nothing is patched, whatever the version number;
* the patched ops zero the input rows whose index is negative and gather with the index clamped to
  slot 0, then run vLLM's own op: such rows add exactly ``0`` (expand) or write ``0`` (shrink, whose
  buffer starts at zero anyway), which is what the GPU kernels' skip amounts to. No branch on the data,
  so the ops stay traceable by ``torch.compile``.

:class:`lmforge.engines.vllm.engine.VllmEngine` makes sure the plugin is allowed to load when
``VLLM_PLUGINS`` restricts vLLM's plugins. This module must stay cheap to import: vLLM imports it in
every process, before the model loads.

A second fault of the same CPU wrapper, patched here too: prompt log-probs with LoRA enabled kill the
engine (vllm-project/vllm#29955 on the CPU platform). vLLM computes a request's prompt log-probs by
running the LoRA logits processor over one row per prompt token, while
``PunicaWrapperCPU.add_lora_logits`` indexes adapters by ``sampler_indices``, one per request of the
step: with two or more requests the einsum's batch sizes differ and the worker raises. The logits
processor's adapter delta is that of an adapter's ``lm_head`` factors, and lmforge registers no adapter
with any (:mod:`lmforge.adapters.validate` accepts the base model's linear layers, ``lm_head``
excluded), so the delta is zero: the patched method leaves the logits as they are when the rows are
not the sampled ones, and runs vLLM's own otherwise.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from lmforge.engines.vllm.cpu_plugin import on_cpu

# under vLLM's logger: vLLM gives it a handler in each of its processes, with the process name in each line
log = logging.getLogger("vllm.plugins.lmforge_cpu_lora_fix")

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "lmforge_cpu_lora_fix"
_PATCHED = "__lmforge_masks_no_lora_rows__"
_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
#: Modules that hold a reference to the ops: the ops' own module (the ``sgmv_*`` ops call the ``bgmv_*``
#: ones through it), the package that re-exports them, and the CPU punica wrapper that imported them.
_MODULES = (
    "vllm.lora.ops.torch_ops.lora_ops",
    "vllm.lora.ops.torch_ops",
    "vllm.lora.punica_wrapper.punica_cpu",
)

applied = False
"""Whether this process runs with the patched ops."""


def aliases_no_lora_rows(shrink: Callable[..., Any]) -> bool:
    """True when ``shrink`` (vLLM's ``bgmv_shrink``) applies slot ``-1`` to a row instead of skipping it."""
    import torch

    weights = torch.zeros(2, 1, 1, 1)
    weights[1] = 1.0  # only the last slot is non-zero
    out = torch.zeros(1, 1)
    shrink(torch.ones(1, 1), weights, out, torch.tensor([-1]), 1.0)
    return bool(out.abs().sum().item() != 0.0)


def _masked(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op(inputs, weights, output, indices, ...)`` that leaves rows with a negative index untouched."""
    import torch

    @functools.wraps(op)
    def wrapper(inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any) -> Any:
        valid = indices >= 0
        if inputs.dim() == 2 and valid.shape[0] in (inputs.shape[0], 1):
            inputs = torch.where(valid.unsqueeze(1), inputs, inputs.new_zeros(()))
        return op(inputs, weights, output, indices.clamp(min=0), *args, **kwargs)

    setattr(wrapper, _PATCHED, True)
    return wrapper


def apply() -> bool:
    """Patch the ops in this process when they alias; True when the patched ops are in place."""
    global applied
    import importlib

    lora_ops = importlib.import_module(_MODULES[0])
    if getattr(lora_ops.bgmv_shrink, _PATCHED, False):
        applied = True
        return True
    if not aliases_no_lora_rows(lora_ops.bgmv_shrink):
        return False
    patched = {name: _masked(getattr(lora_ops, name)) for name in _OPS}
    for module_name in _MODULES:
        module = importlib.import_module(module_name)
        for name, fn in patched.items():
            if hasattr(module, name):
                setattr(module, name, fn)
    applied = True
    return True


def _skips_prompt_rows(method: Callable[..., Any]) -> Callable[..., Any]:
    """``add_lora_logits(self, y, x, ...)`` that adds nothing when ``x`` has other rows than the sampled
    ones (a prompt's log-probs: one row per token) instead of raising."""

    @functools.wraps(method)
    def wrapper(self: Any, y: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
        rows = x.reshape(-1, x.shape[-1]).shape[0]
        if rows != self.sampler_indices.shape[0]:
            return None  # no registered adapter has lm_head factors: the delta would be zero
        return method(self, y, x, *args, **kwargs)

    setattr(wrapper, _PATCHED, True)
    return wrapper


def apply_logits_fix() -> bool:
    """Patch the CPU punica wrapper's ``add_lora_logits`` in this process; True once it is in place."""
    import importlib

    wrapper_cls = importlib.import_module(_MODULES[2]).PunicaWrapperCPU
    if not getattr(wrapper_cls.add_lora_logits, _PATCHED, False):
        wrapper_cls.add_lora_logits = _skips_prompt_rows(wrapper_cls.add_lora_logits)
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point: apply the fix on vLLM's CPU platform when needed
    (when it fails, the engine sees ``applied`` false itself)."""
    on_cpu(log, _fix, "check or patch vLLM's CPU LoRA ops")


def _fix() -> None:
    if apply():
        log.info(
            "lmforge: vLLM's CPU LoRA ops alias base-model rows to the last adapter slot "
            "(vllm-project/vllm#49656); rows without an adapter are masked in this process"
        )
    apply_logits_fix()
