"""Per-request ("varlen") attention for transformers' continuous batching on CPU.

Without flash attention, transformers 5.19 packs every request of a step into one sequence and runs
a single dense SDPA of all query tokens against the keys of *all* requests, under a block-diagonal
mask. A decode step then costs O(batch x total context) instead of O(total context), and long prompts
with many concurrent requests slow down quadratically.

:func:`install` registers, under the ``sdpa`` name that continuous batching uses, a function that
keeps the stock path for everything except paged-cache calls, where it attends each request to its
own keys only (causal with the right offset for chunked prefill), unless the dense call wastes
little (few, short requests), where one call is cheaper than many. Models with sliding-window layers
keep the stock path, whose mask encodes the window.

On CUDA the per-request calls exclude PyTorch's cuDNN attention backend: it builds a new execution
plan for every new key length, i.e. at every decode step (measured on an H100: ~40 ms per step for a
174 M-parameter model, against a few ms with the flash / memory-efficient kernels).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

_INSTALLED = False
_GPU_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def varlen_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if not isinstance(cache, PagedAttentionCache) or getattr(module, "sliding_window", None):
        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
            is_causal=is_causal, cache=cache, **kwargs,
        )  # fmt: skip
    key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    cu_q = kwargs["cu_seq_lens_q"].tolist()
    cu_k = kwargs["cu_seq_lens_k"].tolist()
    gqa = getattr(module, "num_key_value_groups", 1) > 1
    backends = sdpa_kernel(_GPU_BACKENDS) if query.device.type == "cuda" else contextlib.nullcontext()
    with backends:
        if attention_mask is not None and not _per_request_pays(cu_q, cu_k):
            out = F.scaled_dot_product_attention(
                query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=gqa
            )
        else:
            out = _per_request(query, key, value, cu_q, cu_k, scaling, gqa)
    if out.shape[2] < query.shape[2]:  # padded query rows (static shapes): keep the layout
        pad = query.new_zeros(query.shape[0], query.shape[1], query.shape[2] - out.shape[2], query.shape[3])
        out = torch.cat([out, pad], dim=2)
    return out.transpose(1, 2).contiguous(), None


#: Query-key products the dense path may waste per request before one call per request is cheaper
#: (each call costs some fixed overhead; measured on CPU with bench/lmi_dist_attention.py).
WASTE_PER_CALL = 4096


def _per_request_pays(cu_q: list[int], cu_k: list[int]) -> bool:
    """Whether per-request calls beat one dense call, which also computes every cross-request product."""
    n = len(cu_q) - 1
    needed = sum((cu_q[i + 1] - cu_q[i]) * (cu_k[i + 1] - cu_k[i]) for i in range(n))
    dense = cu_q[-1] * cu_k[-1]
    return dense - needed > n * WASTE_PER_CALL


def _per_request(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    scaling: float | None,
    gqa: bool,
) -> torch.Tensor:
    outputs = []
    for i in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        q_len, k_len = q1 - q0, k1 - k0
        if q_len == 0:
            continue
        mask = None
        if q_len > 1:  # query j sits at position k_len - q_len + j and sees keys up to it
            mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, q0:q1],
                key[:, :, k0:k1],
                value[:, :, k0:k1],
                attn_mask=mask,
                scale=scaling,
                enable_gqa=gqa,
            )
        )
    return torch.cat(outputs, dim=2)


def install() -> None:
    """Route paged-cache ``sdpa`` calls to :func:`varlen_sdpa_forward` (idempotent)."""
    global _INSTALLED
    if not _INSTALLED:
        AttentionInterface.register("sdpa", varlen_sdpa_forward)
        _INSTALLED = True
