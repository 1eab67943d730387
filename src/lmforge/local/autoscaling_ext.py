"""Application Auto Scaling on the local control plane: what moto 5.2 lacks for SageMaker.

- The scalable dimension of inference components, ``sagemaker:inference-component:DesiredCopyCount``
  (resource ``inference-component/<name>``): moto's enum of dimensions lacks it, so both of its checks
  (the request's, in ``ApplicationAutoScalingResponse._validate_params``, and the target's, in
  ``models._target_params_are_valid``) refuse it; here they accept it and pass everything else to
  moto's own.
- ``DescribeScalingActivities`` (absent in moto): the activities the local SageMaker's scaling
  evaluator (:mod:`lmforge.local.autoscaler`) records, newest first, filtered as AWS filters them.
- Target tracking's alarms: moto creates them for DynamoDB and ECS only. Here a SageMaker
  ``TargetTrackingScaling`` policy gets AWS's two, ``TargetTracking-<ResourceId>-AlarmHigh-<uuid>`` and
  ``-AlarmLow-<uuid>`` (:mod:`lmforge.local.target_tracking`), in the local CloudWatch and in the
  policy's ``Alarms``; its ``TargetValue`` and predefined metric are checked as AWS checks them.
- Updating a policy (``PutScalingPolicy`` on an existing name) keeps its ARN and replaces its alarms
  (moto gave it a new ARN and left the old alarms behind); ``DeregisterScalableTarget`` deletes the
  target's policies and their alarms, as AWS does (moto kept them).

Policies, targets and alarms stay moto's (``RegisterScalableTarget``, ``PutScalingPolicy``,
``PutMetricAlarm``...); the evaluator reads them through the public API. :data:`PATCHES` and
:data:`REACHES` are checked at start by :func:`check_compatible` against the moto version tested (see
:mod:`lmforge.local.moto_patch`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from typing import Any

from lmforge.local.moto_patch import Patch, Reach, apply, check, original, patched_reaches
from lmforge.local.target_tracking import COMPONENT_PREFIX, PREDEFINED, alarm_requests

__all__ = ["COMPONENT_PREFIX", "COPY_COUNT", "activities", "install", "record_activity"]

MODELS = "moto.applicationautoscaling.models"
BACKEND = f"{MODELS}:ApplicationAutoscalingBackend"
POLICY = f"{MODELS}:FakeApplicationAutoscalingPolicy"
RESPONSE = "moto.applicationautoscaling.responses:ApplicationAutoScalingResponse"
#: the scalable dimension of an inference component's copy count (resource ``inference-component/<name>``)
COPY_COUNT = "sagemaker:inference-component:DesiredCopyCount"
#: the activities kept per account and region (the oldest are forgotten first)
MAX_ACTIVITIES = 1000

_ACTIVITIES: dict[tuple[str, str], deque[dict[str, Any]]] = {}
_ACTIVITIES_LOCK = threading.Lock()


def _aws_validation_error() -> type[Exception]:
    from moto.applicationautoscaling.exceptions import AWSValidationException

    return AWSValidationException  # type: ignore[no-any-return]


def target_params_are_valid(namespace: str, r_id: str, dimension: str) -> bool:
    """``models._target_params_are_valid``: an inference component's copy count too."""
    if dimension == COPY_COUNT:
        name = r_id[len(COMPONENT_PREFIX) :] if isinstance(r_id, str) else ""
        if namespace != "sagemaker" or not r_id.startswith(COMPONENT_PREFIX) or not name or "/" in name:
            raise _aws_validation_error()(
                "Unsupported service namespace, resource type or scalable dimension"
            )
        return True
    return bool(original(MODELS, "_target_params_are_valid")(namespace, r_id, dimension))


def validate_params(self: Any) -> None:
    """``ApplicationAutoScalingResponse._validate_params``: the copy-count dimension passes."""
    if self._get_param("ScalableDimension") == COPY_COUNT:
        namespace = self._get_param("ServiceNamespace")
        if namespace is not None and namespace != "sagemaker":
            raise _aws_validation_error()(
                f"1 validation error detected: Value '{namespace}' at 'serviceNamespace' failed to "
                f"satisfy constraint: {COPY_COUNT} belongs to the sagemaker namespace"
            )
        return
    original(RESPONSE, "_validate_params")(self)


