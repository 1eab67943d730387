"""Multi-LoRA through SageMaker's adapter inference components, on the local SageMaker with the real
boto3 client and the real CLI: a base component (the tiny model with option.enable_lora=true) and
adapter components on it, each invoked with InferenceComponentName and compared with PEFT; update,
delete, failures; `lmforge adapter add|list|remove` against the endpoint and against a server.

One local SageMaker (``lmforge local up``, a separate process) and one base component serve the module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from lmforge.testing.lora import PeftReference, make_adapter
from lmforge.testing.server import TEST_ENV, RemoteServer, http_client
from tests.local_sagemaker import REGION, lmforge
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]

ENDPOINT = "lora-endpoint"
BASE = "lora-base"
PROMPT = "def fibonacci(n):"
NEW = 10
BUCKET = "lora-artifacts"


@pytest.fixture(scope="module")
def material(
    tiny_model: Path, lora_adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """The base model folder (LoRA on, max rank 16) and adapters, good and bad."""
    root = tmp_path_factory.mktemp("lora-ic")
    model = root / "model"
    shutil.copytree(tiny_model, model)
    props = (
        "engine=Python\noption.rolling_batch=lmi-dist\noption.enable_lora=true\noption.max_loras=2\n"
        "option.max_lora_rank=16\noption.max_rolling_batch_size=8\n"
    )
    # with and without adapter roots of its own: the local SageMaker's download folder is added through
    # LMFORGE_ADAPTER_ROOTS either way
    plain = root / "plain-model"
    shutil.copytree(tiny_model, plain)
    (plain / "serving.properties").write_text(props)
    (model / "serving.properties").write_text(props + f"option.adapter_roots={root / 'elsewhere'}\n")
    pickled = root / "pickled"
    shutil.copytree(lora_adapters["a1"], pickled)
    (pickled / "adapter_model.bin").write_bytes(b"\x80\x04pickle")
    return {
        "model": model,
        "plain-model": plain,
        **lora_adapters,
        "pickled": pickled,
        "big-rank": make_adapter(tiny_model, root / "big-rank", seed=9, rank=32, targets=("q_proj",)),
    }


@pytest.fixture(scope="module")
def peft(tiny_model: Path, lora_adapters: dict[str, Path]) -> PeftReference:
    return PeftReference(tiny_model, lora_adapters)


def _tarball(folder: Path, out: Path, *, nested: bool = False) -> Path:
    """An adapter .tar.gz: the files at the top (lmforge package), or inside one folder (tar czf)."""
    import tarfile

    from lmforge.artifacts import package_model

    if not nested:
        return package_model(folder, out, validate=False).output
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return out


def _put(clients: dict[str, Any], path: Path, key: str) -> str:
    clients["s3"].upload_file(str(path), BUCKET, key)
    return f"s3://{BUCKET}/{key}"


def _wait(sm: Any, name: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        desc = sm.describe_inference_component(InferenceComponentName=name)
        if desc["InferenceComponentStatus"] not in ("Creating", "Updating"):
            return dict(desc)
        assert time.monotonic() < deadline, desc
        time.sleep(0.2)


def _components_endpoint(sm: Any, role: str, name: str) -> str:
    """An endpoint for inference components (one instance, no model of its own), in service."""
    sm.create_endpoint_config(
        EndpointConfigName=f"{name}-config",
        ExecutionRoleArn=role,
        ProductionVariants=[
            {"VariantName": "main", "InstanceType": "ml.g5.12xlarge", "InitialInstanceCount": 1}
        ],
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")
    sm.get_waiter("endpoint_in_service").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
    return name


@pytest.fixture(scope="module")
def base_component(
    clients: dict[str, Any], local: dict[str, str], material: dict[str, Path], tmp_path_factory: Any
) -> str:
    """An endpoint for inference components with the base model on it as component BASE."""
    from lmforge.artifacts import package_model

    s3, sm = clients["s3"], clients["sagemaker"]
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    archive = package_model(material["model"], tmp_path_factory.mktemp("pkg") / "model.tar.gz").output
    role = local["LMFORGE_ROLE_ARN"]
    sm.create_model(
        ModelName="lora-model",
        ExecutionRoleArn=role,
        PrimaryContainer={
            "Image": "lmforge:cpu",
            "ModelDataUrl": _put(clients, archive, "base/model.tar.gz"),
        },
    )
    _components_endpoint(sm, role, ENDPOINT)
    sm.create_inference_component(
        InferenceComponentName=BASE,
        EndpointName=ENDPOINT,
        VariantName="main",
        Specification={
            "ModelName": "lora-model",
            "ComputeResourceRequirements": {
                "NumberOfAcceleratorDevicesRequired": 1,
                "MinMemoryRequiredInMb": 1024,
            },
        },
        RuntimeConfig={"CopyCount": 1},
    )
    desc = _wait(sm, BASE, 180)
    assert desc["InferenceComponentStatus"] == "InService", desc.get("FailureReason")
    return BASE


def _body(stream: bool = False) -> str:
    params = {"max_new_tokens": NEW, "ignore_eos_token": True, "details": True}
    return json.dumps({"inputs": PROMPT, "parameters": params, "stream": stream})


def _tokens(smr: Any, component: str, stream: bool = False, endpoint: str = ENDPOINT) -> list[int]:
    if not stream:
        resp = smr.invoke_endpoint(
            EndpointName=endpoint,
            InferenceComponentName=component,
            Body=_body(),
            ContentType="application/json",
        )
        return [t["id"] for t in json.loads(resp["Body"].read())["details"]["tokens"]]
    from lmforge.client import iter_stream_objects

    resp = smr.invoke_endpoint_with_response_stream(
        EndpointName=endpoint,
        InferenceComponentName=component,
        Body=_body(True),
        ContentType="application/json",
    )
    return [obj["token"]["id"] for obj in iter_stream_objects(resp["Body"])]


def _base_dir(local: dict[str, str]) -> Path:
    """The folder of the base component's (latest) container."""
    return sorted(Path(local["LMFORGE_LOCAL_DIR"], "endpoints", ENDPOINT).glob(f"{BASE}-*"))[-1]


