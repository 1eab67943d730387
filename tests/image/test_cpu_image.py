"""lmforge's cpu image, built and run the way SageMaker runs it (marker ``image``).

One session fixture builds the image once (cold on a fresh machine such as CI's, or with
``LMFORGE_IMAGE_TESTS_COLD=1``; the Debian-made base where no public registry answers); every test
then runs containers of it with the engine that built it. The SageMaker
container contract is checked inside the running image: ``/ping`` 503 while loading then 200,
jsonlines streaming, a non-root user, a read-only ``/opt/ml/model``, the HEALTHCHECK, ``SIGTERM``
draining to exit 0 in under 30 s, ``option.model_id=s3://`` from a local S3; and no build secret
(the pip settings and CA bundle of the building machine) is left in any layer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import stat
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmforge.testing.server import http_client
from tests.image.conftest import BuiltImage, ImageRun

pytestmark = [pytest.mark.image, pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("image")]

#: the marker line of any build's pip secrets (lmforge.container.pipsettings: a random token per build)
MARKER = re.compile(rb"lmforge-build-secret-[0-9a-f]{24}")


def test_the_build_was_cold_and_the_image_is_small_enough(cpu_image: BuiltImage) -> None:
    assert cpu_image.reused or cpu_image.result.seconds > 0
    assert cpu_image.result.size_bytes < 1.5e9, f"{cpu_image.result.size_bytes / 1e9:.2f} GB"
    labels = cpu_image.labels
    assert labels["com.amazonaws.sagemaker.capabilities.accept-bind-to-port"] == "true"
    assert labels["com.amazonaws.sagemaker.capabilities.bidirectional-streaming"] == "true"
    assert labels["dev.lmforge.flavour"] == "cpu"


def test_the_engine_asked_for_built_the_image(cpu_image: BuiltImage) -> None:
    """``LMFORGE_CONTAINER_ENGINE`` (``make test-docker``: docker) is the engine that built the image and
    runs every container here, and its daemon holds the image."""
    from lmforge.container.engine import ENV_ENGINE

    asked = os.environ.get(ENV_ENGINE) or cpu_image.engine.kind
    assert (cpu_image.engine.kind, cpu_image.result.engine) == (asked, asked)
    assert os.path.basename(cpu_image.engine.binary) == asked
    info = json.loads(cpu_image.engine.run_cli(["info", "--format", "{{json .}}"], what="info").stdout)
    if asked == "docker":  # a daemon answered, and it has the image
        assert info["ServerVersion"] and info["Driver"], info
        assert cpu_image.engine.builder in ("buildx", "buildkit")
    else:
        assert info["host"]["ociRuntime"]["name"], info
    assert cpu_image.engine.inspect_image(cpu_image.tag)["Id"]


def test_no_build_secret_is_left_in_any_layer(cpu_image: BuiltImage) -> None:
    """No layer holds the marker line of any build's pip secrets (a layer reused from an earlier build's
    cache was made with that build's marker), nor a secret's path."""
    if not cpu_image.reused:
        assert MARKER.fullmatch(cpu_image.result.secret_marker.encode())
    folders = _layer_folders(cpu_image)
    scanned = _scan_layer_folders(folders) if folders else _scan_saved_layers(cpu_image)
    assert scanned > 1000
    history = cpu_image.engine.run_cli(["history", "--no-trunc", "--format", "{{.CreatedBy}}", cpu_image.tag])
    assert not re.search(
        r"http://127\.0\.0\.1:\d+/p\d+/|index-url|find-links|lmforge-build-secret", history.stdout
    )


def _holds_marker(data: bytes) -> bool:
    return b"lmforge-build-secret-" in data and MARKER.search(data) is not None


def _check_entry(name: str, where: str) -> None:
    name = name.lstrip("./")
    assert not name.startswith("run/secrets/"), f"{name} in layer {where}"
    assert not name.endswith(("pip.conf", "pip.ini")), f"{name} in layer {where}"


def _layer_folders(image: BuiltImage) -> list[Path] | None:
    """Each layer of the image as the engine keeps it (overlay: one ``diff`` folder a layer, the same
    files its tar holds), where that is every layer and this process may read them; else None. Reading
    them costs ~1 CPU-s against ~11 for ``save`` and unpacking the 1.2 GB archive."""
    data = image.engine.inspect_image(image.tag)
    driver = data.get("GraphDriver") or {}
    if driver.get("Name") not in ("overlay", "overlay2"):
        return None
    info = driver.get("Data") or {}
    folders = [Path(p) for p in str(info.get("LowerDir") or "").split(":") if p]
    folders += [Path(info["UpperDir"])] if info.get("UpperDir") else []
    layers = (data.get("RootFS") or {}).get("Layers") or []
    if len(folders) != len(layers) or not all(os.access(f, os.R_OK | os.X_OK) for f in folders):
        return None
    return folders


def _scan_layer_folders(folders: list[Path]) -> int:
    """Files checked; no path of a secret and no file holding the marker. Links are not followed: a
    layer's absolute symlink points into the image, not at this machine."""
    scanned = 0
    for folder in folders:
        for parent, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = os.path.join(parent, name)
                _check_entry(os.path.relpath(path, folder), str(folder))
                info = os.lstat(path)
                if name in files and stat.S_ISREG(info.st_mode) and info.st_size < 64 * 2**20:
                    with open(path, "rb") as fh:
                        assert not _holds_marker(fh.read()), f"{path} holds a build secret"
                    scanned += 1
    return scanned


