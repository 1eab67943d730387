"""What the local-SageMaker tests share: the ``lmforge`` CLI as a user runs it, the environment a
user gets from ``eval "$(lmforge local up --print-env)"``, and boto3 clients made only from that
environment. The fixtures themselves are in tests/integration/conftest.py."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmforge.testing.server import TEST_ENV

REGION = "us-west-2"


def lmforge(
    *args: str, env: dict[str, str], check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python -m lmforge ARGS`` with ``env``; AssertionError with its output when it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "lmforge", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"lmforge {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def parse_exports(text: str) -> dict[str, str]:
    """The variables of ``lmforge local up --print-env`` output."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            out[key] = shlex.split(value)[0]
    return out


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without AWS settings, plus the test settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(TEST_ENV)
    env["AWS_DEFAULT_REGION"] = REGION
    env.update(extra)
    return env


@contextmanager
def local_sagemaker(state: Path, mode: str = "process", **extra: str) -> Iterator[dict[str, str]]:
    """A local SageMaker in ``state`` (``lmforge local up --mode MODE``), stopped on exit."""
    base = base_env(**extra)
    up = lmforge("local", "up", "--state-dir", str(state), "--mode", mode, "--print-env", env=base)
    env = {**base, **parse_exports(up.stdout)}
    assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    try:
        yield env
    finally:
        lmforge("local", "down", "--state-dir", str(state), env=base)
    assert not (state / "state.json").exists()


def boto3_clients(env: dict[str, str], *names: str) -> dict[str, Any]:
    """Plain boto3 clients, configured only through ``env`` (no endpoint_url in code)."""
    import boto3
    from botocore.config import Config

    saved = dict(os.environ)
    os.environ.update(env)  # botocore reads AWS_ENDPOINT_URL* when a client is made
    try:
        session = boto3.session.Session()
        cfg = Config(retries={"max_attempts": 1})
        return {name: session.client(name, config=cfg) for name in names}
    finally:
        os.environ.clear()
        os.environ.update(saved)


#: a user's handler (LMI's ``handle(inputs)``): ``max_new_tokens`` lines streamed 10 ms apart when the
#: body asks for a stream, else LMI's JSON reply. For the tests of what an endpoint does around its
#: model (routing, updates, instances' lifecycle): an instance serving it starts in ~0.3 CPU-s, one
#: serving the tiny model on LMI-Dist in ~4.5 (its engine core's imports).
HANDLER_MODEL_PY = """
import json
import time

from djl_python import Input, Output


def handle(inputs: Input):
    if inputs.is_empty():
        return None
    body = inputs.get_as_json()
    count = int(body.get("parameters", {}).get("max_new_tokens", 4))
    if not body.get("stream"):
        return Output().add_as_json({"generated_text": "x" * count})

    def lines():
        for i in range(count):
            time.sleep(0.01)
            yield json.dumps({"token": {"id": i, "text": "x"}}) + "\\n"

    return Output().add_stream_content(lines())
"""


def handler_model(tiny_model: Path, folder: Path) -> Path:
    """:data:`HANDLER_MODEL_PY` in ``folder``, with the tiny model's ``config.json`` (what ``lmforge
    deploy`` sizes the instance by)."""
    folder.mkdir(parents=True)
    shutil.copy(tiny_model / "config.json", folder)
    (folder / "serving.properties").write_text("engine=Python\noption.max_rolling_batch_size=8\n")
    (folder / "model.py").write_text(HANDLER_MODEL_PY)
    return folder


def serves_quantized(local: dict[str, str], smr: Any, name: str, method: str = "w8a8") -> str:
    """Check that endpoint ``name`` of the local SageMaker ``local`` started on a checkpoint quantized
    ahead (``method``: its container log's start check is a hit) and that its stream of 12 tokens is
    the greedy answer it gives whole; the answer."""
    import json

    from lmforge.client import iter_stream_objects
    from lmforge.local.control import ENV_STATE_DIR

    logs = [p.read_text(errors="replace") for p in Path(local[ENV_STATE_DIR]).rglob("container.log")]
    served = [text for text in logs if "quantized checkpoint:" in text]
    assert served, "no container log has the quantized checkpoint's start line"
    assert any(f"quantized checkpoint: hit ({method}" in text for text in served), served[-1][-4000:]
    body = {"inputs": "def fibonacci(n):", "parameters": {"max_new_tokens": 12}, "stream": True}
    resp = smr.invoke_endpoint_with_response_stream(
        EndpointName=name, Body=json.dumps(body), ContentType="application/json"
    )
    objs = list(iter_stream_objects(resp["Body"]))
    tokens = [o["token"] for o in objs if "token" in o]
    assert len(tokens) == 12, objs
    text = "".join(t["text"] for t in tokens)
    assert text, objs
    whole = json.loads(
        smr.invoke_endpoint(
            EndpointName=name,
            Body=json.dumps({"inputs": body["inputs"], "parameters": body["parameters"]}),
            ContentType="application/json",
        )["Body"].read()
    )
    assert whole["generated_text"] == text  # greedy: the stream is the whole answer
    return text
