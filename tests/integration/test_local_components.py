"""Many models on one endpoint: inference components with copies on the local SageMaker, through the
real CLI, boto3 and the SageMaker SDK v2.

Each copy is a container placed on the variant's instances by its ``ComputeResourceRequirements``
(ml.m5.xlarge: 4 vCPUs, 16 GiB); managed instance scaling starts an instance for a copy that fits
nowhere and stops the empty ones; ``UpdateInferenceComponentRuntimeConfig`` reaches any count, 0
included. Where each copy runs and what it served is read from the local runtime's
``GET /lmforge/instances`` (lmforge's, not an AWS operation).

The copies serve a user's ``model.py`` (no model: a copy starts in ~0.3 CPU-s) as
test_local_instances.py's do; the engine behind a component is test_local_sagemaker.py's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.local_sagemaker import handler_model, lmforge
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-sagemaker")]

BODY = json.dumps({"inputs": "def f(x):", "parameters": {"max_new_tokens": 3}})
M5 = "ml.m5.xlarge"


def copies(local: dict[str, str], endpoint: str) -> list[dict[str, Any]]:
    url = local["AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME"] + "/lmforge/instances"
    with urllib.request.urlopen(url, timeout=10) as resp:
        report = json.loads(resp.read())["components"]
    return [r for r in report if r["endpoint"] == endpoint]


def wait_copies(sm: Any, name: str, count: int, timeout: float = 120) -> dict[str, Any]:
    """The component once it is InService with ``count`` current copies."""

    def reached() -> dict[str, Any] | None:
        desc = sm.describe_inference_component(InferenceComponentName=name)
        assert desc["InferenceComponentStatus"] != "Failed", desc.get("FailureReason")
        in_service = desc["InferenceComponentStatus"] == "InService"
        return dict(desc) if in_service and desc["RuntimeConfig"]["CurrentCopyCount"] == count else None

    return eventually(
        reached, timeout=timeout, state=lambda: sm.describe_inference_component(InferenceComponentName=name)
    )


def instance_count(sm: Any, endpoint: str) -> int:
    return int(sm.describe_endpoint(EndpointName=endpoint)["ProductionVariants"][0]["CurrentInstanceCount"])


def wait_instances(sm: Any, endpoint: str, count: int, timeout: float = 60) -> None:
    eventually(
        lambda: instance_count(sm, endpoint) == count,
        timeout=timeout,
        state=lambda: sm.describe_endpoint(EndpointName=endpoint),
    )


def invoke(smr: Any, endpoint: str, component: str) -> dict[str, Any]:
    answer = smr.invoke_endpoint(
        EndpointName=endpoint, InferenceComponentName=component, Body=BODY, ContentType="application/json"
    )
    return dict(json.loads(answer["Body"].read()))


class Invoking:
    """A client invoking ``component`` in a loop on a thread of its own for as long as the block
    lasts, keeping every answer and every failure (each failure is the test's finding)."""

    def __init__(self, smr: Any, endpoint: str, component: str) -> None:
        import threading

        self.answers: list[str] = []
        self.failures: list[Exception] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(smr, endpoint, component))

    def _run(self, smr: Any, endpoint: str, component: str) -> None:
        while not self._done.is_set():
            try:
                self.answers.append(invoke(smr, endpoint, component)["generated_text"])
            except Exception as exc:  # every failure is the test's finding
                self.failures.append(exc)

    def more(self, count: int) -> None:
        """Wait for ``count`` more answers (a failure ends the wait: it is the finding)."""
        target = len(self.answers) + count
        eventually(lambda: self.failures or len(self.answers) >= target, timeout=120, interval=0.05)

    def __enter__(self) -> Invoking:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(60)


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return handler_model(tiny_model, tmp_path_factory.mktemp("components") / "model")


