from __future__ import annotations

import pytest

from lmforge.engines.lmi_dist.sizing import CachePlanError, kv_bytes_per_token, plan_kv_cache


def test_bytes_per_token() -> None:
    assert kv_bytes_per_token(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4) == 1024


def test_default_plan_fits_the_batch() -> None:
    plan = plan_kv_cache(
        bytes_per_token=1024, max_model_len=1024, max_batch_size=32, available_bytes=8 * 2**30
    )
    assert plan.capacity_tokens >= 32 * 1024
    assert plan.max_batch_tokens == 512
    assert plan.total_bytes < 0.4 * 8 * 2**30


def test_default_plan_is_capped_by_memory() -> None:
    plan = plan_kv_cache(
        bytes_per_token=256 * 1024, max_model_len=4096, max_batch_size=256, available_bytes=4 * 2**30
    )
    assert plan.total_bytes <= 0.4 * 4 * 2**30
    assert plan.capacity_tokens >= 4096


def test_explicit_budget() -> None:
    plan = plan_kv_cache(
        bytes_per_token=1024,
        max_model_len=512,
        max_batch_size=8,
        memory_budget_bytes=64 * 2**20,
        prefill_tokens=128,
    )
    assert plan.max_batch_tokens == 128
    assert plan.total_bytes <= 64 * 2**20
    assert plan.capacity_tokens > 8 * 512  # a budget is filled, not capped at the batch


def test_budget_too_small_for_one_sequence_names_the_options() -> None:
    with pytest.raises(CachePlanError) as err:
        plan_kv_cache(
            bytes_per_token=1 << 20, max_model_len=4096, max_batch_size=1, memory_budget_bytes=2**30
        )
    msg = err.value.message
    assert "option.max_model_len=4096" in msg
    assert "option.kv_cache_memory_mb" in msg


def test_batch_of_one_still_holds_a_full_sequence() -> None:
    plan = plan_kv_cache(
        bytes_per_token=1024, max_model_len=1024, max_batch_size=1, available_bytes=8 * 2**30
    )
    assert plan.capacity_tokens >= 1024 + plan.page_size
