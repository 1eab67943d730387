"""``lmforge plan``: memory and timeout arithmetic against hand-computed answers, and the command."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.cli.plan_cmd import plan_command
from lmforge.config.schema import ServingConfig
from lmforge.deploy.instances import INSTANCES, get_instance
from lmforge.deploy.plan import GIB, PlanError, make_plan, read_safetensors_header, render_plan

# Llama-3-8B shapes. Parameters by hand:
#   embeddings + lm_head (untied): 2 x 128256 x 4096               =  1,050,673,152
#   attention per layer: q,o 2 x 4096 x 4096 + k,v 2 x 4096 x 1024 =     41,943,040
#   MLP per layer (gate, up, down): 3 x 4096 x 14336               =    176,160,768
#   32 layers x 218,103,808                                        =  6,979,321,856
#   norms: (2 x 32 + 1) x 4096                                     =        266,240
#   total                                                          =  8,030,261,248  -> x 2 B (bf16)
LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
}
LLAMA_8B_PARAMS = 8_030_261_248
LLAMA_8B_BYTES = 16_060_522_496
# Llama-3-70B: embeddings 2 x 128256 x 8192 = 2,101,346,304; per layer attention 2 x 8192^2 +
# 2 x 8192 x 1024 = 150,994,944 and MLP 3 x 8192 x 28672 = 704,643,072; x 80 layers = 68,451,041,280;
# norms 161 x 8192 = 1,318,912; total 70,553,706,496 parameters = 141,107,412,992 bytes in bf16.
LLAMA_70B = {
    **LLAMA_8B,
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "intermediate_size": 28672,
}
LLAMA_70B_BYTES = 141_107_412_992
TINY: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 256,
}


def _model(tmp_path: Path, config_json: dict[str, Any], properties: str = "") -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_json))
    if properties:
        (folder / "serving.properties").write_text(properties)
    return folder


def _cfg(folder: Path, **options: Any) -> ServingConfig:
    return ServingConfig(model_dir=folder, **options)


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> int:
    """A valid safetensors file (zeros as data), written by hand; returns the data size."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return offset


# --- the instance table --------------------------------------------------------------------------


def test_instance_table_covers_the_lmi_families() -> None:
    names = {i.name for i in INSTANCES}
    for family, sizes in {
        "g5": ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"),
        "g6": ("xlarge", "12xlarge", "48xlarge"),
        "g6e": ("xlarge", "12xlarge", "48xlarge"),
        "g4dn": ("xlarge", "12xlarge", "16xlarge"),
        "p3": ("2xlarge", "8xlarge", "16xlarge"),
    }.items():
        for size in sizes:
            assert f"ml.{family}.{size}" in names
    assert len(names) == len(INSTANCES)
    g5 = get_instance("ml.g5.12xlarge")
    assert (g5.accelerator, g5.gpu_count, g5.memory_per_gpu_gib, g5.vcpus) == ("A10G", 4, 24, 48)
    p4d = get_instance("ml.p4d.24xlarge")
    assert (p4d.accelerator, p4d.gpu_count, p4d.memory_per_gpu_gib) == ("A100-40GB", 8, 40)
    assert get_instance("ml.p5e.48xlarge").memory_per_gpu_gib == 141
    assert get_instance("ml.m5.xlarge").is_cpu
    assert not get_instance("ml.inf2.xlarge").is_supported_gpu
    assert get_instance("G5.2XLARGE").name == "ml.g5.2xlarge"


def test_unknown_instance_type_suggests_a_near_name() -> None:
    with pytest.raises(ValueError, match=r"ml\.g5\.2xlarge"):
        get_instance("ml.g5.2xlarg")


# --- memory ---------------------------------------------------------------------------------------


