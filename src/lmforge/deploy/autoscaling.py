"""Application Auto Scaling for an endpoint's production variant (``lmforge deploy --autoscale``).

SageMaker scales a variant's instance count through Application Auto Scaling: a *scalable target*
(``ServiceNamespace=sagemaker``, ``ResourceId=endpoint/<endpoint>/variant/<variant>``,
``ScalableDimension=sagemaker:variant:DesiredInstanceCount``, min and max capacity) and a
target-tracking *policy* on the predefined metric ``SageMakerVariantInvocationsPerInstance``
(invocations per instance per minute). Application Auto Scaling then calls
``UpdateEndpointWeightsAndCapacities``. A variant keeps at least one instance (scale to zero is for
inference-component endpoints).

SageMaker refuses ``UpdateEndpoint`` on a variant that is a registered scalable target, so a
redeploy takes the registration off first (:func:`suspend`) and puts it back after
(:func:`register`, with the new ``--autoscale`` or the one it had).

An inference component scales its copy count instead (:func:`register_component`):
``ResourceId=inference-component/<name>``, ``ScalableDimension=sagemaker:inference-component:
DesiredCopyCount``, target tracking on ``SageMakerInferenceComponentInvocationsPerCopy``; a minimum of
0 copies also gets what AWS documents for scaling from zero, since target tracking cannot scale out
from no copy: a step-scaling policy (+1 copy) and the CloudWatch alarm on the component's
``NoCapacityInvocationFailures`` that runs it. :func:`deregister_component` takes all of it off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
COMPONENT_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
COMPONENT_METRIC = "SageMakerInferenceComponentInvocationsPerCopy"
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Autoscale:
    min_capacity: int
    max_capacity: int
    target_invocations: float = 10.0
    """Invocations per instance per minute the policy keeps the variant at."""
    scale_in_cooldown_s: int = 300
    scale_out_cooldown_s: int = 60

    def __post_init__(self) -> None:
        if self.min_capacity < 0:
            raise ValueError(f"the minimum ({self.min_capacity}) is below 0")
        if self.max_capacity < self.min_capacity:
            raise ValueError(f"the maximum ({self.max_capacity}) is below the minimum ({self.min_capacity})")
        if self.target_invocations <= 0:
            raise ValueError("the target (invocations per instance per minute) must be above 0")


def parse_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` (``2:8``) as two integers; ValueError saying what is wrong."""
    low, sep, high = text.partition(":")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(f"{text!r} is not MIN:MAX (for example 1:4)")
    return int(low), int(high)


def resource_id(endpoint_name: str, variant: str) -> str:
    return f"endpoint/{endpoint_name}/variant/{variant}"


def policy_name(endpoint_name: str, variant: str) -> str:
    return f"{endpoint_name}-{variant}-invocations-per-instance"[:256]


def client(region: str | None = None) -> Any:
    import boto3

    return boto3.client("application-autoscaling", region_name=region)


def current(aas: Any, endpoint_name: str, variant: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The variant's scalable target and its policies, or None when it has none."""
    rid = resource_id(endpoint_name, variant)
    targets = aas.describe_scalable_targets(
        ServiceNamespace=NAMESPACE, ResourceIds=[rid], ScalableDimension=DIMENSION
    )["ScalableTargets"]
    if not targets:
        return None
    policies = aas.describe_scaling_policies(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
    )["ScalingPolicies"]
    return targets[0], policies


def _track(aas: Any, rid: str, dimension: str, metric: str, policy: str, scale: Autoscale) -> None:
    """Register ``rid``'s ``dimension`` as a scalable target with a target-tracking policy on the
    predefined ``metric`` (replacing any)."""
    aas.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=dimension,
        MinCapacity=scale.min_capacity,
        MaxCapacity=scale.max_capacity,
    )
    aas.put_scaling_policy(
        PolicyName=policy,
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=dimension,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": scale.target_invocations,
            "PredefinedMetricSpecification": {"PredefinedMetricType": metric},
            "ScaleInCooldown": scale.scale_in_cooldown_s,
            "ScaleOutCooldown": scale.scale_out_cooldown_s,
        },
    )


def register(aas: Any, endpoint_name: str, variant: str, scale: Autoscale, echo: Echo = print) -> None:
    """Register the variant as a scalable target with a target-tracking policy (replacing any)."""
    rid = resource_id(endpoint_name, variant)
    _track(aas, rid, DIMENSION, METRIC, policy_name(endpoint_name, variant), scale)
    echo(
        f"autoscaling {rid}: {scale.min_capacity} to {scale.max_capacity} instances, target "
        f"{scale.target_invocations:g} invocations per instance per minute"
    )


