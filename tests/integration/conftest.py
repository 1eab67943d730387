"""Servers shared by integration modules: one local SageMaker (process mode: lmforge's server as host
processes) for every module that deploys to it (tests/image runs its own in image mode), one
tiny-model server for the modules that only read from one, and one vLLM server (LoRA on) for
test_vllm.py and test_vllm_lora.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.server import VLLM_PROPERTIES, RemoteServer
from tests.conftest import Reference
from tests.local_sagemaker import boto3_clients, local_sagemaker
from tests.shared_vllm import VLLM_SHARED_PROPERTIES, SharedVllm


@pytest.fixture(scope="session")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment a user gets from ``eval "$(lmforge local up --print-env)"``."""
    with local_sagemaker(tmp_path_factory.mktemp("local-sagemaker")) as env:
        yield env


@pytest.fixture(scope="session")
def clients(local: dict[str, str]) -> dict[str, Any]:
    return boto3_clients(local, "sagemaker", "sagemaker-runtime", "s3")


@pytest.fixture(scope="session")
def tiny_server(tiny_model: Path) -> Iterator[RemoteServer]:
    """``lmforge serve`` on the tiny model with its own serving.properties, for every module that only
    reads from such a server (test_server, test_openai_client, test_bench_cli, test_lora: one
    pytest-xdist group, so one start). A test that stops or breaks a server starts its own."""
    with RemoteServer(tiny_model) as srv:
        yield srv


@pytest.fixture(scope="session")
def smollm2_lmi_dist(smollm2_model: Path) -> Iterator[RemoteServer]:
    """LMI-Dist on SmolLM2-135M (the folder as ``example-model`` writes it) through ``lmforge serve``,
    for the modules of the smollm2 group."""
    assert "option.rolling_batch=lmi-dist" in (smollm2_model / "serving.properties").read_text()
    with RemoteServer(smollm2_model) as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_reference(smollm2_model: Path) -> Reference:
    """transformers' own SmolLM2-135M (fp32) on the same folder, loaded once for the modules of the
    smollm2 group that compare against it (test_real_model, test_same_answer)."""
    import torch

    torch.set_num_threads(1)
    return Reference(smollm2_model)


@pytest.fixture(scope="session")
def smollm2_vllm(
    smollm2_model: Path, tmp_path_factory: pytest.TempPathFactory, vllm_env: dict[str, str]
) -> Iterator[RemoteServer]:
    """vLLM on SmolLM2-135M (fp32, eager) through ``lmforge serve``, for the modules of the smollm2
    group (test_real_model, test_same_answer: one pytest-xdist worker, so one start)."""
    root = tmp_path_factory.mktemp("smollm2-vllm")
    model = root / "model"
    shutil.copytree(smollm2_model, model)
    (model / "serving.properties").write_text(
        "option.rolling_batch=vllm\noption.dtype=fp32\noption.enforce_eager=true\n"
        "option.max_model_len=1024\noption.max_rolling_batch_size=8\n"
    )
    server = RemoteServer(model, env=vllm_env, startup_timeout=400).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_shared(
    tiny_model: Path,
    lora_adapters: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    vllm_env: dict[str, str],
) -> Iterator[SharedVllm]:
    root = tmp_path_factory.mktemp("vllm-shared")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    for name in ("a1", "a2"):
        shutil.copytree(lora_adapters[name], model / "adapters" / name)
    extra = root / "extra"
    for name in ("a1", "a3"):
        shutil.copytree(lora_adapters[name], extra / name)
    properties = VLLM_PROPERTIES + VLLM_SHARED_PROPERTIES + f"option.adapter_roots={extra}\n"
    (model / "serving.properties").write_text(properties)
    server = RemoteServer(model, env=vllm_env, wait_ready=False, startup_timeout=400).start()
    try:
        yield SharedVllm(server, vllm_env)
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _healthy_vllm(request: pytest.FixtureRequest) -> None:
    """A test that uses the shared vLLM server gets a healthy one, whichever test broke it before (a
    server that is only starting is left to the fixture that needs it ready, after its reference)."""
    if "vllm_shared" in request.fixturenames:
        shared: SharedVllm = request.getfixturevalue("vllm_shared")
        if shared.broken:
            shared.ready()


@pytest.fixture
def breaks_vllm(vllm_shared: SharedVllm) -> Iterator[RemoteServer]:
    """The shared vLLM server, ready, for a test that breaks it (the next test that needs it restarts it)."""
    yield vllm_shared.ready()
    vllm_shared.broken = True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that break the shared vLLM server run after the others, so one start serves them all
    (correctness does not depend on it: ``_healthy_vllm`` restarts a broken server for whoever needs it)."""
    breaking = [item for item in items if "breaks_vllm" in getattr(item, "fixturenames", ())]
    if breaking:
        items[:] = [item for item in items if item not in breaking] + breaking
