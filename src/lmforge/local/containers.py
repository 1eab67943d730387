"""One local "instance" of an endpoint: a container started the way SageMaker starts a serving
container (``serve``, the model at ``/opt/ml/model``, ``SAGEMAKER_BIND_TO_PORT``) and stopped the way
SageMaker stops one (SIGTERM, then SIGKILL 30 s later).

Two kinds, one interface (:class:`Container`):

- :class:`ImageContainer` (mode ``image``): the endpoint's image itself, run by podman or docker:
  the model folder mounted read-only at ``/opt/ml/model``, the Model's ``Environment``, a memory
  limit from the instance type (:func:`memory_limit`), the ulimits this machine can grant. An image
  with the ``accept-bind-to-port`` label shares the host's network and listens on the loopback port
  given in ``SAGEMAKER_BIND_TO_PORT`` (so it reaches the local S3 like a SageMaker container reaches
  S3); any other image listens on 8080 behind a published loopback port.
- :class:`ProcessContainer` (mode ``process``): lmforge's container entrypoint as a host process,
  for machines with no container engine. It stands in for lmforge's own images only.

Each instance has a folder of its own under ``<state>/endpoints/<endpoint>/``: ``model/`` (what
SageMaker mounts at ``/opt/ml/model``), ``container.log`` (what CloudWatch would hold) and
``container.json`` (mode, pid or container name), which lets a restarted local SageMaker find and
stop instances that outlived a crash of the previous one.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.container.engine import ContainerEngine

log = logging.getLogger("lmforge.local")

PING_TIMEOUT_S = 2.0
STOP_GRACE_S = 30.0
CONTAINER_PORT = 8080
#: every container the local SageMaker starts carries this label (value: its state folder)
OWNER_LABEL = "dev.lmforge.local"
MEMORY_FRACTION_ENV = "LMFORGE_LOCAL_MEMORY_FRACTION"
DEFAULT_MEMORY_FRACTION = 0.5
_CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE")
_INFO = "container.json"


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


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return 0


def memory_limit(instance_memory_gib: float | None, env: Mapping[str, str] | None = None) -> int | None:
    """Bytes of memory one local instance may use: the instance type's memory, scaled to this machine
    (at most ``$LMFORGE_LOCAL_MEMORY_FRACTION`` of it, default half); None when unknown."""
    host = _host_memory_bytes()
    try:
        fraction = float((env or os.environ).get(MEMORY_FRACTION_ENV) or DEFAULT_MEMORY_FRACTION)
    except ValueError:
        fraction = DEFAULT_MEMORY_FRACTION
    cap = int(host * min(max(fraction, 0.05), 1.0)) if host else None
    wanted = int(instance_memory_gib * 2**30) if instance_memory_gib else None
    if wanted is None:
        return cap
    return min(wanted, cap) if cap else wanted


def shm_bytes(memory_bytes: int | None) -> int:
    """The ``/dev/shm`` size of one instance: half its memory limit, 1 GiB without one."""
    return max(memory_bytes // 2, 2**28) if memory_bytes else 2**30


def container_env(
    base: Mapping[str, str], model_env: Mapping[str, str], port: int, s3_url: str
) -> dict[str, str]:
    """The environment of a host-process container: the model's ``Environment`` over a base without
    the user's own AWS credentials (a SageMaker container gets its role's instead: here, the local
    SageMaker's)."""
    env = {
        k: v for k, v in base.items() if k not in _CREDENTIAL_VARS and not k.startswith("AWS_ENDPOINT_URL")
    }
    env.update(sagemaker_env(model_env, port, s3_url))
    return env


def sagemaker_env(model_env: Mapping[str, str], port: int | None, s3_url: str) -> dict[str, str]:
    """What SageMaker gives every container: the Model's ``Environment``, the port to bind (when the
    image accepts one), and credentials for (the local) S3."""
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": s3_url,
    }
    env.update({str(k): str(v) for k, v in model_env.items()})
    if port is not None:
        env.update({"SAGEMAKER_BIND_TO_PORT": str(port), "LMFORGE_HOST": "127.0.0.1"})
    return env


