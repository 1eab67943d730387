"""One local "container": lmforge's container entrypoint (:mod:`lmforge.container.entrypoint`, what
the images run) on a model folder, started the way SageMaker starts a serving container (``serve``,
the model at a fixed folder, ``SAGEMAKER_BIND_TO_PORT``), and
stopped the way SageMaker stops one (SIGTERM, then SIGKILL 30 s later).

Each container has a folder of its own under ``<state>/endpoints/<endpoint>/``: ``model/`` (what
SageMaker mounts at ``/opt/ml/model``), ``container.log`` (what CloudWatch would hold) and
``container.pid``, which lets a restarted local SageMaker find and stop containers that outlived a
crash of the previous one.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("lmforge.local")

PING_TIMEOUT_S = 2.0
STOP_GRACE_S = 30.0
_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PING_TIMEOUT_S)
    try:
        conn.request("GET", "/ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def new_folder(state_dir: Path, endpoint_name: str, label: str) -> Path:
    """A fresh folder for one container; never one that an earlier container used."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = state_dir / "endpoints" / endpoint_name / f"{label}-{stamp}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True, exist_ok=False)
    return folder


def container_env(
    base: Mapping[str, str], model_env: Mapping[str, str], port: int, s3_url: str
) -> dict[str, str]:
    """The container's environment: the model's ``Environment`` over a base without the user's own AWS
    credentials (a SageMaker container gets its role's instead: here, the local SageMaker's)."""
    env = {
        k: v for k, v in base.items() if k not in _CREDENTIAL_VARS and not k.startswith("AWS_ENDPOINT_URL")
    }
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_ENDPOINT_URL": s3_url,
        }
    )
    env.update({str(k): str(v) for k, v in model_env.items()})
    env.update({"SAGEMAKER_BIND_TO_PORT": str(port), "LMFORGE_HOST": "127.0.0.1"})
    return env


@dataclass
class Container:
    label: str
    """The production variant or inference component it serves."""
    folder: Path
    port: int
    env: dict[str, str]
    python: str = sys.executable
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    stopping: bool = field(default=False)

    @property
    def model_dir(self) -> Path:
        return self.folder / "model"

    @property
    def log_path(self) -> Path:
        return self.folder / "container.log"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> None:
        """Start (or restart) the server process; returns at once."""
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [self.python, "-m", "lmforge.container.entrypoint", "serve", str(self.model_dir)],
                cwd=self.folder,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.folder / "container.pid").write_text(f"{self.process.pid}\n")

    def wait_healthy(self, timeout_s: float) -> bool:
        """Poll ``/ping`` until 200 (True), the process exits or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping:
            if not self.alive:
                return False
            if ping(self.port):
                return True
            time.sleep(0.5)
        return False

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, SIGKILL after ``grace_s``; then drop the model copy (the log stays)."""
        self.stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.model_dir, ignore_errors=True)
        (self.folder / "container.pid").unlink(missing_ok=True)


def _is_our_server(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"lmforge.container.entrypoint" in cmdline and b"serve" in cmdline


def reap_orphans(state_dir: Path, grace_s: float = STOP_GRACE_S) -> int:
    """Stop containers a previous local SageMaker left running (it crashed or was killed) and remove
    their folders: their endpoints died with it. Returns how many processes were stopped."""
    endpoints = state_dir / "endpoints"
    pids = []
    for pid_file in endpoints.glob("*/*/container.pid"):
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            continue
        if _is_our_server(pid):
            pids.append(pid)
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while _is_our_server(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_our_server(pid):
            os.kill(pid, signal.SIGKILL)
    if pids:
        log.warning("stopped %d container(s) left running by an earlier local SageMaker", len(pids))
    shutil.rmtree(endpoints, ignore_errors=True)
    return len(pids)
