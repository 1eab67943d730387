from __future__ import annotations

import pytest
import torch

from lmforge.engines.lmi_dist.attention import _per_request, _per_request_pays


def dense_reference(q, k, v, cu_q, cu_k, groups):  # type: ignore[no-untyped-def]
    """Block-diagonal causal mask over the packed batch: what transformers' CB computes densely."""
    mask = torch.zeros(q.shape[2], k.shape[2], dtype=torch.bool)
    for i in range(len(cu_q) - 1):
        ql, kl = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        mask[cu_q[i] : cu_q[i + 1], cu_k[i] : cu_k[i + 1]] = torch.ones(ql, kl, dtype=torch.bool).tril(
            kl - ql
        )
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=groups > 1)


def test_per_request_equals_dense_block_diagonal_attention() -> None:
    torch.manual_seed(0)
    # a decode row, a first prefill, a later chunk of a chunked prefill, another decode row
    q_lens, k_lens = [1, 7, 5, 1], [9, 7, 20, 3]
    cu_q = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(k_lens).cumsum(0).tolist()]
    q = torch.randn(1, 4, cu_q[-1], 16)
    k = torch.randn(1, 2, cu_k[-1], 16)
    v = torch.randn(1, 2, cu_k[-1], 16)
    ours = _per_request(q, k, v, cu_q, cu_k, None, True)
    ref = dense_reference(q, k, v, cu_q, cu_k, groups=2)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_dense_is_kept_when_it_wastes_little() -> None:
    assert not _per_request_pays([0, 1, 2], [0, 10, 20])  # two short decode rows
    # the same layout with wide heads (a real model: 9 heads of 64) wastes more per product
    cu_q, cu_k = [0, 8, 16], [0, 250, 500]
    assert not _per_request_pays(cu_q, cu_k, (1, 4, 32, 32))
    assert _per_request_pays(cu_q, cu_k, (1, 9, 32, 64))
    assert _per_request_pays([0, *range(1, 33)], [0, *range(500, 500 * 33, 500)])  # 32 rows x 500 keys


