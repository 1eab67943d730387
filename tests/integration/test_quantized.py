"""LMI-Dist serves W8A8 int8: the checkpoint `lmforge compile --quantize w8a8` writes, and
``option.quantize=w8a8`` on an unquantized folder (quantized at load), both through `lmforge serve`.

A quantized model must give the same tokens and log-probs alone and in a crowd (:mod:`tests.same_answer`:
its int8 layers quantize each token by its own scale and sum in integers, so a row's output does not
depend on the other rows), and the quantized-at-load model must answer as the compiled checkpoint does
(one rounding rule, :func:`lmforge.quantize.w8a8.rtn_int8`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lmforge.testing.server import RemoteServer
from tests.same_answer import Probe, answers_alone, same_alone_and_in_a_crowd, standard_probes

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("quantized")]

PROMPTS = (
    "def main():",
    "import os\nimport sys\n\nclass Reader:\n    def __init__(self, path):",
    "for i in range(",
    "    return self._value + other._value if isinstance(other, type(self)) else",
    "x = ",
)


def _compile(tmp_path_factory: pytest.TempPathFactory, model: Path, method: str) -> Path:
    """`lmforge compile --quantize METHOD` on ``model`` (its own CLI, as a user runs it)."""
    from click.testing import CliRunner

    from lmforge.cli import main

    out = tmp_path_factory.mktemp(method) / f"tiny-{method}"
    result = CliRunner().invoke(main, ["compile", str(model), "--quantize", method, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """`lmforge compile --quantize w8a8` on the tiny model."""
    return _compile(tmp_path_factory, tiny_model, "w8a8")


@pytest.fixture(scope="module")
def compiled_server(compiled: Path) -> Iterator[RemoteServer]:
    with RemoteServer(compiled) as server:
        yield server


def _greedy(url: str) -> list[list[int]]:
    out = []
    for prompt in PROMPTS:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 16, "details": True}}
        reply = httpx.post(f"{url}/invocations", json=body, timeout=120).json()
        out.append([t["id"] for t in reply["details"]["tokens"]])
    return out


def test_compiled_w8a8_is_served_on_int8_layers_and_same_alone_or_in_a_crowd(
    compiled_server: RemoteServer,
) -> None:
    assert "linear layers on int8 weights (W8A8" in compiled_server.logs()
    same_alone_and_in_a_crowd(compiled_server.url, standard_probes(PROMPTS))


def test_option_quantize_on_an_unquantized_folder_quantizes_at_load(
    tmp_path: Path, tiny_model: Path, compiled_server: RemoteServer
) -> None:
    folder = tmp_path / "jit"
    shutil.copytree(tiny_model, folder)
    with (folder / "serving.properties").open("a") as f:
        f.write("option.quantize=w8a8\n")
    with RemoteServer(folder) as server:
        logs = server.logs()
        assert "option.quantize=w8a8: quantized the weights at load" in logs
        assert "lmforge compile" in logs and "--quantize w8a8" in logs
        assert _greedy(server.url) == _greedy(compiled_server.url)


def test_an_unknown_option_quantize_stops_the_start_naming_the_choices(
    tmp_path: Path, tiny_model: Path
) -> None:
    folder = tmp_path / "bad"
    shutil.copytree(tiny_model, folder)
    with (folder / "serving.properties").open("a") as f:
        f.write("option.quantize=int3\n")
    with pytest.raises((RuntimeError, TimeoutError)) as failed:  # the server exits, or never turns ready
        RemoteServer(folder, startup_timeout=120).start()
    assert "option.quantize=int3: unknown quantization method; choose one of: w8a8" in str(failed.value)


@pytest.fixture(scope="module")
def lora_server(
    tmp_path_factory: pytest.TempPathFactory, compiled: Path, lora_adapters: dict[str, Path]
) -> Iterator[RemoteServer]:
    """The W8A8 checkpoint with two float32 adapters (LoRA keeps q/k/v and gate/up apart: their int8
    layers are the checkpoint's own)."""
    folder = tmp_path_factory.mktemp("w8a8-lora") / "model"
    shutil.copytree(compiled, folder)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=lmi-dist\noption.enable_lora=true\noption.max_loras=2\noption.max_lora_rank=16\n"
    )
    with RemoteServer(folder) as server:
        yield server


