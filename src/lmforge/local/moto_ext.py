"""lmforge's extensions to moto's SageMaker control plane (moto is pinned in the ``local`` extra).

moto 5.2 lacks what an LMI deployment needs, so each gap is closed here by a small patch, applied
once in the local SageMaker process (nothing is copied from moto):

- instance types: moto accepts only an old list (no ml.g5/g6/g6e/p4d/p5/inf2); the check here uses
  botocore's own ``ProductionVariantInstanceType`` enum, so it follows the installed botocore;
- lifecycle: moto makes an endpoint ``InService`` at once; here it starts ``Creating`` and the
  provisioner moves it to ``InService`` or ``Failed`` (with ``FailureReason``) once its container
  has answered ``/ping``, or not;
- ``UpdateEndpoint`` (absent in moto): ``Updating`` while the new configuration's containers start,
  then ``InService`` on the new configuration, or back on the old one with a ``FailureReason``;
- ``DeleteEndpoint`` stops the endpoint's containers;
- ``RoutingConfig.RoutingStrategy`` is checked (``RANDOM`` or ``LEAST_OUTSTANDING_REQUESTS``) and the
  runtime routes by it; ``UpdateEndpointWeightsAndCapacities`` (what Application Auto Scaling calls)
  starts or stops instances: the endpoint is ``Updating`` until they serve (moto only rewrote counts);
- inference components (absent in moto): see :mod:`lmforge.local.inference_components`;
- wire fidelity: moto echoes empty ``VpcConfig``/``DataCaptureConfig`` objects that the real service
  omits (and that break strict clients); they are dropped from describe responses.
- IAM (the execution role, ``SimulatePrincipalPolicy`` for SDK v3's role validation): see
  :mod:`lmforge.local.iam_ext`.

Each patch is a named function here (or in :mod:`.component_actions`), listed in
:data:`PATCHES`; :data:`REACHES` lists the moto attributes they use, and ``check_compatible()`` fails
loudly, naming each attribute and the moto version tested, when a moto upgrade removes one (see
:mod:`lmforge.local.moto_patch`). The provisioner the patches call is held in
:mod:`lmforge.local.hooks`, not on moto's classes.
"""

from __future__ import annotations

import difflib
from typing import Any

from lmforge.local import component_actions
from lmforge.local.hooks import EndpointHooks, install_hooks, installed_hooks
from lmforge.local.moto_patch import Patch, Reach, apply, check, original, patched_reaches

BACKEND = "moto.sagemaker.models:SageMakerModelBackend"
RESPONSE = "moto.sagemaker.responses:SageMakerResponse"
CONFIG = "moto.sagemaker.models:FakeEndpointConfig"
ENDPOINT = "moto.sagemaker.models:FakeEndpoint"


def _validation_error() -> type[Exception]:
    from moto.sagemaker.exceptions import ValidationError

    return ValidationError  # type: ignore[no-any-return]


def validate_instance_type(self: Any, instance_type: str) -> None:
    """``FakeEndpointConfig.validate_instance_type``: any real-time type botocore knows, with a hint."""
    from lmforge.deploy.instances import sagemaker_instance_types

    known = sagemaker_instance_types()
    if instance_type not in known:
        close = difflib.get_close_matches(instance_type, known, n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise _validation_error()(
            f"Value '{instance_type}' at 'instanceType' failed to satisfy constraint: "
            f"Member must be a SageMaker real-time instance type{hint}"
        )


def _drop_empty(result: Any) -> Any:
    payload = getattr(result, "result", None)
    if isinstance(payload, dict):
        for key in ("VpcConfig", "DataCaptureConfig"):
            if payload.get(key) == {}:
                payload = {k: v for k, v in payload.items() if k != key}
        result._result = payload
    return result


def create_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str, tags: Any) -> Any:
    """``CreateEndpoint``: names checked, an existing name refused, ``Creating`` until the provisioner
    has the containers serving."""
    validation_error = _validation_error()
    _check_name("endpointName", endpoint_name)
    if endpoint_name in self.endpoints:
        raise validation_error(f'Cannot create already existing endpoint "{endpoint_name}".')
    endpoint = original(BACKEND, "create_endpoint")(self, endpoint_name, endpoint_config_name, tags)
    endpoint.endpoint_status = "Creating"
    installed_hooks().endpoint_created(self, endpoint)
    return endpoint


