"""The inference-component actions lmforge adds to moto's SageMaker (moto 5.2 has none).

Each action is a named function installed on moto's ``SageMakerResponse`` (moto routes the action
``CreateInferenceComponent`` to its method ``create_inference_component``), listed in :data:`PATCHES`
with the moto attributes they use in :data:`REACHES`; :mod:`.moto_ext` installs and checks them. The
components themselves are in :mod:`.inference_components`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lmforge.local.hooks import installed_hooks
from lmforge.local.inference_components import (
    InferenceComponent,
    check_adapter_spec,
    check_copy_count,
    check_deployment_config,
    check_requirements,
    components,
)
from lmforge.local.moto_patch import Patch, Reach, original

BACKEND = "moto.sagemaker.models:SageMakerModelBackend"
RESPONSE = "moto.sagemaker.responses:SageMakerResponse"

#: ``ListInferenceComponents``' filters: request parameter -> does the component match its value
FILTERS: dict[str, Callable[[InferenceComponent, str], bool]] = {
    "EndpointNameEquals": lambda c, v: c.endpoint_name == v,
    "VariantNameEquals": lambda c, v: c.variant_name == v,
    "StatusEquals": lambda c, v: c.status == v,
    "NameContains": lambda c, v: v in c.name,
}


def _validation_error() -> type[Exception]:
    from moto.sagemaker.exceptions import ValidationError

    return ValidationError  # type: ignore[no-any-return]


def _result(body: dict[str, Any]) -> Any:
    from moto.sagemaker.responses import ActionResult

    return ActionResult(body)


def _get(backend: Any, name: str) -> InferenceComponent:
    component = components(backend).get(name)
    if component is None:
        raise _validation_error()(f"Could not find inference component '{name}'.")
    return component


def create_inference_component(self: Any) -> Any:
    """``CreateInferenceComponent``: checked as SageMaker does, ``Creating`` until the provisioner has
    its container (or, for an adapter, its base's) serving it."""
    from moto.core.utils import utcnow

    from lmforge.aws.names import name_problem

    validation_error = _validation_error()
    backend = self.sagemaker_backend
    name = self._get_param("InferenceComponentName")
    endpoint_name = self._get_param("EndpointName")
    spec = self._get_param("Specification") or {}
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
        raise validation_error(f"Endpoint {endpoint_name} has no variant {variant!r} (it has {variants}).")
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
    else:
        check_requirements(spec, _instance_type(backend, endpoint, variant), validation_error)
    copies = check_copy_count(
        _raw(self, "RuntimeConfig", "CopyCount", 1), "runtimeConfig.copyCount", validation_error
    )
    now = utcnow()
    arn = f"arn:aws:sagemaker:{backend.region_name}:{backend.account_id}:inference-component/{name}"
    component = InferenceComponent(
        name=name,
        arn=arn,
        endpoint_name=endpoint_name,
        endpoint_arn=endpoint.arn,
        variant_name=variant,
        specification=spec,
        copy_count=copies,
        created=now,
        modified=now,
    )
    components(backend)[name] = component
    installed_hooks().component_created(backend, component)
    return _result({"InferenceComponentArn": arn})


def describe_inference_component(self: Any) -> Any:
    """``DescribeInferenceComponent``."""
    return _result(_get(self.sagemaker_backend, self._get_param("InferenceComponentName")).describe())


def list_inference_components(self: Any) -> Any:
    """``ListInferenceComponents`` with its filters and sort order (one page)."""
    found = list(components(self.sagemaker_backend).values())
    for param, keep in FILTERS.items():
        value = self._get_param(param)
        if value:
            found = [c for c in found if keep(c, value)]
    found.sort(key=lambda c: c.created, reverse=self._get_param("SortOrder", "Descending") == "Descending")
    return _result({"InferenceComponents": [c.summary() for c in found]})


def update_inference_component(self: Any) -> Any:
    """``UpdateInferenceComponent``: a new Specification is ``Updating`` until the provisioner serves it."""
    from moto.core.utils import utcnow

    validation_error = _validation_error()
    backend = self.sagemaker_backend
    component = _get(backend, self._get_param("InferenceComponentName"))
    if component.status not in ("InService", "Failed"):
        raise validation_error(
            f"Cannot update inference component {component.name} while it is {component.status}."
        )
    spec = self._get_param("Specification")
    runtime = self._get_param("RuntimeConfig")
    deployment = check_deployment_config(_raw(self, "DeploymentConfig", None, None), validation_error)
    if spec and (spec.get("BaseInferenceComponentName") or component.base_name):
        if component.base_name and "BaseInferenceComponentName" not in spec:
            spec = {**spec, "BaseInferenceComponentName": component.base_name}  # unchanged when left out
        if spec.get("BaseInferenceComponentName") != component.base_name:
            raise validation_error(
                f"Cannot change BaseInferenceComponentName of inference component {component.name} "
                f"(it is {component.base_name or 'not set'}); create a new inference component instead."
            )
        check_adapter_spec(backend, spec, component.endpoint_name, validation_error)
    elif spec:
        endpoint = backend.endpoints.get(component.endpoint_name)
        check_requirements(spec, _instance_type(backend, endpoint, component.variant_name), validation_error)
    copies = None
    if runtime and "CopyCount" in runtime:
        copies = check_copy_count(
            _raw(self, "RuntimeConfig", "CopyCount", None), "runtimeConfig.copyCount", validation_error
        )
    if copies is not None:
        component.copy_count = copies
    component.modified = utcnow()
    if spec:
        component.previous_specification = component.specification
        component.deployment_config = deployment
        component.specification = spec
        component.status = "Updating"
        component.failure_reason = None
        installed_hooks().component_created(backend, component)
    elif copies is not None:
        installed_hooks().component_scaling(backend, component)
    return _result({"InferenceComponentArn": component.arn})


def update_inference_component_runtime_config(self: Any) -> Any:
    """``UpdateInferenceComponentRuntimeConfig``: the desired copy count."""
    from moto.core.utils import utcnow

    backend = self.sagemaker_backend
    component = _get(backend, self._get_param("InferenceComponentName"))
    desired = self._get_param("DesiredRuntimeConfig") or {}
    if "CopyCount" not in desired:
        raise _validation_error()("DesiredRuntimeConfig.CopyCount is required.")
    copies = check_copy_count(
        _raw(self, "DesiredRuntimeConfig", "CopyCount", None),
        "desiredRuntimeConfig.copyCount",
        _validation_error(),
    )
    component.copy_count = copies
    component.modified = utcnow()
    installed_hooks().component_scaling(backend, component)
    return _result({"InferenceComponentArn": component.arn})


def delete_inference_component(self: Any) -> Any:
    """``DeleteInferenceComponent``: refused while adapter components use it; the provisioner stops it."""
    from moto.core.responses import EmptyResult

    backend = self.sagemaker_backend
    component = _get(backend, self._get_param("InferenceComponentName"))
    adapters = sorted(c.name for c in components(backend).values() if c.base_name == component.name)
    if adapters:
        raise _validation_error()(
            f"Cannot delete inference component {component.name}: adapter inference components "
            f"{', '.join(adapters)} use it as their BaseInferenceComponentName. Delete them first."
        )
    del components(backend)[component.name]
    component.status = "Deleting"
    installed_hooks().component_deleted(backend, component)
    return EmptyResult()


def _raw(self: Any, member: str, key: str | None, default: object) -> object:
    """``member.key`` as the client sent it (moto's parser turns 1.5 and "2" into integers, which
    SageMaker refuses)."""
    import json

    try:
        body = json.loads(self.body or b"{}")
    except (ValueError, TypeError):
        body = {}
    value = body.get(member) if isinstance(body, dict) else None
    if key is None:  # the whole member
        return value if value is not None else default
    return value.get(key, default) if isinstance(value, dict) else default


def _instance_type(backend: Any, endpoint: Any, variant: str) -> str:
    """The instance type of ``variant`` in the endpoint's configuration ("" when it has none)."""
    config = backend.describe_endpoint_config(endpoint.endpoint_config_name)
    for row in config["ProductionVariants"]:
        if row["VariantName"] == variant:
            return str(row.get("InstanceType") or "")
    return ""


def validate_production_variants(self: Any, production_variants: list[dict[str, Any]]) -> None:
    """moto's check, of the variants with a ``ModelName`` only: those of an endpoint meant for
    inference components carry none."""
    original(BACKEND, "validate_production_variants")(
        self, [v for v in production_variants if v.get("ModelName")]
    )


#: the actions added to moto's response class, and the variant check relaxed
PATCHES: tuple[Patch, ...] = (
    *(
        Patch(RESPONSE, action.__name__, action, adds=True)
        for action in (
            create_inference_component,
            describe_inference_component,
            list_inference_components,
            update_inference_component,
            update_inference_component_runtime_config,
            delete_inference_component,
        )
    ),
    Patch(BACKEND, "validate_production_variants", validate_production_variants),
)

#: the moto attributes the actions use
REACHES: tuple[Reach, ...] = (
    Reach("moto.sagemaker.exceptions", ("ValidationError",)),
    Reach("moto.sagemaker.responses", ("ActionResult",)),
    Reach("moto.core.responses", ("EmptyResult",)),
    Reach("moto.core.utils", ("utcnow",)),
    Reach(RESPONSE, ("sagemaker_backend", "_get_param")),
    Reach(RESPONSE, ("body",), set_in="setup_class"),
    Reach(BACKEND, ("endpoints", "_models", "region_name", "account_id"), set_in="__init__"),
    Reach(
        "moto.sagemaker.models:FakeEndpoint",
        ("arn", "production_variants", "endpoint_config_name"),
        set_in="__init__",
    ),
    Reach(BACKEND, ("describe_endpoint_config",)),
)
