"""Target tracking's alarms on the local control plane, through boto3's ``application-autoscaling`` and
``cloudwatch`` clients (moto in process, with lmforge's Application Auto Scaling patches): a SageMaker
target-tracking policy gets AWS's two alarms, named as AWS names them, in its ``Alarms`` and in
CloudWatch; an update replaces them and keeps the policy's ARN; deleting the policy or deregistering
its target deletes them. The evaluator that scales on them is tests/unit/test_local_autoscaler.py's and
tests/integration/test_local_scaling.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

REGION = "us-west-2"
COMPONENT = "inference-component/ic-a"
COPY_COUNT = "sagemaker:inference-component:DesiredCopyCount"
VARIANT = "endpoint/e/variant/AllTraffic"
INSTANCES = "sagemaker:variant:DesiredInstanceCount"


@pytest.fixture
def clients() -> Iterator[tuple[Any, Any]]:
    from lmforge.local import autoscaling_ext

    autoscaling_ext.install()
    with moto.mock_aws():
        yield (
            boto3.client("application-autoscaling", region_name=REGION),
            boto3.client("cloudwatch", region_name=REGION),
        )


def _register(aas: Any, rid: str = COMPONENT, dim: str = COPY_COUNT) -> None:
    aas.register_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=dim, MinCapacity=0, MaxCapacity=4
    )


def _tracking(aas: Any, target: float = 5.0, rid: str = COMPONENT, dim: str = COPY_COUNT, **more: Any) -> Any:
    metric = (
        "SageMakerInferenceComponentInvocationsPerCopy"
        if rid.startswith("inference-component/")
        else "SageMakerVariantInvocationsPerInstance"
    )
    return aas.put_scaling_policy(
        PolicyName="per-copy",
        ServiceNamespace="sagemaker",
        ResourceId=rid,
        ScalableDimension=dim,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": target,
            "PredefinedMetricSpecification": {"PredefinedMetricType": metric},
            **more,
        },
    )


def _alarms(cw: Any) -> dict[str, dict[str, Any]]:
    return {a["AlarmName"]: a for a in cw.describe_alarms()["MetricAlarms"]}


def test_a_target_tracking_policy_gets_aws_two_alarms(clients: tuple[Any, Any]) -> None:
    aas, cw = clients
    _register(aas)
    answer = _tracking(aas)
    names = [a["AlarmName"] for a in answer["Alarms"]]
    assert len(names) == 2
    assert names[0].startswith(f"TargetTracking-{COMPONENT}-AlarmHigh-")
    assert names[1].startswith(f"TargetTracking-{COMPONENT}-AlarmLow-")
    assert all(a["AlarmARN"].endswith(f":alarm:{a['AlarmName']}") for a in answer["Alarms"])
    alarms = _alarms(cw)
    assert sorted(alarms) == sorted(names)
    high, low = alarms[names[0]], alarms[names[1]]
    for alarm in (high, low):
        assert alarm["Namespace"] == "AWS/SageMaker" and alarm["MetricName"] == "InvocationsPerCopy"
        assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": "ic-a"}]
        assert alarm["AlarmActions"] == [answer["PolicyARN"]]
        assert alarm["Statistic"] == "Sum"
    assert (high["ComparisonOperator"], high["Threshold"], high["EvaluationPeriods"]) == (
        "GreaterThanThreshold",
        5.0,
        3,
    )
    assert (low["ComparisonOperator"], low["Threshold"], low["EvaluationPeriods"]) == (
        "LessThanThreshold",
        4.5,
        15,
    )
    described = aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    assert [a["AlarmName"] for a in described[0]["Alarms"]] == names

    aas.delete_scaling_policy(
        PolicyName="per-copy",
        ServiceNamespace="sagemaker",
        ResourceId=COMPONENT,
        ScalableDimension=COPY_COUNT,
    )
    assert _alarms(cw) == {}


def test_an_update_replaces_the_alarms_and_keeps_the_arn(clients: tuple[Any, Any]) -> None:
    aas, cw = clients
    _register(aas)
    first = _tracking(aas)
    second = _tracking(aas, target=8.0, DisableScaleIn=True)
    assert second["PolicyARN"] == first["PolicyARN"]
    alarms = _alarms(cw)
    assert list(alarms) == [a["AlarmName"] for a in second["Alarms"]]  # the high one only: no scale-in
    (only,) = alarms.values()
    assert "-AlarmHigh-" in only["AlarmName"] and only["Threshold"] == 8.0


def test_deregistering_the_target_deletes_its_policies_and_alarms(clients: tuple[Any, Any]) -> None:
    aas, cw = clients
    _register(aas, VARIANT, INSTANCES)
    answer = _tracking(aas, rid=VARIANT, dim=INSTANCES)
    alarm = _alarms(cw)[answer["Alarms"][0]["AlarmName"]]
    assert alarm["MetricName"] == "InvocationsPerInstance"
    assert alarm["Dimensions"] == [
        {"Name": "EndpointName", "Value": "e"},
        {"Name": "VariantName", "Value": "AllTraffic"},
    ]
    assert alarm["AlarmName"].startswith(f"TargetTracking-{VARIANT}-AlarmHigh-")
    aas.deregister_scalable_target(
        ServiceNamespace="sagemaker", ResourceId=VARIANT, ScalableDimension=INSTANCES
    )
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert _alarms(cw) == {}


def test_a_bad_target_tracking_configuration_is_refused(clients: tuple[Any, Any]) -> None:
    aas, cw = clients
    _register(aas)
    with pytest.raises(aas.exceptions.ValidationException, match="targetValue"):
        _tracking(aas, target=0.0)
    with pytest.raises(
        aas.exceptions.ValidationException, match="is not a metric of inference-component/ic-a"
    ):
        aas.put_scaling_policy(
            PolicyName="wrong-metric",
            ServiceNamespace="sagemaker",
            ResourceId=COMPONENT,
            ScalableDimension=COPY_COUNT,
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": 1.0,
                "PredefinedMetricSpecification": {
                    "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"
                },
            },
        )
    assert aas.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert _alarms(cw) == {}
