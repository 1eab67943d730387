"""The local SageMaker in image mode, with real clients: ``lmforge container push`` to the local ECR,
a SageMaker SDK v2 ``Model(image_uri=<ECR URI>)`` deployment whose instance is that image run by the
engine, boto3 streaming from inside it, and images that cannot be had failing with a reason."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lmforge.local.containers import OWNER_LABEL
from tests.image.build_cpu import image_names
from tests.image.conftest import BuiltImage
from tests.local_sagemaker import (
    REGION,
    boto3_clients,
    handler_model,
    lmforge,
    local_sagemaker,
    serves_quantized,
)
from tests.polling import eventually

pytestmark = [pytest.mark.image, pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("image")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local-images")


@pytest.fixture(scope="module")
def ours(state: Path) -> str:
    """The label of the containers this module's local SageMaker starts (another run's may be there)."""
    return f"{OWNER_LABEL}={state.resolve()}"


@pytest.fixture(scope="module")
def local(state: Path, ours: str, cpu_image: BuiltImage) -> Iterator[dict[str, str]]:
    with local_sagemaker(state, "image", LMFORGE_CONTAINER_ENGINE=cpu_image.engine.kind) as env:
        registry = re.search(r'addr: "([^"]+)"', (state / "registry" / "config.yml").read_text())
        yield env
    leftovers = cpu_image.engine.containers(ours)
    assert leftovers == [], f"containers left after local down: {leftovers}"
    # the pushes and pulls tagged the image with this registry's loopback address: gone with it
    if registry:
        for _, name in image_names(cpu_image.engine):
            if name.startswith(registry.group(1) + "/"):
                cpu_image.engine.untag(name)


@pytest.fixture(scope="module")
def clients(local: dict[str, str]) -> dict[str, Any]:
    return boto3_clients(local, "ecr", "sagemaker", "sagemaker-runtime")


@pytest.fixture(scope="module")
def pushed(local: dict[str, str], cpu_image: BuiltImage, clients: dict[str, Any]) -> str:
    """``lmforge container push cpu --tag <the test image>``: its ECR URI."""
    out = lmforge("container", "push", "cpu", "--tag", cpu_image.tag, env=local)
    return out.stdout.strip().splitlines()[-1]


def test_push_lands_in_the_local_ecr(pushed: str, clients: dict[str, Any]) -> None:
    from lmforge import __version__

    assert pushed == f"123456789012.dkr.ecr.{REGION}.amazonaws.com/lmforge-cpu:{__version__}"
    repos = clients["ecr"].describe_repositories()["repositories"]
    assert "lmforge-cpu" in [r["repositoryName"] for r in repos]
    details = clients["ecr"].describe_images(repositoryName="lmforge-cpu")["imageDetails"]
    assert [d["imageTags"] for d in details] == [[__version__]]
    assert details[0]["imageSizeInBytes"] > 100e6 and details[0]["imageDigest"].startswith("sha256:")


def test_sdk_deploys_the_pushed_image_and_boto3_streams_from_it(
    pushed: str,
    local: dict[str, str],
    clients: dict[str, Any],
    tiny_model: Path,
    cpu_image: BuiltImage,
    ours: str,
) -> None:
    name = "image-sdk"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "sagemaker_sdk_v2.py"),
            str(tiny_model),
            *("--endpoint-name", name, "--instance-type", "ml.m5.xlarge", "--image-uri", pushed, "--keep"),
        ],
        env=local,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches the stream: True" in proc.stderr
    try:
        status = lmforge("local", "status", env=local).stdout
        assert f"mode: images ({cpu_image.engine.kind})" in status, status
        assert f"{name}/AllTraffic: image mode, image {pushed}" in status
        running = cpu_image.engine.containers(ours)
        assert running, "the endpoint's instance is a container"
        labels = cpu_image.engine.run_cli(
            ["inspect", "--format", "{{json .Config.Labels}}", running[0]]
        ).stdout
        assert "accept-bind-to-port" in labels, "the container runs the pushed image"

        from lmforge.client import iter_stream_objects

        response = clients["sagemaker-runtime"].invoke_endpoint_with_response_stream(
            EndpointName=name,
            Body=json.dumps({"inputs": "def ", "parameters": {"max_new_tokens": 6}, "stream": True}),
            ContentType="application/json",
        )
        lines = list(iter_stream_objects(response["Body"]))
        assert len(lines) == 6 and lines[-1]["generated_text"]

        from lmforge.local.containers import memory_limit

        memory = cpu_image.engine.run_cli(
            ["inspect", "--format", "{{.HostConfig.Memory}}", running[0]]
        ).stdout
        assert int(memory.strip()) == memory_limit(16), "ml.m5.xlarge's 16 GiB, scaled to this machine"

        # an instance that dies is replaced (the watchdog starts the image again)
        cpu_image.engine.run_cli(["kill", running[0]])
        deadline = time.monotonic() + 120
        answer = None
        while time.monotonic() < deadline:
            try:
                answer = clients["sagemaker-runtime"].invoke_endpoint(
                    EndpointName=name,
                    Body=json.dumps({"inputs": "def ", "parameters": {"max_new_tokens": 2}}),
                    ContentType="application/json",
                )
                break
            except clients["sagemaker-runtime"].exceptions.ModelError:
                time.sleep(1)
        assert answer is not None, "the killed instance was not replaced"
        assert json.loads(answer["Body"].read())["generated_text"]
    finally:
        clients["sagemaker"].delete_endpoint(EndpointName=name)
    deadline = time.monotonic() + 60
    while cpu_image.engine.containers(ours) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not cpu_image.engine.containers(ours), "delete stops the container"


def test_sdk_v3_model_builder_deploys_the_pushed_image_and_the_stream_is_read(
    pushed: str, local: dict[str, str], clients: dict[str, Any], tiny_model: Path, tmp_path: Path
) -> None:
    """SageMaker SDK v3's ModelBuilder (its role validation included) deploys lmforge's pushed cpu
    image on the local SageMaker in image mode; the example streams from the container through boto3
    and lmforge's reader, and the stream equals the non-streamed answer."""
    from tests.sdk3 import ensure_sdk3, run_v3, sdk3_env

    env = sdk3_env(local, ensure_sdk3(), tmp_path)
    name = "image-sdk3"
    args = ("--endpoint-name", name, "--instance-type", "ml.m5.xlarge", "--image-uri", pushed, "--keep")
    proc = run_v3(env, ROOT / "examples" / "sagemaker_sdk_v3.py", str(tiny_model), *args, timeout=600)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "matches the stream: True" in proc.stderr
        status = lmforge("local", "status", env=local).stdout
        assert f"{name}/AllTraffic: image mode, image {pushed}" in status
    finally:
        clients["sagemaker"].delete_endpoint(EndpointName=name)


