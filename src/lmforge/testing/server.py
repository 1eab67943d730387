"""A real ``lmforge serve`` process on a free loopback port (vLLM's RemoteOpenAIServer idea), and
the environment tests and benchmarks give it."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from lmforge.process import free_port

# torch on 2 busy cores collapses 5-20x with its default thread count: tests use one thread.
TEST_ENV = {"OMP_NUM_THREADS": "1", "OPTION_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
# vLLM-CPU on a machine with no hub and only loopback: no network lookups, no usage reports.
VLLM_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# The tiny model on vLLM-CPU: eager mode and a small KV cache keep its start under a minute here.
VLLM_PROPERTIES = """\
option.rolling_batch=vllm
option.dtype=fp32
option.max_model_len=1024
option.max_rolling_batch_size=32
option.enforce_eager=true
option.enable_prefix_caching=false
"""


@functools.cache
def http_client() -> httpx.Client:
    """The process's one client for the loopback servers that tests and benchmarks start (thread-safe;
    pooled keep-alive connections). ``httpx.get``/``post``/``stream`` make a client per call, and each
    new client loads the CA bundle into a TLS context: ~30 ms of CPU per call, for plain HTTP on
    127.0.0.1 that never uses it. Polling ``/ping`` every 0.1 s that way kept a test worker ~30 %
    busy while its server started. No TLS here (``verify=False``): every server it talks to listens
    on loopback, in plain HTTP."""
    return httpx.Client(verify=False, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


class RemoteServer:
    """``python -m lmforge serve DIR`` in a subprocess; ``with RemoteServer(dir) as srv: srv.url``."""

    def __init__(
        self,
        model_dir: Path,
        *,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        startup_timeout: float = 180.0,
        own_group: bool = False,
    ) -> None:
        """``own_group``: the server leads a process group of its own (its engine processes in it), so
        that :meth:`stop` can signal the whole group, as Ctrl-C in a terminal or systemd does."""
        self.model_dir = model_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **TEST_ENV, **(env or {})}
        self.wait_ready = wait_ready
        self.startup_timeout = startup_timeout
        self.own_group = own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = model_dir.parent / f"server-{self.port}.log"
        self._own_sockets = "VLLM_RPC_BASE_PATH" not in (env or {})
        self._sockets: str | None = None

    def start(self) -> RemoteServer:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        if self._own_sockets:
            # vLLM's ZeroMQ sockets (<dir>/<uuid>) in a folder of this server's, removed in stop(): a
            # server that a test kills never removes them itself. Only vLLM's sockets move (short
            # path, as Unix socket paths must be): torch's compile caches stay in the shared temp dir
            self._sockets = tempfile.mkdtemp(prefix="lmf-srv-")
            self.env["VLLM_RPC_BASE_PATH"] = self._sockets
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "lmforge", "serve", str(self.model_dir)),
                *("--host", "127.0.0.1", "--port", str(self.port), "--log-level", "info"),
            ],
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self.own_group,
        )
        if self.wait_ready:
            try:
                self.wait_for_ping(200, self.startup_timeout)
            except BaseException:
                self.stop()  # its log stays for the error's message; the process and folder go
                raise
        return self

    def wait_for_ping(self, status: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            with contextlib.suppress(httpx.HTTPError):
                last = http_client().get(self.url + "/ping", timeout=2).status_code
                if last == status:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"/ping never returned {status} (last {last}):\n{self.logs()}")

    def descendant(self, module: str) -> Any:
        """The ``psutil.Process`` of the server's descendant running ``python -m <module>`` (an engine
        core such as ``lmforge.engines.lmi_dist.core``, a tensor-parallel rank's ``...follower``)."""
        import psutil

        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if module in child.cmdline():
                    return child
        raise LookupError(f"no process runs {module} under the server (pid {self.proc.pid})")

    def logs(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-6000:]
        return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0, *, group: bool = False) -> int | None:
        """Send ``sig`` to the server (to its whole process group with ``group``, which needs
        ``own_group``), wait for it to exit (killed after ``timeout``); its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if group:
                assert self.own_group, "signal a group only where the server leads its own"
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None
        return self.proc.returncode

    def __enter__(self) -> RemoteServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stream_lines(url: str, body: dict[str, object], **kwargs: object) -> Iterator[tuple[float, bytes]]:
    """POST and yield (arrival time, line) for each line of a streamed response."""
    with http_client().stream("POST", url, json=body, timeout=120, **kwargs) as resp:  # type: ignore[arg-type]
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line:
                yield time.monotonic(), line.encode()


def metrics(url: str) -> dict[str, float]:
    text = http_client().get(url + "/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