def test_llama_8b_does_not_fit_g5_2xlarge(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder), "ml.g5.2xlarge")
    assert plan.parameters == LLAMA_8B_PARAMS
    assert plan.weights_bytes == LLAMA_8B_BYTES
    assert plan.weights_source == "estimated from config.json"
    # KV per token: 2 (K, V) x 32 layers x 8 heads x 128 dims x 2 B = 131,072 B
    assert plan.kv_bytes_per_token == 131_072
    # 32 sequences x 8192 tokens (max_position_embeddings) x 131,072 B = 32 GiB
    assert plan.max_model_len == 8192
    assert plan.kv_per_gpu_bytes == 32 * GIB
    # overhead: 1.5 GiB + 5% of 16,060,522,496 = 1,610,612,736 + 803,026,124
    assert plan.overhead_per_gpu_bytes == 2_413_638_860
    # available: 24 GiB x 0.9 = 23,192,823,398 B; total 14.96 + 32 + 2.25 GiB = 49.21 GiB
    assert plan.available_per_gpu_bytes == 23_192_823_398
    assert plan.total_per_gpu_bytes == LLAMA_8B_BYTES + 32 * GIB + 2_413_638_860
    assert not plan.fits
    assert not plan.problems
    # free for KV: 23,192,823,398 - 16,060,522,496 - 2,413,638,860 = 4,718,662,042 B; one 8192-token
    # sequence takes 1 GiB -> 4 sequences
    assert plan.max_rolling_batch_size_that_fits == 4
    # at batch 32: 4,718,662,042 / (32 x 131,072) = 1125 tokens
    assert plan.max_model_len_that_fits == 1125
    text = render_plan(plan)
    assert "DOES NOT FIT" in text
    assert "max_rolling_batch_size=4" in text
    assert "max_model_len=1024" in text
    # smallest instance where 32 x 8192 fits with all GPUs: 4 x 24 GiB (g6e.xlarge's 48 GiB is too small,
    # g4dn.12xlarge's T4s have no bf16)
    assert plan.suggested_instance == "ml.g5.12xlarge"


def test_llama_8b_fits_g5_12xlarge_with_tp4(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, tensor_parallel_degree=4), "ml.g5.12xlarge")
    # weights 16,060,522,496 / 4; KV heads 8 / 4 = 2 per GPU -> 32,768 B/token -> 8 GiB for 262,144 tokens
    assert plan.weights_per_gpu_bytes == 4_015_130_624
    assert plan.kv_bytes_per_token_per_gpu == 32_768
    assert plan.kv_per_gpu_bytes == 8 * GIB
    assert plan.overhead_per_gpu_bytes == 1_610_612_736 + 200_756_531
    assert plan.total_per_gpu_bytes == 14_416_434_483  # 13.43 GiB of 21.6
    assert plan.fits
    assert plan.problems == []
    # (23,192,823,398 - 4,015,130,624 - 1,811,369,267) / (32,768 x 8192) = 64.7
    assert plan.max_rolling_batch_size_that_fits == 64
    assert "FITS" in render_plan(plan)


def test_tp_max_uses_every_gpu(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, tensor_parallel_degree="max"), "ml.g5.48xlarge")
    assert plan.tensor_parallel_degree == 8
    # 8 KV heads over 8 GPUs: 1 each -> 2 x 32 x 1 x 128 x 2
    assert plan.kv_bytes_per_token_per_gpu == 16_384
    assert plan.fits


def test_70b_refused_on_g5_12xlarge_accepted_on_p4d(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_70B)
    small = make_plan(folder, _cfg(folder, tensor_parallel_degree=4), "ml.g5.12xlarge")
    assert small.weights_bytes == LLAMA_70B_BYTES
    assert not small.fits
    assert small.max_rolling_batch_size_that_fits == 0  # 32.9 GiB of weights per 24 GiB GPU
    assert any("weights alone" in s for s in small.suggestions)
    big = make_plan(folder, _cfg(folder, tensor_parallel_degree=8), "ml.p4d.24xlarge")
    # per GPU: weights 17,638,426,624 (16.43 GiB); KV 1 head: 2 x 80 x 1 x 128 x 2 = 40,960 B/token
    # x 262,144 = 10 GiB; overhead 1.5 GiB + 881,921,331; total 28.75 GiB of 40 x 0.9 = 36 GiB
    assert big.weights_per_gpu_bytes == 17_638_426_624
    assert big.kv_per_gpu_bytes == 10 * GIB
    assert big.total_per_gpu_bytes == 17_638_426_624 + 10 * GIB + 1_610_612_736 + 881_921_331
    assert big.fits


def test_awq_checkpoint(tmp_path: Path) -> None:
    awq = {
        **LLAMA_8B,
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
    }
    folder = _model(tmp_path, awq)
    plan = make_plan(folder, _cfg(folder), "ml.g5.2xlarge")
    # linear 6,979,321,856 x 4.25 bits / 8 = 3,707,764,736; embeddings + norms 1,050,939,392 x 2 B
    assert plan.weights_bytes == 3_707_764_736 + 2_101_878_784
    assert plan.quantization == "awq"
    assert plan.dtype == "fp16"


