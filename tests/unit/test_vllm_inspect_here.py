"""lmforge.engines.vllm.inspect_here: on vLLM's CPU platform a model class is inspected in the process
that asks (no new interpreter importing vLLM and torch again), and the answer is vLLM's own."""

from __future__ import annotations

import sys
import types
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from lmforge.engines.vllm import inspect_here
from tests.shared_vllm import needs_vllm

pytestmark = pytest.mark.xdist_group("vllm-unit")


def test_it_replaces_the_function_the_registry_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake of vLLM's registry module (the boundary: importing vLLM is seconds)."""

    def in_a_subprocess(fn: object) -> object:
        raise AssertionError("a new interpreter was started")

    registry = types.ModuleType(inspect_here.MODULE)
    registry._run_in_subprocess = in_a_subprocess  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, inspect_here.MODULE, registry)
    assert inspect_here.apply()
    assert registry._run_in_subprocess(lambda: 42) == 42  # type: ignore[attr-defined]

    del registry._run_in_subprocess  # type: ignore[attr-defined]  # another vLLM: nothing patched
    assert not inspect_here.apply()


@needs_vllm
@pytest.mark.vllm
def test_vllms_registry_inspects_here_and_caches_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.32's own registry, through its own call path, with no modelinfos entry (as in a new
    container): Llama is inspected with no registry interpreter started, and cached as vLLM caches."""
    import subprocess

    from vllm.model_executor.models import registry

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))  # empty: the class must be inspected
    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)  # put back after
    assert inspect_here.apply()
    run = subprocess.run

    def no_interpreter(args: Any, *rest: Any, **kwargs: Any) -> Any:
        # other commands may run (an import asks `file` for the architecture), not vLLM's registry
        assert list(args) != list(registry._SUBPROCESS_COMMAND), "a new interpreter was started"
        return run(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "run", no_interpreter)
    model = registry._LazyRegisteredModel("vllm.model_executor.models.llama", "LlamaForCausalLM")
    info = model.inspect_model_cls()
    assert info.architecture == "LlamaForCausalLM"
    assert info.is_text_generation_model and not info.is_pooling_model and not info.supports_multimodal
    assert list((tmp_path / "modelinfos").iterdir())


def test_the_plugin_is_registered_for_vllm() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get(inspect_here.PLUGIN_NAME) == "lmforge.engines.vllm.inspect_here:register"
