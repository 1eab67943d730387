"""The build of the cpu image for tests/image, shared by every pytest-xdist worker of a run.

tests/image/conftest.py starts it; tests/conftest.py (which the run's main process also loads, where
an xdist controller never loads tests/image/conftest.py) clears and stops it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest


class EarlyBuild:
    """The build of the cpu image, started in its own process as soon as the session knows it
    has image tests (they run last), so that it overlaps the other tests instead of adding to them.

    One build per test run, also under pytest-xdist: the build lives in a folder named after the run's
    main process (each worker's parent); the first worker to collect image tests creates the folder
    and starts the build, the worker that runs them waits for its ``exit`` file, and the main process
    stops it, if still running, when the session ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log_path = root / "build.log"

    @staticmethod
    def folder(config: pytest.Config) -> Path:
        main_pid = os.getppid() if hasattr(config, "workerinput") else os.getpid()
        return Path(tempfile.gettempdir()) / f"lmforge-image-tests-{main_pid}"

    @classmethod
    def start_once(cls, config: pytest.Config) -> EarlyBuild:
        """Start the build unless this run already did (the folder exists); either way, the build."""
        root = cls.folder(config)
        try:
            root.mkdir()
        except FileExistsError:
            return cls(root)
        tag = f"localhost/lmforge-test/cpu:{uuid.uuid4().hex[:8]}"
        with open(root / "build.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("build_cpu.py")), tag, str(root)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # stop() ends podman with it
            )
        (root / "pid").write_text(str(proc.pid))
        return cls(root)

    def wait(self, timeout: float = 1800) -> Any:
        from lmforge.container.build import BuildResult

        deadline = time.monotonic() + timeout
        while not (self.root / "exit").exists():
            if time.monotonic() > deadline:
                pytest.fail(f"building the cpu image took more than {timeout:.0f} s (log: {self.log_path})")
            time.sleep(0.5)
        code = int((self.root / "exit").read_text() or 1)
        if code != 0:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
            pytest.fail(f"building the cpu image failed (exit {code}):\n{tail}")
        return BuildResult(**json.loads((self.root / "result.json").read_text()))

    @classmethod
    def clear(cls, config: pytest.Config) -> None:
        """In the run's main process, at the start: no folder left by an earlier run with this pid."""
        if not hasattr(config, "workerinput"):
            shutil.rmtree(cls.folder(config), ignore_errors=True)

    @classmethod
    def stop(cls, config: pytest.Config) -> None:
        """In the run's main process: end a build still running, take the built image's name off it and
        remove what the build left in the image store, and remove the folder. Here, not in a worker: the
        image is every worker's, and a worker whose tests end first would take it from the others."""
        if hasattr(config, "workerinput"):
            return
        root = cls.folder(config)
        if (root / "pid").exists() and not (root / "exit").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int((root / "pid").read_text()), signal.SIGTERM)
            deadline = time.monotonic() + 60
            while not (root / "exit").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        if (root / "result.json").exists():
            cls._clean_store(root)
        shutil.rmtree(root, ignore_errors=True)

    @staticmethod
    def _clean_store(root: Path) -> None:
        from lmforge.container.engine import EngineError, detect
        from tests.image.build_cpu import remove_leftovers

        tag = json.loads((root / "result.json").read_text())["tag"]
        try:
            engine = detect()
        except EngineError:
            return
        if engine.image_exists(tag):
            engine.untag(tag)
        remove_leftovers(engine, root)