def _check_tracking(resource_id: str, config: Any) -> None:
    """A SageMaker target-tracking configuration as AWS checks it: a positive ``TargetValue`` and, when
    predefined, a metric of that kind of resource."""
    invalid = _aws_validation_error()
    field = "targetTrackingScalingPolicyConfiguration"
    if not isinstance(config, dict):
        raise invalid(f"1 validation error detected: Value null at '{field}' failed to satisfy constraint")
    value = config.get("TargetValue")
    if value is None:
        raise invalid(
            f"1 validation error detected: Value null at '{field}.targetValue' failed to satisfy "
            "constraint: Member must not be null"
        )
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise invalid(
            f"1 validation error detected: Value '{value}' at '{field}.targetValue' failed to satisfy "
            "constraint: Member must have value greater than or equal to 8.515920e-109"
        )
    predefined = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
    if predefined is None:
        return
    component = resource_id.startswith(COMPONENT_PREFIX)
    fits = predefined in PREDEFINED and predefined.startswith("SageMakerInferenceComponent") == component
    if not fits:
        kinds = sorted(k for k in PREDEFINED if k.startswith("SageMakerInferenceComponent") == component)
        raise invalid(
            f"{field}.predefinedMetricSpecification.predefinedMetricType {predefined} is not a metric of "
            f"{resource_id}; use one of: {', '.join(kinds)}"
        )


def _create_tracking_alarms(policy: Any) -> None:
    """Put a SageMaker target-tracking policy's alarms into the local CloudWatch, and on the policy."""
    from moto.cloudwatch.models import cloudwatch_backends

    cloudwatch = cloudwatch_backends[policy.account_id][policy.region_name]
    config = policy.target_tracking_scaling_policy_configuration or {}
    for request in alarm_requests(policy.policy_arn, policy.resource_id, config):
        policy.alarms.append(
            cloudwatch.put_metric_alarm(
                name=request["AlarmName"],
                namespace=request["Namespace"],
                metric_name=request["MetricName"],
                comparison_operator=request["ComparisonOperator"],
                evaluation_periods=request["EvaluationPeriods"],
                datapoints_to_alarm=request["DatapointsToAlarm"],
                period=request["Period"],
                threshold=request["Threshold"],
                statistic=request["Statistic"],
                description=request["AlarmDescription"],
                dimensions=request["Dimensions"],
                alarm_actions=request["AlarmActions"],
                treat_missing_data=request["TreatMissingData"],
            )
        )


def _sagemaker_tracking(policy: Any) -> bool:
    return bool(policy.service_namespace == "sagemaker" and policy.policy_type == "TargetTrackingScaling")


def create_alarms(self: Any) -> None:
    """``FakeApplicationAutoscalingPolicy.create_alarms`` (in its constructor): nothing yet for a
    SageMaker target-tracking policy (:func:`put_scaling_policy` creates its alarms once its ARN is
    final); moto's own for the rest."""
    if not _sagemaker_tracking(self):
        original(POLICY, "create_alarms")(self)


def put_scaling_policy(
    self: Any,
    policy_name: str,
    service_namespace: str,
    resource_id: str,
    scalable_dimension: str,
    policy_body: dict[str, Any],
    policy_type: str | None,
) -> Any:
    """``PutScalingPolicy``: a SageMaker target-tracking policy checked, then given its two alarms; an
    update replaces the policy's alarms and (SageMaker's) keeps its ARN."""
    if service_namespace == "sagemaker" and policy_type == "TargetTrackingScaling":
        _check_tracking(resource_id, policy_body)
    key = _policy_class().formulate_key(service_namespace, resource_id, scalable_dimension, policy_name)
    old = self.policies.get(key)
    policy = original(BACKEND, "put_scaling_policy")(
        self,
        policy_name=policy_name,
        service_namespace=service_namespace,
        resource_id=resource_id,
        scalable_dimension=scalable_dimension,
        policy_body=policy_body,
        policy_type=policy_type,
    )
    if old is not None and old is not policy:
        old.delete_alarms(self.account_id, self.region_name)
        if service_namespace == "sagemaker":  # moto's other namespaces made their alarms on the new ARN
            policy.policy_arn = old.policy_arn
    if _sagemaker_tracking(policy):
        _create_tracking_alarms(policy)
    return policy


def deregister_scalable_target(self: Any, namespace: str, r_id: str, dimension: str) -> None:
    """``DeregisterScalableTarget``: the target, and with it its scaling policies and their alarms."""
    original(BACKEND, "deregister_scalable_target")(self, namespace, r_id, dimension)
    for key, policy in list(self.policies.items()):
        if (policy.service_namespace, policy.resource_id, policy.scalable_dimension) == (
            namespace,
            r_id,
            dimension,
        ):
            policy.delete_alarms(self.account_id, self.region_name)
            del self.policies[key]


