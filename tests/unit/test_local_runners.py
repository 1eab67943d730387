"""How the local SageMaker turns a Model's image into an instance, without a container engine: the
mode rules, where an image comes from, the command a container is started with, memory scaling.
The engine is a stand-in (named as such) at the boundary of podman/docker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmforge.container.engine import ContainerEngine, EngineError
from lmforge.local.containers import ImageContainer, ProcessContainer, memory_limit, shm_bytes
from lmforge.local.runners import ImageUnavailable, InstanceRunner

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"


class FakeEngine(ContainerEngine):
    """podman's answers, scripted (a stand-in at the engine boundary)."""

    def __init__(self, images: dict[str, dict[str, str]], pullable: set[str] | None = None) -> None:
        super().__init__("podman", "/usr/bin/podman")
        object.__setattr__(self, "images", dict(images))
        object.__setattr__(self, "pullable", pullable or set())
        object.__setattr__(self, "pulled", [])

    def image_exists(self, ref: str) -> bool:
        return ref in self.images  # type: ignore[attr-defined]

    def pull(self, ref: str, *, insecure: bool, timeout: float | None = None) -> None:
        self.pulled.append((ref, insecure))  # type: ignore[attr-defined]
        if ref not in self.pullable:  # type: ignore[attr-defined]
            raise EngineError(f"pulling {ref} failed:\nError: initializing source: manifest unknown")
        self.images.setdefault(ref, {})  # type: ignore[attr-defined]

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Config": {"Labels": self.images[ref]}}  # type: ignore[attr-defined]


class FakeRegistry:
    url = "http://127.0.0.1:5999"
    address = "127.0.0.1:5999"


def test_auto_mode_follows_the_engine_and_image_mode_needs_one(tmp_path: Path) -> None:
    assert InstanceRunner("auto", None, state_dir=tmp_path, account="1").mode == "process"
    assert InstanceRunner("auto", FakeEngine({}), state_dir=tmp_path, account="1").mode == "image"
    process = InstanceRunner("process", FakeEngine({}), state_dir=tmp_path, account="1")
    assert process.mode == "process" and process.engine is None and process.any_engine is not None
    with pytest.raises(EngineError, match="needs a container engine"):
        InstanceRunner("image", None, state_dir=tmp_path, account="1")


def test_process_mode_stands_in_for_lmforge_images_only(tmp_path: Path) -> None:
    runner = InstanceRunner("process", None, state_dir=tmp_path, account="123456789012")
    for image in (f"{ECR}/lmforge-cpu:0.1.0", "lmforge/vllm-cpu:1", "lmforge:cpu", "localhost/lmforge/cpu:x"):
        assert runner.plan(image).mode == "process"
    lmi = "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.33.0-lmi15.0.0-cu128"
    with pytest.raises(ImageUnavailable, match="stands in for lmforge's own images only"):
        runner.plan(lmi)


def test_images_come_from_the_local_ecr_the_store_or_a_pull(tmp_path: Path) -> None:
    bind = {"com.amazonaws.sagemaker.capabilities.accept-bind-to-port": "true"}
    engine = FakeEngine({"my/own:1": {}}, pullable={"127.0.0.1:5999/lmforge-cpu:0.1.0"})
    engine.pullable.add("docker.io/library/other:2")  # type: ignore[attr-defined]
    runner = InstanceRunner(
        "image",
        engine,
        state_dir=tmp_path,
        account="123456789012",
        registry=FakeRegistry(),  # type: ignore[arg-type]
    )
    engine.images["127.0.0.1:5999/lmforge-cpu:0.1.0"] = bind  # type: ignore[attr-defined]
    plan = runner.plan(f"{ECR}/lmforge-cpu:0.1.0")
    assert (plan.local_ref, plan.host_network) == ("127.0.0.1:5999/lmforge-cpu:0.1.0", True)
    assert engine.pulled[-1] == ("127.0.0.1:5999/lmforge-cpu:0.1.0", True)  # type: ignore[attr-defined]
    own = runner.plan("my/own:1")
    assert (own.local_ref, own.host_network) == ("my/own:1", False)  # no label: port 8080 published

    with pytest.raises(ImageUnavailable, match="no credentials") as lmi:
        runner.plan("763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.33.0-lmi15.0.0-cu128")
    assert str(lmi.value).startswith("CannotPullContainerError")
    with pytest.raises(ImageUnavailable, match="It is not there: push it first"):
        runner.plan(f"{ECR}/lmforge-vllm-cpu:0.1.0")
    with pytest.raises(ImageUnavailable, match="could not be pulled"):
        runner.plan("registry.example.com/missing:1")