def _scan_saved_layers(image: BuiltImage) -> int:
    """The same check on ``save``'s archive, for engines whose layers are not readable folders here."""
    scanned = 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "image.tar"
        image.engine.save(image.tag, archive)
        with tarfile.open(archive) as outer:
            layers = [m for m in outer.getmembers() if m.isfile() and m.name.endswith((".tar", "/layer.tar"))]
            assert layers, "the saved image lists its layers"
            for member in layers:
                data = outer.extractfile(member)
                assert data is not None
                with tarfile.open(fileobj=io.BytesIO(data.read())) as layer:
                    for entry in layer.getmembers():
                        _check_entry(entry.name, member.name)
                        if entry.isfile() and entry.size < 64 * 2**20:
                            content = layer.extractfile(entry)
                            assert content is not None
                            assert not _holds_marker(content.read()), f"{entry.name} holds a build secret"
                            scanned += 1
    return scanned


def test_sagemaker_contract_inside_the_image(cpu_image: BuiltImage, tiny_model: Path) -> None:
    """One container, as SageMaker runs it, from the first /ping to its stop (one start: ~5 CPU-s)."""
    with ImageRun(cpu_image, tiny_model) as run:
        seen = run.wait_for_ping(timeout=120)
        assert 503 in seen, f"/ping answered {seen} before 200: it must say 503 while the model loads"
        assert run.exec(["id", "-u"]).stdout.strip() == "1000", "the server runs as a non-root user"
        denied = run.exec(["sh", "-c", "touch /opt/ml/model/x"])
        assert denied.returncode != 0, "/opt/ml/model is mounted read-only"
        assert cpu_image.engine.kind != "podman" or cpu_image.engine.healthcheck(run.name)

        body = {"inputs": "def ", "parameters": {"max_new_tokens": 8, "details": True}, "stream": True}
        with http_client().stream("POST", run.url + "/invocations", json=body, timeout=60) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("application/jsonlines")
            lines = [json.loads(line) for line in resp.iter_lines() if line]
        assert len(lines) == 8 and all("token" in line for line in lines)
        assert lines[-1]["generated_text"] == "".join(line["token"]["text"] for line in lines)
        assert lines[-1]["details"]["finish_reason"] == "length"
        # structured output in the image (xgrammar's CPU kernel: the image leaves triton out)
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        chat = {
            "messages": [{"role": "user", "content": "ok?"}],
            "max_tokens": 24,
            "response_format": {"type": "json_schema", "json_schema": {"name": "ok", "schema": schema}},
        }
        reply = http_client().post(run.url + "/invocations", json=chat, timeout=60).json()
        assert isinstance(json.loads(reply["choices"][0]["message"]["content"])["ok"], bool), reply
        assert run.exec(["/opt/lmforge/bin/python", "-c", "import triton"]).returncode != 0
        # the build's warm start (lmforge.container.warm) left the .pyc of what a start imports, and
        # only those: no model class the example model does not use
        site = "/opt/lmforge/lib/python3.11/site-packages"
        used = ("torch/__pycache__/__init__.cpython-311.pyc", "transformers/models/llama/__pycache__")
        assert run.exec(["ls", *(f"{site}/{path}" for path in used)]).returncode == 0
        assert run.exec(["ls", f"{site}/transformers/models/bert/__pycache__"]).returncode != 0
        # bidirectional streaming: the image's server speaks WebSocket (the label says it does)
        from websockets.sync.client import connect

        with connect(run.url.replace("http://", "ws://") + "/invocations-bidirectional-stream") as ws:
            ws.send(json.dumps(body))
            frames = []
            while (frame := ws.recv(timeout=60)) != "[DONE]":
                frames.append(json.loads(frame))
        assert "".join(f["token"]["text"] for f in frames) == lines[-1]["generated_text"]
        _sigterm_drains_and_exits_zero_within_30_s(run)


