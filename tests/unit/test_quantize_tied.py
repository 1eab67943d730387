"""W8A8 on a model whose LM head is tied to its input embedding (SmolLM2's shape): the checkpoint keeps
one int8 matrix with one scale per row for both (compressed-tensors' ``Embedding`` target beside the
``Linear`` W8A8 group), transformers reads it, and LMI-Dist serves the head on its int8 GEMM and the
lookup on the int8 rows, equal to the dequantized embedding's rows; a folder vLLM serves keeps both
float and tied."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmforge.quantize import (
    EMBEDDING_TARGETS,
    MANIFEST,
    QuantizeError,
    checkpoint_scheme,
    quantization_config,
    quantized_embedding,
)

IDS = [[1, 5, 9, 100, 7, 2047, 0, 5]]


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """The tiny model with its LM head tied to the input embedding (no lm_head.weight stored)."""
    from safetensors.torch import load_file, save_file

    tied = tmp_path_factory.mktemp("tied") / "tiny-tied"
    shutil.copytree(tiny_model, tied)
    config = json.loads((tied / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(tied / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tied / "model.safetensors"), metadata={"format": "pt"})
    return tied


@pytest.fixture(scope="module")
def tied_w8a8(tmp_path_factory: pytest.TempPathFactory, tied_model: Path) -> Path:
    from lmforge.quantize.w8a8 import quantize_folder

    out = tmp_path_factory.mktemp("tied-w8a8") / "out"
    quantize_folder(tied_model, out)
    return out


def _dequantized_embedding(folder: Path):
    """The source's input embedding as the checkpoint holds it: int8 rows times their scales."""
    import torch
    from transformers import AutoModelForCausalLM

    from lmforge.quantize.w8a8 import rtn_int8

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    q, scale = rtn_int8(model.get_input_embeddings().weight)
    return q.float() * scale, model