def _policy_class() -> Any:
    from moto.applicationautoscaling.models import FakeApplicationAutoscalingPolicy

    return FakeApplicationAutoscalingPolicy


def record_activity(
    account: str,
    region: str,
    *,
    resource_id: str,
    dimension: str,
    description: str,
    cause: str,
    status: str = "Successful",
    message: str | None = None,
    started: float,
    ended: float | None,
) -> dict[str, Any]:
    """Remember one scaling activity (what ``DescribeScalingActivities`` answers); returns it."""
    activity: dict[str, Any] = {
        "ActivityId": str(uuid.uuid4()),
        "ServiceNamespace": "sagemaker",
        "ResourceId": resource_id,
        "ScalableDimension": dimension,
        "Description": description,
        "Cause": cause,
        "StartTime": started,
        "StatusCode": status,
    }
    if ended is not None:
        activity["EndTime"] = ended
    if message:
        activity["StatusMessage"] = message
    with _ACTIVITIES_LOCK:
        _ACTIVITIES.setdefault((account, region), deque(maxlen=MAX_ACTIVITIES)).appendleft(activity)
    return activity


def activities(account: str, region: str) -> list[dict[str, Any]]:
    """The activities recorded for ``account`` in ``region``, newest first."""
    with _ACTIVITIES_LOCK:
        return [dict(a) for a in _ACTIVITIES.get((account, region), ())]


def describe_scaling_activities(self: Any) -> str:
    """``DescribeScalingActivities``: the recorded activities of a namespace (and resource, dimension),
    newest first, in pages."""
    namespace = self._get_param("ServiceNamespace")
    resource_id = self._get_param("ResourceId")
    dimension = self._get_param("ScalableDimension")
    if bool(resource_id) != bool(dimension):
        raise _aws_validation_error()("ResourceId and ScalableDimension must be given together, or neither.")
    found = [
        a
        for a in activities(self.current_account, self.region)
        if a["ServiceNamespace"] == namespace
        and (not resource_id or a["ResourceId"] == resource_id)
        and (not dimension or a["ScalableDimension"] == dimension)
    ]
    size = self._get_int_param("MaxResults") or 50
    start = int(self._get_param("NextToken") or 0)
    page = found[start : start + size]
    token = str(start + size) if start + size < len(found) else None
    return json.dumps({"ScalingActivities": page, "NextToken": token})


#: the patches of moto's Application Auto Scaling
PATCHES: tuple[Patch, ...] = (
    Patch(MODELS, "_target_params_are_valid", target_params_are_valid),
    Patch(RESPONSE, "_validate_params", validate_params),
    Patch(RESPONSE, "describe_scaling_activities", describe_scaling_activities, adds=True),
    Patch(POLICY, "create_alarms", create_alarms),
    Patch(BACKEND, "put_scaling_policy", put_scaling_policy),
    Patch(BACKEND, "deregister_scalable_target", deregister_scalable_target),
)

#: the moto attributes they use
REACHES: tuple[Reach, ...] = (
    Reach("moto.applicationautoscaling.exceptions", ("AWSValidationException",)),
    Reach(RESPONSE, ("_get_param", "_get_int_param")),
    Reach(RESPONSE, ("current_account", "region"), set_in="setup_class"),
    Reach(POLICY, ("formulate_key", "delete_alarms")),
    Reach(
        POLICY,
        (
            "alarms",
            "policy_arn",
            "account_id",
            "region_name",
            "service_namespace",
            "resource_id",
            "scalable_dimension",
            "policy_type",
            "target_tracking_scaling_policy_configuration",
        ),
        set_in="__init__",
        why="a SageMaker target-tracking policy's alarms are made from its fields",
    ),
    Reach(BACKEND, ("policies", "account_id", "region_name"), set_in="__init__"),
    Reach("moto.cloudwatch.models", ("cloudwatch_backends",)),
    Reach("moto.cloudwatch.models:CloudWatchBackend", ("put_metric_alarm",)),
)


def check_compatible() -> None:
    """Raise RuntimeError naming each attribute the installed moto lacks, and the version tested."""
    check("lmforge.local.autoscaling_ext", (*patched_reaches(PATCHES), *REACHES))


def install() -> None:
    """Apply the patches (idempotent per process)."""
    check_compatible()
    apply(PATCHES)
