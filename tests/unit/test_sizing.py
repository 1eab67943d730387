from __future__ import annotations

import json
from pathlib import Path

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


# --------------------------------------------------------------------------- vLLM on a CPU

SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "dtype": "float32",
    "tie_word_embeddings": True,
}


def _smollm2_folder(tmp_path: Path, properties: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    (tmp_path / "serving.properties").write_text("option.rolling_batch=vllm\n" + properties)
    return tmp_path


def _vllm_sizing(folder: Path, available: int, env: dict[str, str] | None = None) -> tuple[dict, str | None]:
    from lmforge.config import load_config
    from lmforge.engines.vllm.cpu_sizing import cpu_cache_kwargs

    resolved = load_config(folder, env={})
    kwargs = {"max_num_seqs": resolved.config.max_rolling_batch_size}
    if resolved.config.max_model_len is not None:
        kwargs["max_model_len"] = resolved.config.max_model_len
    return cpu_cache_kwargs(
        resolved.config, kwargs, resolved.extra_options, environ=env or {}, available_bytes=available
    )


def test_vllm_cpu_cache_holds_the_batch_when_memory_allows(tmp_path: Path) -> None:
    folder = _smollm2_folder(tmp_path, "option.max_model_len=2048\noption.max_rolling_batch_size=16\n")
    sized, note = _vllm_sizing(folder, available=16 * 2**30)
    per_token = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, fp32
    assert sized == {"kv_cache_memory_bytes": 16 * 2048 * per_token, "max_model_len": 2048}
    assert note is not None and "16 x 2048" in note


def test_vllm_cpu_cache_is_capped_by_available_memory_and_lowers_an_unset_max_model_len(
    tmp_path: Path,
) -> None:
    """No max_model_len: the model's 8192 context, lowered to what 40 % of 100 MiB holds."""
    folder = _smollm2_folder(tmp_path, "option.max_rolling_batch_size=4\n")
    sized, note = _vllm_sizing(folder, available=100 * 2**20)
    per_token = 2 * 30 * 3 * 64 * 4
    assert sized["kv_cache_memory_bytes"] <= 0.4 * 100 * 2**20
    assert sized["max_model_len"] % 16 == 0 and sized["max_model_len"] < 8192
    assert sized["kv_cache_memory_bytes"] == sized["max_model_len"] * per_token
    assert note is not None and "lowered from the model's 8192" in note


def test_vllm_cpu_cache_refuses_a_set_max_model_len_that_does_not_fit(tmp_path: Path) -> None:
    from lmforge.engines.vllm.cpu_sizing import CpuCacheError

    folder = _smollm2_folder(tmp_path, "option.max_model_len=8192\n")
    with pytest.raises(CpuCacheError, match=r"option\.max_model_len=8192.*option\.kv_cache_memory_mb >= 360"):
        _vllm_sizing(folder, available=100 * 2**20)


@pytest.mark.parametrize(
    ("properties", "env"),
    [
        ("option.kv_cache_memory_mb=64\n", {}),
        ("option.gpu_memory_utilization=0.5\n", {}),
        ("", {"VLLM_CPU_KVCACHE_SPACE": "2"}),
    ],
)
def test_vllm_cpu_cache_is_left_to_the_user_who_sized_it(
    tmp_path: Path, properties: str, env: dict[str, str]
) -> None:
    assert _vllm_sizing(_smollm2_folder(tmp_path, properties), 16 * 2**30, env) == ({}, None)


def test_vllm_cpu_cache_counts_bf16_and_fp8_bytes(tmp_path: Path) -> None:
    per_token_fp32 = 2 * 30 * 3 * 64 * 4
    bf16, _ = _vllm_sizing(_smollm2_folder(tmp_path, "option.dtype=bf16\noption.max_model_len=1024\n"), 2**34)
    assert bf16["kv_cache_memory_bytes"] == 32 * 1024 * per_token_fp32 // 2
    (tmp_path / "serving.properties").write_text(
        "option.rolling_batch=vllm\noption.max_model_len=1024\noption.kv_cache_dtype=fp8\n"
    )
    fp8, _ = _vllm_sizing(tmp_path, 2**34)
    assert fp8["kv_cache_memory_bytes"] == 32 * 1024 * per_token_fp32 // 4