@dataclass
class Container:
    """What the provisioner needs of one instance, whatever runs it."""

    label: str
    """The production variant or inference component it serves."""
    folder: Path
    port: int
    """The loopback port its server answers on."""
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    stopping: bool = field(default=False)
    outstanding: int = field(default=0, compare=False)
    """Invocations the runtime has sent it that have not finished (``LEAST_OUTSTANDING_REQUESTS``)."""
    invocations: int = field(default=0, compare=False)
    """Invocations the runtime has sent it, in all."""
    _life: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    """Serializes :meth:`start` and :meth:`stop`: the watchdog's restart and a delete's stop can come
    at the same moment, and a start that lost the race must not leave an instance nobody stops."""
    mode = "process"

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

    def command(self) -> list[str]:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """What ``container.json`` records (and ``lmforge local status`` shows)."""
        return {"mode": self.mode, "label": self.label, "port": self.port}

    def start(self) -> None:
        """Start (or restart) the instance; returns at once. Does nothing once :meth:`stop` was called
        (the instance is being, or has been, stopped for good)."""
        with self._life:
            if self.stopping:
                log.info("not starting %s: it is stopping", self.folder)
                return
            self._launch()

    def _launch(self) -> None:
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.folder,
                env=self._popen_env(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.folder / _INFO).write_text(json.dumps({**self.info(), "pid": self.process.pid}) + "\n")

    def _popen_env(self) -> dict[str, str]:
        return self.env

    def wait_healthy(self, timeout_s: float) -> bool:
        """Poll ``/ping`` until 200 (True), the instance exits or ``timeout_s`` passes (False)."""
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
        with self._life:  # a start under way finishes first, and is then stopped too
            self._terminate(grace_s)
        shutil.rmtree(self.model_dir, ignore_errors=True)
        (self.folder / _INFO).unlink(missing_ok=True)

    def _terminate(self, grace_s: float) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ProcessContainer(Container):
    """lmforge's container entrypoint as a host process (mode ``process``)."""

    python: str = sys.executable
    image: str = ""
    """The image it stands in for."""
    mode = "process"

    def command(self) -> list[str]:
        return [self.python, "-m", "lmforge.container.entrypoint", "serve", str(self.model_dir)]

    def info(self) -> dict[str, Any]:
        return {**super().info(), "image": self.image}


@dataclass
class ImageContainer(Container):
    """The endpoint's image, run by a container engine (mode ``image``)."""

    engine: ContainerEngine | None = None
    image: str = ""
    """The local reference the engine runs."""
    image_uri: str = ""
    """The image as the Model names it."""
    host_network: bool = True
    memory_bytes: int | None = None
    owner: str = ""
    mounts: list[Path] = field(default_factory=list)
    """More host folders, mounted read-only at the same path (adapter download folders)."""
    name: str = field(default_factory=lambda: f"lmforge-{uuid.uuid4().hex[:12]}")
    mode = "image"

    def _engine(self) -> ContainerEngine:
        if self.engine is None:
            raise RuntimeError("ImageContainer needs an engine")
        return self.engine

    def command(self) -> list[str]:
        engine = self._engine()
        env_file = self.folder / "container.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in self.env.items() if "\n" not in v))
        env_file.chmod(0o600)
        cmd = engine.argv(*engine.run_args(), "--rm", "--name", self.name)
        cmd += ["--label", f"{OWNER_LABEL}={self.owner}", "--env-file", str(env_file)]
        cmd += ["--volume", f"{self.model_dir}:/opt/ml/model:ro"]
        for folder in self.mounts:
            cmd += ["--volume", f"{folder}:{folder}:ro"]
        if self.memory_bytes:
            cmd += ["--memory", str(self.memory_bytes)]
        # engines share tensors through /dev/shm (vLLM's message queues need > 64 MiB, the default)
        cmd += ["--shm-size", str(shm_bytes(self.memory_bytes))]
        if self.host_network:
            cmd += ["--network", "host"]
        else:
            cmd += ["--publish", f"127.0.0.1:{self.port}:{CONTAINER_PORT}"]
        # SageMaker polls /ping itself and runs no HEALTHCHECK (podman would need systemd for it)
        cmd += ["--no-healthcheck", "--stop-timeout", str(int(STOP_GRACE_S)), self.image, "serve"]
        return cmd

    def _popen_env(self) -> dict[str, str]:
        return dict(os.environ)  # the engine's own environment, not the container's

    def _launch(self) -> None:
        self._engine().remove_container(self.name)  # a restart: the exited one may not be gone yet
        super()._launch()

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "image": self.image_uri,
            "local_image": self.image,
            "container": self.name,
            "engine": self._engine().kind,
            "memory_bytes": self.memory_bytes,
        }

    def _terminate(self, grace_s: float) -> None:
        """``stop`` (SIGTERM, SIGKILL after ``grace_s``), then wait for the attached ``run`` to end."""
        engine = self._engine()
        if self.process is not None and self.process.poll() is None:
            try:
                engine.stop(self.name, int(grace_s))
            except Exception as exc:  # the engine hung: kill what we can
                log.warning("stopping container %s: %s", self.name, exc)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        engine.remove_container(self.name)


def _is_our_server(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"lmforge.container.entrypoint" in cmdline and b"serve" in cmdline


def reap_orphans(state_dir: Path, engine: ContainerEngine | None, grace_s: float = STOP_GRACE_S) -> int:
    """Stop instances a previous local SageMaker left running (it crashed or was killed) and remove
    their folders: their endpoints died with it. Returns how many were stopped."""
    endpoints = state_dir / "endpoints"
    pids = []
    for info_file in endpoints.glob(f"*/*/{_INFO}"):
        try:
            pid = int(json.loads(info_file.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _is_our_server(pid):
            pids.append(pid)
            os.kill(pid, signal.SIGTERM)
    names: list[str] = []
    if engine is not None:
        names = engine.containers(f"{OWNER_LABEL}={state_dir}")
        for name in names:
            engine.stop(name, int(grace_s))
            engine.remove_container(name)
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while _is_our_server(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _is_our_server(pid):
            os.kill(pid, signal.SIGKILL)
    stopped = len(pids) + len(names)
    if stopped:
        log.warning("stopped %d container(s) left running by an earlier local SageMaker", stopped)
    shutil.rmtree(endpoints, ignore_errors=True)
    return stopped
