"""Metrics and scaling that run on the local SageMaker: SageMaker's invocation metrics in the local
CloudWatch, read back with boto3's ``cloudwatch`` client, and Application Auto Scaling policies
(target tracking, step scaling on a CloudWatch alarm) that the local SageMaker evaluates on them.

This module runs its own local SageMaker with a one-second period
(``LMFORGE_LOCAL_METRICS_PERIOD_S=1``: each second stands for CloudWatch's minute), so that policies
act within a test; every wait is for an event (a copy count reached, a scaling activity recorded, a
datapoint published), never for a time. The copies serve a user's ``model.py`` (no model).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.local_sagemaker import boto3_clients, lmforge, local_sagemaker
from tests.polling import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("local-scaling")]

M5 = "ml.m5.xlarge"
NS = "AWS/SageMaker"

#: a user's handler: answers ``"ok"``, or the error status a body's ``fail`` asks for
FAILING_MODEL_PY = """
from djl_python import Input, Output


def handle(inputs: Input):
    if inputs.is_empty():
        return None
    body = inputs.get_as_json()
    if body.get("fail"):
        return Output().error("asked to fail", code=int(body["fail"]))
    return Output().add_as_json({"generated_text": "ok"})
"""


@pytest.fixture(scope="module")
def scaling_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("local-scaling")
    with local_sagemaker(state, LMFORGE_LOCAL_METRICS_PERIOD_S="1") as env:
        yield env


@pytest.fixture(scope="module")
def aws(scaling_local: dict[str, str]) -> dict[str, Any]:
    return boto3_clients(
        scaling_local, "sagemaker", "sagemaker-runtime", "s3", "cloudwatch", "application-autoscaling"
    )


@pytest.fixture(scope="module")
def model_name(
    aws: dict[str, Any], scaling_local: dict[str, str], tiny_model: Path, tmp_path_factory: Any
) -> str:
    from lmforge.artifacts import package_model

    folder = tmp_path_factory.mktemp("scaling-model") / "model"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model / "config.json").read_text())
    (folder / "serving.properties").write_text("engine=Python\noption.max_rolling_batch_size=8\n")
    (folder / "model.py").write_text(FAILING_MODEL_PY)
    s3, sm = aws["s3"], aws["sagemaker"]
    s3.create_bucket(Bucket="scaling", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    archive = package_model(folder, folder.parent / "model.tar.gz").output
    s3.upload_file(str(archive), "scaling", "model/model.tar.gz")
    sm.create_model(
        ModelName="scaling-model",
        ExecutionRoleArn=scaling_local["LMFORGE_ROLE_ARN"],
        PrimaryContainer={"Image": "lmforge:cpu", "ModelDataUrl": "s3://scaling/model/model.tar.gz"},
    )
    return "scaling-model"


def _endpoint(sm: Any, role: str, name: str, max_instances: int = 2, min_instances: int = 1) -> None:
    variant = {
        "VariantName": "AllTraffic",
        "InstanceType": M5,
        "InitialInstanceCount": 1,
        "ManagedInstanceScaling": {
            "Status": "ENABLED",
            "MinInstanceCount": min_instances,
            "MaxInstanceCount": max_instances,
        },
    }
    sm.create_endpoint_config(
        EndpointConfigName=f"{name}-config", ExecutionRoleArn=role, ProductionVariants=[variant]
    )
    sm.create_endpoint(EndpointName=name, EndpointConfigName=f"{name}-config")
    sm.get_waiter("endpoint_in_service").wait(EndpointName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def _component(sm: Any, model: str, endpoint: str, name: str, copies: int = 1) -> None:
    sm.create_inference_component(
        InferenceComponentName=name,
        EndpointName=endpoint,
        VariantName="AllTraffic",
        Specification={
            "ModelName": model,
            "ComputeResourceRequirements": {"NumberOfCpuCoresRequired": 1, "MinMemoryRequiredInMb": 1024},
        },
        RuntimeConfig={"CopyCount": copies},
    )
    _wait_copies(sm, name, copies)


def _wait_copies(sm: Any, name: str, count: int, timeout: float = 180) -> None:
    def reached() -> bool:
        desc = sm.describe_inference_component(InferenceComponentName=name)
        return bool(
            desc["InferenceComponentStatus"] == "InService"
            and desc["RuntimeConfig"]["CurrentCopyCount"] == count
            and desc["RuntimeConfig"]["DesiredCopyCount"] == count
        )

    eventually(
        reached, timeout=timeout, state=lambda: sm.describe_inference_component(InferenceComponentName=name)
    )


def _invoke(smr: Any, endpoint: str, component: str, **body: Any) -> str:
    answer = smr.invoke_endpoint(
        EndpointName=endpoint,
        InferenceComponentName=component,
        Body=json.dumps({"inputs": "x", **body}),
        ContentType="application/json",
    )
    return str(json.loads(answer["Body"].read())["generated_text"])


def _statistic(cw: Any, metric: str, dims: dict[str, str], statistic: str = "Sum") -> float:
    """The metric's ``statistic`` over the last hour (all of this test's datapoints)."""
    now = datetime.now(UTC)
    points = cw.get_metric_statistics(
        Namespace=NS,
        MetricName=metric,
        Dimensions=[{"Name": k, "Value": v} for k, v in dims.items()],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
        Period=3600,
        Statistics=[statistic],
    )["Datapoints"]
    return float(sum(p[statistic] for p in points))


def test_invocation_metrics_are_published_to_cloudwatch(
    aws: dict[str, Any], scaling_local: dict[str, str], model_name: str
) -> None:
    """Invocations, errors by class, latencies, per-copy invocations and no-capacity refusals of two
    components on one endpoint, read back with ``get_metric_statistics``, ``get_metric_data`` and
    ``list_metrics`` under SageMaker's names and dimensions."""
    sm, smr, cw = aws["sagemaker"], aws["sagemaker-runtime"], aws["cloudwatch"]
    _endpoint(sm, scaling_local["LMFORGE_ROLE_ARN"], "metrics")
    _component(sm, model_name, "metrics", "ic-m1", copies=2)
    _component(sm, model_name, "metrics", "ic-m2")
    for _ in range(3):
        assert _invoke(smr, "metrics", "ic-m1") == "ok"
    with pytest.raises(smr.exceptions.ModelError):
        _invoke(smr, "metrics", "ic-m1", fail=400)
    with pytest.raises(smr.exceptions.ModelError):
        _invoke(smr, "metrics", "ic-m2", fail=500)
    assert _invoke(smr, "metrics", "ic-m2") == "ok"
    sm.update_inference_component_runtime_config(
        InferenceComponentName="ic-m2", DesiredRuntimeConfig={"CopyCount": 0}
    )
    _wait_copies(sm, "ic-m2", 0)
    with pytest.raises(smr.exceptions.ValidationError, match="no capacity"):
        _invoke(smr, "metrics", "ic-m2")

    m1, m2 = {"InferenceComponentName": "ic-m1"}, {"InferenceComponentName": "ic-m2"}
    endpoint = {"EndpointName": "metrics", "VariantName": "AllTraffic"}
    expected = [
        ("Invocations", m1, "Sum", 4.0),
        ("Invocation4XXErrors", m1, "Sum", 1.0),
        ("Invocation5XXErrors", m1, "Sum", 0.0),
        ("Invocations", m2, "Sum", 2.0),
        ("Invocation5XXErrors", m2, "Sum", 1.0),
        ("NoCapacityInvocationFailures", m2, "Sum", 1.0),
        ("NoCapacityInvocationFailures", m1, "Sum", 0.0),
        ("Invocations", endpoint, "Sum", 6.0),
        ("InvocationModelErrors", endpoint, "Sum", 2.0),
        ("ModelLatency", m1, "SampleCount", 4.0),
        ("OverheadLatency", endpoint, "SampleCount", 6.0),
        ("InvocationsPerCopy", m1, "Sum", 2.0),  # 4 invocations over 2 copies
    ]

    def published() -> list[tuple[str, dict[str, str], str, float]]:
        return [(m, d, s, _statistic(cw, m, d, s)) for m, d, s, _ in expected]

    eventually(lambda: published() == expected, timeout=60, state=published)
    # an invocation takes some time in the model, as SageMaker measures it (microseconds)
    assert _statistic(cw, "ModelLatency", m1, "Maximum") > 0

    now = datetime.now(UTC)
    data = cw.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "copies",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NS,
                        "MetricName": "Invocations",
                        "Dimensions": [{"Name": "InferenceComponentName", "Value": "ic-m1"}],
                    },
                    "Period": 3600,
                    "Stat": "Sum",
                },
            }
        ],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
    )["MetricDataResults"]
    assert sum(data[0]["Values"]) == 4.0
    for name in ("ic-m1", "ic-m2"):
        sm.delete_inference_component(InferenceComponentName=name)
    eventually(
        lambda: not sm.list_inference_components(EndpointNameEquals="metrics")["InferenceComponents"],
        timeout=60,
    )
    sm.delete_endpoint(EndpointName="metrics")