def _deploy_raw(clients: dict[str, Any], name: str, image: str, model_data: str) -> dict[str, Any]:
    sm = clients["sagemaker"]
    sm.create_model(
        ModelName=name,
        ExecutionRoleArn="arn:aws:iam::123456789012:role/lmforge-local",
        PrimaryContainer={"Image": image, "ModelDataUrl": model_data},
    )
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": name,
                "InstanceType": "ml.g5.2xlarge",
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        desc = sm.describe_endpoint(EndpointName=name)
        if desc["EndpointStatus"] in ("InService", "Failed"):
            return dict(desc)
        time.sleep(0.5)
    raise AssertionError(f"{name} stayed {desc['EndpointStatus']}")


@pytest.mark.parametrize(
    ("image", "reason"),
    [
        (
            "763104351884.dkr.ecr.us-west-2.amazonaws.com/djl-inference:0.33.0-lmi15.0.0-cu128",
            "no credentials",
        ),
        (
            "123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge-vllm-cpu:0.0.0",
            "could not be pulled from the local ECR",
        ),
    ],
)
def test_an_image_that_cannot_be_had_fails_with_the_reason(
    image: str, reason: str, clients: dict[str, Any], tiny_model: Path, tmp_path: Path, local: dict[str, str]
) -> None:
    from lmforge.artifacts import package_model

    archive = package_model(tiny_model, tmp_path / "model.tar.gz").output

    name = "unpullable-" + ("lmi" if "djl" in image else "ecr")
    s3 = boto3_clients(local, "s3")["s3"]
    s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(archive), name, "model.tar.gz")
    desc = _deploy_raw(clients, name, image, f"s3://{name}/model.tar.gz")
    assert desc["EndpointStatus"] == "Failed"
    assert "CannotPullContainerError" in desc["FailureReason"] and reason in desc["FailureReason"]
    clients["sagemaker"].delete_endpoint(EndpointName=name)