def test_cli_deploys_two_components_whose_copies_share_and_add_instances(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """``lmforge deploy --inference-component`` twice on one endpoint (created for components with
    managed instance scaling, 1 to 2 instances); copies placed by their cores; more copies than one
    instance holds start the second instance; traffic spreads over the copies; 0 copies is refused as
    SageMaker refuses it; ``lmforge delete`` takes the components, then the endpoint."""
    sm, smr = clients["sagemaker"], clients["sagemaker-runtime"]
    endpoint = "two-models"
    common = ("--endpoint-name", endpoint, "--instance-type", M5, "--artifact-format", "prefix")
    out = lmforge(
        *(
            "deploy",
            str(model),
            *common,
            "--inference-component",
            "ic-a",
            "--cpus",
            "2",
            "--memory-mb",
            "1024",
        ),
        "--max-instances",
        "2",
        env=local,
    )
    assert f"{endpoint}/ic-a: InService, 1/1 copies (created)" in out.stdout, out.stderr
    config = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName=endpoint)["EndpointConfigName"]
    )
    variant = config["ProductionVariants"][0]
    assert "ModelName" not in variant
    assert variant["ManagedInstanceScaling"] == {
        "Status": "ENABLED",
        "MinInstanceCount": 1,
        "MaxInstanceCount": 2,
    }
    out = lmforge(
        *("deploy", str(model), *common, "--inference-component", "ic-b", "--copies", "2", "--cpus", "1"),
        env=local,
    )
    assert f"{endpoint}/ic-b: InService, 2/2 copies (created)" in out.stdout, out.stderr
    placed = copies(local, endpoint)
    assert sorted((r["component"], r["instance"]) for r in placed) == [
        ("ic-a", f"{M5}-1"),
        ("ic-b", f"{M5}-1"),
        ("ic-b", f"{M5}-1"),
    ]  # 2 + 1 + 1 cores: one instance holds them all
    assert instance_count(sm, endpoint) == 1
    answer = lmforge("invoke", endpoint, "x", "--inference-component", "ic-b", env=local)
    assert answer.stdout.strip()

    # a second copy of ic-a (2 cores) fits nowhere: managed instance scaling starts the second instance
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-a", DesiredRuntimeConfig={"CopyCount": 2}
    )
    desc = wait_copies(sm, "ic-a", 2)
    assert desc["RuntimeConfig"] == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}
    assert instance_count(sm, endpoint) == 2
    a_copies = [r for r in copies(local, endpoint) if r["component"] == "ic-a"]
    assert sorted(r["instance"] for r in a_copies) == [f"{M5}-1", f"{M5}-2"]
    status = lmforge("local", "status", env=local).stdout
    assert re.search(rf"{endpoint}/AllTraffic {M5}-2: ic-a#\d \(port \d+", status), status
    # a third fits nowhere (MaxInstanceCount 2): it waits, the component stays in service on two
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-a", DesiredRuntimeConfig={"CopyCount": 3}
    )
    for _ in range(12):  # both copies answer: traffic is spread (random routing) over the copies
        assert invoke(smr, endpoint, "ic-a")["generated_text"] == "xxx"
    desc = sm.describe_inference_component(InferenceComponentName="ic-a")
    assert desc["RuntimeConfig"] == {"DesiredCopyCount": 3, "CurrentCopyCount": 2}
    served = [r["invocations"] for r in copies(local, endpoint) if r["component"] == "ic-a"]
    assert len(served) == 2 and sum(served) == 12 and min(served) > 0, served

    # zero copies: SageMaker's no-capacity answer; the instance it freed stays while ic-b holds it
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-a", DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_copies(sm, "ic-a", 0)
    with pytest.raises(smr.exceptions.ValidationError, match="has no capacity to process this request"):
        invoke(smr, endpoint, "ic-a")
    assert invoke(smr, endpoint, "ic-b")["generated_text"] == "xxx"
    # the update path of the CLI: a new model for ic-b, its copies replaced
    before = {r["port"] for r in copies(local, endpoint) if r["component"] == "ic-b"}
    out = lmforge(
        *("deploy", str(model), *common, "--inference-component", "ic-b", "--copies", "1", "--cpus", "1"),
        env=local,
    )
    assert f"{endpoint}/ic-b: InService, 1/1 copies (updated)" in out.stdout, out.stderr
    after = [r for r in copies(local, endpoint) if r["component"] == "ic-b"]
    assert len(after) == 1 and after[0]["port"] not in before
    wait_instances(sm, endpoint, 1)  # the empty instance stopped (MinInstanceCount 1)

    with pytest.raises(sm.exceptions.ClientError, match="has inference components"):
        sm.delete_endpoint(EndpointName=endpoint)
    lmforge("delete", endpoint, "--inference-component", "ic-a", env=local)
    assert [
        c["InferenceComponentName"]
        for c in sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"]
    ] == ["ic-b"]
    lmforge("delete", endpoint, env=local)
    assert sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"] == []
    assert copies(local, endpoint) == []


