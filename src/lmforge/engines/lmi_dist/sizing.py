"""Sizing of the paged KV cache from the config and the machine's memory.

transformers' continuous batching sizes itself from a share of *all* memory when left alone (on a
CPU box: ~20 s and ~8 GiB for a 1 M-parameter model), so LMI-Dist always passes explicit numbers.
Its batch IO also keeps an fp32 attention mask of ``max_batch_tokens x (cache tokens +
max_batch_tokens)``, which this plan counts as part of the cache's cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmforge.engines.memory import DEFAULT_MEMORY_SHARE, available_memory_bytes, kv_bytes_per_token
from lmforge.errors import LmforgeError

__all__ = ["DEFAULT_MEMORY_SHARE", "CachePlanError", "KvCachePlan", "kv_bytes_per_token", "plan_kv_cache"]

PAGE_SIZE = 64
DEFAULT_PREFILL_TOKENS = 512


class CachePlanError(LmforgeError):
    kind = "model_error"


@dataclass(frozen=True)
class KvCachePlan:
    page_size: int
    num_blocks: int
    max_batch_tokens: int
    bytes_per_token: int
    """KV bytes for one token across all layers."""

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.page_size

    @property
    def total_bytes(self) -> int:
        mask = 4 * self.max_batch_tokens * (self.capacity_tokens + self.max_batch_tokens)
        return self.capacity_tokens * self.bytes_per_token + mask


def plan_kv_cache(
    *,
    bytes_per_token: int,
    max_model_len: int,
    max_batch_size: int,
    prefill_tokens: int | None = None,
    memory_budget_bytes: int | None = None,
    available_bytes: int | None = None,
    page_size: int = PAGE_SIZE,
) -> KvCachePlan:
    """Choose ``num_blocks`` and ``max_batch_tokens``.

    Wanted: room for ``max_batch_size`` sequences of ``max_model_len`` tokens. With an explicit
    budget (``option.kv_cache_memory_mb``) the cache fills that budget; otherwise it takes what it
    wants up to :data:`DEFAULT_MEMORY_SHARE` of the available memory. Either way it must hold one
    full-length sequence, or starting fails with a message naming the options to change.
    """
    batch_tokens = prefill_tokens or min(DEFAULT_PREFILL_TOKENS, max(page_size, max_model_len))
    per_token = bytes_per_token + 4 * batch_tokens  # KV + this token's column of the attention mask
    fixed = 4 * batch_tokens * batch_tokens
    needed_blocks = math.ceil(max_model_len / page_size) + 1  # one full sequence, plus a partial page
    wanted_tokens = max(max_batch_size * max_model_len, needed_blocks * page_size)
    if memory_budget_bytes is not None:
        tokens = max(0, memory_budget_bytes - fixed) // per_token
        limit_name = "option.kv_cache_memory_mb"
    else:
        avail = available_memory_bytes() if available_bytes is None else available_bytes
        budget_tokens = max(0, int(avail * DEFAULT_MEMORY_SHARE) - fixed) // per_token
        tokens = min(wanted_tokens, budget_tokens)
        limit_name = "available memory"
    num_blocks = tokens // page_size
    if num_blocks < needed_blocks:
        need_mb = math.ceil((needed_blocks * page_size * per_token + fixed) / 2**20)
        raise CachePlanError(
            f"the KV cache ({limit_name}) holds {num_blocks * page_size} tokens, less than one sequence of "
            f"option.max_model_len={max_model_len} tokens; lower option.max_model_len or give "
            f"option.kv_cache_memory_mb >= {need_mb}"
        )
    return KvCachePlan(
        page_size=page_size,
        num_blocks=num_blocks,
        max_batch_tokens=batch_tokens,
        bytes_per_token=bytes_per_token,
    )