def test_an_image_without_the_port_label_needs_a_daemon_that_publishes_ports(tmp_path: Path) -> None:
    """dockerd --bridge=none (as CI runs it): lmforge's images share the host's network; an image that
    listens on 8080 would be published nowhere, so its endpoint fails with the reason."""

    class NoBridgeDocker(FakeEngine):
        def publishes_ports(self) -> bool:
            return False

    bind = {"com.amazonaws.sagemaker.capabilities.accept-bind-to-port": "true"}
    engine = NoBridgeDocker({"my/own:1": {}, "lmforge/cpu:1": bind})
    object.__setattr__(engine, "kind", "docker")
    runner = InstanceRunner("image", engine, state_dir=tmp_path, account="1")
    assert runner.plan("lmforge/cpu:1").host_network
    with pytest.raises(ImageUnavailable, match="no bridge network") as err:
        runner.plan("my/own:1")
    assert "accept-bind-to-port=true label" in str(err.value) and "docker daemon" in str(err.value)


def test_an_image_container_is_started_as_sagemaker_starts_one(tmp_path: Path) -> None:
    engine = FakeEngine({})
    runner = InstanceRunner("image", engine, state_dir=tmp_path, account="1")
    from lmforge.local.runners import RunPlan

    folder = tmp_path / "instance"
    folder.mkdir()
    plan = RunPlan("image", f"{ECR}/lmforge-cpu:0.1.0", "127.0.0.1:5999/lmforge-cpu:0.1.0", True)
    container = runner.create(
        plan,
        label="AllTraffic",
        folder=folder,
        port=43210,
        model_env={"OPTION_MAX_ROLLING_BATCH_SIZE": "4"},
        s3_url="http://127.0.0.1:1234",
        base_env={"AWS_SECRET_ACCESS_KEY": "the-users-own", "HOME": "/root"},
        memory_gib=16,
    )
    assert isinstance(container, ImageContainer)
    cmd = container.command()
    assert cmd[:2] == ["/usr/bin/podman", "run"] and cmd[-2:] == ["127.0.0.1:5999/lmforge-cpu:0.1.0", "serve"]
    assert f"{folder / 'model'}:/opt/ml/model:ro" in cmd
    assert cmd[cmd.index("--network") + 1] == "host" and "--no-healthcheck" in cmd
    assert int(cmd[cmd.index("--memory") + 1]) == memory_limit(16)
    assert cmd[cmd.index("--stop-timeout") + 1] == "30"
    env = dict(line.split("=", 1) for line in (folder / "container.env").read_text().splitlines())
    assert env["SAGEMAKER_BIND_TO_PORT"] == "43210" and env["OPTION_MAX_ROLLING_BATCH_SIZE"] == "4"
    assert env["AWS_SECRET_ACCESS_KEY"] == "testing", "never the user's own credentials"
    assert "HOME" not in env, "the container gets SageMaker's environment, not this machine's"
    assert oct((folder / "container.env").stat().st_mode)[-3:] == "600"

    published = runner.create(
        RunPlan("image", "my/own:1", "my/own:1", False),
        label="v2",
        folder=folder,
        port=43211,
        model_env={},
        s3_url="http://127.0.0.1:1234",
        base_env={},
        memory_gib=None,
    )
    cmd = published.command()
    assert cmd[cmd.index("--publish") + 1] == "127.0.0.1:43211:8080" and "--network" not in cmd

    process = InstanceRunner("process", None, state_dir=tmp_path, account="1").create(
        RunPlan("process", "lmforge/cpu:1"),
        label="p",
        folder=folder,
        port=43212,
        model_env={},
        s3_url="http://127.0.0.1:1234",
        base_env={"AWS_SECRET_ACCESS_KEY": "the-users-own", "PATH": "/usr/bin"},
        memory_gib=None,
    )
    assert isinstance(process, ProcessContainer)
    assert process.env["AWS_SECRET_ACCESS_KEY"] == "testing" and process.env["PATH"] == "/usr/bin"


def test_memory_is_the_instance_types_scaled_to_this_machine() -> None:
    import os

    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_limit(0.5, {}) == int(0.5 * 2**30)
    assert memory_limit(10_000, {}) == int(host * 0.5)
    assert memory_limit(10_000, {"LMFORGE_LOCAL_MEMORY_FRACTION": "0.25"}) == int(host * 0.25)
    assert memory_limit(None, {}) == int(host * 0.5)
    assert shm_bytes(None) == 2**30 and shm_bytes(8 * 2**30) == 4 * 2**30