def _adapter_folders(local: dict[str, str], name: str) -> list[Path]:
    root = Path(local["LMFORGE_LOCAL_DIR"], "adapters")
    return sorted(p for p in root.rglob(f"{name}-*") if p.is_dir())


def _create_adapter(sm: Any, name: str, url: str) -> dict[str, Any]:
    sm.create_inference_component(
        InferenceComponentName=name,
        EndpointName=ENDPOINT,
        Specification={"BaseInferenceComponentName": BASE, "Container": {"ArtifactUrl": url}},
    )
    return _wait(sm, name)


def test_adapter_components_equal_peft(
    base_component: str,
    clients: dict[str, Any],
    local: dict[str, str],
    material: dict[str, Path],
    peft: PeftReference,
    tmp_path: Path,
) -> None:
    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    # a1 as a .tar.gz (files at the top), a2 as an uncompressed S3 prefix
    a1_url = _put(clients, _tarball(material["a1"], tmp_path / "a1.tar.gz"), "adapters/a1/adapter.tar.gz")
    for f in material["a2"].iterdir():
        _put(clients, f, f"adapters/a2/{f.name}")
    for name, url in (("ic-a1", a1_url), ("ic-a2", f"s3://{BUCKET}/adapters/a2/")):
        desc = _create_adapter(sm, name, url)
        assert desc["InferenceComponentStatus"] == "InService", desc.get("FailureReason")
        assert desc["Specification"]["BaseInferenceComponentName"] == BASE
        assert desc["Specification"]["Container"]["ArtifactUrl"] == url
        assert desc["VariantName"] == "main"
    listed = sm.list_inference_components(EndpointNameEquals=ENDPOINT)["InferenceComponents"]
    assert sorted(c["InferenceComponentName"] for c in listed) == sorted([BASE, "ic-a1", "ic-a2"])

    assert _tokens(smr, BASE) == peft.greedy(PROMPT, NEW, None)
    for name, adapter in (("ic-a1", "a1"), ("ic-a2", "a2")):
        expected = peft.greedy(PROMPT, NEW, adapter)
        assert _tokens(smr, name) == expected, name
        assert _tokens(smr, name, stream=True) == expected, name
    assert peft.greedy(PROMPT, NEW, "a1") != peft.greedy(PROMPT, NEW, None)  # the comparison can fail

    # a base component with adapters cannot be deleted
    with pytest.raises(sm.exceptions.ClientError, match="ic-a1, ic-a2 use it"):
        sm.delete_inference_component(InferenceComponentName=BASE)

    # update: a new artifact (a3, a tarball of its folder) replaces a1's files under the same name
    old = _adapter_folders(local, "ic-a1")
    a3_url = _put(
        clients, _tarball(material["a3"], tmp_path / "a3.tar.gz", nested=True), "adapters/a3.tar.gz"
    )
    sm.update_inference_component(
        InferenceComponentName="ic-a1",
        Specification={"BaseInferenceComponentName": BASE, "Container": {"ArtifactUrl": a3_url}},
    )
    desc = _wait(sm, "ic-a1")
    assert desc["InferenceComponentStatus"] == "InService" and "FailureReason" not in desc, desc
    assert desc["Specification"]["Container"]["ArtifactUrl"] == a3_url
    assert _tokens(smr, "ic-a1") == peft.greedy(PROMPT, NEW, "a3")
    assert len(old) == 1 and not old[0].exists() and len(_adapter_folders(local, "ic-a1")) == 1

    # the base container dies: it is restarted and gets its adapters registered again
    pid = _pid(_base_dir(local))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while _pid(_base_dir(local)) == pid:  # the watchdog restarts it
        assert time.monotonic() < deadline, "the base container was not restarted"
        time.sleep(0.2)
    while True:
        try:
            assert _tokens(smr, "ic-a2") == peft.greedy(PROMPT, NEW, "a2")
            break
        except smr.exceptions.ModelError:  # starting, or its adapters not registered again yet
            assert time.monotonic() < deadline, "the adapter did not come back after a restart"
            time.sleep(0.5)
    assert _tokens(smr, "ic-a1") == peft.greedy(PROMPT, NEW, "a3")

    # delete: deregistered, files gone, invocations refused
    folder = _adapter_folders(local, "ic-a2")[0]
    sm.delete_inference_component(InferenceComponentName="ic-a2")
    deadline = time.monotonic() + 30
    while folder.exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(smr.exceptions.ValidationError, match="not in service"):
        _tokens(smr, "ic-a2")
    with pytest.raises(sm.exceptions.ClientError, match="Could not find"):
        sm.describe_inference_component(InferenceComponentName="ic-a2")
    assert "adapter ic-a2 removed" in _base_dir(local).joinpath("container.log").read_text()
    sm.delete_inference_component(InferenceComponentName="ic-a1")
    assert _tokens(smr, BASE) == peft.greedy(PROMPT, NEW, None)


