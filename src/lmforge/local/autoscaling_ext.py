"""Application Auto Scaling on the local control plane: what moto 5.2 lacks for SageMaker.

- The scalable dimension of inference components, ``sagemaker:inference-component:DesiredCopyCount``
  (resource ``inference-component/<name>``): moto's enum of dimensions lacks it, so both of its checks
  (the request's, in ``ApplicationAutoScalingResponse._validate_params``, and the target's, in
  ``models._target_params_are_valid``) refuse it; here they accept it and pass everything else to
  moto's own.
- ``DescribeScalingActivities`` (absent in moto): the activities the local SageMaker's scaling
  evaluator (:mod:`lmforge.local.autoscaler`) records, newest first, filtered as AWS filters them.

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

MODELS = "moto.applicationautoscaling.models"
RESPONSE = "moto.applicationautoscaling.responses:ApplicationAutoScalingResponse"
#: the scalable dimension of an inference component's copy count, and its resource id's prefix
COPY_COUNT = "sagemaker:inference-component:DesiredCopyCount"
COMPONENT_PREFIX = "inference-component/"
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
)

#: the moto attributes they use
REACHES: tuple[Reach, ...] = (
    Reach("moto.applicationautoscaling.exceptions", ("AWSValidationException",)),
    Reach(RESPONSE, ("_get_param", "_get_int_param")),
    Reach(RESPONSE, ("current_account", "region"), set_in="setup_class"),
)


def check_compatible() -> None:
    """Raise RuntimeError naming each attribute the installed moto lacks, and the version tested."""
    check("lmforge.local.autoscaling_ext", (*patched_reaches(PATCHES), *REACHES))


def install() -> None:
    """Apply the patches (idempotent per process)."""
    check_compatible()
    apply(PATCHES)