def _lora_probes() -> list[Probe]:
    probes = [*standard_probes(PROMPTS), *standard_probes(PROMPTS, adapter="a1")]
    return probes + standard_probes(PROMPTS, adapter="a2")


def test_lora_adapters_apply_over_a_quantized_base(lora_server: RemoteServer) -> None:
    assert "linear layers on int8 weights (W8A8" in lora_server.logs()
    probes = _lora_probes()
    alone = answers_alone(lora_server.url, probes)
    answers = dict(zip((p.name for p in probes), alone, strict=True))
    base = [p.name for p in probes if not p.name.startswith("a")]
    assert any(answers[f"a1-{k}"] != answers[k] for k in base), "adapter a1 changed nothing"
    assert any(answers[f"a2-{k}"] != answers[f"a1-{k}"] for k in base), "a1 and a2 answered alike"


def test_lora_adapters_on_a_quantized_base_same_alone_or_in_a_crowd(lora_server: RemoteServer) -> None:
    """The adapters' products are batch-invariant (lora_mixed: the C pass sums each row in one order
    whatever the step), and so is the W8A8 base on a CPU (exact int8 sums, the C decode attention, prompts
    attended one by one), so the next int8 layer quantizes the same activations alone and in a crowd.
    Before the base was (a dense prompt call and PyTorch's gathered decode attention rounded by the
    crowd), a rounding near an int8 level gave ~1e-2 on a token's log-prob in one of two runs."""
    same_alone_and_in_a_crowd(lora_server.url, _lora_probes(), rounds=1)


def test_a_checkpoint_with_a_float_lm_head_serves_it_in_float(tmp_path: Path, tiny_model: Path) -> None:
    """What `lmforge compile --quantize` writes for a vLLM folder (vLLM 0.32 loads no int8 LM head):
    LMI-Dist serves the head as the checkpoint declares it, in float32."""
    from lmforge.quantize.w8a8 import quantize_folder

    out = tmp_path / "head-fp32"
    manifest = quantize_folder(tiny_model, out, lm_head=False)
    assert manifest["lm_head"] == "fp32"
    with RemoteServer(out) as server:
        logs = server.logs()
        assert "8 linear layers on int8 weights (W8A8" in logs  # 2 layers x (qkv, o, gate/up, down)
        assert len(_greedy(server.url)[0]) == 16


# --- GPTQ (W4A16 int4, calibrated) and the start check of the manifest -----------------------------


@pytest.fixture(scope="module")
def gptq_compiled(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """`lmforge compile --quantize gptq` on the tiny model (calibrated on lmforge's own prompt set)."""
    return _compile(tmp_path_factory, tiny_model, "gptq")


@pytest.fixture(scope="module")
def gptq_server(gptq_compiled: Path) -> Iterator[RemoteServer]:
    with RemoteServer(gptq_compiled) as server:
        yield server


def test_compiled_gptq_is_served_on_int4_layers_and_same_alone_or_in_a_crowd(
    gptq_server: RemoteServer,
) -> None:
    logs = gptq_server.logs()
    assert "linear layers on int4 weights (W4A16" in logs
    assert "lmi-dist: quantized checkpoint: hit (gptq" in logs
    same_alone_and_in_a_crowd(gptq_server.url, standard_probes(PROMPTS))


def test_changed_weights_are_a_logged_miss_and_required_refuses_the_start(
    tmp_path: Path, compiled: Path
) -> None:
    folder = tmp_path / "tampered"
    shutil.copytree(compiled, folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with RemoteServer(folder) as server:  # auto: served, the miss logged
        assert "quantized checkpoint: miss (model.safetensors: weights digest mismatch" in server.logs()
    with (folder / "serving.properties").open("a") as f:
        f.write("option.compile_cache=required\n")
    with pytest.raises((RuntimeError, TimeoutError)) as failed:
        RemoteServer(folder, startup_timeout=120).start()
    assert "option.compile_cache=required refuses to start lmi-dist" in str(failed.value)
    assert "weights digest mismatch" in str(failed.value)


@pytest.fixture(scope="module")
def gptq_lora_server(
    tmp_path_factory: pytest.TempPathFactory, gptq_compiled: Path, lora_adapters: dict[str, Path]
) -> Iterator[RemoteServer]:
    """The GPTQ checkpoint with two float32 adapters over its int4 layers."""
    folder = tmp_path_factory.mktemp("gptq-lora") / "model"
    shutil.copytree(gptq_compiled, folder)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], folder / "adapters" / name)
    (folder / "serving.properties").write_text(
        "option.rolling_batch=lmi-dist\noption.enable_lora=true\noption.max_loras=2\noption.max_lora_rank=16\n"
    )
    with RemoteServer(folder) as server:
        yield server


