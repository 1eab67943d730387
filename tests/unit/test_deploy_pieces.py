"""Upload (content-addressed, skips known content), naming, images, moto extensions, invoke payloads.

The S3 tests run against moto's server on loopback, through a real boto3 client (the fake is AWS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest

from lmforge import __version__
from lmforge.artifacts import package_model
from lmforge.config import ServingConfig
from lmforge.deploy.endpoints import resource_names
from lmforge.deploy.images import ImageError, choose_image, image_problem, lmi_image_uri
from lmforge.deploy.upload import split_s3_uri, upload_archive, upload_prefix

pytestmark = pytest.mark.xdist_group("deploy-pieces")


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    import boto3
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket="artifacts")
    yield client
    server.stop()


def _model(tmp_path: Path, size: int = 3000) -> Path:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "serving.properties").write_text("option.rolling_batch=lmi-dist\n")
    (folder / "weights.bin").write_bytes(bytes(range(256)) * (size // 256))
    (folder / "sub" / "adapter.json").write_text("{}")
    return folder


def test_archive_upload_is_content_addressed_and_skips_known_content(s3: Any, tmp_path: Path) -> None:
    packed = package_model(_model(tmp_path), tmp_path / "model.tar.gz")
    seen: list[int] = []
    first = upload_archive(
        packed.output, packed.sha256, "s3://artifacts/team/llm", s3=s3, progress=seen.append
    )
    assert first.uri == f"s3://artifacts/team/llm/{packed.sha256[:16]}/model.tar.gz"
    assert first.sent_bytes == packed.output.stat().st_size == sum(seen)
    assert first.model_data() == {"ModelDataUrl": first.uri}
    body = s3.get_object(Bucket="artifacts", Key=first.uri.split("/", 3)[3])["Body"].read()
    assert body == packed.output.read_bytes()
    again = upload_archive(packed.output, packed.sha256, "s3://artifacts/team/llm", s3=s3)
    assert again.sent_bytes == 0 and again.skipped_files == 1 and again.uri == first.uri


def test_prefix_upload_sends_only_changed_files(s3: Any, tmp_path: Path) -> None:
    folder = _model(tmp_path)
    first = upload_prefix(folder, "s3://artifacts/pfx", s3=s3)
    assert first.form == "prefix" and first.uri.endswith("/")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="artifacts", Prefix="pfx/")["Contents"]}
    base = first.uri[len("s3://artifacts/") :]
    assert keys == {
        base + n for n in ("serving.properties", "weights.bin", "sub/adapter.json", "lmforge-manifest.json")
    }
    assert first.model_data()["ModelDataSource"]["S3DataSource"] == {
        "S3Uri": first.uri,
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    assert upload_prefix(folder, "s3://artifacts/pfx", s3=s3).sent_bytes == 0
    (folder / "sub" / "adapter.json").write_text('{"r": 8}')
    changed = upload_prefix(folder, "s3://artifacts/pfx", s3=s3)
    assert changed.uri != first.uri  # a new manifest, a new prefix: the old one stays intact
    assert (
        changed.sent_bytes
        == len('{"r": 8}') + (folder / "serving.properties").stat().st_size + 3000 - 3000 % 256
    )


def test_split_s3_uri() -> None:
    assert split_s3_uri("s3://b/a/b/") == ("b", "a/b")
    assert split_s3_uri("s3://b") == ("b", "")
    for bad in ("b/a", "s3:///a", "https://b/a"):
        with pytest.raises(ValueError, match="s3://"):
            split_s3_uri(bad)


def test_resource_names_fit_sagemaker_limits() -> None:
    now = datetime(2026, 11, 23, 6, 30, 1, 123456, tzinfo=UTC)
    assert resource_names("llm", now) == "llm-20261123-063001-123"
    long = resource_names("x" * 63, now)
    assert len(long) == 63 and long.endswith("-20261123-063001-123")


def test_lmi_image_follows_backend_and_region() -> None:
    vllm = ServingConfig(rolling_batch="vllm")
    trt = ServingConfig(rolling_batch="trtllm")
    assert lmi_image_uri(vllm, "us-west-2").startswith(
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:"
    )
    assert "tensorrtllm" in lmi_image_uri(trt, "eu-west-1")
    assert lmi_image_uri(vllm, "cn-north-1").endswith(
        ".amazonaws.com.cn/djl-inference:" + lmi_image_uri(vllm, "x").split(":")[-1]
    )


def test_default_image_is_lmforges_own_in_the_accounts_ecr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LMFORGE_IMAGE_URI", raising=False)
    lmi_dist = ServingConfig(rolling_batch="lmi-dist")
    cpu = choose_image(None, lmi_dist, "ml.m5.xlarge", "us-west-2", "111122223333")
    assert cpu.uri == f"111122223333.dkr.ecr.us-west-2.amazonaws.com/lmforge-cpu:{__version__}"
    assert (cpu.kind, cpu.flavour, cpu.default) == ("lmforge", "cpu", True)
    gpu = choose_image(None, ServingConfig(rolling_batch="vllm"), "ml.g5.2xlarge", "eu-west-1", "1")
    assert gpu.uri == f"1.dkr.ecr.eu-west-1.amazonaws.com/lmforge-vllm:{__version__}"
    assert choose_image(
        None, ServingConfig(rolling_batch="vllm"), "ml.c6i.4xlarge", "us-east-1", "1"
    ).flavour == ("vllm-cpu")
    assert choose_image("lmi", lmi_dist, "ml.g5.2xlarge", "us-west-2", "1").kind == "lmi"
    monkeypatch.setenv("LMFORGE_IMAGE_URI", "123.dkr.ecr.us-east-1.amazonaws.com/team/lmforge-cpu:dev")
    chosen = choose_image(None, lmi_dist, "ml.g5.2xlarge", "us-west-2", "1")
    assert (chosen.uri, chosen.flavour, chosen.default) == (
        "123.dkr.ecr.us-east-1.amazonaws.com/team/lmforge-cpu:dev",
        "cpu",
        False,
    )
    with pytest.raises(ImageError, match="needs an NVIDIA GPU"):
        choose_image("lmforge", ServingConfig(rolling_batch="trtllm"), "ml.m5.xlarge", "us-west-2", "1")


@pytest.mark.parametrize(
    ("image", "backend", "instance", "problem"),
    [
        ("lmi", "lmi-dist", "ml.g5.2xlarge", "LMI removed LMI-Dist in 0.33"),
        ("lmi", "vllm", "ml.g5.2xlarge", None),
        ("lmi", "vllm", "ml.m5.xlarge", "need an NVIDIA GPU"),
        ("lmi", "trtllm", "ml.g5.2xlarge", None),  # LMI's TensorRT-LLM image is picked for it
        (
            "x.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.33.0-lmi15.0.0-cu128",
            "trtllm",
            "ml.g5.2xlarge",
            "needs LMI's TensorRT-LLM image",
        ),
        (
            "x.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.31.0-lmi13.0.0-cu124",
            "lmi-dist",
            "ml.g5.2xlarge",
            None,
        ),
        ("lmforge/cpu:0.1.0", "vllm", "ml.m5.xlarge", "serves option.rolling_batch=lmi-dist, not vllm"),
        ("lmforge/vllm-cpu:0.1.0", "vllm", "ml.m5.xlarge", None),
        ("lmforge/vllm:0.1.0", "vllm", "ml.m5.xlarge", "needs an NVIDIA GPU"),
        ("lmforge/cpu:0.1.0", "lmi-dist", "ml.g5.2xlarge", None),
        ("registry.example.com/my/own:1", "trtllm", "ml.g5.2xlarge", None),
    ],
)
def test_images_that_cannot_serve_the_configuration_are_refused(
    image: str, backend: str, instance: str, problem: str | None
) -> None:
    config = ServingConfig(rolling_batch=backend)
    found = image_problem(choose_image(image, config, instance, "us-west-2", "1"), config, instance)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_moto_extensions_fit_the_pinned_moto() -> None:
    from lmforge.deploy.instances import sagemaker_instance_types
    from lmforge.local import iam_ext, moto_ext

    moto_ext.check_compatible()
    iam_ext.check_compatible()
    types = sagemaker_instance_types()
    for name in (
        "ml.g5.2xlarge",
        "ml.g6e.12xlarge",
        "ml.p4d.24xlarge",
        "ml.p5.48xlarge",
        "ml.inf2.xlarge",
        "ml.m5.xlarge",
    ):
        assert name in types


def test_invoke_payloads() -> None:
    from lmforge.cli.invoke_cmd import _payload

    assert _payload("hi", None, '{"temperature": 0.5}', 7, True, False) == {
        "inputs": "hi",
        "parameters": {"temperature": 0.5, "max_new_tokens": 7, "details": True},
    }
    assert _payload("hi", None, None, None, False, True) == {"messages": [{"role": "user", "content": "hi"}]}
    assert _payload(None, json.dumps({"inputs": "x"}), None, None, False, False) == {"inputs": "x"}
    with pytest.raises(click.BadParameter, match="not JSON"):
        _payload(None, "{nope", None, None, False, False)
    with pytest.raises(click.UsageError, match="PROMPT"):
        _payload(None, None, None, None, False, False)


def test_autoscale_ranges_are_checked_before_anything_is_sent() -> None:
    from click.testing import CliRunner

    from lmforge.cli import main
    from lmforge.deploy.autoscaling import Autoscale, parse_range

    assert parse_range("1:4") == (1, 4)
    for bad in ("4", "a:b", "1-4", ":3"):
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_range(bad)
    with pytest.raises(ValueError, match="below 0"):
        Autoscale(-1, 2)
    assert Autoscale(0, 2).min_capacity == 0  # a component's; a variant's is refused by check_settings
    with pytest.raises(ValueError, match="below the minimum"):
        Autoscale(3, 2)
    runner = CliRunner()
    base = ["deploy", ".", "--endpoint-name", "e", "--instance-type", "ml.g5.xlarge"]
    for extra, needle in (
        (["--autoscale", "0:2"], "scale to zero"),
        (["--autoscale", "2:4"], "--instance-count 1 is outside 2:4"),
        (["--autoscale", "1:4", "--no-wait"], "drop --no-wait"),
        (["--routing-strategy", "ROUND_ROBIN"], "LEAST_OUTSTANDING_REQUESTS"),
    ):
        result = runner.invoke(main, base + extra)
        assert result.exit_code == 2 and needle in result.output, (extra, result.output)


@pytest.mark.parametrize(
    ("backend", "says"),
    [
        ("lmi-dist", "lmforge-cpu:"),
        ("vllm", "lmforge-vllm-cpu:"),
        ("trtllm", "has no CPU image"),
    ],
)
def test_a_gpu_image_on_the_local_sagemaker_without_a_gpu_says_how_to_try_it_here(
    monkeypatch: pytest.MonkeyPatch, backend: str, says: str
) -> None:
    """The local SageMaker runs images here: with no GPU, a GPU instance type's image cannot start,
    and the first message says so and how to try the model on this machine (not "build it")."""
    from lmforge.container import build
    from lmforge.deploy import DeployError
    from lmforge.deploy.image_prep import refuse_gpu_image_without_gpu
    from lmforge.deploy.images import GPU_FLAVOURS

    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: False)
    config = ServingConfig(rolling_batch=backend)
    args = (config, "ml.g5.2xlarge", Path("m"), "111122223333", "us-west-2")
    with pytest.raises(DeployError) as refused:
        refuse_gpu_image_without_gpu(GPU_FLAVOURS[backend], *args)
    message = str(refused.value)
    assert "needs an NVIDIA GPU" in message and "has none" in message and "ml.m5.xlarge" in message
    assert says in message
    assert "container build" not in message
    refuse_gpu_image_without_gpu("cpu", *args)  # a CPU image: nothing to say
    monkeypatch.setattr(build, "has_nvidia_gpu", lambda: True)
    refuse_gpu_image_without_gpu(GPU_FLAVOURS[backend], *args)  # a GPU here: it can run
