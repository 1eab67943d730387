from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmforge.cli.example_cmd import example_model_command
from lmforge.config import load_config
from lmforge.models.example import write_example_model


def test_files_and_modes(tiny_model: Path) -> None:
    names = {p.name for p in tiny_model.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "serving.properties",
    } <= names
    assert (
        "chat_template.jinja" in names
        or "chat_template" in (tiny_model / "tokenizer_config.json").read_text()
    )
    for p in tiny_model.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_loads_with_the_real_loading_code(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    ids = tok("def f(x):\n    return x")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "def f(x):\n    return x"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    assert model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


def test_serving_properties_is_valid(tiny_model: Path) -> None:
    cfg = load_config(tiny_model, env={}).config
    assert cfg.max_model_len == 1024
    assert cfg.dtype == "fp32"


def test_deterministic_per_seed(tiny_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    again = write_example_model(tmp_path / "again")
    other = write_example_model(tmp_path / "other", seed=1)
    assert (again / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (tiny_model, again, other))
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a)
    assert any(not (a[k] == c[k]).all() for k in a)
    assert json.loads((again / "config.json").read_text())["num_hidden_layers"] == 2


def test_refuses_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_example_model(tmp_path / "x")
    result = CliRunner().invoke(example_model_command, [str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "--overwrite" in result.output


def test_cli_writes_and_says_what_next(tmp_path: Path) -> None:
    result = CliRunner().invoke(example_model_command, [str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert f"Next: lmforge serve {tmp_path / 'm'}" in result.output
    assert "curl -N localhost:8080/invocations" in result.output
