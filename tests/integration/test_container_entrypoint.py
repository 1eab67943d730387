"""The cpu flavour's rendered entrypoint, run on the host against folders laid out like /opt/ml/model:
an extracted model.tar.gz, an S3 prefix from a local S3 (moto), a hub id while offline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmforge.testing.server import TEST_ENV, free_port, http_client

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("container-entrypoint")]

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "containers" / "cpu" / "entrypoint.sh"


class Container:
    """``entrypoint.sh serve`` as SageMaker would start the image (a host process stands in for it)."""

    def __init__(self, model_dir: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "OPTION_"))},
            **TEST_ENV,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "LMFORGE_MODEL_DIR": str(model_dir),
            "LMFORGE_DEFAULT_PROPERTIES": str(ROOT / "containers" / "cpu" / "serving.properties"),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "LMFORGE_HOST": "127.0.0.1",
            **env,
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Container:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(ENTRYPOINT), "serve"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def wait_ready(self, timeout: float = 180) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if http_client().get(self.url + "/ping", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"never healthy:\n{self.log.read_text()[-3000:]}")

    def generate(self) -> dict[str, Any]:
        resp = http_client().post(
            self.url + "/invocations",
            json={"inputs": "def ", "parameters": {"max_new_tokens": 4, "details": True}},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def sigterm(self, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def container_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Container] = []

    def make(model_dir: Path, env: dict[str, str] | None = None) -> Container:
        c = Container(model_dir, env or {}, tmp_path / f"container-{len(started)}.log")
        started.append(c)
        return c.start()

    yield make
    for c in started:
        c.kill()


def test_serves_an_extracted_model_tarball_and_stops_on_sigterm(
    tiny_model: Path, tmp_path: Path, container_factory: Any
) -> None:
    from lmforge.artifacts import package_model, safe_extract

    archive = package_model(tiny_model, tmp_path / "model.tar.gz")
    opt_ml_model = tmp_path / "opt" / "ml" / "model"
    safe_extract(archive.output, opt_ml_model)
    container = container_factory(opt_ml_model)
    container.wait_ready()
    out = container.generate()
    assert out["details"]["generated_tokens"] == 4
    # 0: it drained and exited on its own (sigterm() raises if it is still running after SageMaker's
    # 30 s; a SIGKILL would read -9)
    assert container.sigterm() == 0


@pytest.fixture(scope="module")
def local_s3() -> Iterator[str]:
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_downloads_option_model_id_from_an_s3_prefix(
    tiny_model: Path, tmp_path: Path, container_factory: Any, local_s3: str
) -> None:
    import boto3

    from lmforge.deploy.upload import upload_prefix

    s3 = boto3.client(
        "s3",
        endpoint_url=local_s3,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket="weights")
    uploaded = upload_prefix(tiny_model, "s3://weights/tiny", s3=s3)
    opt_ml_model = tmp_path / "opt" / "ml" / "model"
    opt_ml_model.mkdir(parents=True)
    (opt_ml_model / "serving.properties").write_text(
        f"option.model_id={uploaded.uri}\noption.rolling_batch=lmi-dist\noption.dtype=fp32\noption.max_model_len=1024\n"
    )
    cache = tmp_path / "cache"
    env = {
        "AWS_ENDPOINT_URL": local_s3,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "LMFORGE_CACHE_DIR": str(cache),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",  # no s5cmd: boto3 downloads
    }
    container = container_factory(opt_ml_model, env)
    container.wait_ready()
    assert container.generate()["details"]["finish_reason"] == "length"
    downloaded = list(cache.rglob("model.safetensors"))
    assert len(downloaded) == 1 and list(cache.rglob(".lmforge-complete"))
    assert "downloading s3://weights/tiny/" in container.log.read_text()
    assert container.sigterm() == 0


def test_hub_id_offline_is_a_clear_error(tmp_path: Path, container_factory: Any) -> None:
    opt_ml_model = tmp_path / "opt" / "ml" / "model"
    opt_ml_model.mkdir(parents=True)
    (opt_ml_model / "serving.properties").write_text("option.model_id=example-org/not-cached-model\n")
    container = container_factory(
        opt_ml_model, {"HF_HUB_OFFLINE": "1", "LMFORGE_CACHE_DIR": str(tmp_path / "c")}
    )
    assert container.proc is not None
    code = container.proc.wait(120)
    text = container.log.read_text()
    assert code != 0
    assert (
        "example-org/not-cached-model" in text and "HF_HUB_OFFLINE=1" in text and "not in the cache" in text
    )