def test_bad_adapters_fail_with_a_reason(
    base_component: str, clients: dict[str, Any], material: dict[str, Path], tmp_path: Path
) -> None:
    sm = clients["sagemaker"]
    cases = {
        "bad-pickled": (material["pickled"], "adapter_model.bin is not allowed"),
        "bad-rank": (material["big-rank"], "max_lora_rank=16"),
    }
    for name, (folder, needle) in cases.items():
        url = _put(clients, _tarball(folder, tmp_path / f"{name}.tar.gz"), f"bad/{name}.tar.gz")
        desc = _create_adapter(sm, name, url)
        assert desc["InferenceComponentStatus"] == "Failed", desc
        assert needle in desc["FailureReason"] and BASE in desc["FailureReason"], desc["FailureReason"]
        sm.delete_inference_component(InferenceComponentName=name)
    desc = _create_adapter(sm, "bad-missing", f"s3://{BUCKET}/no/such/adapter.tar.gz")
    assert desc["InferenceComponentStatus"] == "Failed" and "download" in desc["FailureReason"], desc
    sm.delete_inference_component(InferenceComponentName="bad-missing")
    # refused up front, as SageMaker refuses them
    good = {"BaseInferenceComponentName": BASE, "Container": {"ArtifactUrl": f"s3://{BUCKET}/adapters/a1/"}}
    bad_specs = [
        ({**good, "BaseInferenceComponentName": "nope"}, "Could not find inference component 'nope'"),
        ({**good, "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 1024}}, "must be omitted"),
        ({"BaseInferenceComponentName": BASE}, "ArtifactUrl"),
    ]
    for spec, needle in bad_specs:
        with pytest.raises(sm.exceptions.ClientError, match=needle):
            sm.create_inference_component(
                InferenceComponentName="refused", EndpointName=ENDPOINT, Specification=spec
            )


def test_cli_against_the_endpoint(
    base_component: str,
    clients: dict[str, Any],
    local: dict[str, str],
    material: dict[str, Path],
    peft: PeftReference,
) -> None:
    """`lmforge adapter add NAME FOLDER --endpoint`: checked, uploaded, created, waited for."""
    smr = clients["sagemaker-runtime"]
    target = ("--endpoint", ENDPOINT)
    added = lmforge(
        "adapter", "add", "cli-a2", str(material["a2"]), *target, "--base-component", BASE, env=local
    )
    assert "cli-a2: InService (created)" in added.stdout
    assert "--inference-component cli-a2" in added.stderr and "upload" in added.stderr
    assert _tokens(smr, "cli-a2") == peft.greedy(PROMPT, NEW, "a2")
    out = lmforge(
        "invoke", ENDPOINT, PROMPT, "--inference-component", "cli-a2", "--max-new-tokens", "6", env=local
    )
    assert (
        out.stdout.strip()
        == peft.tokenizer.decode(peft.greedy(PROMPT, 6, "a2"), skip_special_tokens=True).strip()
    )

    again = lmforge(
        "adapter", "add", "cli-a2", str(material["a2"]), *target, "--base-component", BASE, env=local
    )
    assert "(updated)" in again.stdout and "nothing sent" in again.stderr  # content-addressed upload
    rows = json.loads(lmforge("adapter", "list", *target, "--json", env=local).stdout)
    assert [(r["name"], r["base"], r["status"]) for r in rows] == [("cli-a2", BASE, "InService")]
    assert rows[0]["artifact"].startswith("s3://sagemaker-us-west-2-") and rows[0]["artifact"].endswith(
        ".tar.gz"
    )
    table = lmforge("adapter", "list", *target, env=local).stdout
    assert table.split()[:4] == ["NAME", "BASE", "STATUS", "ARTIFACT"] and "cli-a2" in table

    refused = lmforge(
        "adapter",
        "add",
        "cli-bad",
        str(material["pickled"]),
        *target,
        "--base-component",
        BASE,
        env=local,
        check=False,
    )
    assert refused.returncode == 1 and "adapter_model.bin is not allowed" in refused.stderr
    failed = lmforge(
        "adapter",
        "add",
        "cli-big",
        str(material["big-rank"]),
        *target,
        "--base-component",
        BASE,
        env=local,
        check=False,
    )
    assert (
        failed.returncode == 1 and "cli-big Failed" in failed.stderr and "max_lora_rank=16" in failed.stderr
    )
    lmforge("adapter", "remove", "cli-big", *target, env=local)
    not_adapter = lmforge("adapter", "remove", BASE, *target, env=local, check=False)
    assert not_adapter.returncode == 1 and "not an adapter inference component" in not_adapter.stderr

    removed = lmforge("adapter", "remove", "cli-a2", *target, env=local)
    assert "cli-a2: deleted" in removed.stdout
    assert json.loads(lmforge("adapter", "list", *target, "--json", env=local).stdout) == []
    usage = lmforge("adapter", "list", env=local, check=False)
    assert usage.returncode == 2 and "--url" in usage.stderr and "--endpoint" in usage.stderr


def test_cli_against_a_server(material: dict[str, Path], peft: PeftReference, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(material["model"], model)
    roots = tmp_path / "roots"
    for name in ("a1", "pickled"):
        shutil.copytree(material[name], roots / name)
    with (model / "serving.properties").open("a") as f:
        f.write(f"option.adapter_roots={roots}\n")
    env = {**os.environ, **TEST_ENV}
    with RemoteServer(model) as srv:
        url = ("--url", srv.url)
        added = lmforge("adapter", "add", "x1", str(roots / "a1"), *url, env=env)
        assert "x1: registered" in added.stdout and "rank 8" in added.stdout
        rows = json.loads(lmforge("adapter", "list", *url, "--model", "model", "--json", env=env).stdout)
        assert [(r["name"], r["rank"], r["src"]) for r in rows] == [("x1", 8, str(roots / "a1"))]
        body = {
            "inputs": PROMPT,
            "adapters": "x1",
            "parameters": {"max_new_tokens": NEW, "ignore_eos_token": True, "details": True},
        }
        answer = http_client().post(srv.url + "/invocations", json=body, timeout=60).json()
        assert [t["id"] for t in answer["details"]["tokens"]] == peft.greedy(PROMPT, NEW, "a1")

        bad = lmforge("adapter", "add", "x2", str(roots / "pickled"), *url, env=env, check=False)
        assert bad.returncode == 1
        assert (
            "400" in bad.stderr
            and "adapter_model.bin is not allowed" in bad.stderr
            and "Traceback" not in bad.stderr
        )
        outside = lmforge("adapter", "add", "x3", "/etc", *url, env=env, check=False)
        assert outside.returncode == 1 and "outside the allowed" in outside.stderr

        assert "x1: removed" in lmforge("adapter", "remove", "x1", *url, env=env).stdout
        again = lmforge("adapter", "remove", "x1", *url, env=env, check=False)
        assert again.returncode == 1 and "404" in again.stderr and "'x1'" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
    gone = lmforge("adapter", "list", "--url", srv.url, env=env, check=False)
    assert gone.returncode == 1 and "cannot reach" in gone.stderr


def test_adapter_on_a_starting_base_then_endpoint_delete(
    base_component: str,  # the bucket
    clients: dict[str, Any],
    local: dict[str, str],
    material: dict[str, Path],
    peft: PeftReference,
    tmp_path: Path,
) -> None:
    """An adapter component created while its base is still Creating waits for it; the endpoint cannot
    be deleted while it has components, and ``lmforge delete`` takes the adapters (and their files),
    then the base, then the endpoint. An endpoint of its own (the module's stays), and
    artifacts it uploads itself: it passes alone and in any order."""
    from lmforge.artifacts import package_model

    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    endpoint = _components_endpoint(sm, local["LMFORGE_ROLE_ARN"], "lora-late-endpoint")
    archive = package_model(material["plain-model"], tmp_path / "model.tar.gz").output
    sm.create_model(
        ModelName="plain-model",
        ExecutionRoleArn=local["LMFORGE_ROLE_ARN"],
        PrimaryContainer={
            "Image": "lmforge:cpu",
            "ModelDataUrl": _put(clients, archive, "plain/model.tar.gz"),
        },
    )
    a1_url = _put(clients, _tarball(material["a1"], tmp_path / "a1.tar.gz"), "late/a1.tar.gz")
    sm.create_inference_component(
        InferenceComponentName="lora-base2",
        EndpointName=endpoint,
        Specification={
            "ModelName": "plain-model",
            "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
        },
        RuntimeConfig={"CopyCount": 1},
    )
    sm.create_inference_component(
        InferenceComponentName="late-a1",
        EndpointName=endpoint,
        Specification={"BaseInferenceComponentName": "lora-base2", "Container": {"ArtifactUrl": a1_url}},
    )
    assert (
        sm.describe_inference_component(InferenceComponentName="late-a1")["InferenceComponentStatus"]
        == "Creating"
    )
    desc = _wait(sm, "late-a1", 180)
    assert desc["InferenceComponentStatus"] == "InService", desc.get("FailureReason")
    assert _tokens(smr, "late-a1", endpoint=endpoint) == peft.greedy(PROMPT, NEW, "a1")
    # a new container for the base (UpdateInferenceComponent): the adapter moves with it
    containers = Path(local["LMFORGE_LOCAL_DIR"], "endpoints", endpoint)
    first = sorted(containers.glob("lora-base2-*"))
    sm.update_inference_component(
        InferenceComponentName="lora-base2",
        Specification={
            "ModelName": "plain-model",
            "Container": {"Environment": {"OPTION_MAX_LORAS": "3"}},
            "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
        },
    )
    desc = _wait(sm, "lora-base2", 180)
    assert desc["InferenceComponentStatus"] == "InService" and "FailureReason" not in desc, desc
    assert len(sorted(containers.glob("lora-base2-*"))) == len(first) + 1
    assert _tokens(smr, "late-a1", endpoint=endpoint) == peft.greedy(PROMPT, NEW, "a1")
    # SageMaker refuses to delete an endpoint that still has components; lmforge delete removes them first
    with pytest.raises(sm.exceptions.ClientError, match="has inference components"):
        sm.delete_endpoint(EndpointName=endpoint)
    lmforge("delete", endpoint, env=local)
    assert sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"] == []
    deadline = time.monotonic() + 30
    while _adapter_folders(local, "late-a1"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the module's endpoint is untouched
    assert (
        sm.describe_inference_component(InferenceComponentName=BASE)["InferenceComponentStatus"]
        == "InService"
    )


def _pid(folder: Path) -> int:
    """The host process of a process-mode instance (its container.json)."""
    return int(json.loads(folder.joinpath("container.json").read_text())["pid"])


def test_an_adapter_is_registered_with_every_copy_of_its_base(
    base_component: str,
    clients: dict[str, Any],
    local: dict[str, str],
    material: dict[str, Path],
    peft: PeftReference,
    tmp_path: Path,
) -> None:
    """A base component scaled to two copies (two containers): the adapter component is registered
    with the new copy before it serves, and answers as PEFT does from either (docs/components.md)."""
    from lmforge.client.adapters import AdaptersClient

    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    url = _put(clients, _tarball(material["a1"], tmp_path / "a1.tar.gz"), "copies/a1.tar.gz")
    desc = _create_adapter(sm, "copies-a1", url)
    assert desc["InferenceComponentStatus"] == "InService", desc.get("FailureReason")
    sm.update_inference_component_runtime_config(
        InferenceComponentName=BASE, DesiredRuntimeConfig={"CopyCount": 2}
    )
    try:

        def runtime() -> dict[str, Any]:
            return dict(sm.describe_inference_component(InferenceComponentName=BASE)["RuntimeConfig"])

        eventually(lambda: runtime()["CurrentCopyCount"] == 2, timeout=240, state=runtime, interval=0.3)
        url_report = local["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"] + "/lmforge/instances"
        report = http_client().get(url_report).json()["components"]
        ports = [r["port"] for r in report if r["component"] == BASE]
        assert len(ports) == 2
        for port in ports:  # each copy's own adapters API has it
            assert AdaptersClient(f"http://127.0.0.1:{port}").describe("copies-a1")["name"] == "copies-a1"
        expected = peft.greedy(PROMPT, NEW, "a1")
        for _ in range(6):
            assert _tokens(smr, "copies-a1") == expected
    finally:
        sm.update_inference_component_runtime_config(
            InferenceComponentName=BASE, DesiredRuntimeConfig={"CopyCount": 1}
        )
        sm.delete_inference_component(InferenceComponentName="copies-a1")