def test_each_adapter_component_publishes_its_usage(
    aws: dict[str, Any],
    scaling_local: dict[str, str],
    tiny_model: Path,
    lora_adapters: dict[str, Path],
    tmp_path: Path,
) -> None:
    """The usage of each fine-tuned adapter: two adapter components on one base component (the tiny
    model with LoRA on) count their invocations, errors and latencies under their own
    ``InferenceComponentName`` in the local CloudWatch, apart from the base's and each other's, read
    back with ``get_metric_statistics`` and found with ``list_metrics``."""
    import shutil

    from lmforge.artifacts import package_model

    sm, smr, s3, cw = aws["sagemaker"], aws["sagemaker-runtime"], aws["s3"], aws["cloudwatch"]
    folder = tmp_path / "lora-model"
    shutil.copytree(tiny_model, folder)
    (folder / "serving.properties").write_text(
        "engine=Python\noption.rolling_batch=lmi-dist\noption.enable_lora=true\noption.max_loras=2\n"
        "option.max_lora_rank=16\noption.max_rolling_batch_size=8\n"
    )
    s3.create_bucket(Bucket="adapter-usage", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    archive = package_model(folder, tmp_path / "model.tar.gz").output
    s3.upload_file(str(archive), "adapter-usage", "base/model.tar.gz")
    for name in ("a1", "a2"):
        for f in lora_adapters[name].iterdir():
            s3.upload_file(str(f), "adapter-usage", f"adapters/{name}/{f.name}")
    sm.create_model(
        ModelName="adapter-usage-model",
        ExecutionRoleArn=scaling_local["LMFORGE_ROLE_ARN"],
        PrimaryContainer={"Image": "lmforge:cpu", "ModelDataUrl": "s3://adapter-usage/base/model.tar.gz"},
    )
    _endpoint(sm, scaling_local["LMFORGE_ROLE_ARN"], "adapter-usage")
    _component(sm, "adapter-usage-model", "adapter-usage", "ic-usage-base")
    for name in ("a1", "a2"):
        sm.create_inference_component(
            InferenceComponentName=f"ic-usage-{name}",
            EndpointName="adapter-usage",
            Specification={
                "BaseInferenceComponentName": "ic-usage-base",
                "Container": {"ArtifactUrl": f"s3://adapter-usage/adapters/{name}/"},
            },
        )
    for name in ("a1", "a2"):
        eventually(
            lambda name=name: (
                sm.describe_inference_component(InferenceComponentName=f"ic-usage-{name}")[
                    "InferenceComponentStatus"
                ]
                == "InService"
            ),
            timeout=120,
            state=lambda name=name: sm.describe_inference_component(
                InferenceComponentName=f"ic-usage-{name}"
            ),
        )

    def invoke(component: str) -> dict[str, Any]:
        answer = smr.invoke_endpoint(
            EndpointName="adapter-usage",
            InferenceComponentName=component,
            Body=json.dumps({"inputs": "def fibonacci(n):", "parameters": {"max_new_tokens": 4}}),
            ContentType="application/json",
        )
        return dict(json.loads(answer["Body"].read()))

    counts = {"ic-usage-a1": 3, "ic-usage-a2": 1, "ic-usage-base": 2}
    for component, times in counts.items():
        for _ in range(times):
            assert "generated_text" in invoke(component)
    with pytest.raises(smr.exceptions.ModelError):  # a bad request: an error of that adapter's
        smr.invoke_endpoint(
            EndpointName="adapter-usage",
            InferenceComponentName="ic-usage-a2",
            Body=b"not json",
            ContentType="application/json",
        )

    a1, a2 = {"InferenceComponentName": "ic-usage-a1"}, {"InferenceComponentName": "ic-usage-a2"}
    expected = [
        ("Invocations", a1, "Sum", 3.0),
        ("Invocations", a2, "Sum", 2.0),  # one answered, one the model refused
        ("Invocations", {"InferenceComponentName": "ic-usage-base"}, "Sum", 2.0),
        ("InvocationModelErrors", a2, "Sum", 1.0),
        ("InvocationModelErrors", a1, "Sum", 0.0),
        ("ModelLatency", a1, "SampleCount", 3.0),
        ("Invocations", {"EndpointName": "adapter-usage", "VariantName": "AllTraffic"}, "Sum", 7.0),
    ]

    def published() -> list[tuple[str, dict[str, str], str, float]]:
        return [(m, d, s, _statistic(cw, m, d, s)) for m, d, s, _ in expected]

    eventually(lambda: published() == expected, timeout=60, state=published)
    listed = cw.list_metrics(
        Namespace=NS, Dimensions=[{"Name": "InferenceComponentName", "Value": "ic-usage-a1"}]
    )["Metrics"]
    assert {"Invocations", "ModelLatency", "InvocationsPerCopy"} <= {m["MetricName"] for m in listed}

    for name in ("ic-usage-a1", "ic-usage-a2", "ic-usage-base"):
        sm.delete_inference_component(InferenceComponentName=name)
        eventually(
            lambda name=name: (
                name
                not in [
                    c["InferenceComponentName"]
                    for c in sm.list_inference_components(EndpointNameEquals="adapter-usage")[
                        "InferenceComponents"
                    ]
                ]
            ),
            timeout=60,
        )
    sm.delete_endpoint(EndpointName="adapter-usage")


def _activities(aas: Any, resource: str) -> list[dict[str, Any]]:
    return list(
        aas.describe_scaling_activities(
            ServiceNamespace="sagemaker",
            ResourceId=resource,
            ScalableDimension="sagemaker:inference-component:DesiredCopyCount",
        )["ScalingActivities"]
    )


def test_a_component_scales_out_in_to_zero_and_back_from_zero(
    aws: dict[str, Any], scaling_local: dict[str, str], model_name: str
) -> None:
    """Application Auto Scaling on ``sagemaker:inference-component:DesiredCopyCount``: target tracking
    on ``SageMakerInferenceComponentInvocationsPerCopy`` takes the component from 1 to 2 copies under
    load and to 0 when idle; the step policy on a ``NoCapacityInvocationFailures`` alarm (as AWS
    documents scale from zero) brings a copy back on the first refused request. Each change is a
    scaling activity."""
    sm, smr, cw, aas = (
        aws["sagemaker"],
        aws["sagemaker-runtime"],
        aws["cloudwatch"],
        aws["application-autoscaling"],
    )
    _endpoint(sm, scaling_local["LMFORGE_ROLE_ARN"], "autoscaled", max_instances=1, min_instances=0)
    _component(sm, model_name, "autoscaled", "ic-auto")
    resource, dimension = "inference-component/ic-auto", "sagemaker:inference-component:DesiredCopyCount"
    aas.register_scalable_target(
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=dimension,
        MinCapacity=0,
        MaxCapacity=2,
    )
    tracking = aas.put_scaling_policy(
        PolicyName="per-copy",
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=dimension,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": 3.0,
            "PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"
            },
            "ScaleInCooldown": 0,
            "ScaleOutCooldown": 0,
        },
    )
    step = aas.put_scaling_policy(
        PolicyName="from-zero",
        ServiceNamespace="sagemaker",
        ResourceId=resource,
        ScalableDimension=dimension,
        PolicyType="StepScaling",
        StepScalingPolicyConfiguration={
            "AdjustmentType": "ChangeInCapacity",
            "MetricAggregationType": "Maximum",
            "Cooldown": 0,
            "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
        },
    )
    cw.put_metric_alarm(
        AlarmName="ic-auto-from-zero",
        AlarmActions=[step["PolicyARN"]],
        MetricName="NoCapacityInvocationFailures",
        Namespace=NS,
        Statistic="Maximum",
        Dimensions=[{"Name": "InferenceComponentName", "Value": "ic-auto"}],
        Period=30,
        EvaluationPeriods=1,
        DatapointsToAlarm=1,
        Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        TreatMissingData="missing",
    )

    failures: list[Exception] = []
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            try:
                _invoke(smr, "autoscaled", "ic-auto")
            except Exception as exc:  # every failure is the test's finding
                failures.append(exc)
                return

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        _wait_copies(sm, "ic-auto", 2)
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert failures == []
    high, low = (a["AlarmName"] for a in tracking["Alarms"])  # the policy's alarms, as AWS names them
    assert high.startswith(f"TargetTracking-{resource}-AlarmHigh-")
    assert low.startswith(f"TargetTracking-{resource}-AlarmLow-")
    out = _activities(aas, resource)
    assert out[0]["Description"] == "Setting desired copy count to 2."
    assert out[0]["StatusCode"] == "Successful"
    assert f"monitor alarm {high} in state ALARM triggered policy per-copy" in out[0]["Cause"]

    # idle: the policy scales in, down to the target's minimum of 0 copies (and 0 instances)
    _wait_copies(sm, "ic-auto", 0, timeout=240)
    scaled_in = _activities(aas, resource)[0]
    assert scaled_in["Description"] == "Setting desired copy count to 0."
    assert f"monitor alarm {low} in state ALARM" in scaled_in["Cause"]
    eventually(
        lambda: (
            sm.describe_endpoint(EndpointName="autoscaled")["ProductionVariants"][0]["CurrentInstanceCount"]
            == 0
        ),
        timeout=60,
    )

    # the first request is refused; the alarm on it makes the step policy add a copy
    with pytest.raises(smr.exceptions.ValidationError, match="no capacity"):
        _invoke(smr, "autoscaled", "ic-auto")
    _wait_copies(sm, "ic-auto", 1)
    back = _activities(aas, resource)[0]
    assert back["Description"] == "Setting desired copy count to 1."
    assert "ic-auto-from-zero" in back["Cause"] and "from-zero" in back["Cause"]
    assert _invoke(smr, "autoscaled", "ic-auto") == "ok"
    alarm = cw.describe_alarms(AlarmNames=["ic-auto-from-zero"])["MetricAlarms"][0]
    assert alarm["StateReason"].startswith("Threshold Crossed")  # set by the local SageMaker's evaluation

    aas.deregister_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=resource, ScalableDimension=dimension
    )  # and with it its policies and the target-tracking alarms, as on AWS
    assert (
        aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)["ScalingPolicies"]
        == []
    )
    assert cw.describe_alarms(AlarmNames=[high, low])["MetricAlarms"] == []
    sm.delete_inference_component(InferenceComponentName="ic-auto")
    eventually(
        lambda: not sm.list_inference_components(EndpointNameEquals="autoscaled")["InferenceComponents"],
        timeout=60,
    )
    sm.delete_endpoint(EndpointName="autoscaled")


