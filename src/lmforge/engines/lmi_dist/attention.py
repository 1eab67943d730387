"""Per-request ("varlen") attention for transformers' continuous batching.

Without flash attention, transformers 5.19 packs every request of a step into one sequence and runs
a single dense SDPA of all query tokens against the keys of *all* requests, under a block-diagonal
mask. A decode step then costs O(batch x total context) instead of O(total context), and long prompts
with many concurrent requests slow down quadratically.

:func:`install` registers, under the ``sdpa`` name that continuous batching uses, a function that
keeps the stock path for everything except paged-cache calls, where each request attends to its own
keys only:

* the step's new keys and values are written to the paged cache, and each request's keys are read
  from their cache slots directly (transformers would first copy every request's keys into one packed
  tensor, a second copy of the whole context per layer);
* the decode rows of a step (one query each: all rows of most steps under load) attend in one batched
  call: their keys are gathered into a padded ``[rows, kv heads, longest, dim]`` block under a padding
  mask, and the query heads that share a key head are that head's queries (no copy of the keys per
  query head), so a layer makes a handful of calls, not one per request;
* prefill rows (a prompt, or a chunk of one) attend per request, causal with the right offset;
  on the C kernel below, a request's few queries after cached keys (a speculative step's verify rows,
  up to :data:`ROW_WISE_QUERIES`) are decode rows instead, each with the keys up to its position, so
  they get the bits one-at-a-time decoding gets;
* what a step's layout implies (lengths, cache slots, masks) is worked out once, at layer 0, and
  reused by every later layer of the same forward pass (on CUDA that is also one host sync per step
  instead of one per layer).

A step with nothing in the cache yet (prompts only) and models with several attention kinds keep
transformers' packed read and attend per request. On a GPU one dense call over the packed batch is
kept where it wastes little (few, short requests), as one call is cheaper than many there; on a CPU
never: its rounding depends on the other prompts of the step, and a request's prompt log-probs would
then change in a crowd (the same-answer harness caught it on W8A8 with LoRA adapters).

Float32 decode rows on a CPU attend on the C kernel of ``attention_kernel.c`` (:class:`DecodeKernel`):
each row's keys and values read in place through its slot list, no gathered copy, each row computed
on its own (batch-invariant); measured on SmolLM2-135M W8A8 at 32 rows, 146 -> 201 tok/s through
``lmforge serve``. Elsewhere (no C library, another dtype, a GPU) the gather + SDPA above.

Models with sliding-window layers keep the stock path, whose mask encodes the window.

On CUDA the attention calls exclude PyTorch's cuDNN attention backend: it builds a new execution
plan for every new key length, i.e. at every decode step (measured on an H100: ~40 ms per step for a
174 M-parameter model, against a few ms with the flash / memory-efficient kernels).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from lmforge.config.speculative import MAX_SPECULATIVE_TOKENS

log = logging.getLogger("lmforge.engines.lmi_dist")
_INSTALLED = False
_GPU_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

#: Query-key products the dense path may waste per request before one call per request is cheaper,
#: for a product of 128 multiply-adds (heads x head dim; each call costs some fixed overhead; measured
#: on CPU with bench/lmi_dist_attention.py on the tiny example model, 4 heads of 32)
WASTE_PER_CALL = 4096
_WASTE_WIDTH = 128
#: most queries of one request that attend row by row on the C kernel when keys before them are cached:
#: a speculative step's verify rows (the last token and up to the cap of drafts)
ROW_WISE_QUERIES = MAX_SPECULATIVE_TOKENS + 1


@dataclass
class _Step:
    """One forward pass's layout, worked out at its first layer."""

    cu_q: list[int]
    cu_k: list[int]
    direct: bool = False
    """Read keys from their cache slots (one full-attention cache, something cached to read)."""
    decode_rows: torch.Tensor | None = None
    """The query rows of the requests with one query (decode rows), in request order."""
    slots: torch.Tensor | None = None
    """[decode rows x longest], flat: each decode row's key slots in the cache, padding repeating a
    slot (flat for ``index_select``, 3-5x faster here than indexing with a 2-D index)."""
    mask: torch.Tensor | None = None
    """[decode rows, 1, 1, longest]: True at the row's own keys."""
    lengths: torch.Tensor | None = None
    """[decode rows] int64: each decode row's number of keys (for the C kernel)."""
    prefills: list[tuple[int, int, torch.Tensor]] | None = None
    """Requests with several queries: (first query row, end row, their key slots)."""


_step: _Step | None = None