def _scattered_cache(
    k_lens: list[int], heads: int, kv_heads: int, dim: int, n_slots: int
) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed queries/keys/values of requests with ``k_lens`` keys, the keys also held by a cache
    [n_slots, kv heads, dim] at scattered slots; returns (cu_k, q, k, v, k_cache, v_cache, slots
    [rows, longest], 0 past a row's keys)."""
    cu_k = [0, *torch.tensor(k_lens).cumsum(0).tolist()]
    rows = len(k_lens)
    q = torch.randn(1, heads, rows, dim) * 2
    k = torch.randn(1, kv_heads, cu_k[-1], dim)
    v = torch.randn(1, kv_heads, cu_k[-1], dim)
    slots_of = torch.randperm(n_slots)[: cu_k[-1]]
    k_cache = torch.zeros(n_slots, kv_heads, dim)
    v_cache = torch.zeros(n_slots, kv_heads, dim)
    k_cache[slots_of] = k[0].transpose(0, 1)
    v_cache[slots_of] = v[0].transpose(0, 1)
    slots = torch.zeros(rows, max(k_lens), dtype=torch.long)
    for i, n in enumerate(k_lens):
        slots[i, :n] = slots_of[cu_k[i] : cu_k[i] + n]
    return cu_k, q, k, v, k_cache, v_cache, slots


def test_batched_decode_equals_per_request_attention() -> None:
    """Decode rows against keys read from their cache slots, the query heads of a key head grouped:
    the same as one call per request over packed keys."""
    from lmforge.engines.lmi_dist.attention import _decode_batch

    torch.manual_seed(1)
    k_lens = [9, 1, 30, 4, 17]
    rows, heads, kv_heads = len(k_lens), 6, 3
    cu_k, q, k, v, k_cache, v_cache, slots = _scattered_cache(k_lens, heads, kv_heads, 8, 200)
    mask = torch.zeros(rows, 1, 1, slots.shape[1], dtype=torch.bool)
    for i, n in enumerate(k_lens):
        mask[i, ..., :n] = True
    ours = _decode_batch(q[0], k_cache, v_cache, slots.reshape(-1), mask, None, heads // kv_heads)
    ref = _per_request(q, k, v, list(range(rows + 1)), cu_k, None, True)[0]
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("portable", [False, True], ids=["native", "portable"])
@pytest.mark.parametrize("dim", [64, 12])
def test_c_decode_attention_equals_sdpa_and_each_row_is_its_own(portable: bool, dim: int) -> None:
    """The C decode attention (attention_kernel.c), read in place from scattered cache slots, equals
    one SDPA call per request to float rounding, on the vector path and the portable one, for a head
    size that is a multiple of 8 and one that is not; each row gives the same bits alone as in the
    batch; and a slot outside the cache is refused before anything is read."""
    from lmforge.engines.lmi_dist import attention

    kernel = attention._decode_kernel()
    if kernel is None:
        pytest.skip("the C library was not built")
    torch.manual_seed(2)
    k_lens = [9, 1, 30, 4, 17, 8, 130]
    rows, heads, kv_heads = len(k_lens), 9, 3
    cu_k, q, k, v, k_cache, v_cache, slots = _scattered_cache(k_lens, heads, kv_heads, dim, 400)
    lengths = torch.tensor(k_lens)
    scale = dim**-0.5
    kernel.force_portable(portable)
    try:
        ours = kernel(q[0], k_cache, v_cache, slots.reshape(-1), lengths, scale)
        ref = _per_request(q, k, v, list(range(rows + 1)), cu_k, None, True)[0]
        torch.testing.assert_close(ours, ref, atol=2e-6, rtol=2e-5)
        for i in range(rows):
            n = k_lens[i]
            alone = kernel(
                q[0, :, i : i + 1], k_cache, v_cache, slots[i, :n].contiguous(), lengths[i : i + 1], scale
            )
            assert torch.equal(alone[:, 0], ours[:, i]), f"row {i} alone differs"
    finally:
        kernel.force_portable(False)
    bad = slots.clone()
    bad[2, 3] = 400
    with pytest.raises(ValueError, match="out of range"):
        kernel(q[0], k_cache, v_cache, bad.reshape(-1), lengths, scale)


def _step_for(q_lens: list[int], k_lens: list[int], read_index: torch.Tensor, row_wise: bool):  # type: ignore[no-untyped-def]
    from lmforge.engines.lmi_dist.attention import _plan_direct, _Step

    cu_q = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(k_lens).cumsum(0).tolist()]
    step = _Step(cu_q, cu_k)
    _plan_direct(step, read_index, row_wise)
    return step


def test_verify_rows_after_cached_keys_attend_as_decode_rows_each_with_its_own_keys() -> None:
    """A speculative step's verify rows (a few queries after cached keys) are decode rows with the
    key counts of their positions; a first prefill and a long chunk stay causal blocks; without the
    row-wise kernel the verify rows stay a block too."""
    from lmforge.engines.lmi_dist.attention import ROW_WISE_QUERIES

    # decode, verify (5 queries, 20 keys), a first prefill (7 of 7), a long chunk after cached keys
    q_lens, k_lens = [1, 5, 7, ROW_WISE_QUERIES + 1], [9, 20, 7, 60]
    read_index = torch.arange(sum(k_lens)) + 100
    step = _step_for(q_lens, k_lens, read_index, row_wise=True)
    assert step.decode_rows is not None and step.lengths is not None and step.slots is not None
    assert step.decode_rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert step.lengths.tolist() == [9, 16, 17, 18, 19, 20]
    slots = step.slots.view(6, -1)
    assert slots[2, :17].tolist() == list(range(109, 126))  # the verify request's keys, from its start
    assert [(q0, q1) for q0, q1, _ in step.prefills or ()] == [(6, 13), (13, 13 + ROW_WISE_QUERIES + 1)]
    plain = _step_for(q_lens, k_lens, read_index, row_wise=False)
    assert plain.decode_rows is not None and plain.decode_rows.tolist() == [0]
    assert [(q0, q1) for q0, q1, _ in plain.prefills or ()] == [
        (1, 6),
        (6, 13),
        (13, 13 + ROW_WISE_QUERIES + 1),
    ]


def test_verify_rows_get_the_bits_each_would_get_decoded_alone() -> None:
    """On the C kernel, each verify row's attention has the bits of the same row decoded one step at a
    time (what a W8A8 model needs for speculation to give the same answer), in a step with others."""
    from lmforge.engines.lmi_dist import attention

    if attention._decode_kernel() is None:
        pytest.skip("the C library was not built")
    torch.manual_seed(3)
    heads, kv_heads, dim, n_slots = 9, 3, 64, 300
    q_lens, k_lens = [1, 5, 1], [12, 40, 33]
    read_index = torch.randperm(n_slots)[: sum(k_lens)]
    k_cache, v_cache = torch.randn(n_slots, kv_heads, dim), torch.randn(n_slots, kv_heads, dim)
    query = torch.randn(1, heads, sum(q_lens), dim)
    step = _step_for(q_lens, k_lens, read_index, row_wise=True)
    out = attention._attend_direct(query, k_cache, v_cache, step, None, heads // kv_heads)
    for j in range(5):  # verify row j: position 35 + j of the second request, alone
        alone = _step_for([1], [36 + j], read_index[12 : 12 + 36 + j], row_wise=True)
        got = attention._attend_direct(query[:, :, 1 + j : 2 + j], k_cache, v_cache, alone, None, 3)
        assert torch.equal(got[0, :, 0], out[0, :, 1 + j]), f"verify row {j}"
