"""Memory arithmetic every engine's KV-cache sizing shares (no engine library imported)."""

from __future__ import annotations

import os

#: Share of the memory available (after the weights) that a default-sized KV cache may take.
DEFAULT_MEMORY_SHARE = 0.4


def kv_bytes_per_token(*, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys and values of one token across all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
