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

``check_compatible()`` fails loudly when a moto upgrade removes what these patches rely on.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from lmforge.local.hooks import EndpointHooks

_PATCHED = "_lmforge_patched"


def _moto() -> tuple[Any, Any, Any, Any]:
    from moto.sagemaker import models, responses
    from moto.sagemaker.exceptions import ValidationError

    return models, responses, ValidationError, models.SageMakerModelBackend


def check_compatible() -> None:
    """Raise RuntimeError when the installed moto lacks what the patches below rely on."""
    models, responses, _, backend_cls = _moto()
    needed = {
        models.FakeEndpointConfig: ["validate_instance_type"],
        models.FakeEndpoint: ["__init__", "response_object", "_process_production_variants"],
        backend_cls: [
            "create_endpoint",
            "delete_endpoint",
            "describe_endpoint_config",
            "describe_model",
            "validate_production_variants",
            "create_endpoint_config",
            "update_endpoint_weights_and_capacities",
            "create_model",
        ],
        responses.SageMakerResponse: ["describe_model", "describe_endpoint_config", "describe_endpoint"],
    }
    missing = [
        f"{cls.__name__}.{name}" for cls, names in needed.items() for name in names if not hasattr(cls, name)
    ]
    if missing:
        import moto

        raise RuntimeError(
            f"moto {moto.__version__} lacks {', '.join(missing)}; install the version lmforge pins "
            "(pip install -e '.[local]')"
        )


def _validate_instance_type(validation_error: type[Exception]) -> Callable[[Any, str], None]:
    def validate(self: Any, instance_type: str) -> None:
        from lmforge.deploy.instances import sagemaker_instance_types

        known = sagemaker_instance_types()
        if instance_type not in known:
            close = difflib.get_close_matches(instance_type, known, n=3)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise validation_error(
                f"Value '{instance_type}' at 'instanceType' failed to satisfy constraint: "
                f"Member must be a SageMaker real-time instance type{hint}"
            )

    return validate


def _drop_empty(result: Any) -> Any:
    payload = getattr(result, "result", None)
    if isinstance(payload, dict):
        for key in ("VpcConfig", "DataCaptureConfig"):
            if payload.get(key) == {}:
                payload = {k: v for k, v in payload.items() if k != key}
        result._result = payload
    return result


def install(hooks: EndpointHooks) -> None:
    """Apply the patches (idempotent per process; the last ``hooks`` given wins)."""
    models, responses, validation_error, backend_cls = _moto()
    check_compatible()
    backend_cls._lmforge_hooks = hooks
    if getattr(backend_cls, _PATCHED, False):
        return
    setattr(backend_cls, _PATCHED, True)

    models.FakeEndpointConfig.validate_instance_type = _validate_instance_type(validation_error)

    original_create = backend_cls.create_endpoint
    original_delete = backend_cls.delete_endpoint

    def create_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str, tags: Any) -> Any:
        _check_name(validation_error, "endpointName", endpoint_name)
        if endpoint_name in self.endpoints:
            raise validation_error(f'Cannot create already existing endpoint "{endpoint_name}".')
        endpoint = original_create(self, endpoint_name, endpoint_config_name, tags)
        endpoint.endpoint_status = "Creating"
        backend_cls._lmforge_hooks.endpoint_created(self, endpoint)
        return endpoint

    def delete_endpoint(self: Any, endpoint_name: str) -> None:
        original_delete(self, endpoint_name)
        backend_cls._lmforge_hooks.endpoint_deleted(self, endpoint_name)

    def update_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str) -> Any:
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
        backend_cls._lmforge_hooks.endpoint_updating(self, endpoint, endpoint_config_name)
        return endpoint

    original_create_config = backend_cls.create_endpoint_config

    def create_endpoint_config(
        self: Any, endpoint_config_name: str, production_variants: Any, *a: Any, **kw: Any
    ) -> Any:
        _check_name(validation_error, "endpointConfigName", endpoint_config_name)
        for variant in production_variants or []:
            _check_name(validation_error, "productionVariants.member.variantName", variant.get("VariantName"))
            _check_routing(validation_error, variant)
        return original_create_config(self, endpoint_config_name, production_variants, *a, **kw)

    def update_endpoint_weights_and_capacities(
        self: Any, endpoint_name: str, desired_weights_and_capacities: list[dict[str, Any]]
    ) -> str:
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
        backend_cls._lmforge_hooks.capacity_changing(self, endpoint, desired)
        return str(endpoint.arn)

    original_create_model = backend_cls.create_model

    def create_model(self: Any, *a: Any, **kw: Any) -> Any:
        _check_name(validation_error, "modelName", kw.get("model_name", a[0] if a else None))
        return original_create_model(self, *a, **kw)

    backend_cls.create_endpoint_config = create_endpoint_config
    backend_cls.create_model = create_model
    backend_cls.create_endpoint = create_endpoint
    backend_cls.delete_endpoint = delete_endpoint
    backend_cls.update_endpoint = update_endpoint
    backend_cls.update_endpoint_weights_and_capacities = update_endpoint_weights_and_capacities

    response_cls = responses.SageMakerResponse
    action_result = responses.ActionResult

    def update_endpoint_action(self: Any) -> Any:
        endpoint = self.sagemaker_backend.update_endpoint(
            endpoint_name=self._get_param("EndpointName"),
            endpoint_config_name=self._get_param("EndpointConfigName"),
        )
        return action_result({"EndpointArn": endpoint.arn})

    response_cls.update_endpoint = update_endpoint_action
    from lmforge.local import inference_components

    inference_components.install(backend_cls, response_cls, action_result, validation_error)
    for name in ("describe_model", "describe_endpoint_config", "describe_endpoint"):
        original = getattr(response_cls, name)

        def describe(self: Any, _original: Any = original) -> Any:
            return _drop_empty(_original(self))

        setattr(response_cls, name, describe)


def _check_routing(validation_error: type[Exception], variant: dict[str, Any]) -> None:
    from lmforge.local.placements import ROUTING_STRATEGIES

    strategy = (variant.get("RoutingConfig") or {}).get("RoutingStrategy")
    if strategy is not None and strategy not in ROUTING_STRATEGIES:
        raise validation_error(
            f"1 validation error detected: Value '{strategy}' at "
            "'productionVariants.1.member.routingConfig.routingStrategy' failed to satisfy constraint: "
            f"Member must satisfy enum value set: [{', '.join(ROUTING_STRATEGIES)}]"
        )


def _check_name(validation_error: type[Exception], field: str, value: object) -> None:
    from lmforge.aws.names import name_problem

    if problem := name_problem(field, value):
        raise validation_error(problem)


def finish_update(endpoint: Any, backend: Any, endpoint_config_name: str) -> None:
    """Point ``endpoint`` at its new configuration once the new containers are serving."""
    from moto.core.utils import utcnow

    config = backend.describe_endpoint_config(endpoint_config_name)
    endpoint.endpoint_config_name = endpoint_config_name
    endpoint.production_variants = endpoint._process_production_variants(config["ProductionVariants"])
    endpoint.last_modified_time = utcnow()
