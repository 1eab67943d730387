"""The cpu image, built once per session, and a runner for containers of it.

The build uses the engine's layer cache: on a fresh machine (CI's) it is a cold build, and a later
build in the session (``lmforge deploy --build-image``) reuses its layers, as a user's would.
``LMFORGE_IMAGE_TESTS_COLD=1`` builds with ``--no-cache`` instead. The tests skip where no container
engine answers, except where ``LMFORGE_REQUIRE_IMAGE_TESTS=1`` (CI, which installs podman): there a
missing engine fails the session instead. For an inner loop on the tests themselves,
``LMFORGE_IMAGE_TESTS_REUSE=REF`` runs them against an image already built (``lmforge/cpu:VERSION``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmforge.testing.server import TEST_ENV, free_port, http_client
from tests.image.early_build import EarlyBuild

REQUIRE = os.environ.get("LMFORGE_REQUIRE_IMAGE_TESTS") == "1"


@dataclass
class BuiltImage:
    engine: Any
    tag: str
    result: Any
    labels: dict[str, str]
    reused: bool = False


def container_engine() -> Any:
    from lmforge.container.engine import EngineError, detect

    try:
        return detect()
    except EngineError as exc:
        if REQUIRE:
            pytest.fail(f"LMFORGE_REQUIRE_IMAGE_TESTS=1 but {exc}")
        pytest.skip(f"image tests need a container engine: {exc}")


@pytest.fixture(scope="session")
def engine() -> Any:
    return container_engine()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Image tests run last, and their image starts building now (after -m/-k deselection)."""
    image = [item for item in items if item.get_closest_marker("image")]
    if not image or config.option.collectonly or os.environ.get("LMFORGE_IMAGE_TESTS_REUSE"):
        return
    items[:] = [item for item in items if not item.get_closest_marker("image")] + image
    from lmforge.container.engine import EngineError, detect

    try:
        detect()
    except EngineError:
        return  # the engine fixture skips (or fails under LMFORGE_REQUIRE_IMAGE_TESTS=1)
    EarlyBuild.start_once(config)


@pytest.fixture(scope="session")
def cpu_image(engine: Any, request: pytest.FixtureRequest) -> Iterator[BuiltImage]:
    """``lmforge container build cpu`` (on the Debian-made base when the pinned one is absent)."""
    from lmforge.container.build import BuildResult

    reuse = os.environ.get("LMFORGE_IMAGE_TESTS_REUSE")
    if reuse:
        tag = f"localhost/lmforge-test/cpu:{uuid.uuid4().hex[:8]}"
        engine.tag(reuse, tag)
        result = BuildResult(tag, "(reused)", 0.0, engine.image_size(tag), engine.kind)
    else:
        result = EarlyBuild.start_once(request.config).wait()
        tag = result.tag
    data = engine.inspect_image(tag)
    labels = (data.get("Config") or {}).get("Labels") or data.get("Labels") or {}
    yield BuiltImage(engine, tag, result, dict(labels), reused=bool(reuse))
    if reuse:  # this worker's own name for the image; the build's name is every worker's: EarlyBuild.stop
        engine.untag(tag)


class ImageRun:
    """``podman|docker run IMAGE serve`` as SageMaker starts it: the model read-only at
    /opt/ml/model, port 8080 published on loopback (or the host's network with
    SAGEMAKER_BIND_TO_PORT, always on a Docker daemon without a bridge network: CI's), one torch
    thread."""

    def __init__(
        self,
        image: BuiltImage,
        model_dir: Path,
        *,
        env: dict[str, str] | None = None,
        host_network: bool = False,
    ) -> None:
        self.image = image
        self.engine = image.engine
        self.model_dir = model_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = f"lmforge-test-{uuid.uuid4().hex[:10]}"
        self.env = {**TEST_ENV, **(env or {})}
        self.host_network = host_network or not self.engine.publishes_ports()
        self.exit_code: int | None = None
        self.saved_logs = ""

    def start(self) -> ImageRun:
        args = [*self.engine.run_args(), "--detach", "--name", self.name, "--shm-size", "1g"]
        args += ["--volume", f"{self.model_dir}:/opt/ml/model:ro"]
        env = dict(self.env)
        if self.host_network:
            args += ["--network", "host"]
            env.update({"SAGEMAKER_BIND_TO_PORT": str(self.port), "LMFORGE_HOST": "127.0.0.1"})
        else:
            args += ["--publish", f"127.0.0.1:{self.port}:8080"]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        self.engine.run_cli([*args, self.image.tag, "serve"], what=f"starting {self.image.tag}")
        return self

    def wait_for_ping(self, timeout: float) -> list[int]:
        """Poll /ping every 50 ms until 200; returns the statuses seen (0: no answer yet). Whether the
        container exited is asked once a second: each ``podman inspect`` is a process of ~0.2 CPU-s,
        and asking at the ping's pace took ~40 CPU-s of a test run from the container it waits for."""
        seen: list[int] = []
        deadline = time.monotonic() + timeout
        next_state = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                status = http_client().get(self.url + "/ping", timeout=2).status_code
            except httpx.HTTPError:
                status = 0
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == 200:
                return seen
            if time.monotonic() >= next_state:
                state = self.engine.container_state(self.name) or {}
                if state.get("Status") in ("exited", "stopped"):
                    raise AssertionError(f"the container exited:\n{self.logs()}")
                next_state = time.monotonic() + 1.0
            time.sleep(0.05)
        raise AssertionError(f"/ping never answered 200 (saw {seen}):\n{self.logs()}")

    def exec(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return self.engine.run_cli(["exec", self.name, *cmd])

    def logs(self) -> str:
        proc = self.engine.run_cli(["logs", self.name])
        return (proc.stdout or "") + (proc.stderr or "") if proc.returncode == 0 else self.saved_logs

    def stop(self, grace_s: int = 30) -> int | None:
        self.engine.stop(self.name, grace_s)
        state = self.engine.container_state(self.name) or {}
        self.exit_code = state.get("ExitCode")
        self.saved_logs = self.logs()
        return self.exit_code

    def __enter__(self) -> ImageRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.saved_logs = self.logs()
        self.engine.remove_container(self.name)