def _layout(module: torch.nn.Module, cache: Any, kwargs: dict[str, Any], row_wise: bool) -> _Step:
    """The current step's layout: worked out at layer 0 (or when the batch says it is another step),
    then reused by the later layers of the same forward pass. Reads the kwargs before the cache
    update narrows them to this layer's attention kind. ``row_wise``: the step's float32 CPU rows
    attend on the C kernel, where a short run of queries after cached keys is decode rows too."""
    global _step
    cu_seq_q = kwargs["cu_seq_lens_q"]
    step = _step
    if step is not None and getattr(module, "layer_idx", 0) != 0 and len(step.cu_q) == cu_seq_q.shape[0]:
        return step
    allocator = cache.layer_to_allocator[module.layer_idx]
    cu_seq_k = kwargs["cu_seq_lens_k"]
    if isinstance(cu_seq_k, dict):
        cu_seq_k = cu_seq_k[allocator.layer_type]
    read_index = kwargs["read_index"][allocator.index] if kwargs.get("read_index") else None
    step = _Step(cu_seq_q.tolist(), cu_seq_k.tolist())
    single_kind = len(set(cache.layer_to_allocator.values())) == 1
    if (
        single_kind
        and hasattr(allocator, "_kv_token_views")
        and read_index is not None
        and read_index.numel()
    ):
        _plan_direct(step, read_index, row_wise)
    _step = step
    return step


def _plan_direct(step: _Step, read_index: torch.Tensor, row_wise: bool) -> None:
    """Which query rows attend as decode rows (each on its own, with its number of keys) and which
    requests attend as one causal block. With ``row_wise``, a request's few queries after keys already
    in the cache (a speculative step's verify rows: the last token and its drafts) are decode rows
    too, row j seeing the keys up to its own position: the same call, hence the same bits, as if each
    had come one step at a time; else the block's SDPA rounds them otherwise, and a W8A8 model, whose
    per-token quantization turns the last bit into a different int8 value, would then answer
    differently with speculation on."""
    device = read_index.device
    step.direct = True
    step.prefills = []
    rows: list[int] = []
    starts: list[int] = []
    lengths: list[int] = []
    cu_q, cu_k = step.cu_q, step.cu_k
    for i in range(len(cu_q) - 1):
        q0, q_len, k0, k_len = cu_q[i], cu_q[i + 1] - cu_q[i], cu_k[i], cu_k[i + 1] - cu_k[i]
        if q_len == 1 or (row_wise and 1 < q_len <= ROW_WISE_QUERIES < k_len):
            rows.extend(range(q0, q0 + q_len))
            starts.extend([k0] * q_len)
            lengths.extend(range(k_len - q_len + 1, k_len + 1))
        elif q_len > 1:
            step.prefills.append((q0, q0 + q_len, read_index[k0 : k0 + k_len]))
    if not rows:
        return
    start = torch.tensor(starts, device=device)
    length = torch.tensor(lengths, device=device)
    longest = max(lengths)
    offsets = torch.arange(longest, device=device)
    valid = offsets.unsqueeze(0) < length.unsqueeze(1)
    positions = torch.where(valid, start.unsqueeze(1) + offsets, start.unsqueeze(1))
    step.slots = read_index[positions].reshape(-1).long()
    step.mask = valid[:, None, None, :]
    step.lengths = length
    step.decode_rows = torch.tensor(rows, device=device)


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
    row_wise = query.dtype == torch.float32 and query.device.type == "cpu" and _decode_kernel() is not None
    step = _layout(module, cache, kwargs, row_wise)
    groups = getattr(module, "num_key_value_groups", 1)
    backends = sdpa_kernel(_GPU_BACKENDS) if query.device.type == "cuda" else contextlib.nullcontext()
    with backends:
        if step.direct:
            k_cache, v_cache = _write(cache, module.layer_idx, key, value, kwargs)
            out = _attend_direct(query, k_cache, v_cache, step, scaling, groups)
        else:
            key, value = cache.update(
                key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs
            )
            cu_q, cu_k = step.cu_q, step.cu_k
            dense = query.device.type != "cpu" and attention_mask is not None  # see the module notes
            if dense and not _per_request_pays(cu_q, cu_k, query.shape):
                out = F.scaled_dot_product_attention(
                    query, key, value, attn_mask=attention_mask, scale=scaling, enable_gqa=groups > 1
                )
            else:
                out = _per_request(query, key, value, cu_q, cu_k, scaling, groups > 1)
    if out.shape[2] < query.shape[2]:  # padded query rows (static shapes): keep the layout
        pad = query.new_zeros(query.shape[0], query.shape[1], query.shape[2] - out.shape[2], query.shape[3])
        out = torch.cat([out, pad], dim=2)
    return out.transpose(1, 2).contiguous(), None