def test_bad_scaling_requests_are_refused(aws: dict[str, Any]) -> None:
    """The copy-count dimension belongs to SageMaker's namespace and to an ``inference-component/``
    resource; activities are asked for with a resource and a dimension together, or neither."""
    aas = aws["application-autoscaling"]
    with pytest.raises(aas.exceptions.ValidationException, match="Unsupported"):
        aas.register_scalable_target(
            ServiceNamespace="sagemaker",
            ResourceId="endpoint/x/variant/AllTraffic",
            ScalableDimension="sagemaker:inference-component:DesiredCopyCount",
            MinCapacity=0,
            MaxCapacity=1,
        )
    with pytest.raises(aas.exceptions.ValidationException, match="together"):
        aas.describe_scaling_activities(ServiceNamespace="sagemaker", ResourceId="inference-component/x")


def test_lmforge_local_up_refuses_a_bad_period(tmp_path: Path) -> None:
    """``LMFORGE_LOCAL_METRICS_PERIOD_S`` must be seconds above 0; the start says which variable."""
    from tests.local_sagemaker import base_env

    proc = lmforge(
        "local",
        "up",
        "--state-dir",
        str(tmp_path),
        "--mode",
        "process",
        env=base_env(LMFORGE_LOCAL_METRICS_PERIOD_S="soon"),
        check=False,
    )
    assert proc.returncode != 0
    assert "LMFORGE_LOCAL_METRICS_PERIOD_S" in proc.stdout + proc.stderr