def delete_endpoint(self: Any, endpoint_name: str) -> None:
    """``DeleteEndpoint``: refused while inference components are on it (as SageMaker refuses it);
    moto's, then the endpoint's containers are stopped."""
    from lmforge.local.inference_components import components

    on_it = sorted(c.name for c in components(self).values() if c.endpoint_name == endpoint_name)
    if on_it and endpoint_name in self.endpoints:
        raise _validation_error()(
            f"Cannot delete endpoint {endpoint_name}: it has inference components ({', '.join(on_it)}). "
            "Delete the inference components first."
        )
    original(BACKEND, "delete_endpoint")(self, endpoint_name)
    installed_hooks().endpoint_deleted(self, endpoint_name)


def update_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str) -> Any:
    """``UpdateEndpoint`` (moto has none): ``Updating`` while the new configuration's containers start."""
    validation_error = _validation_error()
    endpoint = self.endpoints.get(endpoint_name)
    if endpoint is None:
        raise validation_error(f"Could not find endpoint '{endpoint_name}'.")
    self.describe_endpoint_config(endpoint_config_name)  # raises when it does not exist
    if endpoint.endpoint_status != "InService":
        raise validation_error(
            f'Cannot update in-progress endpoint "{endpoint.arn}" (status {endpoint.endpoint_status}).'
        )
    endpoint.endpoint_status = "Updating"
    endpoint.failure_reason = None
    installed_hooks().endpoint_updating(self, endpoint, endpoint_config_name)
    return endpoint


def create_endpoint_config(
    self: Any, endpoint_config_name: str, production_variants: Any, *a: Any, **kw: Any
) -> Any:
    """``CreateEndpointConfig``: names and ``RoutingConfig`` checked, then moto's."""
    _check_name("endpointConfigName", endpoint_config_name)
    for variant in production_variants or []:
        _check_name("productionVariants.member.variantName", variant.get("VariantName"))
        _check_routing(variant)
    return original(BACKEND, "create_endpoint_config")(
        self, endpoint_config_name, production_variants, *a, **kw
    )


def update_endpoint_weights_and_capacities(
    self: Any, endpoint_name: str, desired_weights_and_capacities: list[dict[str, Any]]
) -> str:
    """``UpdateEndpointWeightsAndCapacities``: checked as SageMaker does; ``Updating`` until the
    provisioner has started or stopped the instances (moto only rewrote the counts)."""
    validation_error = _validation_error()
    endpoint = self.endpoints.get(endpoint_name)
    if endpoint is None:
        raise validation_error(f"Could not find endpoint '{endpoint_name}'.")
    if endpoint.endpoint_status != "InService":
        raise validation_error(
            f'Cannot update in-progress endpoint "{endpoint.arn}" (status {endpoint.endpoint_status}).'
        )
    variants = {v["VariantName"]: v for v in endpoint.production_variants}
    desired: dict[str, dict[str, Any]] = {}
    for item in desired_weights_and_capacities or []:
        name = str(item.get("VariantName"))
        if name in desired:
            raise validation_error(f'The variant name "{name}" was non-unique within the request.')
        if name not in variants:
            raise validation_error(
                f'The variant name(s) "{name}" is/are not present within endpoint configuration '
                f'"{endpoint.endpoint_config_name}".'
            )
        count = item.get("DesiredInstanceCount")
        if count is not None and int(count) < 1:
            raise validation_error(
                f"DesiredInstanceCount {count} for variant {name}: an endpoint's production variant "
                "keeps at least one instance (scale to zero is for inference components)"
            )
        desired[name] = {k: item[k] for k in ("DesiredWeight", "DesiredInstanceCount") if k in item}
    for name, change in desired.items():
        variants[name].update(change)
    endpoint.endpoint_status = "Updating"
    installed_hooks().capacity_changing(self, endpoint, desired)
    return str(endpoint.arn)


def create_model(self: Any, *a: Any, **kw: Any) -> Any:
    """``CreateModel``: the name checked, then moto's."""
    _check_name("modelName", kw.get("model_name", a[0] if a else None))
    return original(BACKEND, "create_model")(self, *a, **kw)


def update_endpoint_action(self: Any) -> Any:
    """The ``UpdateEndpoint`` action on moto's response class (moto routes an action to the method)."""
    from moto.sagemaker.responses import ActionResult

    endpoint = self.sagemaker_backend.update_endpoint(
        endpoint_name=self._get_param("EndpointName"),
        endpoint_config_name=self._get_param("EndpointConfigName"),
    )
    return ActionResult({"EndpointArn": endpoint.arn})