def suspend(aas: Any, endpoint_name: str, variant: str, echo: Echo = print) -> Autoscale | None:
    """Take the variant's registration off (before an update or a delete); returns what it was, as far
    as lmforge can put it back (its target-tracking policy on the invocations metric), or None."""
    from botocore.exceptions import ClientError

    try:
        found = current(aas, endpoint_name, variant)
    except ClientError as exc:  # no Application Auto Scaling permissions: nothing lmforge registered
        if "AccessDenied" in str(exc.response.get("Error", {}).get("Code", "")):
            return None
        raise
    if found is None:
        return None
    target, policies = found
    rid = resource_id(endpoint_name, variant)
    for policy in policies:
        aas.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=NAMESPACE,
            ResourceId=rid,
            ScalableDimension=DIMENSION,
        )
    aas.deregister_scalable_target(ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION)
    echo(f"autoscaling of {rid} deregistered ({len(policies)} policies)")
    tracking = next(
        (
            p["TargetTrackingScalingPolicyConfiguration"]
            for p in policies
            if p.get("PolicyType") == "TargetTrackingScaling"
            and p.get("TargetTrackingScalingPolicyConfiguration", {})
            .get("PredefinedMetricSpecification", {})
            .get("PredefinedMetricType")
            == METRIC
        ),
        None,
    )
    try:
        return Autoscale(
            int(target["MinCapacity"]),
            int(target["MaxCapacity"]),
            float(tracking["TargetValue"]) if tracking else Autoscale.target_invocations,
            int(tracking.get("ScaleInCooldown", 300)) if tracking else 300,
            int(tracking.get("ScaleOutCooldown", 60)) if tracking else 60,
        )
    except ValueError:
        return None


def component_resource_id(component: str) -> str:
    return f"inference-component/{component}"


def component_names(component: str) -> tuple[str, str, str]:
    """The names of the component's (target-tracking policy, scale-from-zero policy, its alarm)."""
    return (
        f"{component}-invocations-per-copy"[:256],
        f"{component}-scale-from-zero"[:256],
        f"{component}-no-capacity"[:255],
    )


def register_component(
    aas: Any, cloudwatch: Any, component: str, scale: Autoscale, echo: Echo = print
) -> None:
    """Register the component's copy count with a target-tracking policy on invocations per copy,
    and, with a minimum of 0, the step policy and alarm that scale it from zero (replacing any)."""
    rid = component_resource_id(component)
    tracking, from_zero, alarm = component_names(component)
    _track(aas, rid, COMPONENT_DIMENSION, COMPONENT_METRIC, tracking, scale)
    extra = ""
    if scale.min_capacity == 0:
        step = aas.put_scaling_policy(
            PolicyName=from_zero,
            ServiceNamespace=NAMESPACE,
            ResourceId=rid,
            ScalableDimension=COMPONENT_DIMENSION,
            PolicyType="StepScaling",
            StepScalingPolicyConfiguration={
                "AdjustmentType": "ChangeInCapacity",
                "MetricAggregationType": "Maximum",
                "Cooldown": scale.scale_out_cooldown_s,
                "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}],
            },
        )
        cloudwatch.put_metric_alarm(
            AlarmName=alarm,
            AlarmDescription=f"scale {component} from zero copies on its first refused request",
            AlarmActions=[step["PolicyARN"]],
            MetricName="NoCapacityInvocationFailures",
            Namespace="AWS/SageMaker",
            Statistic="Maximum",
            Dimensions=[{"Name": "InferenceComponentName", "Value": component}],
            Period=30,
            EvaluationPeriods=1,
            DatapointsToAlarm=1,
            Threshold=1,
            ComparisonOperator="GreaterThanOrEqualToThreshold",
            TreatMissingData="missing",
        )
        extra = f"; from zero on the alarm {alarm}"
    echo(
        f"autoscaling {rid}: {scale.min_capacity} to {scale.max_capacity} copies, target "
        f"{scale.target_invocations:g} invocations per copy per minute{extra}"
    )


def deregister_component(aas: Any, cloudwatch: Any, component: str, echo: Echo = print) -> bool:
    """Take the component's scaling off (policies, target, the scale-from-zero alarm); False when it
    had none (or Application Auto Scaling cannot be asked)."""
    from botocore.exceptions import ClientError

    rid = component_resource_id(component)
    try:
        targets = aas.describe_scalable_targets(
            ServiceNamespace=NAMESPACE, ResourceIds=[rid], ScalableDimension=COMPONENT_DIMENSION
        )["ScalableTargets"]
        if not targets:
            return False
        policies = aas.describe_scaling_policies(
            ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=COMPONENT_DIMENSION
        )["ScalingPolicies"]
    except ClientError as exc:
        if "AccessDenied" in str(exc.response.get("Error", {}).get("Code", "")):
            return False
        raise
    for policy in policies:
        aas.delete_scaling_policy(
            PolicyName=policy["PolicyName"],
            ServiceNamespace=NAMESPACE,
            ResourceId=rid,
            ScalableDimension=COMPONENT_DIMENSION,
        )
    aas.deregister_scalable_target(
        ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=COMPONENT_DIMENSION
    )
    cloudwatch.delete_alarms(AlarmNames=[component_names(component)[2]])
    echo(f"autoscaling of {rid} deregistered ({len(policies)} policies)")
    return True


def cloudwatch_client(region: str | None = None) -> Any:
    import boto3

    return boto3.client("cloudwatch", region_name=region)
