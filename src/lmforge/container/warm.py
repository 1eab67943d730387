"""A warm start inside an image build: ``python -m lmforge.container.warm`` (templates/Dockerfile.j2,
flavours with ``warm_start = true``).

pip byte-compiles every module it installs: about 10,500 files and 26 CPU-s for the cpu image, whose
``.pyc`` files then weigh 222 MB, while a start imports about 2,500 of them. A flavour that warms
installs its dependencies with ``pip install --no-compile`` instead, and this step starts the image's
own server the way SageMaker does (``lmforge.container.entrypoint serve``, as root during the build, so
Python writes the ``.pyc`` of every module the start imports), on lmforge's example model (a tiny
random-weight Llama written for it), then sends a generation, a streamed one and a streamed chat
completion, and stops the server with SIGTERM. Whatever it did not import is compiled in memory by
the process that first imports it, as any module without a ``.pyc`` is.

It is also the image's smoke test: a server that does not start, answer or stop cleanly fails the
build, with the end of its log. Everything it writes (model, caches, log) is in a temporary folder that
is removed afterwards, so the layer keeps only the ``.pyc`` files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from lmforge.process import free_port, gc_paused

#: seconds for the example model's server to answer ``/ping`` (a cold start on a busy builder)
START_TIMEOUT_S = 600.0
#: seconds to drain and exit after SIGTERM (SageMaker allows 30)
STOP_TIMEOUT_S = 60.0


class WarmStartError(Exception):
    """The image's server did not start, answer or stop as it must."""


def _post(url: str, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        data: bytes = response.read()
        if response.status != 200:
            raise WarmStartError(f"POST {url} answered {response.status}: {data[:300]!r}")
        return data


def _requests(base: str) -> None:
    """A generation, a streamed one and a streamed chat completion: the request paths' imports."""
    body: dict[str, object] = {"inputs": "def f(x):", "parameters": {"max_new_tokens": 4}}
    reply = json.loads(_post(f"{base}/invocations", body))
    if not isinstance(reply, dict) or "generated_text" not in reply:
        raise WarmStartError(f"/invocations answered {reply!r}")
    streamed = _post(f"{base}/invocations", {**body, "stream": True})
    if not streamed.strip():
        raise WarmStartError("the streamed /invocations reply was empty")
    chat = _post(
        f"{base}/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
    )
    if b"[DONE]" not in chat:
        raise WarmStartError(f"the streamed chat completion did not end with [DONE]: {chat[-300:]!r}")


def _wait_for_ping(base: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise WarmStartError(f"the server exited with code {proc.returncode} before /ping answered 200")
        try:
            with urllib.request.urlopen(f"{base}/ping", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise WarmStartError(f"/ping did not answer 200 within {START_TIMEOUT_S:.0f} s")


def _count_compiled(root: Path) -> int:
    return sum(1 for _ in root.rglob("*.pyc"))


def warm_start(say: Callable[[str], None] = print) -> int:
    """Start, exercise and stop the image's server once; returns how many ``.pyc`` files it wrote."""
    site = Path(sysconfig.get_paths()["purelib"])
    before = _count_compiled(site)
    with tempfile.TemporaryDirectory(prefix="lmforge-warm-") as tmp_name:
        tmp = Path(tmp_name)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        # every cache this process and the server might fill goes in the folder that is removed
        isolated = {
            "HOME": str(tmp / "home"),
            "XDG_CACHE_HOME": str(tmp / "cache"),
            "HF_HOME": str(tmp / "hf"),
            "LMFORGE_CACHE_DIR": str(tmp / "lmforge-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "TRITON_CACHE_DIR": str(tmp / "triton"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        os.environ.update(isolated)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # writing .pyc files is the point
        sys.dont_write_bytecode = False
        from lmforge.models.example import write_example_model

        say("warm start: writing the example model")
        with gc_paused():  # torch's and transformers' imports: see lmforge.process
            model = write_example_model(tmp / "model")
        env = {
            **os.environ,
            "LMFORGE_INSTALL_REQUIREMENTS": "false",
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "LMFORGE_HOST": "127.0.0.1",
            "OPTION_NUM_THREADS": "1",
        }
        log_path = tmp / "server.log"
        start = time.monotonic()
        say("warm start: starting the server as SageMaker does (lmforge.container.entrypoint serve)")
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lmforge.container.entrypoint", "serve", str(model)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_for_ping(base, proc, start + START_TIMEOUT_S)
                say(f"warm start: /ping 200 after {time.monotonic() - start:.1f} s; sending three requests")
                _requests(base)
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(STOP_TIMEOUT_S)
                if code != 0:
                    raise WarmStartError(f"the server exited with code {code} after SIGTERM")
            except BaseException as exc:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                tail = log_path.read_text(errors="replace")[-4000:]
                message = f"{exc}" if isinstance(exc, WarmStartError) else f"{type(exc).__name__}: {exc}"
                raise WarmStartError(f"{message}\n--- the server's log, last lines ---\n{tail}") from None
    written = _count_compiled(site) - before
    say(f"warm start: done in {time.monotonic() - start:.1f} s; {written} modules compiled")
    return written


def main() -> int:
    try:
        warm_start(lambda line: print(line, flush=True))
    except WarmStartError as exc:
        print(f"lmforge warm start failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