def _write(
    cache: Any, layer_idx: int, key: torch.Tensor, value: torch.Tensor, kwargs: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the step's new keys and values ([1, kv heads, rows, dim]) into their cache slots; return
    the layer's cache as [slots, kv heads, dim] views."""
    allocator = cache.layer_to_allocator[layer_idx]
    k_cache, v_cache = allocator._kv_token_views[layer_idx]
    write_index = kwargs["write_index"][allocator.index]
    k_cache.index_copy_(0, write_index, key[0].transpose(0, 1))
    v_cache.index_copy_(0, write_index, value[0].transpose(0, 1))
    return k_cache, v_cache


def _attend_direct(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    step: _Step,
    scaling: float | None,
    groups: int,
) -> torch.Tensor:
    """Every request's queries against its own keys, read from the cache: [1, heads, rows, dim]."""
    rows = step.cu_q[-1]
    out = query.new_empty(1, query.shape[1], rows, query.shape[3])
    if step.decode_rows is not None and step.slots is not None and step.mask is not None:
        decode_q = query[0, :, step.decode_rows]
        kernel = _decode_kernel() if query.dtype == torch.float32 and query.device.type == "cpu" else None
        if (
            kernel is not None
            and step.lengths is not None
            and k_cache.is_contiguous()
            and v_cache.is_contiguous()
        ):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            out[0, :, step.decode_rows] = kernel(decode_q, k_cache, v_cache, step.slots, step.lengths, scale)
        else:
            out[0, :, step.decode_rows] = _decode_batch(
                decode_q, k_cache, v_cache, step.slots, step.mask, scaling, groups
            )
    for q0, q1, slots in step.prefills or ():
        q_len, k_len = q1 - q0, slots.shape[0]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
        out[:, :, q0:q1] = F.scaled_dot_product_attention(
            query[:, :, q0:q1],
            k_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0),
            v_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            scale=scaling,
            enable_gqa=groups > 1,
        )
    return out


def _decode_batch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    mask: torch.Tensor,
    scaling: float | None,
    groups: int,
) -> torch.Tensor:
    """One query per row ([heads, rows, dim]), each against its own keys: [heads, rows, dim] out.

    The ``groups`` query heads that share a key head attend as that head's ``groups`` queries, so the
    keys are never repeated per query head."""
    heads, rows, dim = query.shape
    q = query.transpose(0, 1).reshape(rows, heads // groups, groups, dim)  # [rows, kv heads, groups, dim]
    shape = (rows, -1, k_cache.shape[1], dim)
    k = k_cache.index_select(0, slots).view(shape).transpose(1, 2)  # [rows, kv heads, longest, dim]
    v = v_cache.index_select(0, slots).view(shape).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, dim).transpose(0, 1)


class DecodeKernel:
    """``lmforge_decode_attention`` of the C library (attention_kernel.c): the decode rows' attention
    read in place from the cache, each row on its own (batch-invariant)."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.lmforge_decode_attention.restype = ctypes.c_int
        lib.lmforge_decode_attention.argtypes = [ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64]
        lib.lmforge_decode_attention.argtypes += [ctypes.c_float, ptr, ptr]
        lib.lmforge_attention_isa.restype = ctypes.c_int
        lib.lmforge_attention_force_portable.argtypes = [ctypes.c_int]
        self._lib = lib
        self._call = lib.lmforge_decode_attention

    def isa(self) -> str:
        return {1: "portable C", 2: "AVX2+FMA"}.get(self._lib.lmforge_attention_isa(), "?")

    def force_portable(self, portable: bool) -> None:
        self._lib.lmforge_attention_force_portable(1 if portable else 0)

    def __call__(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """``query`` [heads, rows, dim] float32; the caches [slots, kv heads, dim], contiguous;
        ``slots`` the rows' key slots, flat [rows x longest] int64; ``lengths`` [rows] int64."""
        heads, rows, dim = query.shape
        query = query.contiguous()
        longest = slots.numel() // max(rows, 1)
        kv_heads = k_cache.shape[1]
        out = torch.empty_like(query)
        scores = torch.empty(max(heads // kv_heads, 1) * max(longest, 1))
        status = self._call(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], slots.data_ptr(),
            lengths.data_ptr(), rows, longest, heads, kv_heads, dim, scale, out.data_ptr(), scores.data_ptr(),
        )  # fmt: skip
        if status != 0:
            raise ValueError(f"decode attention: a slot or length out of range ({rows} rows, {longest} keys)")
        return out


@functools.cache
def _decode_kernel() -> DecodeKernel | None:
    """The C decode attention, loaded once (None without the C library: PyTorch's gather + SDPA)."""
    from lmforge.engines.lmi_dist import lora_kernel

    lib, why = lora_kernel.library()
    if lib is not None and not hasattr(lib, "lmforge_decode_attention"):
        lib, why = None, "the built library predates it: reinstall lmforge"
    kernel = DecodeKernel(lib) if lib is not None else None
    if kernel is None:
        log.info("lmi-dist: decode attention on PyTorch's gather + SDPA (the C kernel: %s)", why)
    else:
        log.info("lmi-dist: float32 CPU decode attention on the C kernel (%s), read in place", kernel.isa())
    return kernel


def _per_request_pays(cu_q: list[int], cu_k: list[int], shape: tuple[int, ...] = (1, 4, 0, 32)) -> bool:
    """Whether per-request calls beat one dense call, which also computes every cross-request product
    (a product costs heads x head dim multiply-adds; ``shape`` is the query's [1, heads, rows, dim])."""
    n = len(cu_q) - 1
    needed = sum((cu_q[i + 1] - cu_q[i]) * (cu_k[i + 1] - cu_k[i]) for i in range(n))
    dense = cu_q[-1] * cu_k[-1]
    return (dense - needed) * shape[1] * shape[3] > n * WASTE_PER_CALL * _WASTE_WIDTH


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
