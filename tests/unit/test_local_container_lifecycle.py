"""An instance's start and stop: the watchdog's restart and a delete's stop may come at once, and the
container entrypoint ends on a SIGTERM that comes before its server runs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from lmforge.local.containers import Container


@dataclass
class SleepContainer(Container):
    """A host process that only sleeps: what matters here is whether it runs."""

    hold_launch: bool = False
    """The launch of a restart waits until a stop has begun: the race under test, made to happen."""
    launching: threading.Event | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(120)"]

    def _launch(self) -> None:
        if self.launching is not None:
            self.launching.set()
        deadline = time.monotonic() + 30  # a hang guard
        while self.hold_launch and not self.stopping and time.monotonic() < deadline:
            time.sleep(0.01)  # the engine's slow ``rm`` and ``run`` of a restart, until the stop comes
        super()._launch()


def _container(tmp_path: Path, **kwargs: object) -> SleepContainer:
    return SleepContainer(label="v", folder=tmp_path, port=1, env=dict(os.environ), **kwargs)  # type: ignore[arg-type]


def test_a_stopped_instance_is_not_started_again(tmp_path: Path) -> None:
    container = _container(tmp_path)
    container.start()
    assert container.alive
    container.stop(5)
    assert not container.alive
    container.start()  # the watchdog saw it dead a moment before the stop
    assert not container.alive and container.returncode is not None


def test_a_stop_during_a_restart_stops_what_the_restart_started(tmp_path: Path) -> None:
    launching = threading.Event()
    container = _container(tmp_path, hold_launch=True, launching=launching)
    restart = threading.Thread(target=container.start)
    restart.start()
    assert launching.wait(10)
    container.stop(5)  # waits for the restart under way, then stops its process
    restart.join(10)
    assert not restart.is_alive()
    assert container.process is not None, "the restart under way finished"
    assert not container.alive, "and what it started was stopped"


def test_the_entrypoint_ends_on_sigterm_before_its_server_runs(tmp_path: Path) -> None:
    """PID 1 ignores a signal it has no handler for, so without one a container stopped while it
    installs requirements (or imports) would wait out the 30 s to SIGKILL."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "requirements.txt").write_text("some-package-nobody-serves==1.0\n")
    with socket.socket() as index:  # a package index that takes the connection and never answers
        index.bind(("127.0.0.1", 0))
        index.listen(8)
        env = {
            **os.environ,
            "PIP_INDEX_URL": f"http://127.0.0.1:{index.getsockname()[1]}/simple",
            "PIP_CONFIG_FILE": os.devnull,
            "LMFORGE_REQUIREMENTS_DIR": str(tmp_path / "requirements"),
            "LMFORGE_DEFAULT_PROPERTIES": str(tmp_path / "none"),
        }
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("LMFORGE_OFFLINE", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmforge.container.entrypoint", "serve", str(model)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "installing" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 128 + signal.SIGTERM
        finally:
            proc.kill()
            proc.wait()