def test_lmforge_deploy_autoscales_a_component_from_zero(
    aws: dict[str, Any], scaling_local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    """``lmforge deploy --inference-component --autoscale 0:2``: the copy-count target, its
    target-tracking policy, and (minimum 0) the step policy and alarm AWS documents for scaling from
    zero; idle, the component goes to 0 copies, and the first refused request brings one back.
    ``lmforge delete`` takes the registration and the alarm off with the component."""
    from tests.local_sagemaker import handler_model

    sm, smr, cw, aas = (
        aws["sagemaker"],
        aws["sagemaker-runtime"],
        aws["cloudwatch"],
        aws["application-autoscaling"],
    )
    folder = handler_model(tiny_model, tmp_path / "model")
    out = lmforge(
        *("deploy", str(folder), "--endpoint-name", "cli-auto", "--instance-type", M5),
        *("--artifact-format", "prefix", "--inference-component", "ic-cli", "--memory-mb", "1024"),
        *("--autoscale", "0:2", "--autoscale-target", "5"),
        env=scaling_local,
    )
    assert "cli-auto/ic-cli: InService, 1/1 copies (created)" in out.stdout, out.stderr
    assert "autoscaling inference-component/ic-cli: 0 to 2 copies" in out.stderr
    resource = "inference-component/ic-cli"
    targets = aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource])[
        "ScalableTargets"
    ]
    assert [(t["ScalableDimension"], t["MinCapacity"], t["MaxCapacity"]) for t in targets] == [
        ("sagemaker:inference-component:DesiredCopyCount", 0, 2)
    ]
    policies = aas.describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource)[
        "ScalingPolicies"
    ]
    kinds = {p["PolicyName"]: p["PolicyType"] for p in policies}
    assert kinds == {
        "ic-cli-invocations-per-copy": "TargetTrackingScaling",
        "ic-cli-scale-from-zero": "StepScaling",
    }
    alarm = cw.describe_alarms(AlarmNames=["ic-cli-no-capacity"])["MetricAlarms"][0]
    tracking = cw.describe_alarms(AlarmNamePrefix=f"TargetTracking-{resource}-")["MetricAlarms"]
    assert sorted(a["AlarmName"].split("-")[-6] for a in tracking) == ["AlarmHigh", "AlarmLow"]
    step_arn = next(p["PolicyARN"] for p in policies if p["PolicyType"] == "StepScaling")
    assert alarm["AlarmActions"] == [step_arn] and alarm["MetricName"] == "NoCapacityInvocationFailures"

    _wait_copies(sm, "ic-cli", 0, timeout=240)  # idle: in to the minimum
    with pytest.raises(smr.exceptions.ValidationError, match="no capacity"):
        smr.invoke_endpoint(
            EndpointName="cli-auto",
            InferenceComponentName="ic-cli",
            Body=b'{"inputs": "x"}',
            ContentType="application/json",
        )
    _wait_copies(sm, "ic-cli", 1)
    assert lmforge(
        "invoke", "cli-auto", "x", "--inference-component", "ic-cli", env=scaling_local
    ).stdout.strip()

    lmforge("delete", "cli-auto", env=scaling_local)
    assert (
        aas.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=[resource])["ScalableTargets"]
        == []
    )
    assert cw.describe_alarms(AlarmNames=["ic-cli-no-capacity"])["MetricAlarms"] == []
    assert cw.describe_alarms(AlarmNamePrefix=f"TargetTracking-{resource}-")["MetricAlarms"] == []


