"""SageMaker inference components for the local control plane (moto 5.2 has none).

An inference component places a model on an endpoint whose configuration has variants without a
``ModelName``; clients pick it with ``InferenceComponentName``. Implemented here: create, describe,
list, update, update-runtime-config and delete, with SageMaker's statuses (``Creating`` ->
``InService`` | ``Failed``, ``Updating``, ``Deleting``). The provisioner starts one container per
component from its ``Specification`` (a ``ModelName``, or a ``Container`` with ``ArtifactUrl``).

Adapter components (``Specification.BaseInferenceComponentName`` plus ``Container.ArtifactUrl``, no
``ComputeResourceRequirements``) get no container: the provisioner downloads the adapter and registers
it with the base component's container (see :mod:`.provisioner`). A base component that still has
adapter components cannot be deleted.

Here: the component record and lmforge's store of them (:func:`components`, by moto backend, kept by
lmforge rather than on moto's objects); the actions moto's SageMaker gets are in
:mod:`.component_actions`.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class InferenceComponent:
    name: str
    arn: str
    endpoint_name: str
    endpoint_arn: str
    variant_name: str
    specification: dict[str, Any]
    copy_count: int
    created: datetime
    modified: datetime
    status: str = "Creating"
    failure_reason: str | None = None
    current_copies: int = 0
    generation: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    deployment_config: dict[str, Any] | None = None
    """The ``DeploymentConfig`` of the update in progress (or the last one)."""
    previous_specification: dict[str, Any] | None = None
    """The specification an update replaces: what a rollback brings back."""

    def describe(self) -> dict[str, Any]:
        spec = {k: v for k, v in self.specification.items() if k != "Container"}
        container = self.specification.get("Container")
        if container:
            summary: dict[str, Any] = {
                k: v for k, v in container.items() if k in ("ArtifactUrl", "Environment")
            }
            if "Image" in container:
                summary["DeployedImage"] = {"SpecifiedImage": container["Image"]}
            spec["Container"] = summary
        out: dict[str, Any] = {
            "InferenceComponentName": self.name,
            "InferenceComponentArn": self.arn,
            "EndpointName": self.endpoint_name,
            "EndpointArn": self.endpoint_arn,
            "VariantName": self.variant_name,
            "Specification": spec,
            "RuntimeConfig": {"DesiredCopyCount": self.copy_count, "CurrentCopyCount": self.current_copies},
            "CreationTime": self.created,
            "LastModifiedTime": self.modified,
            "InferenceComponentStatus": self.status,
        }
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        if self.deployment_config:
            out["LastDeploymentConfig"] = self.deployment_config
        return out

    @property
    def base_name(self) -> str | None:
        """The base component of an adapter component (None for a base component)."""
        base = self.specification.get("BaseInferenceComponentName")
        return str(base) if base else None

    def summary(self) -> dict[str, Any]:
        full = self.describe()
        keys = (
            "CreationTime",
            "InferenceComponentArn",
            "InferenceComponentName",
            "EndpointArn",
            "EndpointName",
            "VariantName",
            "InferenceComponentStatus",
            "LastModifiedTime",
        )
        return {k: full[k] for k in keys}


def check_adapter_spec(backend: Any, spec: dict[str, Any], endpoint_name: str, validation_error: Any) -> None:
    """Refuse an adapter component's Specification the way SageMaker documents it: an existing base
    component (itself no adapter) on the same endpoint, the adapter in Container.ArtifactUrl, and no
    ModelName or ComputeResourceRequirements (an adapter uses its base's)."""
    base_name = spec["BaseInferenceComponentName"]
    base = components(backend).get(base_name)
    if base is None:
        raise validation_error(f"Could not find inference component '{base_name}'.")
    if base.base_name:
        raise validation_error(
            f"Inference component {base_name} is an adapter inference component; "
            "BaseInferenceComponentName must name a component that hosts a model."
        )
    if base.endpoint_name != endpoint_name:
        raise validation_error(
            f"Base inference component {base_name} is on endpoint {base.endpoint_name}, not {endpoint_name}."
        )
    for key in ("ModelName", "ComputeResourceRequirements"):
        if spec.get(key):
            raise validation_error(
                f"Specification.{key} must be omitted for an adapter inference component "
                "(BaseInferenceComponentName): it uses the base inference component's model and resources."
            )
    url = (spec.get("Container") or {}).get("ArtifactUrl")
    if not isinstance(url, str) or not url.startswith("s3://") or len(url) <= len("s3://"):
        raise validation_error(
            "Specification.Container.ArtifactUrl must give the adapter's S3 location (s3://...) for an "
            "adapter inference component."
        )


#: ``ComputeResourceRequirements``' fields: (the instance's figure they are held against, its unit,
#: SageMaker's minimum)
REQUIREMENTS = {
    "NumberOfCpuCoresRequired": ("cpus", "vCPUs", 0.25),
    "MinMemoryRequiredInMb": ("memory_mb", "MiB of memory", 128),
    "NumberOfAcceleratorDevicesRequired": ("accelerators", "accelerator devices", 1),
}


def check_copy_count(value: object, field_name: str, validation_error: Any) -> int:
    """A ``CopyCount`` as SageMaker takes it: a whole number >= 0 (``field_name``: as its message
    names it)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_error(
            f"1 validation error detected: Value '{value}' at '{field_name}' failed to satisfy constraint: "
            "Member must be an integer"
        )
    if value < 0:
        raise validation_error(
            f"1 validation error detected: Value '{value}' at '{field_name}' failed to satisfy constraint: "
            "Member must have value greater than or equal to 0"
        )
    return value


def check_requirements(spec: dict[str, Any], instance_type: str, validation_error: Any) -> None:
    """A base component's ``ComputeResourceRequirements``: given (memory at least), within SageMaker's
    bounds, and no more than one instance of the variant's type has."""
    from lmforge.local.placements import instance_capacity

    needs = spec.get("ComputeResourceRequirements")
    if not isinstance(needs, dict) or "MinMemoryRequiredInMb" not in needs:
        raise validation_error(
            "Specification.ComputeResourceRequirements.MinMemoryRequiredInMb is required for an inference "
            "component that hosts a model (only an adapter inference component omits "
            "ComputeResourceRequirements)."
        )
    capacity = instance_capacity(instance_type)
    for key, (attr, unit, minimum) in REQUIREMENTS.items():
        if key not in needs:
            continue
        value = needs[key]
        where = f"Specification.ComputeResourceRequirements.{key}"
        if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
            raise validation_error(f"{where} must be a number >= {minimum} (got {value!r}).")
        if capacity is not None and value > getattr(capacity, attr):
            raise validation_error(
                f"{where} ({value:g}) is more than an instance of type {instance_type} has "
                f"({getattr(capacity, attr):g} {unit}); choose an instance type with more, or require less."
            )


@dataclass
class _Store:
    """One moto backend's inference components; ``state``: the backend's attribute dict when the store
    was made (moto's reset gives the backend a new one, and that empties the store, as it empties
    moto's own endpoints)."""

    state: dict[str, Any]
    items: dict[str, InferenceComponent]


#: the inference components, by moto SageMaker backend (one per account and region), kept by lmforge
_STORES: weakref.WeakKeyDictionary[Any, _Store] = weakref.WeakKeyDictionary()
_STORES_LOCK = threading.Lock()


def components(backend: Any) -> dict[str, InferenceComponent]:
    """The inference components of ``backend`` (a moto SageMaker backend: one account and region)."""
    with _STORES_LOCK:
        store = _STORES.get(backend)
        if store is None or store.state is not vars(backend):
            store = _STORES[backend] = _Store(vars(backend), {})
        return store.items


#: ``RollingUpdatePolicy``'s batch size types
BATCH_TYPES = ("COPY_COUNT", "CAPACITY_PERCENT")


def check_deployment_config(config: object, validation_error: Any) -> dict[str, Any] | None:
    """``UpdateInferenceComponent``'s ``DeploymentConfig`` as SageMaker takes it: a
    ``RollingUpdatePolicy`` with ``MaximumBatchSize`` ({Type, Value}) and ``WaitIntervalInSeconds``,
    an optional ``RollbackMaximumBatchSize`` and ``MaximumExecutionTimeoutInSeconds``, and an optional
    ``AutoRollbackConfiguration`` naming CloudWatch alarms."""
    if config is None:
        return None
    if not isinstance(config, dict) or not isinstance(config.get("RollingUpdatePolicy"), dict):
        raise validation_error("DeploymentConfig.RollingUpdatePolicy is required in a DeploymentConfig.")
    policy = config["RollingUpdatePolicy"]
    for key in ("MaximumBatchSize", "RollbackMaximumBatchSize"):
        where = f"DeploymentConfig.RollingUpdatePolicy.{key}"
        size = policy.get(key)
        if size is None and key == "RollbackMaximumBatchSize":
            continue
        if not isinstance(size, dict):
            raise validation_error(f"{where} is required (Type COPY_COUNT or CAPACITY_PERCENT, and a Value).")
        if size.get("Type") not in BATCH_TYPES:
            raise validation_error(
                f"1 validation error detected: Value '{size.get('Type')}' at '{where}.Type' failed to "
                f"satisfy constraint: Member must satisfy enum value set: [{', '.join(BATCH_TYPES)}]"
            )
        value = size.get("Value")
        percent = size["Type"] == "CAPACITY_PERCENT"
        # SageMaker: a batch is 5 to 50 % of the copies; a rollback batch up to all of them
        low, top = (5, 50 if key == "MaximumBatchSize" else 100) if percent else (1, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (top and value > top):
            bound = f"between {low} and {top}" if top else "at least 1"
            raise validation_error(f"{where}.Value must be a whole number {bound} (got {value!r}).")
    wait = policy.get("WaitIntervalInSeconds")
    if isinstance(wait, bool) or not isinstance(wait, int) or not 0 <= wait <= 3600:
        raise validation_error(
            "DeploymentConfig.RollingUpdatePolicy.WaitIntervalInSeconds must be a whole number of seconds "
            f"between 0 and 3600 (got {wait!r})."
        )
    alarms = (config.get("AutoRollbackConfiguration") or {}).get("Alarms") or []
    if not isinstance(alarms, list) or not all(isinstance(a, dict) and a.get("AlarmName") for a in alarms):
        raise validation_error(
            "DeploymentConfig.AutoRollbackConfiguration.Alarms must each name an AlarmName."
        )
    return config


def batch_size(size: dict[str, Any] | None, copies: int) -> int:
    """How many copies one batch holds (``MaximumBatchSize``: a count, or a percentage of the copies)."""
    if not size:
        return max(1, copies)
    value = int(size["Value"])
    if size["Type"] == "CAPACITY_PERCENT":
        return max(1, -(-copies * value // 100))
    return max(1, value)
