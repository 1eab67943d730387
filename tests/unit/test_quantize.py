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
from tests.shared_vllm import needs_vllm


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


def test_int8_scaling_in_c_is_pytorchs_bits_and_each_rows_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C library's per-token scaling (lmforge_int8_*_rows) gives the same bits as the PyTorch
    operations it replaces, with and without a bias, for a zero row, for batches past the buffer's
    first size and for strided rows; and a row's output does not depend on the rows beside it."""
    import torch

    from lmforge.engines.lmi_dist import cpu_linear, int8_kernel
    from lmforge.quantize.w8a8 import rtn_int8

    scaling = cpu_linear._scaling()
    if scaling is None:
        pytest.skip("the C library was not built (no C compiler)")
    torch.manual_seed(0)
    w = torch.randn(80, 48) * 0.02
    monkeypatch.setattr(int8_kernel, "kernel", lambda: None)  # fbgemm's products, whatever this CPU has
    layer = cpu_linear.Int8Weight(*rtn_int8(w))
    assert layer.own is None
    bias = torch.randn(80)
    for n in (1, 7, 70, 200):
        x = torch.randn(n, 96) * 4
        x[0] = 0.0
        rows = x[:, :48]  # a row stride of 96, unit column stride
        for b in (None, bias):
            fast = layer(rows, b)
            with monkeypatch.context() as patch:
                patch.setattr(cpu_linear, "_scaling", lambda: None)
                slow = layer(rows, b)
            assert torch.equal(fast, slow), f"{n} rows, bias {b is not None}"
            assert torch.equal(layer(rows[n - 1 :], b)[0], fast[n - 1]), "the last row alone differs"
    assert not torch.isnan(fast[0]).any()


def _w8a8_reference(x, q, scale, bias=None):
    """compressed-tensors' W8A8 product in PyTorch, exactly as int8_kernel.c promises it: each row
    quantized by its own scale (round half to even, clamped to +-127), the integer sums in int64, then
    ((sum * w_scale) * x_scale) + bias in float32."""
    import torch

    top = x.abs().amax(-1, keepdim=True)
    inv = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    xq = (x * inv).round().clamp(-127, 127).to(torch.int64)
    y = ((xq @ q.to(torch.int64).t()).float() * scale.reshape(1, -1).float()) * (top / 127.0)
    return y + bias if bias is not None else y


