""":class:`LocalRegistry`: the registry process (config, start, readiness, stop, stale-run cleanup)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from lmforge.local.registry.api import RegistryError
from lmforge.local.registry.binary import BINARY_NAMES, find_registry_binary, missing_binary_message
from lmforge.local.registry.storage import RegistryStorage
from lmforge.process import free_port

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, or None (0: any free port, never a problem)."""
    if port == 0:
        return None
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class LocalRegistry(RegistryStorage):
    """A CNCF distribution registry, run as a child process on ``host`` (loopback)."""

    def __init__(self, state_dir: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state_dir = Path(state_dir).absolute()
        self.host = host
        self.port = port
        self.dir = self.state_dir / "registry"
        self.config_path = self.dir / "config.yml"
        self.log_path = self.dir / "registry.log"
        self.pid_path = self.dir / "registry.pid"
        self.data_dir = self.dir / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._bound_port = port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRegistry:
        """Start the registry (no-op when this object's registry is already running)."""
        if self.running:
            return self
        binary = find_registry_binary()
        if binary is None:
            raise RegistryError(missing_binary_message())
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._stop_stale()
        attempts = 3 if self.port == 0 else 1  # a free port can be taken between choosing and binding
        for attempt in range(attempts):
            self._bound_port = self.port or free_port(self.host)
            if problem := port_problem(self.host, self._bound_port):
                # another server there would answer /v2/ in our registry's place
                raise RegistryError(f"the registry cannot listen on {self.address}: {problem}")
            self._write_config()
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(
                    [binary, "serve", str(self.config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self.pid_path.write_text(f"{self._proc.pid}\n")
            try:
                self._wait_ready()
                return self
            except RegistryError:
                self.stop()
                busy = "address already in use" in _log_tail(self.log_path, 5)
                if not busy or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; removes the pid file."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.pid_path.unlink(missing_ok=True)

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _write_config(self) -> None:
        # YAML by hand: paths are JSON-quoted (JSON strings are valid YAML scalars)
        self.config_path.write_text(
            "version: 0.1\n"
            "log:\n"
            "  level: warn\n"
            "  accesslog:\n"
            "    disabled: true\n"
            "storage:\n"
            "  filesystem:\n"
            f"    rootdirectory: {json.dumps(str(self.data_dir))}\n"
            "  delete:\n"
            "    enabled: true\n"
            "http:\n"
            f"  addr: {json.dumps(self.address)}\n"
            f"  secret: {secrets.token_hex(16)}\n"
            "  headers:\n"
            "    X-Content-Type-Options: [nosniff]\n"
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise RegistryError(
                    f"the registry exited with status {code} at start; {self.log_path}:\n"
                    f"{_log_tail(self.log_path)}"
                )
            try:
                status, _, _ = self._request("GET", "/v2/", timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RegistryError(
                    f"the registry did not answer GET {self.url}/v2/ within {START_TIMEOUT_S:.0f} s; "
                    f"{self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(0.05)

    def _stop_stale(self) -> None:
        """Stop a registry a crashed earlier run left on this state dir (its pid file names it)."""
        try:
            pid = int(self.pid_path.read_text().strip())
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            self.pid_path.unlink(missing_ok=True)
            return
        name = os.path.basename(argv[0].decode(errors="replace"))
        names = {*BINARY_NAMES, os.path.basename(find_registry_binary() or "registry")}
        ours = name in names and str(self.config_path).encode() in argv
        if ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        self.pid_path.unlink(missing_ok=True)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