def describe_model(self: Any) -> Any:
    """``DescribeModel`` without the empty ``VpcConfig`` moto echoes."""
    return _drop_empty(original(RESPONSE, "describe_model")(self))


def describe_endpoint_config(self: Any) -> Any:
    """``DescribeEndpointConfig`` without the empty ``VpcConfig``/``DataCaptureConfig`` moto echoes."""
    return _drop_empty(original(RESPONSE, "describe_endpoint_config")(self))


def describe_endpoint(self: Any) -> Any:
    """``DescribeEndpoint`` without the empty ``DataCaptureConfig`` moto echoes."""
    return _drop_empty(original(RESPONSE, "describe_endpoint")(self))


#: every patch of moto's SageMaker this module and :mod:`.component_actions` make
PATCHES: tuple[Patch, ...] = (
    Patch(CONFIG, "validate_instance_type", validate_instance_type),
    Patch(BACKEND, "create_endpoint_config", create_endpoint_config),
    Patch(BACKEND, "create_model", create_model),
    Patch(BACKEND, "create_endpoint", create_endpoint),
    Patch(BACKEND, "delete_endpoint", delete_endpoint),
    Patch(BACKEND, "update_endpoint", update_endpoint, adds=True),
    Patch(BACKEND, "update_endpoint_weights_and_capacities", update_endpoint_weights_and_capacities),
    Patch(RESPONSE, "update_endpoint", update_endpoint_action, adds=True),
    *component_actions.PATCHES,
    Patch(RESPONSE, "describe_model", describe_model),
    Patch(RESPONSE, "describe_endpoint_config", describe_endpoint_config),
    Patch(RESPONSE, "describe_endpoint", describe_endpoint),
)

#: the moto attributes the patches use besides those they replace, and those the hooks they call use
#: (:func:`finish_update`, the provisioner, scaling and routing read and move moto's endpoints)
REACHES: tuple[Reach, ...] = (
    Reach("moto.sagemaker.exceptions", ("ValidationError",)),
    Reach("moto.sagemaker.responses", ("ActionResult",)),
    Reach("moto.sagemaker.models", ("sagemaker_backends",)),
    Reach("moto.core.utils", ("utcnow",)),
    Reach(BACKEND, ("describe_endpoint_config", "describe_model")),
    Reach(BACKEND, ("endpoints", "region_name", "account_id"), set_in="__init__"),
    Reach(ENDPOINT, ("_process_production_variants",)),
    Reach(
        ENDPOINT,
        (
            "arn",
            "endpoint_name",
            "endpoint_status",
            "failure_reason",
            "production_variants",
            "endpoint_config_name",
            "last_modified_time",
        ),
        set_in="__init__",
    ),
    Reach(RESPONSE, ("sagemaker_backend", "_get_param")),
    Reach("moto.core.responses:ActionResult", ("result", "_result"), set_in="__init__"),
    *component_actions.REACHES,
)


def check_compatible() -> None:
    """Raise RuntimeError, naming each attribute and the moto version tested, when the installed moto
    lacks what the patches rely on."""
    check("lmforge.local.moto_ext", (*patched_reaches(PATCHES), *REACHES))


def install(hooks: EndpointHooks) -> None:
    """Apply the patches (idempotent per process; the last ``hooks`` given wins)."""
    check_compatible()
    install_hooks(hooks)
    apply(PATCHES)


def _check_routing(variant: dict[str, Any]) -> None:
    from lmforge.local.placements import ROUTING_STRATEGIES

    strategy = (variant.get("RoutingConfig") or {}).get("RoutingStrategy")
    if strategy is not None and strategy not in ROUTING_STRATEGIES:
        raise _validation_error()(
            f"1 validation error detected: Value '{strategy}' at "
            "'productionVariants.1.member.routingConfig.routingStrategy' failed to satisfy constraint: "
            f"Member must satisfy enum value set: [{', '.join(ROUTING_STRATEGIES)}]"
        )


def _check_name(field: str, value: object) -> None:
    from lmforge.aws.names import name_problem

    if problem := name_problem(field, value):
        raise _validation_error()(problem)


def finish_update(endpoint: Any, backend: Any, endpoint_config_name: str) -> None:
    """Point ``endpoint`` at its new configuration once the new containers are serving."""
    from moto.core.utils import utcnow

    config = backend.describe_endpoint_config(endpoint_config_name)
    endpoint.endpoint_config_name = endpoint_config_name
    endpoint.production_variants = endpoint._process_production_variants(config["ProductionVariants"])
    endpoint.last_modified_time = utcnow()
