"""Target tracking as Application Auto Scaling runs it for SageMaker: the metric a policy tracks and
the two CloudWatch alarms it creates for it.

On AWS, ``PutScalingPolicy`` with ``TargetTrackingScaling`` creates (and ``DeleteScalingPolicy``
deletes) two metric alarms on the tracked metric, answered in the response's ``Alarms``:

- ``TargetTracking-<ResourceId>-AlarmHigh-<uuid>``: the metric above the target for
  :data:`HIGH_PERIODS` datapoints in a row (a scale-out);
- ``TargetTracking-<ResourceId>-AlarmLow-<uuid>``: below :data:`SCALE_IN_RATIO` of it for
  :data:`LOW_PERIODS` (a scale-in; no such alarm when ``DisableScaleIn``).

:func:`alarm_requests` gives them in ``PutMetricAlarm``'s request shape; the control plane creates
them (:mod:`lmforge.local.autoscaling_ext`) and the local SageMaker's evaluator
(:mod:`lmforge.local.autoscaler`) judges them and scales on their state (:func:`alarm_role`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from lmforge.local.metrics import NAMESPACE, Dims, component_dims, endpoint_dims

#: an inference component's resource id prefix (``inference-component/<name>``)
COMPONENT_PREFIX = "inference-component/"
#: datapoints in a row above the target before a scale-out (AWS: 3 one-minute datapoints)
HIGH_PERIODS = 3
#: datapoints in a row below :data:`SCALE_IN_RATIO` of the target before a scale-in (AWS: 15)
LOW_PERIODS = 15
#: the fraction of the target below which the low alarm breaches
SCALE_IN_RATIO = 0.9

#: predefined target-tracking metrics: type -> (metric name, statistic, dimensions of the resource)
PREDEFINED: dict[str, tuple[str, str, Callable[[list[str]], Dims]]] = {
    "SageMakerInferenceComponentInvocationsPerCopy": (
        "InvocationsPerCopy",
        "Sum",
        lambda parts: component_dims(parts[1]),
    ),
    "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution": (
        "ConcurrentRequestsPerCopy",
        "Average",
        lambda parts: component_dims(parts[1]),
    ),
    "SageMakerVariantInvocationsPerInstance": (
        "InvocationsPerInstance",
        "Sum",
        lambda parts: endpoint_dims(parts[1], parts[3]),
    ),
    "SageMakerVariantConcurrentRequestsPerModelHighResolution": (
        "ConcurrentRequestsPerModel",
        "Average",
        lambda parts: endpoint_dims(parts[1], parts[3]),
    ),
}


class Tracked(NamedTuple):
    """The metric a target-tracking policy tracks."""

    namespace: str
    name: str
    statistic: str
    dims: Dims
    period_s: int
    """Its CloudWatch period: 10 s for a high-resolution metric, else 60 s."""


def tracked_metric(config: dict[str, Any], rid: str) -> Tracked | None:
    """The metric of ``TargetTrackingScalingPolicyConfiguration`` ``config`` on resource ``rid``: a
    predefined SageMaker metric of that resource, or a customized metric (one metric, no metric
    math); None when it names neither."""
    predefined = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
    parts = rid.split("/")
    if predefined in PREDEFINED:
        name, statistic, dims = PREDEFINED[predefined]
        wants_component = predefined.startswith("SageMakerInferenceComponent")
        if wants_component != rid.startswith(COMPONENT_PREFIX) or len(parts) < (2 if wants_component else 4):
            return None
        period = 10 if predefined.endswith("HighResolution") else 60
        return Tracked(NAMESPACE, name, statistic, dims(parts), period)
    custom = config.get("CustomizedMetricSpecification") or {}
    if custom.get("Namespace") and custom.get("MetricName"):
        dims_list = tuple((str(d["Name"]), str(d["Value"])) for d in custom.get("Dimensions") or [])
        return Tracked(
            str(custom["Namespace"]),
            str(custom["MetricName"]),
            str(custom.get("Statistic") or "Average"),
            dims_list,
            60,
        )
    return None


def alarm_prefix(rid: str, role: str) -> str:
    """The start of the name of a target-tracking alarm of ``rid`` (``role``: High or Low)."""
    return f"TargetTracking-{rid}-Alarm{role}-"


def alarm_role(name: str, rid: str) -> str | None:
    """``High`` or ``Low`` for a target-tracking alarm of resource ``rid``, else None."""
    for role in ("High", "Low"):
        if name.startswith(alarm_prefix(rid, role)):
            return role
    return None


def alarm_requests(policy_arn: str, rid: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``PutMetricAlarm`` requests of a target-tracking policy's alarms (high, then low unless
    ``DisableScaleIn``); none when its metric is neither predefined nor one customized metric."""
    metric = tracked_metric(config, rid)
    if metric is None:
        return []
    goal = float(config["TargetValue"])
    roles = [("High", "GreaterThanThreshold", goal, HIGH_PERIODS)]
    if not config.get("DisableScaleIn"):
        roles.append(("Low", "LessThanThreshold", SCALE_IN_RATIO * goal, LOW_PERIODS))
    return [
        {
            "AlarmName": f"{alarm_prefix(rid, role)}{uuid.uuid4()}",
            "AlarmDescription": f"DO NOT EDIT OR DELETE. For TargetTrackingScaling policy {policy_arn}.",
            "AlarmActions": [policy_arn],
            "Namespace": metric.namespace,
            "MetricName": metric.name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in metric.dims],
            "Statistic": metric.statistic,
            "Period": metric.period_s,
            "EvaluationPeriods": periods,
            "DatapointsToAlarm": periods,
            "Threshold": threshold,
            "ComparisonOperator": operator,
            "TreatMissingData": "missing",
        }
        for role, operator, threshold, periods in roles
    ]
