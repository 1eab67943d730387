"""LMI-Dist serves W8A8 on a model whose LM head is tied to its input embedding (SmolLM2's shape),
through `lmforge serve`: the checkpoint `lmforge compile --quantize w8a8` writes keeps one int8 matrix
for both, the engine core looks the embedding up on its int8 rows, a request gets the same answer alone
and in a crowd (:mod:`tests.same_answer`), and ``option.quantize=w8a8`` at load on the tied float
folder answers as the checkpoint does (one int8 matrix, one rounding rule)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lmforge.testing.server import RemoteServer
from tests.same_answer import same_alone_and_in_a_crowd, standard_probes

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("quantized")]

PROMPTS = (
    "def main():",
    "import os\nimport sys\n\nclass Reader:\n    def __init__(self, path):",
    "for i in range(",
    "    return self._value + other._value if isinstance(other, type(self)) else",
)


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
def tied_server(tmp_path_factory: pytest.TempPathFactory, tied_model: Path) -> Iterator[RemoteServer]:
    """`lmforge compile --quantize w8a8` on the tied model (its own CLI), served."""
    from click.testing import CliRunner

    from lmforge.cli import main

    out = tmp_path_factory.mktemp("tied-w8a8") / "out"
    result = CliRunner().invoke(main, ["compile", str(tied_model), "--quantize", "w8a8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "the LM head tied to the input embedding (one int8 matrix)" in result.output
    with RemoteServer(out) as server:
        yield server


def _greedy(url: str) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 16, "details": True}}
        reply = httpx.post(f"{url}/invocations", json=body, timeout=120).json()
        out.append([t["id"] for t in reply["details"]["tokens"]])
    return out


def test_the_tied_checkpoint_is_served_on_int8_rows_and_same_alone_or_in_a_crowd(
    tied_server: RemoteServer,
) -> None:
    logs = tied_server.logs()
    assert "LM head int8, tied to the input embedding" in logs  # the manifest, as the start read it
    assert "the input embedding on int8 rows (tied to the int8 LM head)" in logs
    same_alone_and_in_a_crowd(tied_server.url, standard_probes(PROMPTS))


def test_option_quantize_at_load_on_the_tied_folder_answers_as_the_checkpoint(
    tmp_path: Path, tied_model: Path, tied_server: RemoteServer
) -> None:
    folder = tmp_path / "jit"
    shutil.copytree(tied_model, folder)
    with (folder / "serving.properties").open("a") as f:
        f.write("option.quantize=w8a8\n")
    with RemoteServer(folder) as server:
        logs = server.logs()
        assert "option.quantize=w8a8: quantized the weights at load" in logs
        assert "the input embedding on int8 rows (tied to the int8 LM head)" in logs
        assert _greedy(server.url) == _greedy(tied_server.url)
