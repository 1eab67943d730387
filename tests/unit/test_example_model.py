"""The embedded example model: what ``write_example_model`` and ``lmforge example-model`` write."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lmforge.cli.example_cmd import example_model_command
from lmforge.models.example import SPECIAL_TOKENS, write_example_model

pytestmark = pytest.mark.xdist_group("example-model")

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXPECTED_FILES = {
    "README.md",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "serving.properties",
    "tokenizer.json",
    "tokenizer_config.json",
}
CODE_SAMPLES = [
    "def f(x):\n    return x",
    "import os\n\nclass Spam(object):\n    def __init__(self, eggs=None):\n        self.eggs = eggs  # ham\n",
    "for i in range(10):\n\tprint(f'{i!r:>4}', end='')\n",
    "  leading spaces, trailing spaces  \n\n\n",
    "~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    torch.set_num_threads(1)
    return write_example_model(tmp_path_factory.mktemp("example") / "nested" / "tiny")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(folder / "model.safetensors")))


def _same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_files_exist_with_mode_0644(model_dir: Path) -> None:
    assert model_dir.parent.name == "nested"  # parents are created
    assert {p.name for p in model_dir.iterdir()} == EXPECTED_FILES  # no staging folder left behind
    for p in model_dir.iterdir():
        assert p.is_file(), p
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_serving_properties_and_readme(model_dir: Path) -> None:
    props = {}
    for line in (model_dir / "serving.properties").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    assert props == {
        "engine": "Python",
        "option.rolling_batch": "lmi-dist",
        "option.dtype": "fp32",
        "option.max_rolling_batch_size": "32",
        "option.max_model_len": "1024",
    }
    readme = (model_dir / "README.md").read_text()
    assert "random weights" in readme
    assert "gibberish" in readme


def test_serving_properties_is_valid_lmforge_config(model_dir: Path) -> None:
    from lmforge.config import load_config

    cfg = load_config(model_dir, env={}).config
    assert cfg.max_model_len == 1024
    assert cfg.dtype == "fp32"


def test_configs(model_dir: Path, tokenizer: Any, model: Any) -> None:
    import torch

    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is False
    assert cfg["vocab_size"] == len(tokenizer) == 2048
    assert cfg["num_hidden_layers"] == 2
    assert cfg["num_key_value_heads"] == 2
    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    assert {k: cfg[k] for k in ids} == ids
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert {k: generation[k] for k in ids} == ids
    assert tokenizer.model_max_length == 2048
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 500_000 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_special_tokens(tokenizer: Any) -> None:
    assert (tokenizer.unk_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<unk>",
        "<s>",
        "</s>",
        "<pad>",
    )
    # Special tokens come first in the vocabulary and each encodes as one token, never split.
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(len(SPECIAL_TOKENS)))
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer(token, add_special_tokens=False)["input_ids"] == [i]


@pytest.mark.parametrize("text", CODE_SAMPLES)
def test_encode_decode_round_trip(tokenizer: Any, text: str) -> None:
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id  # BOS is prepended
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.unk_token_id not in ids  # byte-level: every byte has a token
    assert len(ids) < len(text)  # BPE actually merged something
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids[1:]


def test_round_trip_beyond_ascii(tokenizer: Any) -> None:
    text = "naïve café → 日本語 🐍"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_chat_template(model_dir: Path, tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s><|system|>\nBe brief.</s>\n<|user|>\nhi</s>\n<|assistant|>\n"
    without = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert without == "<s><|system|>\nBe brief.</s>\n<|user|>\nhi</s>\n"
    ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"])
    assert ids[:2] == [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("<|system|>")]
    assert ids.count(tokenizer.bos_token_id) == 1
    assert ids[-2] == tokenizer.convert_tokens_to_ids("<|assistant|>")
    assert "<|assistant|>" in (model_dir / "chat_template.jinja").read_text()


def test_greedy_generate_is_deterministic(tokenizer: Any, model: Any) -> None:
    import torch

    inputs = tokenizer("def main():\n", return_tensors="pt")
    with torch.no_grad():
        runs = [
            model.generate(**inputs, max_new_tokens=16, min_new_tokens=16, do_sample=False) for _ in range(2)
        ]
    assert runs[0].shape == (1, inputs["input_ids"].shape[1] + 16)
    assert torch.equal(runs[0], runs[1])
    # Peaked logits (initializer_range 0.2): the top-1 margin is far above float rounding noise.
    with torch.no_grad():
        logits = model(**inputs).logits[0, -1]
    top2 = logits.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-3


def test_batched_greedy_matches_single(tokenizer: Any, model: Any) -> None:
    import torch

    prompts = ["import sys\n", "class A:\n    def f(self, x):\n        return"]
    single = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
            single.append(out[0, ids["input_ids"].shape[1] :].tolist())
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            batch = tokenizer(prompts, return_tensors="pt", padding=True)
        finally:
            tokenizer.padding_side = side
        out = model.generate(**batch, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert [row[batch["input_ids"].shape[1] :].tolist() for row in out] == single


def test_same_seed_same_model_other_seed_other_weights(model_dir: Path, tmp_path: Path) -> None:
    import torch

    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    again = write_example_model(tmp_path / "again", seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's generator is untouched
    other = write_example_model(tmp_path / "other", seed=1)
    tokenizer_json = (model_dir / "tokenizer.json").read_bytes()
    assert (again / "tokenizer.json").read_bytes() == tokenizer_json
    assert (other / "tokenizer.json").read_bytes() == tokenizer_json  # the seed is the weights' only
    first, second, third = _weights(model_dir), _weights(again), _weights(other)
    assert _same_weights(first, second)
    assert first.keys() == third.keys()
    assert not any(torch.equal(first[k], third[k]) for k in first if "norm" not in k)
    assert (again / "config.json").read_text() == (model_dir / "config.json").read_text()


def test_refuses_non_empty_folder_unless_overwrite(model_dir: Path, tmp_path: Path) -> None:
    target = tmp_path / "x"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        write_example_model(target)
    assert {p.name for p in target.iterdir()} == {"keep.txt"}

    (target / "model.safetensors").write_text("stale")
    write_example_model(target, overwrite=True)
    assert {p.name for p in target.iterdir()} == EXPECTED_FILES | {"keep.txt"}
    assert (target / "keep.txt").read_text() == "mine"  # other files are left alone
    assert _same_weights(_weights(target), _weights(model_dir))  # the stale file was replaced

    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(FileExistsError, match="not a folder"):
        write_example_model(a_file, overwrite=True)


def test_empty_existing_folder_is_fine(tmp_path: Path) -> None:
    write_example_model(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == EXPECTED_FILES


def test_cli_writes_and_says_what_next(tmp_path: Path) -> None:
    target = tmp_path / "m"
    result = CliRunner().invoke(example_model_command, [str(target), "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in target.iterdir()} == EXPECTED_FILES
    lines = result.output.splitlines()
    assert lines[0].startswith("training tokenizer")
    assert lines[1].startswith("building model")
    assert lines[2].startswith(f"wrote {target} (8 files, ")
    assert " MB)" in lines[2]
    assert f"Next: lmforge serve {target}" in lines
    assert (
        "curl -N localhost:8080/invocations -H 'Content-Type: application/json' "
        '-d \'{"inputs":"def ","parameters":{"max_new_tokens":32,"details":true},"stream":true}\''
    ) in result.output
    assert "seed 3" in (target / "README.md").read_text()


def test_cli_refuses_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = CliRunner().invoke(example_model_command, [str(tmp_path)])
    assert result.exit_code == 2
    assert "not empty" in result.output
    assert "--overwrite" in result.output
    assert {p.name for p in tmp_path.iterdir()} == {"keep.txt"}


def test_cli_help() -> None:
    result = CliRunner().invoke(example_model_command, ["--help"])
    assert result.exit_code == 0
    assert "DIR" in result.output
    assert "--overwrite" in result.output
    assert "--seed" in result.output


def test_importing_the_module_does_not_import_torch() -> None:
    code = (
        "import sys, lmforge.models.example, lmforge.cli.example_cmd\n"
        "heavy = {'torch', 'transformers', 'tokenizers', 'safetensors'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_smollm2_conversion_parses_each_gguf_once_then_restores_gguf(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Inside the conversion's block, opening one GGUF again returns the first reader and the tensor-name
    table is built once per (arch, layers); after it, gguf's own functions are back."""
    import gguf

    from lmforge.models.smollm2 import _gguf_parsed_once

    opened: list[str] = []
    tables: list[tuple[Any, int]] = []

    class Reader:
        def __init__(self, path: str | os.PathLike[str], mode: str = "r") -> None:
            opened.append(os.fspath(path))

    def table(arch: Any, n_blocks: int) -> object:
        tables.append((arch, n_blocks))
        return object()

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", table)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with _gguf_parsed_once():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first and gguf.GGUFReader(b) is not first
        assert gguf.get_tensor_name_map("llama", 30) is gguf.get_tensor_name_map("llama", 30)
        gguf.get_tensor_name_map("llama", 2)
    assert opened == [str(a), str(b)] and tables == [("llama", 30), ("llama", 2)]
    assert gguf.GGUFReader is Reader and gguf.get_tensor_name_map is table