def _components_endpoint(sm: Any, role: str, name: str, scaling: dict[str, Any] | None = None) -> None:
    variant: dict[str, Any] = {"VariantName": "AllTraffic", "InstanceType": M5, "InitialInstanceCount": 1}
    if scaling is not None:
        variant["ManagedInstanceScaling"] = scaling
    sm.create_endpoint_config(
        EndpointConfigName=f"{name}-config", ExecutionRoleArn=role, ProductionVariants=[variant]
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")
    sm.get_waiter("endpoint_in_service").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def _model(sm: Any, s3: Any, role: str, model: Path, name: str) -> str:
    from lmforge.artifacts import package_model

    bucket = "components-test"
    try:
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    archive = package_model(model, model.parent / f"{name}.tar.gz").output
    s3.upload_file(str(archive), bucket, f"{name}/model.tar.gz")
    sm.create_model(
        ModelName=name,
        ExecutionRoleArn=role,
        PrimaryContainer={"Image": "lmforge:cpu", "ModelDataUrl": f"s3://{bucket}/{name}/model.tar.gz"},
    )
    return name


def test_scale_to_zero_instances_and_back(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """``MinInstanceCount: 0``: a component at zero copies leaves the endpoint with zero instances,
    and one copy again starts an instance for it (boto3 only)."""
    sm, smr, s3 = clients["sagemaker"], clients["sagemaker-runtime"], clients["s3"]
    role = local["LMFORGE_ROLE_ARN"]
    name = _model(sm, s3, role, model, "zero-model")
    _components_endpoint(
        sm, role, "to-zero", {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 1}
    )
    sm.create_inference_component(
        InferenceComponentName="ic-zero",
        EndpointName="to-zero",
        VariantName="AllTraffic",
        Specification={
            "ModelName": name,
            "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 4, "MinMemoryRequiredInMb": 2048},
        },
        RuntimeConfig={"CopyCount": 1},
    )
    wait_copies(sm, "ic-zero", 1)
    assert invoke(smr, "to-zero", "ic-zero")["generated_text"] == "xxx"
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-zero", DesiredRuntimeConfig={"CopyCount": 0}
    )
    wait_copies(sm, "ic-zero", 0)
    wait_instances(sm, "to-zero", 0)
    with pytest.raises(smr.exceptions.ValidationError, match="no capacity"):
        invoke(smr, "to-zero", "ic-zero")
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-zero", DesiredRuntimeConfig={"CopyCount": 1}
    )
    wait_copies(sm, "ic-zero", 1)
    assert instance_count(sm, "to-zero") == 1
    assert invoke(smr, "to-zero", "ic-zero")["generated_text"] == "xxx"
    sm.delete_inference_component(InferenceComponentName="ic-zero")
    wait_instances(sm, "to-zero", 0)
    sm.delete_endpoint(EndpointName="to-zero")