def test_the_tied_head_stays_tied_as_one_int8_matrix(tied_w8a8: Path, tied_model: Path) -> None:
    from safetensors import safe_open

    config = json.loads((tied_w8a8 / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    qc = config["quantization_config"]
    assert checkpoint_scheme(qc) == "w8a8" and quantized_embedding(qc) and qc["ignore"] == []
    groups = {tuple(g["targets"]): g for g in qc["config_groups"].values()}
    assert set(groups) == {("Linear",), tuple(EMBEDDING_TARGETS)}
    embedding_group = groups[tuple(EMBEDDING_TARGETS)]
    assert embedding_group["input_activations"] is None and embedding_group["format"] == "int-quantized"
    assert {k: embedding_group["weights"][k] for k in ("num_bits", "type", "strategy", "symmetric")} == {
        "num_bits": 8,
        "type": "int",
        "strategy": "channel",
        "symmetric": True,
    }
    with safe_open(str(tied_w8a8 / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        matrix = f.get_tensor("model.embed_tokens.weight")
        head_scale, embedding_scale = (
            f.get_tensor("lm_head.weight_scale"),
            f.get_tensor("model.embed_tokens.weight_scale"),
        )
    assert "lm_head.weight" not in keys  # stored once, as the embedding
    assert matrix.dtype.is_floating_point is False and matrix.element_size() == 1
    assert head_scale.shape == (matrix.shape[0], 1) and (head_scale == embedding_scale).all()
    manifest = json.loads((tied_w8a8 / MANIFEST).read_text())
    assert manifest["lm_head"].startswith("int8, tied to the input embedding")
    assert manifest["embedding"].startswith("int8, one scale per row")
    assert manifest["layers"] == 2 * 7 + 1  # 2 layers x (q, k, v, o, gate, up, down) + the LM head
    ratio = manifest["weight_bytes"]["quantized"] / manifest["weight_bytes"]["source"]
    assert ratio < 0.3, ratio


def test_transformers_reads_the_int8_embedding_as_its_dequantized_rows(
    tied_w8a8: Path, tied_model: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    deq, _ = _dequantized_embedding(tied_model)
    model = AutoModelForCausalLM.from_pretrained(str(tied_w8a8))  # its compressed-tensors path
    seen: dict[str, torch.Tensor] = {}
    model.get_input_embeddings().register_forward_hook(lambda _m, _i, out: seen.setdefault("rows", out))
    ids = torch.tensor(IDS)
    with torch.no_grad():
        model(ids)
    assert torch.equal(seen["rows"][0].float(), deq[ids[0]])


def test_lmi_dist_serves_the_lookup_on_int8_rows_equal_to_the_dequantized_embedding(
    tied_w8a8: Path, tied_model: Path
) -> None:
    import torch

    from lmforge.engines.lmi_dist import lean_layers
    from lmforge.engines.lmi_dist.cpu_linear import Int8Embedding, prepack, quantize_int8
    from lmforge.engines.lmi_dist.loading import _load_w8a8
    from lmforge.quantize.w8a8 import rtn_int8

    deq, fp32 = _dequantized_embedding(tied_model)
    model = _load_w8a8(tied_w8a8, {})
    model.eval()
    lean_layers.install(model, fuse=True)
    count, _ = quantize_int8(model, rtn_int8, checkpoint=True)
    prepack(model, 8)
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    assert count == 2 * 4 + 1  # fused q/k/v and gate/up: qkv, o, gate_up, down per layer + the head
    assert isinstance(embedding._lmforge_int8, Int8Embedding) and embedding.weight.numel() == 0
    assert hasattr(head, "_lmforge_int8") and not hasattr(head, "_lmforge_packed")  # int8, not float
    ids = torch.tensor(IDS)
    with torch.no_grad():
        assert torch.equal(embedding(ids)[0], deq[ids[0]])
        logits, ref = model(ids).logits, fp32(ids).logits
    assert ((logits - ref).abs().max() / ref.abs().max()).item() < 0.15
    assert (logits.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.75

    # option.quantize=w8a8 at load on the tied folder: the same int8 matrix, the same logits
    from transformers import AutoModelForCausalLM

    jit = AutoModelForCausalLM.from_pretrained(str(tied_model), dtype=torch.float32)
    jit.eval()
    lean_layers.install(jit, fuse=True)
    quantize_int8(jit, rtn_int8)
    prepack(jit, 8)
    assert jit.get_input_embeddings().weight.numel() == 0
    with torch.no_grad():
        assert torch.equal(jit(ids).logits, logits)


def test_the_int8_lookup_is_row_times_scale_for_any_ids_shape() -> None:
    import torch

    from lmforge.engines.lmi_dist.cpu_linear import Int8Embedding
    from lmforge.quantize.w8a8 import rtn_int8

    torch.manual_seed(0)
    weight = torch.randn(50, 16)
    q, scale = rtn_int8(weight)
    lookup = Int8Embedding(q, scale)
    deq = q.float() * scale
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    out = lookup(ids)
    assert out.shape == (2, 3, 16) and out.dtype == torch.float32
    assert torch.equal(out, torch.nn.functional.embedding(ids, deq))
    assert torch.equal(lookup(torch.tensor([49])), deq[49:50])
    assert ((out - torch.nn.functional.embedding(ids, weight)).abs().max() <= scale.max() / 2 + 1e-6).item()
    with pytest.raises(ValueError, match="row scales"):
        Int8Embedding(q, scale[:10])


def test_a_vllm_folder_keeps_the_tied_head_and_embedding_float(tmp_path: Path, tied_model: Path) -> None:
    from safetensors import safe_open

    from lmforge.cli import main

    folder = tmp_path / "v"
    shutil.copytree(tied_model, folder)
    (folder / "serving.properties").write_text("option.rolling_batch=vllm\noption.dtype=fp32\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["compile", str(folder), "--quantize", "w8a8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    qc = quantization_config(out)
    assert qc is not None and qc["ignore"] == ["lm_head"] and not quantized_embedding(qc)
    assert len(qc["config_groups"]) == 1
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["lm_head"] == "fp32" and manifest["embedding"] == "fp32 (tied to the LM head)"
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype.is_floating_point
        assert "model.embed_tokens.weight_scale" not in set(f.keys())


def test_an_embedding_group_lmi_dist_cannot_serve_is_refused_naming_it(tied_w8a8: Path) -> None:
    qc = quantization_config(tied_w8a8)
    assert qc is not None
    name = next(k for k, g in qc["config_groups"].items() if g["targets"] == EMBEDDING_TARGETS)
    four_bits = json.loads(json.dumps(qc))
    four_bits["config_groups"][name]["weights"]["num_bits"] = 4
    with pytest.raises(QuantizeError, match=r"\['Embedding'\] group: \{'num_bits': 4\}"):
        checkpoint_scheme(four_bits)
    with_acts = json.loads(json.dumps(qc))
    with_acts["config_groups"][name]["input_activations"] = {"num_bits": 8}
    with pytest.raises(QuantizeError, match=r"\['Embedding'\] group: .*input_activations"):
        checkpoint_scheme(with_acts)
    three = json.loads(json.dumps(qc))
    three["config_groups"]["group_9"] = three["config_groups"][name]
    with pytest.raises(QuantizeError, match=r"with 3 config group\(s\)"):
        checkpoint_scheme(three)


def test_the_plan_reads_the_tied_checkpoint_as_w8a8_at_8_bits(tied_w8a8: Path) -> None:
    from lmforge.hf.config import ModelShape

    shape = ModelShape.from_config(json.loads((tied_w8a8 / "config.json").read_text()))
    assert shape.quant_method == "w8a8" and shape.quant_bits == 8.0 and shape.tie_word_embeddings
