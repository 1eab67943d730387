"""W8A8 quantization: the method table's errors, the compressed-tensors checkpoint `lmforge compile
--quantize` writes, the int8 linear layer LMI-Dist serves it with, and the refusals at start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmforge.config import load_config
from lmforge.errors import LmforgeError
from lmforge.quantize import MANIFEST, QuantizeError, checkpoint_scheme, method, quantization_config


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    from lmforge.quantize.w8a8 import quantize_folder

    out = tmp_path_factory.mktemp("quantized") / "tiny-w8a8"
    quantize_folder(tiny_model, out)
    return out


def test_unknown_method_names_the_option_and_the_choices() -> None:
    with pytest.raises(QuantizeError, match=r"option.quantize=awq: unknown .* w8a8 \(CPU and GPU\)"):
        method("awq")
    assert method(" W8A8 ").name == "w8a8"


def test_fp8_is_refused_on_a_cpu_only_target_with_the_reason() -> None:
    with pytest.raises(QuantizeError, match=r"--quantize=fp8: .*CPU-only.*no fp8 inputs"):
        method("fp8", option="--quantize", cpu_only=True)


def test_checkpoint_is_compressed_tensors_w8a8_with_a_manifest(quantized: Path, tiny_model: Path) -> None:
    from safetensors import safe_open

    from lmforge.quantize.w8a8 import weights_digest

    qc = quantization_config(quantized)
    assert qc is not None and checkpoint_scheme(qc) == "w8a8"
    assert qc["format"] == "int-quantized" and qc["ignore"] == []
    manifest = json.loads((quantized / MANIFEST).read_text())
    assert manifest["method"] == "w8a8" and manifest["scheme"] == "W8A8"
    assert manifest["source"]["weights"] == weights_digest(tiny_model)
    assert manifest["calibration"] is None
    assert set(manifest["libraries"]) >= {"torch", "transformers", "compressed-tensors"}
    with safe_open(str(quantized / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("lm_head.weight").dtype.is_floating_point is False
    assert "model.layers.0.mlp.down_proj.weight_scale" in keys and "lm_head.weight_scale" in keys
    assert manifest["weight_bytes"]["quantized"] < 0.5 * manifest["weight_bytes"]["source"]
    # the option that asked for it is not carried over: the weights say it now
    assert "option.quantize" not in (quantized / "serving.properties").read_text()


def test_tied_lm_head_is_untied_and_quantized(tmp_path: Path, tiny_model: Path) -> None:
    from safetensors import safe_open

    from lmforge.quantize.w8a8 import quantize_folder

    tied = tmp_path / "tied"
    shutil.copytree(tiny_model, tied)
    config = json.loads((tied / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tied / "model.safetensors"))
    del tensors["lm_head.weight"]  # tied: the head is the embedding
    save_file(tensors, str(tied / "model.safetensors"), metadata={"format": "pt"})
    manifest = quantize_folder(tied, tmp_path / "out")
    assert manifest["lm_head"].startswith("int8 (untied")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype.is_floating_point
        assert not f.get_tensor("lm_head.weight").dtype.is_floating_point


def test_a_failure_midway_leaves_no_output(tmp_path: Path, tiny_model: Path, monkeypatch) -> None:
    from lmforge.quantize import w8a8

    def broken(*args: object) -> None:
        (tmp_path / "marker").write_text("started")
        raise RuntimeError("disk full")

    monkeypatch.setattr(w8a8, "_write", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        w8a8.quantize_folder(tiny_model, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["marker"]  # no out, no partial folder


def test_int8_layer_is_close_to_fp32_and_the_same_alone_or_in_a_batch() -> None:
    import torch

    from lmforge.engines.lmi_dist.cpu_linear import Int8Weight
    from lmforge.quantize.w8a8 import rtn_int8

    torch.manual_seed(0)
    w = torch.randn(96, 64) * 0.02
    q, scale = rtn_int8(w)
    layer = Int8Weight(q, scale)
    x = torch.randn(1, 9, 64) * 3
    y, ref = layer(x), torch.nn.functional.linear(x, w)
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 0.03
    for i in range(9):
        assert torch.equal(layer(x[:, i : i + 1])[0, 0], y[0, i]), f"row {i} alone differs"


def _cfg(folder: Path, properties: str):
    (folder / "serving.properties").write_text(properties)
    return load_config(folder).config


def test_start_refuses_what_lmi_dist_cannot_serve(tmp_path: Path, tiny_model: Path, quantized: Path) -> None:
    from lmforge.engines.lmi_dist.loading import quantization

    plain = tmp_path / "plain"
    shutil.copytree(tiny_model, plain)
    assert quantization(_cfg(plain, "option.rolling_batch=lmi-dist\n"), plain, 1, False) == (None, False)
    jit = _cfg(plain, "option.rolling_batch=lmi-dist\noption.quantize=w8a8\n")
    assert quantization(jit, plain, 1, False) == ("w8a8", False)
    with pytest.raises(LmforgeError, match=r"option.quantize=gptq: unknown"):
        quantization(_cfg(plain, "option.quantize=gptq\n"), plain, 1, False)
    with pytest.raises(LmforgeError, match=r"option.quantize=fp8: .*CPU-only"):
        quantization(_cfg(plain, "option.quantize=fp8\n"), plain, 1, False)
    with pytest.raises(LmforgeError, match="without tensor parallelism"):
        quantization(jit, plain, 2, False)
    with pytest.raises(LmforgeError, match=r"option.dtype=bf16 with w8a8"):
        quantization(_cfg(plain, "option.quantize=w8a8\noption.dtype=bf16\n"), plain, 1, False)
    copy = tmp_path / "q"
    shutil.copytree(quantized, copy)
    assert quantization(_cfg(copy, "option.rolling_batch=lmi-dist\n"), copy, 1, False) == ("w8a8", True)
    with pytest.raises(LmforgeError, match=r"option.quantize=fp8 but .* already quantized \(w8a8"):
        quantization(_cfg(copy, "option.quantize=fp8\n"), copy, 1, True)
    config = json.loads((copy / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["input_activations"]["strategy"] = "tensor"
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(LmforgeError, match=r"input_activations: \{'strategy': 'tensor'\}"):
        quantization(_cfg(copy, "option.rolling_batch=lmi-dist\n"), copy, 1, False)


def test_compile_cli_quantize_errors(tmp_path: Path, tiny_model: Path) -> None:
    from lmforge.cli import main

    runner = CliRunner()
    out = tmp_path / "out"
    result = runner.invoke(main, ["compile", str(tiny_model), "--quantize", "awq", "-o", str(out)])
    assert result.exit_code != 0 and "--quantize=awq: unknown quantization method" in result.output
    result = runner.invoke(main, ["compile", str(tiny_model), "--quantize", "fp8", "-o", str(out)])
    assert result.exit_code != 0 and "CPU-only" in result.output
    trt = tmp_path / "trt"
    shutil.copytree(tiny_model, trt)
    (trt / "serving.properties").write_text("option.rolling_batch=trtllm\n")
    result = runner.invoke(main, ["compile", str(trt), "--quantize", "w8a8", "-o", str(out)])
    assert result.exit_code != 0 and "TensorRT-LLM folder quantizes with ModelOpt" in result.output
    assert not out.exists()


def test_compile_reads_option_quantize_of_an_lmi_dist_folder(tmp_path: Path, tiny_model: Path) -> None:
    from lmforge.cli import main

    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    with (folder / "serving.properties").open("a") as f:
        f.write("option.quantize=w8a8\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", str(folder), "-o", str(out), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{") :])["method"] == "w8a8"


def test_compile_keeps_the_lm_head_float_for_a_vllm_folder(tmp_path: Path, tiny_model: Path) -> None:
    from lmforge.cli import main

    folder = tmp_path / "v"
    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text("option.rolling_batch=vllm\noption.dtype=fp32\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", str(folder), "--quantize", "w8a8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "vLLM 0.32 loads no quantized LM head" in result.output
    manifest = json.loads((out / MANIFEST).read_text())
    qc = quantization_config(out)
    assert manifest["lm_head"] == "fp32" and qc is not None and qc["ignore"] == ["lm_head"]


def test_the_int8_kernels_reach_in_table_resolves() -> None:
    from lmforge.reachins import TORCH_INT8, missing

    assert missing(TORCH_INT8.reaches) == []