def test_runtime_quantize_option_overrides(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, quantize="fp8"), "ml.g6.2xlarge")
    # linear layers 1 B, the rest bf16
    assert plan.weights_bytes == 6_979_321_856 + 2_101_878_784
    assert plan.quantization == "fp8"


def test_mixtral_moe(tmp_path: Path) -> None:
    mixtral = {
        **LLAMA_8B,
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "num_local_experts": 8,
        "max_position_embeddings": 32768,
    }
    folder = _model(tmp_path, mixtral)
    plan = make_plan(folder, _cfg(folder, max_model_len=4096), "ml.g5.48xlarge")
    # embeddings 2 x 32000 x 4096 = 262,144,000; per layer attention 41,943,040 + 8 experts x
    # 176,160,768 + router 4096 x 8 = 1,451,261,952; x 32 = 46,440,382,464; norms 266,240
    assert plan.parameters == 46_702_792_704
    assert plan.weights_bytes == 2 * 46_702_792_704
    assert plan.tensor_parallel_degree == 1
    assert not plan.fits  # 87 GB on one 24 GiB GPU
    max_plan = make_plan(
        folder, _cfg(folder, max_model_len=4096, tensor_parallel_degree="max"), "ml.g5.48xlarge"
    )
    assert max_plan.fits


def test_safetensors_header_sum_is_preferred(tmp_path: Path) -> None:
    folder = _model(tmp_path, TINY)
    # 100 x 64 x 2 B + 128 x 64 x 2 B = 12,800 + 16,384
    size = _write_safetensors(
        folder / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [100, 64]),
            "model.layers.0.mlp.up_proj.weight": ("BF16", [128, 64]),
        },
    )
    assert size == 29_184
    assert sum(t.nbytes for t in read_safetensors_header(folder / "model.safetensors")) == 29_184
    plan = make_plan(folder, _cfg(folder), "ml.g5.xlarge")
    assert plan.weights_bytes == 29_184
    assert plan.parameters == 100 * 64 + 128 * 64
    assert "safetensors" in plan.weights_source
    # int8 weight-only: the projection at 1 B per weight, the embeddings stay bf16
    plan8 = make_plan(folder, _cfg(folder, quantize="int8_wo"), "ml.g5.xlarge")
    assert plan8.weights_bytes == 12_800 + 128 * 64


def test_unreadable_safetensors_falls_back_to_estimate(tmp_path: Path) -> None:
    folder = _model(tmp_path, TINY)
    (folder / "model.safetensors").write_bytes(b"\x01")
    plan = make_plan(folder, _cfg(folder), "ml.g5.xlarge")
    assert plan.weights_source == "estimated from config.json"
    assert any("safetensors" in w for w in plan.warnings)


def test_tp_not_dividing_heads_is_a_problem(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, tensor_parallel_degree=3, max_model_len=1024), "ml.g5.12xlarge")
    assert not plan.fits
    assert any("not divisible" in p and "1, 2, 4" in p for p in plan.problems)


def test_tp_above_gpu_count_is_a_problem(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, tensor_parallel_degree=8), "ml.g5.12xlarge")
    assert any("more than the 4 GPU(s)" in p for p in plan.problems)


def test_cpu_instance(tmp_path: Path) -> None:
    folder = _model(tmp_path, TINY)
    gpu_backend = make_plan(folder, _cfg(folder, rolling_batch="trtllm"), "ml.m5.xlarge")
    assert not gpu_backend.fits
    assert any("needs an NVIDIA GPU" in p for p in gpu_backend.problems)
    host = make_plan(folder, _cfg(folder, rolling_batch="lmi-dist"), "ml.m5.xlarge")
    assert host.fits
    assert host.on_host_memory
    # 16 GiB x 0.85 of host memory
    assert host.available_per_gpu_bytes == int(16 * GIB * 0.85)
    assert "host memory" in render_plan(host)


def test_inferentia_is_refused(tmp_path: Path) -> None:
    folder = _model(tmp_path, TINY)
    plan = make_plan(folder, _cfg(folder), "ml.inf2.xlarge")
    assert not plan.fits
    assert any("inferentia2" in p for p in plan.problems)


# --- timeouts -------------------------------------------------------------------------------------