def _sigterm_drains_and_exits_zero_within_30_s(run: ImageRun) -> None:
    """SageMaker's stop: SIGTERM, then SIGKILL 30 s later. A long stream in flight ends, finished or
    with an error line, the server says it is draining and the container exits 0 in time."""
    streamed: list[dict[str, Any]] = []

    def long_stream() -> None:
        body = {
            "inputs": "x",
            "parameters": {"max_new_tokens": 400, "ignore_eos_token": True},
            "stream": True,
        }
        with (
            contextlib.suppress(httpx.HTTPError),
            http_client().stream("POST", run.url + "/invocations", json=body, timeout=60) as resp,
        ):
            streamed.extend(json.loads(line) for line in resp.iter_lines() if line)

    client = threading.Thread(target=long_stream)
    client.start()
    deadline = time.monotonic() + 30
    while not streamed and time.monotonic() < deadline:
        time.sleep(0.05)
    code = run.stop(grace_s=30)
    client.join(30)
    # 0: it exited on its own within the grace (the engine's stop kills at the grace: 137 then)
    assert code == 0, f"exit code {code}:\n{run.logs()}"
    assert "draining" in run.logs()
    assert streamed and (
        streamed[-1].get("generated_text") is not None or "error" in json.dumps(streamed[-1])
    )


def test_option_model_id_from_the_local_s3(cpu_image: BuiltImage, tiny_model: Path, tmp_path: Path) -> None:
    import boto3
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        s3_url = f"http://{host}:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=s3_url,
            region_name="us-east-1",
            aws_access_key_id="t",
            aws_secret_access_key="t",
        )
        s3.create_bucket(Bucket="weights")
        for path in sorted(tiny_model.iterdir()):
            if path.is_file() and path.name != "serving.properties":
                s3.upload_file(str(path), "weights", f"tiny/{path.name}")
        model = tmp_path / "model"
        model.mkdir()
        (model / "serving.properties").write_text("option.model_id=s3://weights/tiny/\n")
        env = {"AWS_ENDPOINT_URL": s3_url, "AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}
        with ImageRun(cpu_image, model, env=env, host_network=True) as run:
            run.wait_for_ping(timeout=180)
            out = http_client().post(
                run.url + "/invocations",
                json={"inputs": "def ", "parameters": {"max_new_tokens": 4}},
                timeout=60,
            )
            assert out.status_code == 200, out.text
            assert "s5cmd" in run.logs(), "the image downloads with its s5cmd"
    finally:
        server.stop()