@pytest.mark.parametrize("path", ["native", "no-amx", "portable"])
def test_own_int8_kernel_is_the_reference_bit_for_bit_and_each_rows_own(path: str) -> None:
    """lmforge's int8 kernel (int8_kernel.c), on this CPU's paths (AMX from 8 rows where there is AMX,
    the VNNI loop) and on the portable C loop, equals the W8A8 reference bit for bit: odd widths (k and
    n not multiples of 4 or 64), with and without a bias, a zero row, strided rows, a batch past the
    scratch buffers' first size; and every row is the same alone as in its batch, where the batch runs
    on AMX and the row alone on the VNNI loop."""
    import torch

    from lmforge.engines.lmi_dist import int8_kernel, lora_kernel

    lib, why = lora_kernel.library()
    if lib is None:
        pytest.skip(f"the C library: {why}")
    kernel = int8_kernel.Kernel(lib)
    torch.manual_seed(0)
    kernel.force_portable(path == "portable")
    kernel.force_no_amx(path == "no-amx")
    try:
        for n, k in ((100, 37), (64, 64), (130, 576), (7, 1539), (48, 128)):
            q = torch.randint(-128, 128, (n, k), dtype=torch.int8)
            scale = torch.rand(n) * 0.01 + 1e-4
            packed = kernel.pack(q, scale)
            bias = torch.randn(n)
            for m in (1, 3, 6, 40, 300):
                x = torch.randn(m, 2 * k) * 3
                x[0] *= 100.0
                x[m // 2] = 0.0
                rows = x[:, :k]  # a row stride of 2 k
                for b in (None, bias):
                    y = packed(rows, b)
                    ref = _w8a8_reference(rows, q, scale, b)
                    assert torch.equal(y, ref), f"{n}x{k}, {m} rows, bias {b is not None}"
                    for i in {0, m // 2, m - 1}:
                        assert torch.equal(packed(rows[i : i + 1], b)[0], y[i]), f"row {i} alone differs"
    finally:
        kernel.force_portable(False)
        kernel.force_no_amx(False)
    assert packed(torch.empty(0, 128), None).shape == (0, 48)


def test_int8_kernel_choice_follows_the_env_and_names_its_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from lmforge.engines.lmi_dist import int8_kernel, lora_kernel

    if lora_kernel.library()[0] is None:
        pytest.skip("the C library was not built")
    for value, own in (("fbgemm", False), ("c", True)):
        monkeypatch.setenv(int8_kernel.ENV, value)
        int8_kernel.kernel.cache_clear()
        with caplog.at_level(logging.INFO, logger="lmforge.engines.lmi_dist"):
            assert (int8_kernel.kernel() is not None) is own
        assert ("lmforge's int8 kernel (" in caplog.text) is own, caplog.text
        caplog.clear()
    monkeypatch.setenv(int8_kernel.ENV, "fast")
    int8_kernel.kernel.cache_clear()
    with pytest.raises(ValueError, match="LMFORGE_INT8_KERNEL='fast': choose one of auto, c, fbgemm"):
        int8_kernel.kernel()
    int8_kernel.kernel.cache_clear()


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
    with pytest.raises(LmforgeError, match=r"option.quantize=awq: unknown"):
        quantization(_cfg(plain, "option.quantize=awq\n"), plain, 1, False)
    with pytest.raises(LmforgeError, match=r"option.quantize=gptq: gptq is calibrated .*\(lmforge compile"):
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


# --- the start check of the quantize manifest (lmforge.quantize.start_check) -----------------------


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def test_the_manifest_lists_the_quantized_weight_files_with_their_digests(quantized: Path) -> None:
    from lmforge.quantize.start_check import sha256_file

    files = _manifest(quantized)["files"]
    assert [f["path"] for f in files] == ["model.safetensors"]
    assert files[0]["sha256"] == sha256_file(quantized / "model.safetensors")
    assert files[0]["size"] == (quantized / "model.safetensors").stat().st_size


def test_a_fresh_checkpoint_is_a_logged_hit(tmp_path: Path, quantized: Path, caplog) -> None:
    from lmforge.quantize.start_check import check_at_start

    folder = _copy(quantized, tmp_path / "q")
    cfg = _cfg(folder, "option.rolling_batch=lmi-dist\noption.compile_cache=required\n")
    with caplog.at_level("INFO", logger="lmforge.quantize"):
        decision = check_at_start(cfg, folder, "lmi-dist")
    assert decision.status == "hit" and decision.method == "w8a8"
    assert "lmi-dist: quantized checkpoint: hit (w8a8" in caplog.text


def test_changed_weights_are_a_logged_miss_that_required_refuses(
    tmp_path: Path, quantized: Path, caplog
) -> None:
    from lmforge.quantize.start_check import QuantizeStartError, check_at_start

    folder = _copy(quantized, tmp_path / "q")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the same size, other bytes
    weights.write_bytes(bytes(data))
    with caplog.at_level("INFO", logger="lmforge.quantize"):
        decision = check_at_start(_cfg(folder, "option.rolling_batch=lmi-dist\n"), folder, "lmi-dist")
    assert decision.status == "miss"
    assert "quantized checkpoint: miss (model.safetensors: weights digest mismatch" in caplog.text
    assert any(r.levelname == "WARNING" for r in caplog.records)
    required = _cfg(folder, "option.rolling_batch=lmi-dist\noption.compile_cache=required\n")
    with pytest.raises(QuantizeStartError, match=r"option.compile_cache=required refuses .* weights digest"):
        check_at_start(required, folder, "lmi-dist")
    # off: not checked at all
    off = _cfg(folder, "option.rolling_batch=lmi-dist\noption.compile_cache=off\n")
    assert check_at_start(off, folder, "lmi-dist").status == "none"


def test_missing_added_and_truncated_weight_files_are_misses(tmp_path: Path, quantized: Path) -> None:
    from lmforge.quantize.start_check import decide

    folder = _copy(quantized, tmp_path / "q")
    (folder / "extra.safetensors").write_bytes(b"x")
    assert "extra.safetensors is not in the manifest" in decide(folder, None).line()
    (folder / "extra.safetensors").unlink()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert "model.safetensors has " in decide(folder, None).line()
    weights.unlink()
    assert "model.safetensors is missing" in decide(folder, None).line()


def test_other_library_versions_are_a_miss_naming_them(tmp_path: Path, quantized: Path) -> None:
    from lmforge.quantize.start_check import decide

    folder = _copy(quantized, tmp_path / "q")
    manifest = _manifest(folder)
    manifest["libraries"]["compressed-tensors"] = "0.1.0"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    decision = decide(folder, None)
    assert decision.status == "miss"
    assert any(r.startswith("compressed-tensors 0.1.0 at compile, ") for r in decision.reasons)
    del manifest["files"]
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert "lists no quantized weight files" in decide(folder, None).line()
    (folder / MANIFEST).write_text("{not json")
    assert "is unreadable" in decide(folder, None).line()


def test_an_option_quantize_the_manifest_disagrees_with_is_refused_naming_both(
    tmp_path: Path, quantized: Path
) -> None:
    from lmforge.quantize.start_check import QuantizeStartError, check_at_start, decide

    folder = _copy(quantized, tmp_path / "q")
    assert decide(folder, "W8A8").status == "hit"
    with pytest.raises(
        QuantizeStartError, match=r"option.quantize=gptq but .* w8a8 checkpoint .*method=w8a8"
    ):
        check_at_start(_cfg(folder, "option.quantize=gptq\n"), folder, "lmi-dist")


def test_a_manifest_that_disagrees_with_config_json_is_a_miss(tmp_path: Path, quantized: Path) -> None:
    from lmforge.quantize.start_check import decide

    folder = _copy(quantized, tmp_path / "q")
    manifest = _manifest(folder)
    manifest["method"] = "gptq"
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert "config.json's quantization_config is w8a8, the manifest says gptq" in decide(folder, None).line()


def test_required_refuses_quantization_at_load_and_checkpoints_without_a_manifest(
    tmp_path: Path, tiny_model: Path, quantized: Path
) -> None:
    from lmforge.quantize.start_check import QuantizeStartError, check_at_start

    plain = _copy(tiny_model, tmp_path / "plain")
    assert check_at_start(_cfg(plain, "option.compile_cache=required\n"), plain, "lmi-dist").status == "none"
    jit = _cfg(plain, "option.quantize=w8a8\noption.compile_cache=required\n")
    with pytest.raises(QuantizeStartError, match="quantized at load"):
        check_at_start(jit, plain, "lmi-dist")
    assert check_at_start(_cfg(plain, "option.quantize=w8a8\n"), plain, "lmi-dist").status == "none"
    elsewhere = _copy(quantized, tmp_path / "elsewhere")
    shutil.rmtree(elsewhere / "lmforge-compiled")
    assert "made elsewhere" in check_at_start(_cfg(elsewhere, ""), elsewhere, "vllm").line()
    with pytest.raises(QuantizeStartError, match="made elsewhere"):
        check_at_start(_cfg(elsewhere, "option.compile_cache=required\n"), elsewhere, "vllm")


# --- GPTQ (W4A16) -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gptq_quantized(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    from lmforge.quantize.w8a8 import quantize_folder

    out = tmp_path_factory.mktemp("gptq") / "tiny-gptq"
    quantize_folder(tiny_model, out, method_name="gptq")
    return out


def test_gptq_lowers_the_output_error_of_rounding_to_nearest() -> None:
    """On inputs with correlated channels (what real activations have), GPTQ's column updates give a
    smaller output error than rounding each weight to nearest, with the same int4 grid."""
    import torch

    from lmforge.quantize.gptq import gptq_int4, rtn_int4

    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.02
    x = torch.randn(2048, 16) @ torch.randn(16, 128) + 0.1 * torch.randn(2048, 128)
    h = 2 * x.t() @ x / x.shape[0]

    def output_error(q: torch.Tensor, scale: torch.Tensor) -> float:
        deq = (q.float().view(64, -1, 64) * scale[..., None]).view(64, 128)
        return float(((x @ deq.t() - x @ w.t()) ** 2).mean())

    q_g, s_g = gptq_int4(w, h, 64)
    q_r, s_r = rtn_int4(w, 64)
    assert q_g.dtype == torch.int8 and int(q_g.min()) >= -8 and int(q_g.max()) <= 7
    assert s_g.shape == (64, 2)
    assert output_error(q_g, s_g) < 0.7 * output_error(q_r, s_r)


def test_the_group_size_divides_every_input_width_or_the_model_is_refused() -> None:
    from lmforge.quantize.gptq import group_size_for

    assert group_size_for([4096, 11008]) == 128
    assert group_size_for([576, 1536]) == 64  # SmolLM2-135M
    with pytest.raises(QuantizeError, match=r"--quantize gptq: no group size .*\(100, 128\)"):
        group_size_for([100, 128])


def test_gptq_checkpoint_is_compressed_tensors_pack_quantized_with_its_calibration(
    gptq_quantized: Path,
) -> None:
    from safetensors import safe_open

    from lmforge.quantize.calibration import fingerprint
    from lmforge.quantize.start_check import decide

    qc = quantization_config(gptq_quantized)
    assert qc is not None and checkpoint_scheme(qc) == "gptq" and qc["format"] == "pack-quantized"
    assert qc["config_groups"]["group_0"]["weights"]["group_size"] == 128  # the tiny model's widths
    manifest = json.loads((gptq_quantized / MANIFEST).read_text())
    assert manifest["method"] == "gptq" and manifest["scheme"] == "W4A16"
    assert manifest["calibration"]["sha256"] == fingerprint("")[2]
    assert manifest["calibration"]["prompts"] == fingerprint("")[1]
    assert manifest["lm_head"] == "int4"
    with safe_open(str(gptq_quantized / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {
        "lm_head.weight_packed",
        "lm_head.weight_scale",
        "model.layers.0.mlp.down_proj.weight_packed",
    } <= keys
    assert decide(gptq_quantized, "gptq").status == "hit"


def test_int4_layer_matches_its_dequantized_weight_alone_or_in_a_batch() -> None:
    import torch

    from lmforge.engines.lmi_dist.cpu_linear import Int4Weight
    from lmforge.quantize.gptq import rtn_int4

    torch.manual_seed(0)
    w = torch.randn(96, 128) * 0.02
    q, scale = rtn_int4(w, 64)
    deq = (q.float().view(96, 2, 64) * scale[..., None]).view(96, 128)
    x = torch.randn(1, 9, 128) * 3
    ref = torch.nn.functional.linear(x, deq)
    exact = Int4Weight(q, scale, 64, dtype=torch.float32)(x)  # the kernel's float32 path: the same product
    assert ((exact - ref).abs().max() / ref.abs().max()).item() < 1e-5
    layer = Int4Weight(q, scale, 64)  # served: bfloat16 activations (the fast path on this CPU)
    y = layer(x)
    assert y.dtype == torch.float32 and ((y - ref).abs().max() / ref.abs().max()).item() < 1e-2
    for i in range(9):
        assert torch.equal(layer(x[:, i : i + 1])[0, 0], y[0, i]), f"row {i} alone differs"


def test_lmi_dist_loads_the_gptq_checkpoint_on_int4_layers_close_to_its_dequantized_weights(
    gptq_quantized: Path,
) -> None:
    import torch

    from lmforge.engines.lmi_dist.cpu_linear import W_SCALE, quantize_int4
    from lmforge.engines.lmi_dist.loading import _load_w4a16

    model = _load_w4a16(gptq_quantized, {})
    down = model.model.layers[0].mlp.down_proj
    values, scale = down.weight.detach().clone(), getattr(down, W_SCALE)
    assert values.abs().max() <= 8 and torch.equal(values, values.round())
    x = torch.randn(3, down.in_features)
    group = down.in_features // scale.shape[1]
    deq = (values.view(down.out_features, -1, group) * scale[..., None]).view_as(values)
    count, _ = quantize_int4(model)
    assert count == 2 * 7 + 1  # 2 layers x (q, k, v, o, gate, up, down) + the LM head
    ref = x @ deq.t()
    assert ((down(x) - ref).abs().max() / ref.abs().max()).item() < 1e-2


def _vllm(folder: Path, **fields: object):
    from lmforge.config.schema import ServingConfig

    return ServingConfig(model_dir=folder, **fields)  # type: ignore[arg-type]


@needs_vllm
def test_a_gptq_checkpoint_on_vllm_cpu_needs_a_16_bit_dtype(tmp_path: Path, monkeypatch) -> None:
    """vLLM 0.32's CPU int4 kernel (cpu_gemm_wna16) has no float32 path: measured, it starts and then
    fails at the first request ("not implemented for 'Float'"); refused at start instead."""
    import json

    from lmforge.engines.vllm import options
    from lmforge.engines.vllm.options import VllmOptionError, engine_kwargs

    monkeypatch.setattr(options, "_cpu_platform", lambda: True)
    weights = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64, "symmetric": True}
    qc = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
    }
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    with pytest.raises(
        VllmOptionError, match=r"option.dtype=fp32 with a gptq .*no float32 path.*option.dtype=bf16"
    ):
        engine_kwargs(_vllm(tmp_path, dtype="fp32"), {})
    assert engine_kwargs(_vllm(tmp_path, dtype="bf16"), {})["dtype"] == "bfloat16"
    assert "quantization" not in engine_kwargs(_vllm(tmp_path, dtype="bf16", quantize="gptq"), {})


@needs_vllm
def test_a_w8a8_checkpoint_on_vllm_on_an_amx_cpu_needs_a_16_bit_dtype(tmp_path: Path, monkeypatch) -> None:
    """On a CPU with AMX, vLLM 0.32 runs W8A8 on its AMX int8 kernel (int8_scaled_mm_with_quant), which
    takes bfloat16 or float16 activations only: measured on a Sapphire Rapids-class host, an fp32 start
    came up and then failed at the first request ("expect A to be bfloat16 or half"); refused at start
    instead. Without AMX (its oneDNN kernel, float32 in) fp32 is served."""
    import json

    from lmforge.engines.vllm import compile_manifest, options
    from lmforge.engines.vllm.options import VllmOptionError, engine_kwargs

    monkeypatch.setattr(options, "_cpu_platform", lambda: True)
    group = {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True, "dynamic": False},
        "input_activations": {
            "num_bits": 8,
            "type": "int",
            "strategy": "token",
            "symmetric": True,
            "dynamic": True,
        },
    }
    qc = {
        "quant_method": "compressed-tensors",
        "format": "int-quantized",
        "config_groups": {"group_0": group},
    }
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    monkeypatch.setattr(compile_manifest, "cpu_flags", lambda: ("avx512f", "amx_tile", "amx_int8"))
    with pytest.raises(VllmOptionError, match=r"option.dtype=fp32 with a w8a8 .*AMX.*option.dtype=bf16"):
        engine_kwargs(_vllm(tmp_path, dtype="fp32"), {})
    assert engine_kwargs(_vllm(tmp_path, dtype="bf16"), {})["dtype"] == "bfloat16"
    monkeypatch.setattr(compile_manifest, "cpu_flags", lambda: ("avx512f", "avx512_vnni"))
    assert engine_kwargs(_vllm(tmp_path, dtype="fp32"), {})["dtype"] == "float32"


def test_a_quantized_folder_is_readable_by_other_users(tmp_path: Path, tiny_model: Path) -> None:
    """The images serve a mounted folder as uid 1000: safetensors' and mkdtemp's 0600 / 0700 must not
    reach the output."""
    import stat

    from lmforge.quantize.w8a8 import quantize_folder

    out = tmp_path / "q"
    quantize_folder(tiny_model, out)
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o044 == 0o044 if path.is_file() else mode & 0o055 == 0o055, (path, oct(mode))


def test_lmforges_int4_kernel_equals_a_float64_product_and_each_row_is_its_own() -> None:
    """lmforge's W4A16 kernel (int4_kernel.c, AVX-512 BF16) against a float64 product of the same
    bfloat16-rounded input and the dequantized weight, for channel counts that are and are not a
    multiple of 16, every group size it takes, a bias and strided input rows; each row's output has
    the same bits alone as in the batch, and shapes outside its layout are refused."""
    import torch

    from lmforge.engines.lmi_dist import int4_kernel

    kernel = int4_kernel.kernel()
    if kernel is None:
        pytest.skip("lmforge's int4 kernel does not run here (no AVX-512 BF16, or not built)")
    torch.manual_seed(5)
    for n, k, group in [(40, 64, 32), (96, 256, 128), (16, 512, 256), (33, 192, 64)]:
        q = torch.randint(-8, 8, (n, k), dtype=torch.int8)
        scale = torch.rand(n, k // group) * 0.02 + 1e-3
        packed = kernel.pack(q, scale, group)
        deq = (q.double().view(n, -1, group) * scale.double()[..., None]).view(n, k)
        wide = torch.randn(19, 2 * k) * 3
        x = wide[:, :k]  # row stride 2k
        bias = torch.randn(n)
        y = packed(x, bias)
        ref = x.to(torch.bfloat16).double() @ deq.t() + bias.double()
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6, (n, k, group)
        for i in range(19):
            assert torch.equal(packed(x[i : i + 1].contiguous(), bias)[0], y[i]), f"{n}x{k}: row {i} alone"
    with pytest.raises(ValueError, match="in groups of"):
        kernel.pack(torch.zeros(16, 48, dtype=torch.int8), torch.ones(16, 1), 48)
    with pytest.raises(ValueError, match=r"outside -8\.\.7"):
        kernel.pack(torch.full((16, 64), 9, dtype=torch.int8), torch.ones(16, 2), 32)
