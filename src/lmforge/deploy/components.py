"""Inference components through boto3's ``sagemaker`` client: a model deployed as one component of an
endpoint, beside others, with its own compute reservation and number of copies.

:func:`deploy_component` creates the endpoint when it is absent (one variant with
``ManagedInstanceScaling`` and no model: SageMaker places the components' copies on its instances),
then creates the component, or updates it (a new model, a new copy count) when it exists, and waits
for it. :func:`delete_component` removes one component and its model; :func:`endpoint_components`
lists an endpoint's, which :func:`lmforge.deploy.endpoints.delete_endpoint` removes first (SageMaker
refuses to delete an endpoint that still has components).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lmforge.deploy.endpoints import (
    DeployError,
    Echo,
    describe_endpoint,
    preflight,
    resource_names,
    wait_for_endpoint,
)

if TYPE_CHECKING:
    from lmforge.deploy.plan import DeployPlan

#: a component's statuses that end a wait
SETTLED = frozenset({"InService", "Failed"})
MIB = 1024**2


@dataclass(frozen=True)
class Requirements:
    """``ComputeResourceRequirements`` of one copy."""

    cpus: float
    memory_mb: int
    accelerators: int = 0

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"NumberOfCpuCoresRequired": self.cpus, "MinMemoryRequiredInMb": self.memory_mb}
        if self.accelerators:
            out["NumberOfAcceleratorDevicesRequired"] = self.accelerators
        return out


def default_requirements(
    instance_type: str,
    plan: DeployPlan | None,
    *,
    cpus: float | None = None,
    memory_mb: int | None = None,
    accelerators: int | None = None,
) -> Requirements:
    """What one copy reserves: the given values, else from the plan (the GPUs its tensor and pipeline
    parallelism use; the memory it needs on a CPU instance, or its weights on a GPU one), else one core,
    1 GiB and one accelerator on an accelerated instance type."""
    from lmforge.deploy.instances import get_instance

    try:
        instance = get_instance(instance_type)
        gpu = not instance.is_cpu
    except ValueError:
        gpu = False
    if accelerators is None:
        if plan is not None and gpu:
            accelerators = plan.tensor_parallel_degree * plan.pipeline_parallel_degree
        else:
            accelerators = 1 if gpu else 0
    if memory_mb is None:
        if plan is not None:
            need = plan.weights_bytes if plan.gpu_count else plan.total_per_gpu_bytes
            memory_mb = max(1024, math.ceil(need / MIB) + 512)
        else:
            memory_mb = 1024
    return Requirements(cpus=1.0 if cpus is None else cpus, memory_mb=memory_mb, accelerators=accelerators)


@dataclass(frozen=True)
class ComponentSpec:
    endpoint_name: str
    component_name: str
    instance_type: str
    image_uri: str
    role_arn: str
    model_data: Mapping[str, Any]
    requirements: Requirements
    copies: int = 1
    instance_count: int = 1
    """The endpoint's ``InitialInstanceCount`` and ``ManagedInstanceScaling.MinInstanceCount``."""
    max_instance_count: int | None = None
    """``ManagedInstanceScaling.MaxInstanceCount`` (default: ``instance_count``)."""
    environment: Mapping[str, str] = field(default_factory=dict)
    health_check_timeout_s: int | None = None
    download_timeout_s: int | None = None
    routing_strategy: str | None = None
    variant_name: str = "AllTraffic"


@dataclass(frozen=True)
class ComponentResult:
    endpoint_name: str
    component_name: str
    model_name: str
    updated: bool
    """The component existed and was updated."""
    endpoint_created: bool
    description: dict[str, Any]
    """``DescribeInferenceComponent``'s answer at the end."""

    @property
    def status(self) -> str:
        return str(self.description.get("InferenceComponentStatus"))

    @property
    def succeeded(self) -> bool:
        spec = self.description.get("Specification") or {}
        return self.status == "InService" and spec.get("ModelName") == self.model_name


def describe_component(sm: Any, name: str) -> dict[str, Any] | None:
    """The component's description, or None when there is none of that name."""
    from botocore.exceptions import ClientError

    try:
        return dict(sm.describe_inference_component(InferenceComponentName=name))
    except ClientError as exc:
        if "Could not find" in str(exc):
            return None
        raise