def test_timeouts_known_answer(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(
        folder, _cfg(folder, tensor_parallel_degree=4, rolling_batch="lmi-dist"), "ml.g5.12xlarge"
    )
    # download 16.06 GB / 150 MB/s = 107.1 s; load / 500 MB/s = 32.1 s; + 30 s LMI-Dist start = 169.2 s
    # x 1.25 = 211.5 -> 240; download alone x 1.25 = 133.8 -> 180
    assert plan.download_s == pytest.approx(107.1)
    assert plan.health_check_timeout_s == 240
    assert plan.download_timeout_s == 180
    vllm = make_plan(folder, _cfg(folder, tensor_parallel_degree=4, rolling_batch="vllm"), "ml.g5.12xlarge")
    # vLLM with CUDA graphs: 107.1 + 32.1 + 90 = 229.2 x 1.25 = 286.5 -> 300; auto is costed the same
    assert vllm.start_s == 90 and vllm.health_check_timeout_s == 300
    assert (
        make_plan(folder, _cfg(folder, tensor_parallel_degree=4), "ml.g5.12xlarge").health_check_timeout_s
        == 300
    )
    eager = make_plan(
        folder,
        _cfg(folder, tensor_parallel_degree=4, rolling_batch="vllm", enforce_eager=True),
        "ml.g5.12xlarge",
    )
    assert eager.start_s == 60 and eager.health_check_timeout_s == 300  # 199.2 x 1.25 = 249 -> 300
    trt = make_plan(folder, _cfg(folder, tensor_parallel_degree=4, rolling_batch="trtllm"), "ml.g5.12xlarge")
    # + TensorRT-LLM build 120 + 4 x 8.03 = 152.1 s, start 60:
    # (107.1 + 32.1 + 60 + 152.1) x 1.25 = 439.1 -> 480
    assert trt.compile_s == pytest.approx(152.1)
    assert trt.health_check_timeout_s == 480


def test_timeouts_are_clamped(tmp_path: Path) -> None:
    tiny = make_plan(
        _model(tmp_path, TINY), _cfg(tmp_path / "model", rolling_batch="lmi-dist"), "ml.g5.xlarge"
    )
    assert tiny.health_check_timeout_s == 60
    assert tiny.download_timeout_s == 60
    huge_cfg = {**LLAMA_70B, "hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128}
    huge_cfg["intermediate_size"] = 53248
    big_dir = tmp_path / "big"
    big_dir.mkdir()
    (big_dir / "config.json").write_text(json.dumps(huge_cfg))
    huge = make_plan(big_dir, _cfg(big_dir, tensor_parallel_degree=8), "ml.p5e.48xlarge")
    assert huge.health_check_timeout_s == 3600
    assert huge.download_timeout_s == 3600
    assert any("3600" in w for w in huge.warnings)


# --- config.json discovery ------------------------------------------------------------------------


def test_missing_config_json_says_to_pass_model_config(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(PlanError, match="--model-config"):
        make_plan(folder, _cfg(folder, model_id="s3://bucket/llama/"), "ml.g5.2xlarge")
    explicit = tmp_path / "llama-config.json"
    explicit.write_text(json.dumps(LLAMA_8B))
    plan = make_plan(
        folder, _cfg(folder, model_id="s3://bucket/llama/"), "ml.g5.2xlarge", model_config_path=explicit
    )
    assert plan.parameters == LLAMA_8B_PARAMS


def test_to_dict_is_json(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    data = json.loads(json.dumps(make_plan(folder, _cfg(folder), "ml.g5.2xlarge").to_dict()))
    assert data["fits"] is False
    assert data["weights_bytes"] == LLAMA_8B_BYTES


# --- the command ----------------------------------------------------------------------------------


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    runner = CliRunner()
    fits = _model(tmp_path, LLAMA_8B, "option.tensor_parallel_degree=max\n")
    ok = runner.invoke(plan_command, [str(fits), "--instance-type", "ml.g5.12xlarge"])
    assert ok.exit_code == 0, ok.output
    assert "Next: lmforge deploy" in ok.output
    assert "--instance-type ml.g5.12xlarge" in ok.output

    too_big = runner.invoke(plan_command, [str(fits), "--instance-type", "ml.g5.2xlarge"])
    assert too_big.exit_code == 1
    assert "DOES NOT FIT" in too_big.output

    as_json = runner.invoke(plan_command, [str(fits), "--instance-type", "ml.g5.12xlarge", "--json"])
    assert as_json.exit_code == 0
    data = json.loads(as_json.stdout)
    assert data["fits"] is True
    assert data["tensor_parallel_degree"] == 4

    unknown = runner.invoke(plan_command, [str(fits), "--instance-type", "ml.g5.2xlarg"])
    assert unknown.exit_code == 2
    assert "ml.g5.2xlarge" in unknown.output

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "serving.properties").write_text("option.max_rolling_batch_size=lots\n")
    invalid = runner.invoke(plan_command, [str(bad), "--instance-type", "ml.g5.2xlarge"])
    assert invalid.exit_code == 2
    assert "invalid configuration" in invalid.output

    no_config = tmp_path / "noconfig"
    no_config.mkdir()
    missing = runner.invoke(plan_command, [str(no_config), "--instance-type", "ml.g5.2xlarge"])
    assert missing.exit_code == 2
    assert "--model-config" in missing.output


def test_vllm_on_a_cpu_instance_is_planned_with_its_compile(tmp_path: Path) -> None:
    """vLLM runs on CPU instances (the vllm-cpu image): it fits, and the start it is given to become
    healthy depends on whether the folder carries lmforge compile's artifact."""
    from lmforge.deploy.plan.timing import VLLM_CPU_COMPILED_START_S, VLLM_CPU_START_S
    from lmforge.engines.vllm.compile_cache import compiled_folder

    folder = _model(tmp_path, TINY)
    plain = make_plan(folder, _cfg(folder, rolling_batch="vllm"), "ml.m6i.xlarge")
    assert plain.fits, plain.problems
    assert any("torch.compile" in w and "lmforge compile" in w for w in plain.warnings), plain.warnings
    compiled_folder(folder).mkdir(parents=True)
    (compiled_folder(folder) / "manifest.json").write_text("{}")
    compiled = make_plan(folder, _cfg(folder, rolling_batch="vllm"), "ml.m6i.xlarge")
    assert not any("torch.compile" in w for w in compiled.warnings)
    assert compiled.health_check_timeout_s < plain.health_check_timeout_s
    assert VLLM_CPU_COMPILED_START_S < VLLM_CPU_START_S


def _compressed_tensors(bits: int, group: int | None, acts: bool) -> dict[str, Any]:
    weights: dict[str, Any] = {"num_bits": bits, "type": "int", "symmetric": True}
    weights.update({"strategy": "group", "group_size": group} if group else {"strategy": "channel"})
    scheme: dict[str, Any] = {"targets": ["Linear"], "weights": weights}
    if acts:
        scheme["input_activations"] = {
            "num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True
        }  # fmt: skip
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized" if bits == 4 else "int-quantized",
        "config_groups": {"group_0": scheme},
    }


def test_lmforge_compiled_checkpoints_are_priced_by_their_bits(tmp_path: Path) -> None:
    """`lmforge compile --quantize gptq|w8a8` writes compressed-tensors: without the weights at hand
    the plan prices its linear layers at the scheme's bits (float32 scales per group included)."""
    gptq = {**LLAMA_8B, "torch_dtype": "bfloat16", "quantization_config": _compressed_tensors(4, 64, False)}
    (tmp_path / "g").mkdir()
    folder = _model(tmp_path / "g", gptq)
    plan = make_plan(folder, _cfg(folder, quantize="gptq"), "ml.g5.2xlarge")
    # linear 6,979,321,856 x (4 + 32/64) bits / 8; embeddings + norms 1,050,939,392 x 2 B
    assert plan.quantization == "gptq" and not any("quantiz" in w for w in plan.warnings)
    assert plan.weights_bytes == 6_979_321_856 * 9 // 16 + 2_101_878_784
    w8a8 = {**LLAMA_8B, "torch_dtype": "bfloat16", "quantization_config": _compressed_tensors(8, None, True)}
    (tmp_path / "w").mkdir()
    folder = _model(tmp_path / "w", w8a8)
    plan = make_plan(folder, _cfg(folder), "ml.g5.2xlarge")
    assert plan.quantization == "w8a8"
    assert plan.weights_bytes == 6_979_321_856 + 2_101_878_784


def test_option_quantize_w8a8_at_load_is_priced_at_one_byte(tmp_path: Path) -> None:
    folder = _model(tmp_path, LLAMA_8B)
    plan = make_plan(folder, _cfg(folder, quantize="w8a8"), "ml.g6.2xlarge")
    assert plan.quantization == "w8a8" and not any("unknown method" in w for w in plan.warnings)
    assert plan.weights_bytes == 6_979_321_856 + 2_101_878_784