def test_lora_adapters_apply_over_a_gptq_base(gptq_lora_server: RemoteServer) -> None:
    assert "linear layers on int4 weights (W4A16" in gptq_lora_server.logs()
    probes = _lora_probes()
    alone = answers_alone(gptq_lora_server.url, probes)
    answers = dict(zip((p.name for p in probes), alone, strict=True))
    base = [p.name for p in probes if not p.name.startswith("a")]
    assert any(answers[f"a1-{k}"] != answers[k] for k in base), "adapter a1 changed nothing"
    assert any(answers[f"a2-{k}"] != answers[f"a1-{k}"] for k in base), "a1 and a2 answered alike"


@pytest.mark.xfail(
    strict=False,  # passed one run of three: the crowd's timing decides whether a rounding shows
    reason="known defect: the W8A8 base is now batch-invariant (the test above passes), but on the GPTQ "
    "base a1's prompt log-probs still move by ~3e-3 in a crowd in two of three runs (2026-12-03). Not the "
    "adapters' products (tests/unit/test_lora_batch_invariance.py) and not the int4 kernels (torch's "
    "measured row-invariant at 1-64 rows, lmforge's tested; it xfailed on both, 2026-12-04); a float32 "
    "part upstream of the int4 layers' bfloat16 cast still rounds with its crowd, not yet found.",
)
def test_lora_adapters_on_a_gptq_base_same_alone_or_in_a_crowd(gptq_lora_server: RemoteServer) -> None:
    same_alone_and_in_a_crowd(gptq_lora_server.url, _lora_probes(), rounds=1)


@pytest.mark.vllm
def test_vllm_cpu_serves_a_gptq_checkpoint_in_bf16(tmp_path: Path, tiny_model: Path) -> None:
    """The checkpoint compiled from a vLLM folder (LM head float) on vLLM-CPU's own int4 kernel
    (CPUWNA16, bfloat16 activations: it has no float32 path, refused at start in lmforge's words)."""
    from click.testing import CliRunner

    from lmforge.cli import main
    from lmforge.testing.server import VLLM_ENV, VLLM_PROPERTIES

    source = tmp_path / "vllm"
    shutil.copytree(tiny_model, source)
    (source / "serving.properties").write_text(
        VLLM_PROPERTIES.replace("option.dtype=fp32", "option.dtype=bf16")
    )
    out = tmp_path / "vllm-gptq"
    result = CliRunner().invoke(main, ["compile", str(source), "--quantize", "gptq", "-o", str(out)])
    assert result.exit_code == 0, result.output
    with RemoteServer(out, env=dict(VLLM_ENV), startup_timeout=400) as server:
        logs = server.log_path.read_text(errors="replace")  # the whole log: vLLM's fills the tail
        assert "Using CPUWNA16LinearKernel for CompressedTensorsWNA16" in logs
        assert "vllm: quantized checkpoint: hit (gptq" in logs
        body = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 8, "details": True}}
        reply = httpx.post(f"{server.url}/invocations", json=body, timeout=120).json()
        assert reply["details"]["generated_tokens"] == 8, reply
