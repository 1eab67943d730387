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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmforge.local.hooks import EndpointHooks


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


def components(backend: Any) -> dict[str, InferenceComponent]:
    """The backend's inference components (kept on the moto backend object, one per account/region)."""
    store = getattr(backend, "_lmforge_components", None)
    if store is None:
        store = backend._lmforge_components = {}
    return store  # type: ignore[no-any-return]


def install(backend_cls: Any, response_cls: Any, action_result: Any, validation_error: Any) -> None:
    """Add the inference-component actions to moto's SageMaker backend and response classes."""
    from moto.core.utils import utcnow

    def hooks() -> EndpointHooks:
        return backend_cls._lmforge_hooks  # type: ignore[no-any-return]

    def get(backend: Any, name: str) -> InferenceComponent:
        component = components(backend).get(name)
        if component is None:
            raise validation_error(f"Could not find inference component '{name}'.")
        return component

    def create(self: Any) -> Any:
        backend = self.sagemaker_backend
        name = self._get_param("InferenceComponentName")
        endpoint_name = self._get_param("EndpointName")
        spec = self._get_param("Specification") or {}
        from lmforge.aws.names import name_problem

        if problem := name_problem("inferenceComponentName", name):
            raise validation_error(problem)
        if name in components(backend):
            raise validation_error(f'Cannot create already existing inference component "{name}".')
        endpoint = backend.endpoints.get(endpoint_name)
        if endpoint is None:
            raise validation_error(f"Could not find endpoint '{endpoint_name}'.")
        variants = [v["VariantName"] for v in endpoint.production_variants]
        variant = self._get_param("VariantName") or (variants[0] if variants else "AllTraffic")
        if variant not in variants:
            raise validation_error(
                f"Endpoint {endpoint_name} has no variant {variant!r} (it has {variants})."
            )
        if not (spec.get("ModelName") or spec.get("Container") or spec.get("BaseInferenceComponentName")):
            raise validation_error(
                "Specification needs a ModelName, a Container or a BaseInferenceComponentName."
            )
        if spec.get("ModelName") and spec["ModelName"] not in backend._models:
            raise validation_error(f"Could not find model '{spec['ModelName']}'.")
        if spec.get("BaseInferenceComponentName"):
            check_adapter_spec(backend, spec, endpoint_name, validation_error)
            if not self._get_param("VariantName"):
                variant = components(backend)[spec["BaseInferenceComponentName"]].variant_name
        runtime = self._get_param("RuntimeConfig") or {}
        now = utcnow()
        arn = f"arn:aws:sagemaker:{backend.region_name}:{backend.account_id}:inference-component/{name}"
        component = InferenceComponent(
            name=name,
            arn=arn,
            endpoint_name=endpoint_name,
            endpoint_arn=endpoint.arn,
            variant_name=variant,
            specification=spec,
            copy_count=int(runtime.get("CopyCount", 1)),
            created=now,
            modified=now,
        )
        components(backend)[name] = component
        hooks().component_created(backend, component)
        return action_result({"InferenceComponentArn": arn})

    def describe(self: Any) -> Any:
        return action_result(
            get(self.sagemaker_backend, self._get_param("InferenceComponentName")).describe()
        )

    def list_components(self: Any) -> Any:
        found = list(components(self.sagemaker_backend).values())
        filters: dict[str, Callable[[InferenceComponent, str], bool]] = {
            "EndpointNameEquals": lambda c, v: c.endpoint_name == v,
            "VariantNameEquals": lambda c, v: c.variant_name == v,
            "StatusEquals": lambda c, v: c.status == v,
            "NameContains": lambda c, v: v in c.name,
        }
        for param, keep in filters.items():
            value = self._get_param(param)
            if value:
                found = [c for c in found if keep(c, value)]
        found.sort(
            key=lambda c: c.created, reverse=self._get_param("SortOrder", "Descending") == "Descending"
        )
        return action_result({"InferenceComponents": [c.summary() for c in found]})

    def update(self: Any) -> Any:
        backend = self.sagemaker_backend
        component = get(backend, self._get_param("InferenceComponentName"))
        if component.status not in ("InService", "Failed"):
            raise validation_error(
                f"Cannot update inference component {component.name} while it is {component.status}."
            )
        spec = self._get_param("Specification")
        runtime = self._get_param("RuntimeConfig")
        if spec and (spec.get("BaseInferenceComponentName") or component.base_name):
            if component.base_name and "BaseInferenceComponentName" not in spec:
                spec = {**spec, "BaseInferenceComponentName": component.base_name}  # unchanged when left out
            if spec.get("BaseInferenceComponentName") != component.base_name:
                raise validation_error(
                    f"Cannot change BaseInferenceComponentName of inference component {component.name} "
                    f"(it is {component.base_name or 'not set'}); create a new inference component instead."
                )
            check_adapter_spec(backend, spec, component.endpoint_name, validation_error)
        if runtime:
            component.copy_count = int(runtime.get("CopyCount", component.copy_count))
        component.modified = utcnow()
        if spec:
            component.specification = spec
            component.status = "Updating"
            component.failure_reason = None
            hooks().component_created(backend, component)
        return action_result({"InferenceComponentArn": component.arn})

    def update_runtime_config(self: Any) -> Any:
        component = get(self.sagemaker_backend, self._get_param("InferenceComponentName"))
        desired = self._get_param("DesiredRuntimeConfig") or {}
        component.copy_count = int(desired.get("CopyCount", component.copy_count))
        component.modified = utcnow()
        return action_result({"InferenceComponentArn": component.arn})

    def delete(self: Any) -> Any:
        backend = self.sagemaker_backend
        component = get(backend, self._get_param("InferenceComponentName"))
        adapters = sorted(c.name for c in components(backend).values() if c.base_name == component.name)
        if adapters:
            raise validation_error(
                f"Cannot delete inference component {component.name}: adapter inference components "
                f"{', '.join(adapters)} use it as their BaseInferenceComponentName. Delete them first."
            )
        del components(backend)[component.name]
        component.status = "Deleting"
        hooks().component_deleted(backend, component)
        from moto.core.responses import EmptyResult

        return EmptyResult()

    response_cls.create_inference_component = create
    response_cls.describe_inference_component = describe
    response_cls.list_inference_components = list_components
    response_cls.update_inference_component = update
    response_cls.update_inference_component_runtime_config = update_runtime_config
    response_cls.delete_inference_component = delete

    original_validate = backend_cls.validate_production_variants

    def validate_production_variants(self: Any, production_variants: list[dict[str, Any]]) -> None:
        # variants of an endpoint meant for inference components carry no ModelName
        original_validate(self, [v for v in production_variants if v.get("ModelName")])

    backend_cls.validate_production_variants = validate_production_variants