def endpoint_components(sm: Any, endpoint_name: str) -> list[dict[str, Any]]:
    """The summaries of the components on ``endpoint_name`` (every page)."""
    out: list[dict[str, Any]] = []
    token = None
    while True:
        kwargs: dict[str, Any] = {"EndpointNameEquals": endpoint_name}
        if token:
            kwargs["NextToken"] = token
        page = sm.list_inference_components(**kwargs)
        out.extend(page.get("InferenceComponents", []))
        token = page.get("NextToken")
        if not token:
            return out


def _components_variant(spec: ComponentSpec) -> dict[str, Any]:
    maximum = max(spec.instance_count, spec.max_instance_count or spec.instance_count)
    variant: dict[str, Any] = {
        "VariantName": spec.variant_name,
        "InstanceType": spec.instance_type,
        "InitialInstanceCount": spec.instance_count,
        "ManagedInstanceScaling": {
            "Status": "ENABLED",
            "MinInstanceCount": spec.instance_count,
            "MaxInstanceCount": maximum,
        },
    }
    if spec.routing_strategy:
        variant["RoutingConfig"] = {"RoutingStrategy": spec.routing_strategy}
    return variant


def deploy_component(
    sm: Any,
    spec: ComponentSpec,
    *,
    wait: bool = True,
    echo: Echo = print,
    poll_s: float = 5.0,
    timeout_s: float = 3 * 3600,
) -> ComponentResult:
    """The endpoint (created when absent), then the component created or updated, then its wait."""
    existing = preflight(sm, spec.endpoint_name)
    if existing is not None:
        config = sm.describe_endpoint_config(EndpointConfigName=existing["EndpointConfigName"])
        with_model = [v["VariantName"] for v in config["ProductionVariants"] if v.get("ModelName")]
        if with_model:
            raise DeployError(
                f"endpoint {spec.endpoint_name} serves a model on its variant {with_model[0]}; inference "
                "components go on an endpoint whose variant has no model: choose another --endpoint-name "
                "(it is created for components), or deploy without --inference-component"
            )
    name = resource_names(spec.component_name)
    tags = [{"Key": "lmforge:endpoint", "Value": spec.endpoint_name}]
    container: dict[str, Any] = {"Image": spec.image_uri, **spec.model_data}
    if spec.environment:
        container["Environment"] = dict(spec.environment)
    echo(f"creating model {name}")
    sm.create_model(ModelName=name, ExecutionRoleArn=spec.role_arn, PrimaryContainer=container, Tags=tags)
    created = existing is None
    if created:
        config_name = resource_names(spec.endpoint_name)
        variant = _components_variant(spec)
        scaling = variant["ManagedInstanceScaling"]
        echo(
            f"creating endpoint configuration {config_name} for inference components ({spec.instance_type}, "
            f"{scaling['MinInstanceCount']} to {scaling['MaxInstanceCount']} instances)"
        )
        sm.create_endpoint_config(
            EndpointConfigName=config_name,
            ExecutionRoleArn=spec.role_arn,
            ProductionVariants=[variant],
            Tags=tags,
        )
        echo(f"creating endpoint {spec.endpoint_name}")
        sm.create_endpoint(EndpointName=spec.endpoint_name, EndpointConfigName=config_name, Tags=tags)
        described = wait_for_endpoint(sm, spec.endpoint_name, echo=echo, poll_s=poll_s, timeout_s=timeout_s)
        if described["EndpointStatus"] != "InService":
            raise DeployError(
                f"endpoint {spec.endpoint_name} is {described['EndpointStatus']}: "
                f"{described.get('FailureReason', 'no reason given')}"
            )
    startup: dict[str, Any] = {}
    if spec.health_check_timeout_s:
        startup["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.health_check_timeout_s
    if spec.download_timeout_s:
        startup["ModelDataDownloadTimeoutInSeconds"] = spec.download_timeout_s
    specification: dict[str, Any] = {
        "ModelName": name,
        "ComputeResourceRequirements": spec.requirements.to_api(),
    }
    if startup:
        specification["StartupParameters"] = startup
    runtime = {"CopyCount": spec.copies}
    before = describe_component(sm, spec.component_name)
    if before is not None:
        if before.get("EndpointName") != spec.endpoint_name:
            raise DeployError(
                f"inference component {spec.component_name} is on endpoint {before.get('EndpointName')}, "
                f"not {spec.endpoint_name}"
            )
        echo(f"updating inference component {spec.component_name} ({spec.copies} copies)")
        sm.update_inference_component(
            InferenceComponentName=spec.component_name, Specification=specification, RuntimeConfig=runtime
        )
    else:
        echo(f"creating inference component {spec.component_name} ({spec.copies} copies)")
        sm.create_inference_component(
            InferenceComponentName=spec.component_name,
            EndpointName=spec.endpoint_name,
            VariantName=spec.variant_name,
            Specification=specification,
            RuntimeConfig=runtime,
            Tags=tags,
        )
    if wait:
        description = wait_for_component(
            sm, spec.component_name, echo=echo, poll_s=poll_s, timeout_s=timeout_s, model_name=name
        )
    else:
        description = describe_component(sm, spec.component_name) or {}
    return ComponentResult(
        spec.endpoint_name, spec.component_name, name, before is not None, created, description
    )


def wait_for_component(
    sm: Any,
    name: str,
    *,
    echo: Echo = print,
    poll_s: float = 5.0,
    timeout_s: float = 3 * 3600,
    model_name: str | None = None,
) -> dict[str, Any]:
    """Poll until the component settles (InService or Failed) on ``model_name`` (when given: an update
    settles once the component serves the new model, or has kept the old one with a FailureReason)."""
    started = time.monotonic()
    last = None
    while True:
        description = describe_component(sm, name)
        if description is None:
            raise DeployError(f"inference component {name} does not exist")
        status = description["InferenceComponentStatus"]
        elapsed = time.monotonic() - started
        runtime = description.get("RuntimeConfig") or {}
        shown = f"{status} ({runtime.get('CurrentCopyCount', 0)}/{runtime.get('DesiredCopyCount', 0)} copies)"
        if shown != last:
            echo(f"  [{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {name}: {shown}")
            last = shown
        serving = (description.get("Specification") or {}).get("ModelName")
        if status in SETTLED and (
            model_name is None or serving == model_name or description.get("FailureReason")
        ):
            return description
        if elapsed > timeout_s:
            raise DeployError(f"inference component {name} is still {status}; check the console")
        time.sleep(min(poll_s, 1.0 + elapsed / 10))


def delete_component(
    sm: Any, name: str, *, echo: Echo = print, poll_s: float = 1.0, timeout_s: float = 600
) -> list[str]:
    """Delete the component, wait until it is gone, then delete its model (unless another uses it)."""
    from botocore.exceptions import ClientError

    from lmforge.deploy import autoscaling

    found = describe_component(sm, name)
    if found is None:
        raise DeployError(f"inference component {name} does not exist")
    model = (found.get("Specification") or {}).get("ModelName")
    region = sm.meta.region_name  # a scalable target outliving its component would keep calling it
    autoscaling.deregister_component(
        autoscaling.client(region), autoscaling.cloudwatch_client(region), name, echo
    )
    sm.delete_inference_component(InferenceComponentName=name)
    deadline = time.monotonic() + timeout_s
    while describe_component(sm, name) is not None:
        if time.monotonic() > deadline:
            raise DeployError(f"inference component {name} is still being deleted; check the console")
        time.sleep(poll_s)
    echo(f"deleted inference component {name}")
    deleted = [f"inference-component/{name}"]
    if model:
        try:
            sm.delete_model(ModelName=model)
        except ClientError as exc:
            echo(f"kept model {model}: {exc}")
        else:
            echo(f"deleted model {model}")
            deleted.append(f"model/{model}")
    return deleted


def delete_endpoint_components(sm: Any, endpoint_name: str, *, echo: Echo = print) -> list[str]:
    """Delete every component on the endpoint, adapter components before the base ones they use."""
    if describe_endpoint(sm, endpoint_name) is None:
        return []
    deleted: list[str] = []
    found = endpoint_components(sm, endpoint_name)
    described = [d for c in found if (d := describe_component(sm, c["InferenceComponentName"])) is not None]
    described.sort(key=lambda d: not (d.get("Specification") or {}).get("BaseInferenceComponentName"))
    for component in described:
        deleted += delete_component(sm, component["InferenceComponentName"], echo=echo)
    return deleted
