"""The TensorRT-LLM >= 1.3 plan: the version gate, the ModelOpt recipe per option, refusals in both
directions (engine settings on >= 1.3, PyTorch-backend settings on <= 1.2), the offline calibration set,
a cache key covering what changes the checkpoint (and only that), and `lmforge compile --dry-run` for 1.3
(a quantization plan) and 1.2 (an engine plan)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.config import ServingConfig
from lmforge.engines.trtllm.buildplan import BuildPlanError
from lmforge.engines.trtllm.plan import make_plan
from lmforge.engines.trtllm.quantplan import QuantPlan, make_quant_plan
from lmforge.engines.trtllm.version_gate import choose, path_for, release
from lmforge.quantize import calibration

HF = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 32, "max_position_embeddings": 8192}


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF))
    return folder


def _plan(
    tmp_path: Path, extra: dict[str, str] | None = None, arch: str | None = "sm90", **fields: Any
) -> QuantPlan:
    config = ServingConfig(model_dir=_folder(tmp_path), **fields)
    return make_quant_plan(config, extra or {}, arch=arch, trtllm_version="1.3.0rc29", device_count=8)


def test_version_gate() -> None:
    assert release("1.3.0rc29") == (1, 3) and release("1.2.1") == (1, 2) and release("2.0") == (2, 0)
    assert [path_for(v) for v in ("1.0.0", "1.2.1", "1.3.0rc0", "1.4.0rc1")] == [
        "engine",
        "engine",
        "pytorch",
        "pytorch",
    ]
    with pytest.raises(ValueError, match="not a TensorRT-LLM version"):
        release("latest")
    planned = choose("1.2.1")
    assert (planned.path, planned.installed) == ("engine", False)
    assert "TensorRT engine path (TensorRT-LLM not installed here; planning for 1.2.1" in planned.describe()


@pytest.mark.parametrize(
    ("quantize", "extra", "preset", "algo", "kv"),
    [
        ("fp8", {}, "FP8_DEFAULT_CFG", "FP8", None),
        ("nvfp4", {"kv_cache_dtype": "nvfp4"}, "NVFP4_DEFAULT_CFG", "NVFP4", "NVFP4"),
        ("awq", {}, "INT4_AWQ_CFG", "W4A16_AWQ", None),
        ("smoothquant", {"kv_cache_dtype": "fp8"}, "INT8_SMOOTHQUANT_CFG", "W8A8_SQ_PER_CHANNEL", "FP8"),
        ("int8_wo", {}, "INT8_WEIGHT_ONLY_CFG", "W8A16", None),
        (None, {"kv_cache_dtype": "fp8"}, None, None, "FP8"),
    ],
)
def test_modelopt_recipe_per_option(
    tmp_path: Path,
    quantize: str | None,
    extra: dict[str, str],
    preset: str | None,
    algo: str | None,
    kv: str | None,
) -> None:
    plan = _plan(tmp_path, extra, arch="sm100", quantize=quantize)
    assert (plan.modelopt_config, plan.quant_algo, plan.kv_cache_quant_algo, plan.quantizes) == (
        preset,
        algo,
        kv,
        True,
    )
    calibrates = quantize != "int8_wo" or kv is not None
    assert (plan.calib_size is not None) == calibrates
    assert plan.render().count("\n") == 11


def test_nothing_to_quantize_and_runtime_settings(tmp_path: Path) -> None:
    plan = _plan(
        tmp_path,
        {"cuda_graph_max_batch_size": "16", "cuda_graph_padding": "false", "enable_kv_cache_reuse": "false"},
        max_rolling_batch_size=64,
        max_model_len=4096,
        tensor_parallel_degree="max",
    )
    assert not plan.quantizes and plan.calib_size is None and plan.tensor_parallel == 8
    assert plan.runtime["cuda_graph_max_batch_size"] == 16 and not plan.runtime["cuda_graph_padding"]
    assert plan.runtime["max_seq_len"] == 4096 and plan.runtime["enable_kv_cache_reuse"] is False
    assert "nothing to do ahead of time" in plan.render()
    assert _plan(tmp_path).runtime["max_seq_len"] is None  # TensorRT-LLM reads the model's own


@pytest.mark.parametrize(
    ("fields", "extra", "arch", "words"),
    [
        ({"quantize": "fp8"}, {}, "sm80", "option.quantize=fp8 needs a GPU of sm89 or newer"),
        ({"quantize": "nvfp4"}, {}, "sm90", "option.quantize=nvfp4 needs a GPU of sm100"),
        ({}, {"kv_cache_dtype": "fp8"}, "sm86", "option.kv_cache_dtype=fp8 needs a GPU of sm89"),
        ({}, {"kv_cache_dtype": "int8"}, "sm90", "must be one of auto, fp8, nvfp4 on TensorRT-LLM >= 1.3"),
        ({"quantize": "int4_wo"}, {}, "sm90", "use awq"),
        ({"quantize": "gptq"}, {}, "sm90", "not one of fp8, nvfp4, awq, smoothquant, int8_wo"),
        ({}, {"use_paged_context_fmha": "false"}, "sm90", "is a TensorRT engine build setting"),
        ({"quantize": "smoothquant"}, {"smoothquant_alpha": "0.5"}, "sm90", "tensorrt-llm-1.2 image"),
        ({}, {"max_beam_width": "4"}, "sm90", "option.max_beam_width is a TensorRT engine build setting"),
        ({}, {"cuda_grah": "false"}, "sm90", "did you mean option.cuda_graph?"),
        ({}, {"cuda_graph_max_batch_size": "64"}, "sm90", "more than option.max_rolling_batch_size=32"),
        ({"quantize": "int8_wo"}, {"calib_dataset": "x.txt"}, "sm90", "nothing calibrates"),
        ({"quantize": "fp8"}, {"calib_dataset": "hf://org/data"}, "sm90", "never downloads calibration data"),
        ({"quantize": "fp8"}, {"calib_dataset": "/nonexistent/p.jsonl"}, "sm90", "cannot be read"),
        ({"tensor_parallel_degree": 3}, {}, "sm90", "does not divide the model's 32 attention heads"),
        ({}, {"kv_cache_free_gpu_mem_fraction": "1.5"}, "sm90", "must be in (0, 1]"),
    ],
)
def test_invalid_plans_are_refused(
    tmp_path: Path, fields: dict[str, Any], extra: dict[str, str], arch: str, words: str
) -> None:
    with pytest.raises(BuildPlanError, match="invalid TensorRT-LLM plan") as info:
        _plan(tmp_path, extra, arch=arch, **fields)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("fields", "extra", "words"),
    [
        ({}, {"cuda_graph": "true"}, "option.cuda_graph is for TensorRT-LLM >= 1.3"),
        ({}, {"trtllm_async_llm": "true"}, "this TensorRT-LLM builds TensorRT engines"),
        (
            {"quantize": "awq"},
            {"calib_dataset": "p.jsonl"},
            "option.calib_dataset is for TensorRT-LLM >= 1.3",
        ),
        ({"quantize": "nvfp4"}, {}, "option.quantize=nvfp4 needs TensorRT-LLM >= 1.3"),
    ],
)
def test_pytorch_path_options_are_refused_on_the_engine_path(
    tmp_path: Path, fields: dict[str, Any], extra: dict[str, str], words: str
) -> None:
    config = ServingConfig(model_dir=_folder(tmp_path), **fields)
    with pytest.raises(BuildPlanError) as info:
        make_plan(config, extra, arch="sm90", trtllm_version="1.2.1", device_count=1)
    assert words in str(info.value)


def test_calibration_sets(tmp_path: Path) -> None:
    builtin = calibration.load_prompts()
    assert 250 <= len(builtin) <= 400 and len(set(builtin)) == len(builtin)
    assert any("\n" in p for p in builtin) and any("def " in p for p in builtin)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('"plain text"\n{"text": "one"}\n\n{"prompt": "two", "x": 1}\n{"question": "three"}\n')
    assert calibration.load_prompts(str(jsonl)) == ["plain text", "one", "two", "three"]
    txt = tmp_path / "c.txt"
    txt.write_text("first\n\nsecond line\\ncontinued\n")
    assert calibration.load_prompts(str(txt)) == ["first", "second line\ncontinued"]
    for text, words in (('{"answer": 1}\n', "line 1 has no prompt"), ("{oops\n", "line 1 is not JSON")):
        jsonl.write_text(text)
        with pytest.raises(calibration.CalibrationError, match=words):
            calibration.load_prompts(str(jsonl))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(calibration.CalibrationError, match="holds no prompts"):
        calibration.load_prompts(str(tmp_path / "empty.txt"))
    with pytest.raises(calibration.CalibrationError, match=r"must be a \.jsonl or \.txt file"):
        calibration.load_prompts(str(tmp_path / "c.csv"))
    plan = _plan(tmp_path, {"calib_dataset": str(txt), "calib_size": "2"}, quantize="fp8")
    assert plan.calib_dataset == f"{txt}, 2 prompts" and plan.calib_size == 2


def test_cache_key_covers_what_changes_the_checkpoint_only(tmp_path: Path) -> None:
    base = _plan(tmp_path, quantize="fp8")
    txt = tmp_path / "c.txt"
    txt.write_text("a prompt\n")
    changed = [
        _plan(tmp_path, quantize="awq"),
        _plan(tmp_path, {"kv_cache_dtype": "fp8"}, quantize="fp8"),
        _plan(tmp_path, {"calib_size": "64"}, quantize="fp8"),
        _plan(tmp_path, {"calib_seq_len": "128"}, quantize="fp8"),
        _plan(tmp_path, {"calib_dataset": str(txt)}, quantize="fp8"),
        _plan(tmp_path, quantize="fp8", dtype="bf16"),
        _plan(tmp_path, quantize="fp8", revision="v2"),
        _plan(tmp_path, quantize="fp8", model_id="example-org/other"),
    ]
    newer = make_quant_plan(
        ServingConfig(model_dir=_folder(tmp_path), quantize="fp8"), {}, arch="sm90", trtllm_version="1.4.0rc1"
    )
    keys = [p.cache_key() for p in [base, *changed, newer]]
    assert len(set(keys)) == len(keys), "a setting that changes the checkpoint is missing from the key"
    same = [
        _plan(tmp_path, quantize="fp8", tensor_parallel_degree=2),
        _plan(tmp_path, {"cuda_graph": "false", "torch_compile": "true"}, quantize="fp8"),
        _plan(tmp_path, {"kv_cache_free_gpu_mem_fraction": "0.5"}, quantize="fp8", max_rolling_batch_size=64),
        _plan(tmp_path, quantize="fp8", arch="sm100"),
    ]
    assert {p.cache_key() for p in same} == {base.cache_key()}
    txt.write_text("another prompt\n")  # the same file name with other prompts: another checkpoint
    assert _plan(tmp_path, {"calib_dataset": str(txt)}, quantize="fp8").cache_key() != changed[4].cache_key()


def test_dry_run_shows_a_quantization_plan_for_13_and_an_engine_plan_for_12(tmp_path: Path) -> None:
    from lmforge.cli import main

    folder = _folder(tmp_path)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=trtllm\noption.quantize=awq\noption.max_model_len=4096\n"
    )
    runner = CliRunner()
    new = runner.invoke(
        main, ["compile", str(folder), "--dry-run", "--gpu-arch", "sm90", "--trtllm-version", "1.3.0rc29"]
    )
    assert new.exit_code == 0, new.output
    assert (
        "TensorRT-LLM >= 1.3 quantization plan" in new.stdout
        and "W4A16_AWQ (ModelOpt INT4_AWQ_CFG)" in new.stdout
    )
    assert "PyTorch-backend path" in new.stderr
    data = json.loads(
        runner.invoke(
            main, ["compile", str(folder), "--dry-run", "--json", "--trtllm-version", "1.4.0rc1"]
        ).stdout
    )
    assert (data["path"], data["modelopt_config"], data["trtllm_version"]) == (
        "pytorch",
        "INT4_AWQ_CFG",
        "1.4.0rc1",
    )
    old = runner.invoke(
        main, ["compile", str(folder), "--dry-run", "--gpu-arch", "sm90", "--trtllm-version", "1.2.1"]
    )
    assert old.exit_code == 0 and "TensorRT-LLM build plan" in old.stdout and "tokens/step" in old.stdout
    assert "TensorRT engine path" in old.stderr
    (folder / "serving.properties").write_text("option.rolling_batch=trtllm\noption.max_beam_width=2\n")
    refused = runner.invoke(main, ["compile", str(folder), "--dry-run", "--trtllm-version", "1.3.0"])
    assert refused.exit_code == 2 and "max_beam_width is a TensorRT engine build setting" in refused.stderr
    (folder / "serving.properties").write_text("option.rolling_batch=trtllm\n")
    nothing = runner.invoke(main, ["compile", str(folder), "--output", str(tmp_path / "out")])
    assert nothing.exit_code == 2 and "nothing to compile for TensorRT-LLM" in nothing.stderr
    bad = runner.invoke(main, ["compile", str(folder), "--dry-run", "--trtllm-version", "next"])
    assert bad.exit_code == 2 and "--trtllm-version" in bad.stderr
    only_plans = runner.invoke(main, ["compile", str(folder), "--output", "x", "--trtllm-version", "1.2.1"])
    assert only_plans.exit_code == 2 and "only plan (--dry-run)" in only_plans.output


def test_config_show_says_which_path_and_why(tmp_path: Path) -> None:
    from lmforge.cli import main

    folder = _folder(tmp_path)
    (folder / "serving.properties").write_text("option.rolling_batch=trtllm\n")
    shown = CliRunner().invoke(main, ["config", "show", str(folder)])
    assert shown.exit_code == 0, shown.output
    path_line = next(line for line in shown.stdout.splitlines() if "trtllm path:" in line)
    assert "PyTorch-backend path (TensorRT-LLM not installed here; planning for 1.3.0rc29" in path_line
    assert "no TensorRT engine builder" in path_line
