"""The Hugging Face readers (lmforge.hf) that the planner and the adapter checks share."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from lmforge.hf import ModelFileError, ModelShape, read_safetensors_header, weight_files


def test_safetensors_header_lists_every_tensor_without_reading_data(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a.weight": torch.zeros(3, 5, dtype=torch.float16), "b": torch.zeros(7)}, str(path))
    tensors = {t.name: t for t in read_safetensors_header(path)}
    assert (tensors["a.weight"].dtype, tensors["a.weight"].shape, tensors["a.weight"].nbytes) == (
        "F16",
        (3, 5),
        30,
    )
    assert (tensors["b"].numel, tensors["b"].nbytes) == (7, 28)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x02", "shorter than 8 bytes"),
        (struct.pack("<Q", 10**12), "header of"),
        (struct.pack("<Q", 5) + b"{nope", "unreadable safetensors header"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 14) + b'{"x": {"a": 1}}'[:14], "unreadable"),
        (struct.pack("<Q", 19) + b'{"x": {"dtype": 1}}', "malformed safetensors header entry 'x'"),
    ],
)
def test_a_damaged_header_is_a_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        read_safetensors_header(path)


def test_weight_files_follow_the_index_and_skip_consolidated_copies(tmp_path: Path) -> None:
    for name in ("model-00002.safetensors", "model-00001.safetensors", "consolidated.safetensors"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in weight_files(tmp_path)] == ["model-00001.safetensors", "model-00002.safetensors"]
    index = {"weight_map": {"a": "model-00002.safetensors", "b": "model-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert [p.name for p in weight_files(tmp_path)] == ["model-00002.safetensors"]


def test_model_shape_of_the_example_model(tiny_model: Path) -> None:
    data = json.loads((tiny_model / "config.json").read_text())
    shape = ModelShape.from_config(data)
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size) == (
        data["hidden_size"],
        data["num_hidden_layers"],
        data["vocab_size"],
    )
    assert shape.parameters() > 0 and shape.gated_mlp
    with pytest.raises(ModelFileError, match="lacks hidden_size"):
        ModelShape.from_config({"num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 8})