def test_bad_inputs_are_answered_as_sagemaker_does(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """Requirements over the instance type, unknown components, bad copy counts (past botocore's own
    checks), TargetVariant with InferenceComponentName: each refused with SageMaker's error naming the
    field, and nothing left running."""
    sm, smr, s3 = clients["sagemaker"], clients["sagemaker-runtime"], clients["s3"]
    role = local["LMFORGE_ROLE_ARN"]
    name = _model(sm, s3, role, model, "bad-model")
    _components_endpoint(sm, role, "bad-inputs")
    for field, value in (("NumberOfCpuCoresRequired", 8), ("MinMemoryRequiredInMb", 32 * 1024)):
        needs = {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024, field: value}
        with pytest.raises(sm.exceptions.ClientError, match=f"ComputeResourceRequirements.{field}") as err:
            sm.create_inference_component(
                InferenceComponentName="too-big",
                EndpointName="bad-inputs",
                VariantName="AllTraffic",
                Specification={"ModelName": name, "ComputeResourceRequirements": needs},
                RuntimeConfig={"CopyCount": 1},
            )
        assert err.value.response["Error"]["Code"] == "ValidationException"
        assert M5 in str(err.value)
    assert sm.list_inference_components(EndpointNameEquals="bad-inputs")["InferenceComponents"] == []
    assert copies(local, "bad-inputs") == [] or all(
        r["component"] is None for r in copies(local, "bad-inputs")
    )

    for call, kwargs in (
        (sm.describe_inference_component, {}),
        (sm.delete_inference_component, {}),
        (sm.update_inference_component_runtime_config, {"DesiredRuntimeConfig": {"CopyCount": 1}}),
    ):
        with pytest.raises(sm.exceptions.ClientError, match="Could not find inference component 'nope'"):
            call(InferenceComponentName="nope", **kwargs)

    sm.create_inference_component(
        InferenceComponentName="ic-ok",
        EndpointName="bad-inputs",
        VariantName="AllTraffic",
        Specification={
            "ModelName": name,
            "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
        },
        RuntimeConfig={"CopyCount": 1},
    )
    wait_copies(sm, "ic-ok", 1)
    # botocore refuses these itself; a client without its checks reaches the server, which refuses too
    unchecked = _unchecked_sagemaker(local)
    for value, problem in ((-1, "greater than or equal to 0"), (1.5, "must be an integer"), ("2", "integer")):
        with pytest.raises(unchecked.exceptions.ClientError, match=problem) as err:
            unchecked.update_inference_component_runtime_config(
                InferenceComponentName="ic-ok", DesiredRuntimeConfig={"CopyCount": value}
            )
        assert "desiredRuntimeConfig.copyCount" in str(err.value)
    assert (
        sm.describe_inference_component(InferenceComponentName="ic-ok")["RuntimeConfig"]["DesiredCopyCount"]
        == 1
    )
    with pytest.raises(smr.exceptions.ValidationError, match="TargetVariant"):
        smr.invoke_endpoint(
            EndpointName="bad-inputs",
            InferenceComponentName="ic-ok",
            TargetVariant="AllTraffic",
            Body=BODY,
            ContentType="application/json",
        )
    with pytest.raises(sm.exceptions.ClientError, match=r"has inference components \(ic-ok\)"):
        sm.delete_endpoint(EndpointName="bad-inputs")
    assert invoke(smr, "bad-inputs", "ic-ok")["generated_text"] == "xxx"
    sm.delete_inference_component(InferenceComponentName="ic-ok")
    sm.delete_endpoint(EndpointName="bad-inputs")
    assert copies(local, "bad-inputs") == []


def _unchecked_sagemaker(local: dict[str, str]) -> Any:
    """A boto3 SageMaker client made without botocore's parameter validation (as a non-Python SDK)."""
    import os

    import boto3
    from botocore.config import Config

    saved = dict(os.environ)
    os.environ.update(local)
    try:
        return boto3.session.Session().client(
            "sagemaker", config=Config(parameter_validation=False, retries={"max_attempts": 1})
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)


SDK_V2 = """
import functools, json, sys
from sagemaker import Model, Session
from sagemaker.compute_resource_requirements.resource_requirements import ResourceRequirements
from sagemaker.enums import EndpointType
from sagemaker.predictor import Predictor

# the SDK polls every 20-30 s, for AWS's minutes-long starts; the local ones take seconds
for wait in ("wait_for_endpoint", "wait_for_inference_component", "wait_for_inference_component_deletion"):
    setattr(Session, wait, functools.partialmethod(getattr(Session, wait), poll=1))
session = Session()
role, data = sys.argv[1], sys.argv[2]
predictors = []
for name, copies in (("sdk-a", 1), ("sdk-b", 2)):
    model = Model(image_uri="lmforge:cpu", model_data=data, role=role, name=f"{name}-model",
                  sagemaker_session=session, predictor_cls=Predictor)
    predictors.append(model.deploy(
        initial_instance_count=1, instance_type="ml.m5.xlarge", endpoint_name="sdk-components",
        endpoint_type=EndpointType.INFERENCE_COMPONENT_BASED, inference_component_name=name,
        resources=ResourceRequirements(requests={"num_cpus": 1, "memory": 1024, "copies": copies}),
        managed_instance_scaling={"MinInstanceCount": 1, "MaxInstanceCount": 2},
    ))
for p in predictors:
    p.content_type = "application/json"
    print("ANSWER", p.component_name, json.loads(p.predict(json.dumps({"inputs": "x"})))["generated_text"])
for p in predictors:
    p.delete_predictor(wait=True)
session.delete_endpoint("sdk-components")
"""


def test_sagemaker_sdk_v2_deploys_two_models_as_components(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """SDK v2: ``Model.deploy(endpoint_type=INFERENCE_COMPONENT_BASED, resources=...)`` twice on one
    endpoint (the second becomes a second component), each predictor's ``component_name`` answers,
    ``delete_predictor`` then ``delete_endpoint``."""
    sm, s3 = clients["sagemaker"], clients["s3"]
    _model(sm, s3, local["LMFORGE_ROLE_ARN"], model, "sdk-data")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SDK_V2,
            local["LMFORGE_ROLE_ARN"],
            "s3://components-test/sdk-data/model.tar.gz",
        ],
        env=local,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answers = re.findall(r"ANSWER (\S+) (\S+)", proc.stdout)  # the SDK's progress dots come before
    assert answers == [("sdk-a", "xxxx"), ("sdk-b", "xxxx")], proc.stdout
    with pytest.raises(sm.exceptions.ClientError):
        sm.describe_endpoint(EndpointName="sdk-components")
    assert copies(local, "sdk-components") == []


def test_an_update_replaces_copies_without_a_failed_request(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """``UpdateInferenceComponent`` with a new specification while a client keeps invoking: the new
    copies start beside the old ones and take the traffic before those stop, so no request fails."""

    sm, smr, s3 = clients["sagemaker"], clients["sagemaker-runtime"], clients["s3"]
    role = local["LMFORGE_ROLE_ARN"]
    name = _model(sm, s3, role, model, "rolling-model")
    _components_endpoint(sm, role, "rolling")
    spec: dict[str, Any] = {
        "ModelName": name,
        "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
    }
    sm.create_inference_component(
        InferenceComponentName="ic-roll",
        EndpointName="rolling",
        VariantName="AllTraffic",
        Specification=spec,
        RuntimeConfig={"CopyCount": 2},
    )
    wait_copies(sm, "ic-roll", 2)
    old = {r["port"] for r in copies(local, "rolling")}
    with Invoking(smr, "rolling", "ic-roll") as load:
        env = {"Environment": {"ROLLING": "2"}}
        sm.update_inference_component(
            InferenceComponentName="ic-roll", Specification={**spec, "Container": env}
        )

        def replaced() -> bool:
            now = copies(local, "rolling")
            return not {r["port"] for r in now} & old and len(now) == 2

        eventually(replaced, timeout=120, state=lambda: copies(local, "rolling"))
        load.more(5)  # the new copies answer too
    assert load.failures == []
    assert set(load.answers) == {"xxx"}
    desc = sm.describe_inference_component(InferenceComponentName="ic-roll")
    assert desc["InferenceComponentStatus"] == "InService" and "FailureReason" not in desc
    assert desc["Specification"]["Container"]["Environment"] == {"ROLLING": "2"}
    sm.delete_inference_component(InferenceComponentName="ic-roll")
    sm.delete_endpoint(EndpointName="rolling")


def test_a_rolling_update_goes_batch_by_batch_and_rolls_back_a_failing_one(
    local: dict[str, str], clients: dict[str, Any], model: Path
) -> None:
    """``DeploymentConfig.RollingUpdatePolicy`` with batches of one copy: never more than one new copy
    beside the old ones, no failed request; a new specification whose copies fail ``/ping`` rolls
    back, and the component is ``InService`` on its previous specification with the reason."""
    import threading

    sm, smr, s3 = clients["sagemaker"], clients["sagemaker-runtime"], clients["s3"]
    role = local["LMFORGE_ROLE_ARN"]
    name = _model(sm, s3, role, model, "batched-model")
    failing = model.parent / "failing-model"
    if not failing.exists():
        shutil.copytree(model, failing)
        (failing / "model.py").write_text("raise RuntimeError('this model does not load')\n")
    broken = _model(sm, s3, role, failing, "batched-broken")
    _components_endpoint(sm, role, "batched")
    spec: dict[str, Any] = {
        "ModelName": name,
        "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
        "Container": {"Environment": {"GENERATION": "1"}},
    }
    sm.create_inference_component(
        InferenceComponentName="ic-batched",
        EndpointName="batched",
        VariantName="AllTraffic",
        Specification=spec,
        RuntimeConfig={"CopyCount": 3},
    )
    wait_copies(sm, "ic-batched", 3)
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(len(copies(local, "batched")))
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    policy = {
        "RollingUpdatePolicy": {
            "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1},
            "WaitIntervalInSeconds": 0,
        }
    }
    try:
        with Invoking(smr, "batched", "ic-batched") as load:
            old = {r["port"] for r in copies(local, "batched")}
            sm.update_inference_component(
                InferenceComponentName="ic-batched",
                Specification={**spec, "Container": {"Environment": {"GENERATION": "2"}}},
                DeploymentConfig=policy,
            )

            def rolled() -> bool:
                desc = sm.describe_inference_component(InferenceComponentName="ic-batched")
                now = {r["port"] for r in copies(local, "batched")}
                return desc["InferenceComponentStatus"] == "InService" and len(now) == 3 and not now & old

            eventually(rolled, timeout=180, state=lambda: copies(local, "batched"))
            desc = sm.describe_inference_component(InferenceComponentName="ic-batched")
            assert desc["Specification"]["Container"]["Environment"] == {"GENERATION": "2"}
            assert desc["LastDeploymentConfig"] == policy
            assert "FailureReason" not in desc

            # copies of the next specification fail /ping (its model.py raises as it loads): rolled back
            before = {r["port"] for r in copies(local, "batched")}
            sm.update_inference_component(
                InferenceComponentName="ic-batched",
                Specification={
                    **spec,
                    "ModelName": broken,
                    "Container": {"Environment": {"GENERATION": "3"}},
                },
                DeploymentConfig=policy,
            )

            def settled() -> dict[str, Any] | None:
                desc = sm.describe_inference_component(InferenceComponentName="ic-batched")
                return (
                    dict(desc)
                    if desc["InferenceComponentStatus"] == "InService" and desc.get("FailureReason")
                    else None
                )

            desc = eventually(
                settled,
                timeout=180,
                state=lambda: sm.describe_inference_component(InferenceComponentName="ic-batched"),
            )
            load.more(5)
    finally:
        done.set()
        watcher.join(60)
    assert load.failures == []
    assert set(load.answers) == {"xxx"}
    assert max(seen) <= 4, seen  # 3 copies and a batch of 1 beside them
    assert desc["FailureReason"].startswith("Rolled back to the previous specification:"), desc[
        "FailureReason"
    ]
    assert "ping health check" in desc["FailureReason"]
    assert desc["Specification"]["Container"]["Environment"] == {"GENERATION": "2"}
    assert desc["Specification"]["ModelName"] == name
    assert {r["port"] for r in copies(local, "batched")} == before  # the old copies kept serving
    with pytest.raises(sm.exceptions.ClientError, match=r"MaximumBatchSize\.Type"):
        sm.update_inference_component(
            InferenceComponentName="ic-batched",
            Specification=spec,
            DeploymentConfig={
                "RollingUpdatePolicy": {
                    "MaximumBatchSize": {"Type": "COPIES", "Value": 1},
                    "WaitIntervalInSeconds": 0,
                }
            },
        )
    sm.delete_inference_component(InferenceComponentName="ic-batched")
    sm.delete_endpoint(EndpointName="batched")
