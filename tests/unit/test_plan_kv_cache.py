"""``lmforge plan`` and ``option.kv_cache_dtype``: the KV cache counted in the element size each backend
keeps for the value (``auto``: the compute dtype; fp8 / int8: one byte), a value the backend does not
take a problem naming the option and its choices; quantized weights counted by their stored bytes
beside it. Sizes by hand: ``2 x layers x kv_heads x head_dim x bytes`` per token."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.cli.plan_cmd import plan_command
from lmforge.config import load_config
from lmforge.deploy.plan import make_plan, render_plan
from tests.unit.test_plan import LLAMA_8B, TINY

# Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 = 65,536 elements per token; TINY: 2 x 2 x 2 x 16 = 128
LLAMA_ELEMENTS, TINY_ELEMENTS = 65_536, 128


def _folder(tmp_path: Path, config_json: dict[str, Any], **options: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config_json))
    (folder / "serving.properties").write_text("".join(f"option.{k}={v}\n" for k, v in options.items()))
    return folder


def _plan(folder: Path, instance_type: str) -> Any:
    resolved = load_config(folder, env={})
    return make_plan(folder, resolved.config, instance_type, extra_options=resolved.extra_options)


def test_vllm_on_a_gpu_counts_an_fp8_cache_at_one_byte(tmp_path: Path) -> None:
    auto = _plan(_folder(tmp_path / "a", LLAMA_8B, rolling_batch="vllm"), "ml.g6.2xlarge")
    fp8 = _plan(
        _folder(tmp_path / "f", LLAMA_8B, rolling_batch="vllm", kv_cache_dtype="fp8_e4m3"), "ml.g6.2xlarge"
    )
    assert (auto.kv_cache_dtype, auto.kv_bytes_per_token) == ("auto", LLAMA_ELEMENTS * 2)  # bf16
    assert (fp8.kv_cache_dtype, fp8.kv_bytes_per_token) == ("fp8_e4m3", LLAMA_ELEMENTS)
    assert fp8.kv_per_gpu_bytes * 2 == auto.kv_per_gpu_bytes
    assert fp8.total_per_gpu_bytes == auto.total_per_gpu_bytes - auto.kv_per_gpu_bytes // 2
    assert fp8.max_rolling_batch_size_that_fits >= 2 * auto.max_rolling_batch_size_that_fits
    assert not fp8.problems and not fp8.warnings
    assert "KV cache (" in render_plan(fp8) and "fp8_e4m3, 1 B)" in render_plan(fp8)
    assert "bf16)" in render_plan(auto)


def test_vllm_on_a_cpu_takes_its_backends_fp8_values_only(tmp_path: Path) -> None:
    e5m2 = _plan(
        _folder(tmp_path / "e", TINY, rolling_batch="vllm", **{"kv-cache-dtype": "FP8_E5M2"}), "ml.m5.xlarge"
    )
    assert (e5m2.kv_cache_dtype, e5m2.kv_bytes_per_token) == ("fp8_e5m2", TINY_ELEMENTS)
    assert e5m2.fits

    half = _plan(
        _folder(tmp_path / "h", TINY, rolling_batch="vllm", kv_cache_dtype="float16"), "ml.m5.xlarge"
    )
    assert not half.fits
    assert half.problems == [
        "option.kv_cache_dtype=float16: vLLM on CPU does not take it; choose one of: auto, fp8, fp8_e4m3, "
        "fp8_e5m2"
    ]
    assert half.kv_bytes_per_token == TINY_ELEMENTS * 2  # planned in the compute dtype meanwhile


def test_lmi_dist_takes_auto_only_and_says_where_an_fp8_cache_is(tmp_path: Path) -> None:
    auto = _plan(
        _folder(tmp_path / "a", TINY, rolling_batch="lmi-dist", kv_cache_dtype="auto"), "ml.m5.xlarge"
    )
    assert auto.fits and (auto.kv_cache_dtype, auto.kv_bytes_per_token) == ("auto", TINY_ELEMENTS * 2)

    fp32 = _plan(_folder(tmp_path / "d", TINY, rolling_batch="lmi-dist", dtype="fp32"), "ml.m5.xlarge")
    assert fp32.kv_bytes_per_token == TINY_ELEMENTS * 4  # auto: the compute dtype, not the checkpoint's

    fp8 = _plan(_folder(tmp_path / "f", TINY, rolling_batch="lmi-dist", kv_cache_dtype="fp8"), "ml.m5.xlarge")
    assert not fp8.fits
    (problem,) = fp8.problems
    assert problem.startswith("option.kv_cache_dtype=fp8: LMI-Dist keeps its KV cache in the compute dtype")
    assert "option.rolling_batch=vllm" in problem and problem.endswith("choose one of: auto")
    assert fp8.kv_bytes_per_token == TINY_ELEMENTS * 2  # what LMI-Dist would really keep


@pytest.mark.parametrize(
    ("options", "instance", "says"),
    [
        ({"rolling_batch": "vllm", "kv_cache_dtype": "fp9"}, "ml.g6.2xlarge", "vLLM does not take it"),
        ({"rolling_batch": "trtllm", "kv_cache_dtype": "fp8_e5m2"}, "ml.g6.2xlarge", "auto, fp8, int8"),
    ],
)
def test_a_value_the_backend_does_not_take_names_the_option_and_the_choices(
    tmp_path: Path, options: dict[str, str], instance: str, says: str
) -> None:
    plan = _plan(_folder(tmp_path, LLAMA_8B, **options), instance)
    assert any(
        p.startswith(f"option.kv_cache_dtype={options['kv_cache_dtype']}: ") and says in p
        for p in plan.problems
    )
    assert not plan.fits


def test_trtllm_int8_and_a_vllm_value_lmforge_cannot_size(tmp_path: Path) -> None:
    int8 = _plan(
        _folder(tmp_path / "i", LLAMA_8B, rolling_batch="trtllm", kv_cache_dtype="int8"), "ml.g6.2xlarge"
    )
    assert (int8.kv_cache_dtype, int8.kv_bytes_per_token) == ("int8", LLAMA_ELEMENTS)
    unsized = _plan(
        _folder(tmp_path / "u", LLAMA_8B, rolling_batch="vllm", kv_cache_dtype="turboquant_4bit_nc"),
        "ml.g6.2xlarge",
    )
    assert not unsized.problems and unsized.kv_bytes_per_token == LLAMA_ELEMENTS * 2
    assert any("vLLM takes it, lmforge's plan does not know its size" in w for w in unsized.warnings)
    nvfp4 = _plan(
        _folder(tmp_path / "n", LLAMA_8B, rolling_batch="trtllm", kv_cache_dtype="nvfp4"), "ml.g6.2xlarge"
    )
    assert nvfp4.kv_bytes_per_token == LLAMA_ELEMENTS * 2
    assert any(w.startswith("option.kv_cache_dtype=nvfp4: TensorRT-LLM takes it") for w in nvfp4.warnings)


def _safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    sizes = {"BF16": 2, "F32": 4, "I8": 1}
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype] * shape[0] * shape[1]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_a_quantized_checkpoint_and_an_fp8_cache_are_both_counted(tmp_path: Path) -> None:
    """A W8A8 folder as lmforge compile --quantize writes it (int8 weights, float scales) served by
    vLLM with an fp8 cache: the int8 matrix at one byte per weight, the cache at one byte."""
    qc = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
                "input_activations": {
                    "num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True
                },
            }
        },
    }  # fmt: skip
    folder = _folder(
        tmp_path, {**TINY, "quantization_config": qc}, rolling_batch="vllm", kv_cache_dtype="fp8"
    )
    _safetensors(
        folder / "model.safetensors",
        {
            "model.layers.0.mlp.down_proj.weight": ("I8", [64, 128]),
            "model.layers.0.mlp.down_proj.weight_scale": ("F32", [64, 1]),
            "model.embed_tokens.weight": ("BF16", [100, 64]),
        },
    )
    plan = _plan(folder, "ml.m5.xlarge")
    assert plan.quantization == "w8a8"
    # int8 weight 64 x 128 x 1 B, its scales and the embedding in the compute dtype (bf16)
    assert plan.weights_bytes == 64 * 128 + 64 * 2 + 100 * 64 * 2
    assert (plan.kv_cache_dtype, plan.kv_bytes_per_token) == ("fp8", TINY_ELEMENTS)
    assert plan.fits and not plan.problems


def test_lmforge_plan_reads_the_option_from_the_folder(tmp_path: Path) -> None:
    folder = _folder(tmp_path, TINY, rolling_batch="lmi-dist", kv_cache_dtype="fp8")
    result = CliRunner().invoke(plan_command, [str(folder), "--instance-type", "ml.m5.xlarge", "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["kv_cache_dtype"] == "auto" and data["kv_bytes_per_token"] == TINY_ELEMENTS * 2
    assert data["problems"][0].startswith("option.kv_cache_dtype=fp8: LMI-Dist keeps its KV cache")


def test_quantizing_at_load_is_in_the_start_time_estimate(tmp_path: Path) -> None:
    """option.quantize=w8a8 on an unquantized folder: the float checkpoint is read (not the int8 bytes it
    becomes), then LMI-Dist quantizes it at every start; a quantized checkpoint loads its own bytes."""
    from lmforge.deploy.plan.timing import JIT_QUANT_BYTES_PER_S, LOAD_BYTES_PER_S

    plain = _plan(_folder(tmp_path / "p", LLAMA_8B, rolling_batch="lmi-dist"), "ml.m5.24xlarge")
    jit = _plan(
        _folder(tmp_path / "j", LLAMA_8B, rolling_batch="lmi-dist", quantize="w8a8"), "ml.m5.24xlarge"
    )
    assert jit.weights_bytes < plain.weights_bytes and jit.download_bytes == plain.download_bytes
    assert jit.load_s == pytest.approx(plain.download_bytes / LOAD_BYTES_PER_S, abs=0.1)
    assert jit.quantize_s == pytest.approx(plain.download_bytes / JIT_QUANT_BYTES_PER_S, abs=0.1)
    assert plain.quantize_s == 0.0
    assert any(
        w.startswith("option.quantize=w8a8 quantizes the weights at every start") for w in jit.warnings
    )
    assert f"quantize at load {jit.quantize_s:.0f} s" in render_plan(jit)
    assert jit.health_check_timeout_s > plain.health_check_timeout_s


def test_lmi_dist_quantizing_at_load_counts_its_int8_lm_head(tmp_path: Path) -> None:
    """LMI-Dist's w8a8 at load takes every linear layer, the LM head included (a fifth of a small
    model's bytes); a head tied to the embedding stays tied in int8 and the float embedding is released
    (cpu_linear.quantize_int8), the engine core holding the int8 matrix twice (prepacked, and as rows)."""
    untied = _folder(tmp_path / "u", LLAMA_8B, rolling_batch="lmi-dist", quantize="w8a8")
    plan = _plan(untied, "ml.m5.24xlarge")
    # linear 1 B; embedding bf16 (128256 x 4096 x 2); head 1 B (128256 x 4096); norms bf16 (266,240 x 2)
    assert plan.weights_bytes == 6_979_321_856 + 1_050_673_152 + 525_336_576 + 532_480

    tied = _folder(tmp_path / "t", {**TINY, "tie_word_embeddings": True}, rolling_batch="lmi-dist",
                   quantize="w8a8", dtype="fp32")  # fmt: skip
    _safetensors(
        tied / "model.safetensors",
        {
            "model.embed_tokens.weight": ("F32", [100, 64]),
            "model.layers.0.mlp.up_proj.weight": ("F32", [128, 64]),
        },
    )
    # the int8 linear layer and the two int8 copies of the tied head and embedding's matrix
    assert _plan(tied, "ml.m5.xlarge").weights_bytes == 128 * 64 + 2 * 100 * 64
    # estimated from config.json alone: the same two int8 copies, the embedding not priced in bf16 too
    estimated = _folder(tmp_path / "e", {**LLAMA_8B, "tie_word_embeddings": True}, rolling_batch="lmi-dist",
                        quantize="w8a8")  # fmt: skip
    assert _plan(estimated, "ml.m5.24xlarge").weights_bytes == 6_979_321_856 + 2 * 525_336_576 + 532_480