def test_lmforge_deploy_autoscale_scales_a_variant_out_under_load(
    aws: dict[str, Any], scaling_local: dict[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    """The variant policy ``lmforge deploy --autoscale`` registers (target tracking on
    ``SageMakerVariantInvocationsPerInstance``) runs too: under load, a second instance."""
    from tests.local_sagemaker import handler_model

    sm, smr, aas = aws["sagemaker"], aws["sagemaker-runtime"], aws["application-autoscaling"]
    folder = handler_model(tiny_model, tmp_path / "model")
    lmforge(
        *("deploy", str(folder), "--endpoint-name", "variant-auto", "--instance-type", M5),
        *("--artifact-format", "prefix", "--autoscale", "1:2", "--autoscale-target", "3"),
        env=scaling_local,
    )
    failures: list[Exception] = []
    done = threading.Event()

    def load() -> None:
        while not done.is_set():
            try:
                smr.invoke_endpoint(
                    EndpointName="variant-auto", Body=b'{"inputs": "x"}', ContentType="application/json"
                )
            except Exception as exc:  # every failure is the test's finding
                failures.append(exc)
                return

    thread = threading.Thread(target=load)
    thread.start()
    try:

        def instances() -> int:
            return int(
                sm.describe_endpoint(EndpointName="variant-auto")["ProductionVariants"][0][
                    "CurrentInstanceCount"
                ]
            )

        eventually(lambda: instances() == 2, timeout=180, state=instances)
    finally:
        done.set()
        thread.join(60)
    assert failures == []
    activity = aas.describe_scaling_activities(
        ServiceNamespace="sagemaker",
        ResourceId="endpoint/variant-auto/variant/AllTraffic",
        ScalableDimension="sagemaker:variant:DesiredInstanceCount",
    )["ScalingActivities"][0]
    assert activity["Description"] == "Setting desired instance count to 2."
    assert "variant-auto-AllTraffic-invocations-per-instance" in activity["Cause"]
    eventually(
        lambda: sm.describe_endpoint(EndpointName="variant-auto")["EndpointStatus"] == "InService", timeout=60
    )
    lmforge("delete", "variant-auto", env=scaling_local)
