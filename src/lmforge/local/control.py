"""Start, find and stop the local SageMaker process (``lmforge local up`` / ``down``)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lmforge.local.server import STATE_FILE
from lmforge.process import pid_alive

DEFAULT_REGION = "us-west-2"
ENV_STATE_DIR = "LMFORGE_LOCAL_DIR"


class LocalError(Exception):
    pass


@dataclass(frozen=True)
class LocalState:
    pid: int
    control_url: str
    runtime_url: str
    role_arn: str
    state_dir: Path
    mode: str = "process"
    """How endpoint instances run: ``image`` or ``process`` (see :mod:`lmforge.local.runners`)."""
    engine: str | None = None
    registry_url: str | None = None
    """The local ECR's registry (what ``ecr get-authorization-token`` names as proxyEndpoint)."""

    def env(self, region: str | None = None) -> dict[str, str]:
        """The variables that point boto3, the AWS CLI and the SageMaker SDK at this local SageMaker."""
        return {
            "AWS_ENDPOINT_URL": self.control_url,
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": self.runtime_url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": region or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            "LMFORGE_ROLE_ARN": self.role_arn,
            ENV_STATE_DIR: str(self.state_dir),
        }

    def export_lines(self, region: str | None = None) -> str:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.env(region).items()]
        lines.append("unset AWS_SESSION_TOKEN AWS_PROFILE")
        return "\n".join(lines) + "\n"


def state_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit.resolve()
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).resolve()
    return (Path.home() / ".lmforge" / "local").resolve()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=2):
            return True
    except OSError:
        return False


def read_state(directory: Path) -> LocalState | None:
    """The running local SageMaker in ``directory``, or None (a stale state file is removed)."""
    path = directory / STATE_FILE
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    state = LocalState(
        int(raw["pid"]),
        raw["control_url"],
        raw["runtime_url"],
        raw["role_arn"],
        Path(raw["state_dir"]),
        raw.get("mode", "process"),
        raw.get("engine"),
        raw.get("registry_url"),
    )
    if not pid_alive(state.pid) or not _answers(state.control_url):
        path.unlink(missing_ok=True)
        return None
    return state


def up(
    directory: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    runtime_port: int = 0,
    timeout_s: float = 60.0,
    mode: str = "auto",
    engine: str | None = None,
) -> tuple[LocalState, bool]:
    """Start the local SageMaker in the background (or find the running one); returns (state, started)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "up.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two `up` at once find one server, not start two
        return _up_locked(directory, host, port, runtime_port, timeout_s, mode, engine)


def _up_locked(
    directory: Path,
    host: str,
    port: int,
    runtime_port: int,
    timeout_s: float,
    mode: str,
    engine: str | None,
) -> tuple[LocalState, bool]:
    existing = read_state(directory)
    if existing is not None:
        return existing, False
    log_path = directory / "local.log"
    cmd = [
        sys.executable,
        "-m",
        "lmforge.local.server",
        "--state-dir",
        str(directory),
        "--host",
        host,
        "--port",
        str(port),
        "--runtime-port",
        str(runtime_port),
        "--mode",
        mode,
    ]
    if engine:
        cmd += ["--engine", engine]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LocalError(f"the local SageMaker did not start: {_last_error(log_path)} (log: {log_path})")
        state = read_state(directory)
        if state is not None and state.pid == process.pid:
            return state, True
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise LocalError(f"the local SageMaker did not start within {timeout_s:.0f} s; see {log_path}")


def _last_error(log_path: Path) -> str:
    """The most telling line of a failed start: the last ERROR line, or the last line."""
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if " ERROR " in line or "Error" in line]
    return (errors or lines or ["no output"])[-1]


def down(directory: Path, *, timeout_s: float = 45.0) -> bool:
    """Stop the local SageMaker in ``directory`` and its endpoints; False when none was running."""
    state = read_state(directory)
    if state is None:
        return False
    os.kill(state.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(state.pid):
        time.sleep(0.2)
    if pid_alive(state.pid):
        os.kill(state.pid, signal.SIGKILL)
    (directory / STATE_FILE).unlink(missing_ok=True)
    return True


def instances(directory: Path) -> list[dict[str, object]]:
    """The instances the local SageMaker in ``directory`` runs now: one ``container.json`` each
    (mode, image, port, container name or pid), with the endpoint they belong to."""
    out = []
    for info in sorted((directory / "endpoints").glob("*/*/container.json")):
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append({"endpoint": info.parent.parent.name, **data})
    return out


def targeted_mode(env: dict[str, str] | None = None) -> str | None:
    """The mode of the local SageMaker that boto3 is pointed at (``--print-env``), or None when boto3
    talks to anything else."""
    environ = dict(os.environ if env is None else env)
    url = environ.get("AWS_ENDPOINT_URL_SAGEMAKER") or environ.get("AWS_ENDPOINT_URL") or ""
    folder = environ.get(ENV_STATE_DIR)
    if not folder or not url.startswith(("http://127.", "http://localhost")):
        return None
    state = read_state(Path(folder))
    if state is None or state.control_url.rstrip("/") != url.rstrip("/"):
        return None
    return state.mode
