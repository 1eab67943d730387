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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAMESPACE = "sagemaker"
DIMENSION = "sagemaker:variant:DesiredInstanceCount"
METRIC = "SageMakerVariantInvocationsPerInstance"
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
        if self.min_capacity < 1:
            raise ValueError(
                "the minimum is at least 1: an endpoint's production variant keeps one instance "
                "(scale to zero is for inference components)"
            )
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


def register(aas: Any, endpoint_name: str, variant: str, scale: Autoscale, echo: Echo = print) -> None:
    """Register the variant as a scalable target with a target-tracking policy (replacing any)."""
    rid = resource_id(endpoint_name, variant)
    aas.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        MinCapacity=scale.min_capacity,
        MaxCapacity=scale.max_capacity,
    )
    aas.put_scaling_policy(
        PolicyName=policy_name(endpoint_name, variant),
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        PolicyType="TargetTrackingScaling",
        TargetTrackingScalingPolicyConfiguration={
            "TargetValue": scale.target_invocations,
            "PredefinedMetricSpecification": {"PredefinedMetricType": METRIC},
            "ScaleInCooldown": scale.scale_in_cooldown_s,
            "ScaleOutCooldown": scale.scale_out_cooldown_s,
        },
    )
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