def test_a_container_that_fails_to_start_ends_failed_with_its_log(
    pushed: str, clients: dict[str, Any], tiny_model: Path, tmp_path: Path, local: dict[str, str]
) -> None:
    import shutil

    from lmforge.artifacts import package_model

    bad = tmp_path / "bad"
    shutil.copytree(tiny_model, bad)
    (bad / "serving.properties").write_text(
        "option.rolling_batch=lmi-dist\noption.max_rolling_batch_size=-3\n"
    )
    archive = package_model(bad, tmp_path / "bad.tar.gz", validate=False).output
    s3 = boto3_clients(local, "s3")["s3"]
    s3.create_bucket(Bucket="bad-config", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.upload_file(str(archive), "bad-config", "model.tar.gz")
    desc = _deploy_raw(clients, "bad-config", pushed, "s3://bad-config/model.tar.gz")
    assert desc["EndpointStatus"] == "Failed"
    assert "exited with code" in desc["FailureReason"] and "max_rolling_batch_size" in desc["FailureReason"]
    clients["sagemaker"].delete_endpoint(EndpointName="bad-config")


def test_deploy_ships_lmforges_image_and_builds_it_when_asked(
    local: dict[str, str], tiny_model: Path, cpu_image: BuiltImage, clients: dict[str, Any], tmp_path: Path
) -> None:
    """``lmforge deploy`` with no --image: lmforge's cpu image in the account's ECR; missing there, the
    deploy stops before uploading and says how to get it there, and --build-image builds and pushes it.
    The endpoint serves a user's model.py in the image (the engine in it is the other tests')."""
    from lmforge import __version__

    region = "eu-west-1"  # a region whose ECR has no lmforge image yet
    env = {**local, "AWS_DEFAULT_REGION": region}
    model = handler_model(tiny_model, tmp_path / "handler")
    args = ("deploy", str(model), "--endpoint-name", "shipped", "--instance-type", "ml.m5.xlarge")
    refused = subprocess.run(
        [sys.executable, "-m", "lmforge", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 1
    assert (
        "lmforge-cpu" in refused.stderr
        and "not in ECR yet" in refused.stderr
        and "--build-image" in refused.stderr
    )
    assert "[3/5]" not in refused.stderr, "nothing is uploaded before the image is known to be there"

    from lmforge.container.build import has_nvidia_gpu

    if not has_nvidia_gpu():  # a GPU instance type: the first message says why not here, and what instead
        gpu_args = (*args[:-1], "ml.g5.2xlarge")
        on_gpu = subprocess.run(
            [sys.executable, "-m", "lmforge", *gpu_args], env=env, capture_output=True, text=True, timeout=300
        )
        assert on_gpu.returncode == 1 and "needs an NVIDIA GPU" in on_gpu.stderr, on_gpu.stderr
        assert "--instance-type ml.m5.xlarge" in on_gpu.stderr and "lmforge-cpu:" in on_gpu.stderr
        assert "not in ECR yet" not in on_gpu.stderr

    shipped = lmforge(*args, "--build-image", env=env, timeout=900)
    uri = f"123456789012.dkr.ecr.{region}.amazonaws.com/lmforge-cpu:{__version__}"
    assert f"image {uri}" in shipped.stderr and "shipped: InService" in shipped.stdout
    status = lmforge("local", "status", env=env).stdout
    assert f"shipped/AllTraffic: image mode, image {uri}" in status
    lmforge("delete", "shipped", env=env)


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@contextmanager
def _named_as_lmforges_image(image: BuiltImage) -> Iterator[str]:
    """The test image under the name ``lmforge container build cpu`` gives (``lmforge/cpu:VERSION``),
    where deploy looks for lmforge's image to run ``lmforge compile`` in; the name is given back to the
    image that had it (or removed) after."""
    from lmforge.container.flavours import image_name

    name = image_name("cpu")
    had = image.engine.inspect_image(name)["Id"] if image.engine.image_exists(name) else None
    image.engine.tag(image.tag, name)
    try:
        yield name
    finally:
        if had is None:
            image.engine.untag(name)
        else:
            image.engine.tag(had, name)


def test_deploy_compile_quantize_w8a8_quantizes_in_the_image_and_streams(
    local: dict[str, str], pushed: str, clients: dict[str, Any], tiny_model: Path, cpu_image: BuiltImage
) -> None:
    """``lmforge deploy DIR --compile --quantize w8a8`` in image mode: ``lmforge compile --quantize``
    runs inside lmforge's cpu image (the libraries that read the checkpoint at the endpoint write it), the
    quantized folder is what is uploaded, the endpoint's instance is a container of the pushed image whose
    start check finds the checkpoint as compiled, and boto3's ``invoke_endpoint_with_response_stream``
    streams its answer (process mode's run of the same: tests/integration/test_deploy_quantized.py)."""
    name = "image-w8a8"
    before = _tree(tiny_model)
    with _named_as_lmforges_image(cpu_image) as local_image:
        out = lmforge(
            *("deploy", str(tiny_model), "--endpoint-name", name, "--instance-type", "ml.m5.xlarge"),
            *("--compile", "--quantize", "w8a8"),
            env=local,
            timeout=900,
        )
    try:
        assert f"{name}: InService (created)" in out.stdout, out.stderr
        assert f"--quantize w8a8: quantizing inside {local_image}" in out.stderr, out.stderr
        assert "quantized (w8a8) in" in out.stderr  # the image's lmforge compile's own line
        assert _tree(tiny_model) == before  # the source is only read
        status = lmforge("local", "status", env=local).stdout
        assert f"{name}/AllTraffic: image mode, image {pushed}" in status, status

        serves_quantized(local, clients["sagemaker-runtime"], name)
    finally:
        lmforge("delete", name, env=local)


def test_component_copies_are_containers_of_the_image(
    local: dict[str, str], pushed: str, tiny_model: Path, cpu_image: BuiltImage, ours: str, tmp_path: Path
) -> None:
    """``lmforge deploy --inference-component --copies 2`` in image mode: two containers of the pushed
    image, both answering; at 0 copies they are gone (docs/components.md; process mode's copies are
    tests/integration/test_local_components.py's)."""
    model = handler_model(tiny_model, tmp_path / "handler")
    args = ("deploy", str(model), "--endpoint-name", "image-components", "--instance-type", "ml.m5.xlarge")
    before = set(cpu_image.engine.containers(ours))
    out = lmforge(*args, "--image", pushed, "--inference-component", "ic-img", "--copies", "2", env=local)
    assert "image-components/ic-img: InService, 2/2 copies (created)" in out.stdout, out.stderr
    copies = set(cpu_image.engine.containers(ours)) - before
    assert len(copies) == 2, copies
    smr = boto3_clients(local, "sagemaker-runtime")["sagemaker-runtime"]
    sm = boto3_clients(local, "sagemaker")["sagemaker"]
    for _ in range(4):
        answer = smr.invoke_endpoint(
            EndpointName="image-components",
            InferenceComponentName="ic-img",
            Body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 2}}),
            ContentType="application/json",
        )
        assert json.loads(answer["Body"].read()) == {"generated_text": "xx"}
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-img", DesiredRuntimeConfig={"CopyCount": 0}
    )
    eventually(
        lambda: not copies & set(cpu_image.engine.containers(ours)),
        timeout=120,
        state=lambda: cpu_image.engine.containers(ours),
        interval=0.5,
    )
    lmforge("delete", "image-components", env=local)
