"""The TensorRT-LLM build plan: option mapping, refused combinations, and a cache key that changes with
every build-affecting setting (and only with those)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmforge.config import ServingConfig
from lmforge.engines.trtllm.plan import BuildPlan, BuildPlanError, make_plan

HF = {
    "architectures": ["LlamaForCausalLM"],
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}


def _folder(tmp_path: Path, hf: dict[str, Any] | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf or HF))
    return folder


def _plan(
    tmp_path: Path, extra: dict[str, str] | None = None, arch: str | None = "sm90", **fields: Any
) -> BuildPlan:
    cfg = ServingConfig(model_dir=_folder(tmp_path), **fields)
    return make_plan(cfg, extra or {}, arch=arch, trtllm_version="1.2.1", device_count=8)


def test_defaults_and_mapping(tmp_path: Path) -> None:
    plan = _plan(tmp_path, max_rolling_batch_size=64, max_model_len=4096, tensor_parallel_degree=4)
    assert (plan.dtype, plan.tensor_parallel, plan.pipeline_parallel) == ("bfloat16", 4, 1)
    assert plan.build_config() == {
        "max_input_len": 1024,
        "max_seq_len": 4096,
        "max_batch_size": 64,
        "max_num_tokens": 16384,
        "max_beam_width": 1,
    }
    assert plan.plugin_config() == {
        "paged_kv_cache": True,
        "context_fmha": True,
        "use_paged_context_fmha": True,
        "use_custom_all_reduce": True,
    }
    assert plan.quant_config() == {}
    assert plan.runtime == {"kv_cache_free_gpu_mem_fraction": 0.9, "enable_kv_cache_reuse": False}
    assert _plan(tmp_path, tensor_parallel_degree="max").tensor_parallel == 8
    assert _plan(tmp_path, max_input_len=2000, max_output_len=500).max_seq_len == 2500
    assert _plan(tmp_path).max_seq_len == 8192  # max_position_embeddings
    assert _plan(tmp_path, max_model_len=512).max_input_len == 256  # never more than half of a short sequence


@pytest.mark.parametrize(
    ("quantize", "extra", "algo", "quant"),
    [
        ("smoothquant", {}, "W8A8_SQ_PER_TENSOR_PLUGIN", {"smoothquant_val": 0.8}),
        ("smoothquant", {"smoothquant_per_token": "true"}, "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", {}),
        ("smoothquant", {"smoothquant_per_channel": "true"}, "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN", {}),
        (
            "smoothquant",
            {"smoothquant_per_channel": "1", "smoothquant_per_token": "1", "smoothquant_alpha": "0.5"},
            "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN",
            {"smoothquant_val": 0.5},
        ),
        ("awq", {"awq_block_size": "64"}, "W4A16_AWQ", {"group_size": 64}),
        ("fp8", {"kv_cache_dtype": "fp8"}, "FP8", {"kv_cache_quant_algo": "FP8"}),
        ("int8_wo", {}, "W8A16", {}),
        ("int4_wo", {"kv_cache_dtype": "int8"}, "W4A16", {"kv_cache_quant_algo": "INT8"}),
    ],
)
def test_quantization(
    tmp_path: Path, quantize: str, extra: dict[str, str], algo: str, quant: dict[str, Any]
) -> None:
    plan = _plan(tmp_path, extra, quantize=quantize)
    assert plan.quant_algo == algo
    config = plan.quant_config()
    assert config["quant_algo"] == algo
    for key, value in quant.items():
        assert config[key] == value


def test_lora_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, enable_lora=True, max_lora_rank=32, max_loras=8, dtype="fp16")
    assert (plan.lora, plan.max_lora_rank, plan.max_loras) == (True, 32, 8)
    assert plan.plugin_config()["lora_plugin"] == "float16"


@pytest.mark.parametrize(
    ("fields", "extra", "arch", "words"),
    [
        ({"tensor_parallel_degree": 3}, {}, "sm90", "does not divide the model's 32 attention heads"),
        ({"pipeline_parallel_degree": 64}, {}, "sm90", "more than the model's 32 layers"),
        ({"max_input_len": 4096, "max_model_len": 4096}, {}, "sm90", "leaves no room to generate"),
        ({"max_model_len": 100000}, {}, "sm90", "max_position_embeddings=8192"),
        ({"quantize": "fp8"}, {}, "sm80", "FP8 needs a GPU of sm89"),
        ({}, {"kv_cache_dtype": "fp8"}, "sm86", "FP8 needs a GPU of sm89"),
        ({"quantize": "gptq"}, {}, "sm90", "not one of smoothquant, awq, fp8, int8_wo, int4_wo"),
        ({"quantize": "awq", "dtype": "fp32"}, {}, "sm90", "needs option.dtype fp16 or bf16"),
        ({"quantize": "smoothquant"}, {"smoothquant_alpha": "1.5"}, "sm90", "between 0 and 1"),
        ({}, {"smoothquant_per_token": "true"}, "sm90", "need option.quantize=smoothquant"),
        ({"quantize": "awq"}, {"awq_block_size": "32"}, "sm90", "must be 64 or 128"),
        ({"enable_lora": True, "quantize": "smoothquant"}, {}, "sm90", "LoRA adapters cannot be combined"),
        (
            {},
            {"max_num_tokens": "100", "use_paged_context_fmha": "false"},
            "sm90",
            "long prompt would not fit",
        ),
        (
            {},
            {"enable_kv_cache_reuse": "true", "use_paged_context_fmha": "false"},
            "sm90",
            "needs option.use_paged",
        ),
        ({}, {"max_num_tokenz": "5"}, "sm90", "did you mean option.max_num_tokens"),
        ({}, {"max_beam_width": "zero"}, "sm90", "option.max_beam_width = 'zero'"),
        ({}, {"kv_cache_dtype": "fp4"}, "sm90", "must be one of auto, fp8, int8"),
    ],
)
def test_invalid_plans_are_refused(
    tmp_path: Path, fields: dict[str, Any], extra: dict[str, str], arch: str, words: str
) -> None:
    with pytest.raises(BuildPlanError, match="invalid TensorRT-LLM build plan") as info:
        _plan(tmp_path, extra, arch=arch, **fields)
    assert words in str(info.value)


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    with pytest.raises(BuildPlanError) as info:
        _plan(tmp_path, {"kv_cache_dtype": "fp4", "bogus": "1"}, tensor_parallel_degree=3, quantize="gptq")
    assert str(info.value).count("\n  ") == 4


def test_cache_key_covers_every_build_setting_and_nothing_else(tmp_path: Path) -> None:
    base = _plan(tmp_path)
    variants = [
        _plan(tmp_path, max_rolling_batch_size=64),
        _plan(tmp_path, max_input_len=2048),
        _plan(tmp_path, max_model_len=4096),
        _plan(tmp_path, dtype="fp16"),
        _plan(tmp_path, tensor_parallel_degree=2),
        _plan(tmp_path, pipeline_parallel_degree=2),
        _plan(tmp_path, quantize="fp8"),
        _plan(tmp_path, {"kv_cache_dtype": "fp8"}),
        _plan(tmp_path, {"max_num_tokens": "8192"}),
        _plan(tmp_path, {"max_beam_width": "4"}),
        _plan(tmp_path, {"use_paged_context_fmha": "false"}),
        _plan(tmp_path, {"enable_context_fmha": "false"}),
        _plan(tmp_path, {"use_custom_all_reduce": "false"}),
        _plan(tmp_path, quantize="smoothquant"),
        _plan(tmp_path, {"smoothquant_alpha": "0.6"}, quantize="smoothquant"),
        _plan(tmp_path, enable_lora=True),
        _plan(tmp_path, enable_lora=True, max_lora_rank=64),
        _plan(tmp_path, revision="v2"),
        _plan(tmp_path, arch="sm80"),
        _plan(tmp_path, model_id="example-org/another-model"),
    ]
    newer = make_plan(
        ServingConfig(model_dir=_folder(tmp_path)), {}, arch="sm90", trtllm_version="1.3.0", device_count=8
    )
    keys = [p.cache_key() for p in [base, *variants, newer]]
    assert len(set(keys)) == len(keys), "a build setting is missing from the cache key"
    runtime_only = _plan(tmp_path, {"kv_cache_free_gpu_mem_fraction": "0.5", "enable_kv_cache_reuse": "true"})
    assert runtime_only.cache_key() == base.cache_key()
    assert runtime_only.runtime["kv_cache_free_gpu_mem_fraction"] == 0.5
    assert _plan(tmp_path).cache_key() == base.cache_key()  # stable
    (tmp_path / "model" / "config.json").write_text(json.dumps({**HF, "vocab_size": 32000}))
    other = make_plan(
        ServingConfig(model_dir=tmp_path / "model"), {}, arch="sm90", trtllm_version="1.2.1", device_count=8
    )
    assert other.cache_key() != base.cache_key()  # same path, other model: another engine


def test_compiled_folder_reads_the_engine_config(tmp_path: Path) -> None:
    engine_config = {
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "max_position_embeddings": 8192,
        },
        "build_config": {"max_input_len": 1024},
    }
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(engine_config))
    plan = make_plan(ServingConfig(model_dir=folder), {}, arch="sm90", trtllm_version="1.2.1", device_count=1)
    assert (plan.architecture, plan.dtype, plan.max_seq_len) == ("LlamaForCausalLM", "float16", 8192)


def test_dry_run_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lmforge.cli import main

    folder = _folder(tmp_path)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=trtllm\noption.quantize=awq\noption.max_model_len=4096\n"
    )
    result = CliRunner().invoke(
        main,
        ["compile", str(folder), "--dry-run", "--gpu-arch", "sm90", "--json", "--trtllm-version", "1.2.1"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["quant_algo"] == "W4A16_AWQ" and data["max_seq_len"] == 4096 and len(data["cache_key"]) == 24
    text = (
        CliRunner()
        .invoke(
            main, ["compile", str(folder), "--dry-run", "--gpu-arch", "sm90", "--trtllm-version", "1.2.1"]
        )
        .stdout
    )
    assert "W4A16_AWQ" in text and "cache key" in text
    (folder / "serving.properties").write_text("option.quantize=fp8\n")
    bad = CliRunner().invoke(
        main, ["compile", str(folder), "--dry-run", "--gpu-arch", "sm80", "--trtllm-version", "1.2.1"]
    )
    assert bad.exit_code == 2 and "FP8 needs a GPU of sm89" in bad.stderr
