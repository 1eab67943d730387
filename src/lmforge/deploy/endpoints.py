"""SageMaker model, endpoint configuration and endpoint, through boto3's ``sagemaker`` client.

``deploy_endpoint`` creates a model and an endpoint configuration named after the endpoint plus a
timestamp, then creates the endpoint, or updates it when it already serves (SageMaker starts the new
instances before it stops the old ones). ``wait_for_endpoint`` reports each status change until the
endpoint settles. ``delete_endpoint`` removes the endpoint with its configuration and models.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SETTLED = frozenset({"InService", "Failed", "OutOfService", "UpdateRollbackFailed"})
Echo = Callable[[str], None]


class DeployError(Exception):
    """A deployment that cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class EndpointSpec:
    endpoint_name: str
    instance_type: str
    image_uri: str
    role_arn: str
    model_data: Mapping[str, Any]
    """``ModelDataUrl`` or ``ModelDataSource`` (see ``UploadResult.model_data``)."""
    instance_count: int = 1
    environment: Mapping[str, str] = field(default_factory=dict)
    health_check_timeout_s: int | None = None
    download_timeout_s: int | None = None
    volume_size_gb: int | None = None
    variant_name: str = "AllTraffic"
    tags: Mapping[str, str] = field(default_factory=dict)
    routing_strategy: str | None = None
    """``RANDOM`` or ``LEAST_OUTSTANDING_REQUESTS`` (None: SageMaker's default, random)."""


@dataclass(frozen=True)
class DeployResult:
    endpoint_name: str
    model_name: str
    config_name: str
    updated: bool
    description: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.description.get("EndpointStatus"))

    @property
    def succeeded(self) -> bool:
        return self.status == "InService" and self.description.get("EndpointConfigName") == self.config_name


def sagemaker_client(region: str | None = None) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sagemaker", region_name=region, config=Config(retries={"max_attempts": 8, "mode": "adaptive"})
    )


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def describe_endpoint(sm: Any, name: str) -> dict[str, Any] | None:
    """The endpoint's description, or None when it does not exist."""
    from botocore.exceptions import ClientError

    try:
        return dict(sm.describe_endpoint(EndpointName=name))
    except ClientError as exc:
        if _error_code(exc) in ("ValidationException", "ValidationError") and "Could not find" in str(exc):
            return None
        raise


def preflight(sm: Any, endpoint_name: str) -> dict[str, Any] | None:
    """The existing endpoint (None if new) after checking a deploy can go on; DeployError otherwise."""
    from lmforge.aws.names import name_problem

    if problem := name_problem("endpointName", endpoint_name):
        raise DeployError(f"--endpoint-name {endpoint_name!r}: {problem}")
    existing = describe_endpoint(sm, endpoint_name)
    if existing is None or existing["EndpointStatus"] == "InService":
        return existing
    status = existing["EndpointStatus"]
    if status == "Failed":
        raise DeployError(
            f"endpoint {endpoint_name} exists and is Failed "
            f"({existing.get('FailureReason', 'no reason given')}); a failed endpoint cannot be "
            f"updated: run `lmforge delete {endpoint_name}` first, or pass --replace"
        )
    raise DeployError(
        f"endpoint {endpoint_name} is {status}; wait until it is InService (or delete it) and retry"
    )


def resource_names(endpoint_name: str, now: datetime | None = None) -> str:
    """``<endpoint>-<UTC timestamp>``, at most 63 characters (SageMaker's name limit)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S-%f")[:-3]
    return f"{endpoint_name[: 63 - len(stamp) - 1]}-{stamp}"


def deploy_endpoint(
    sm: Any,
    spec: EndpointSpec,
    *,
    wait: bool = True,
    echo: Echo = print,
    poll_s: float = 5.0,
    timeout_s: float = 3 * 3600,
) -> DeployResult:
    existing = preflight(sm, spec.endpoint_name)
    name = resource_names(spec.endpoint_name)
    tags = [{"Key": k, "Value": v} for k, v in {"lmforge:endpoint": spec.endpoint_name, **spec.tags}.items()]
    container: dict[str, Any] = {"Image": spec.image_uri, **spec.model_data}
    if spec.environment:
        container["Environment"] = dict(spec.environment)
    echo(f"creating model {name}")
    sm.create_model(ModelName=name, ExecutionRoleArn=spec.role_arn, PrimaryContainer=container, Tags=tags)
    variant: dict[str, Any] = {
        "VariantName": spec.variant_name,
        "ModelName": name,
        "InstanceType": spec.instance_type,
        "InitialInstanceCount": spec.instance_count,
        "InitialVariantWeight": 1.0,
    }
    if spec.health_check_timeout_s:
        variant["ContainerStartupHealthCheckTimeoutInSeconds"] = spec.health_check_timeout_s
    if spec.download_timeout_s:
        variant["ModelDataDownloadTimeoutInSeconds"] = spec.download_timeout_s
    if spec.volume_size_gb:
        variant["VolumeSizeInGB"] = spec.volume_size_gb
    if spec.routing_strategy:
        variant["RoutingConfig"] = {"RoutingStrategy": spec.routing_strategy}
    echo(f"creating endpoint configuration {name} ({spec.instance_count} x {spec.instance_type})")
    sm.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant], Tags=tags)
    if existing is None:
        echo(f"creating endpoint {spec.endpoint_name}")
        sm.create_endpoint(EndpointName=spec.endpoint_name, EndpointConfigName=name, Tags=tags)
    else:
        echo(f"updating endpoint {spec.endpoint_name} (was on {existing.get('EndpointConfigName')})")
        sm.update_endpoint(EndpointName=spec.endpoint_name, EndpointConfigName=name)
    if wait:
        description = wait_for_endpoint(sm, spec.endpoint_name, echo=echo, poll_s=poll_s, timeout_s=timeout_s)
    else:
        description = dict(sm.describe_endpoint(EndpointName=spec.endpoint_name))
    return DeployResult(spec.endpoint_name, name, name, existing is not None, description)


def wait_for_endpoint(
    sm: Any,
    name: str,
    *,
    echo: Echo = print,
    poll_s: float = 5.0,
    timeout_s: float = 3 * 3600,
) -> dict[str, Any]:
    """Poll until the endpoint settles (InService, Failed, ...), echoing each status with the time spent."""
    started = time.monotonic()
    last = None
    while True:
        found = describe_endpoint(sm, name)
        if found is None:
            raise DeployError(f"endpoint {name} does not exist")
        description = found
        status = description["EndpointStatus"]
        elapsed = time.monotonic() - started
        if status != last:
            echo(f"  [{_clock(elapsed)}] {name}: {status}")
            last = status
        if status in SETTLED:
            return description
        if elapsed > timeout_s:
            raise DeployError(f"endpoint {name} is still {status} after {_clock(elapsed)}; check the console")
        time.sleep(min(poll_s, 1.0 + elapsed / 10))  # quick at first (local starts take seconds), then poll_s


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def delete_endpoint(sm: Any, name: str, *, keep_config: bool = False, echo: Echo = print) -> list[str]:
    """Delete the endpoint, then (unless ``keep_config``) its configuration and models.

    Returns what was deleted."""
    from botocore.exceptions import ClientError

    existing = describe_endpoint(sm, name)
    if existing is None:
        raise DeployError(f"endpoint {name} does not exist")
    deleted = []
    config_name = existing.get("EndpointConfigName")
    models: list[str] = []
    if config_name and not keep_config:
        try:
            config = sm.describe_endpoint_config(EndpointConfigName=config_name)
            models = [v["ModelName"] for v in config.get("ProductionVariants", []) if v.get("ModelName")]
        except ClientError:
            config_name = None
    sm.delete_endpoint(EndpointName=name)
    echo(f"deleted endpoint {name}")
    deleted.append(f"endpoint/{name}")
    if config_name and not keep_config:
        sm.delete_endpoint_config(EndpointConfigName=config_name)
        echo(f"deleted endpoint configuration {config_name}")
        deleted.append(f"endpoint-config/{config_name}")
        for model in models:
            try:
                sm.delete_model(ModelName=model)
            except ClientError as exc:
                echo(f"kept model {model}: {exc}")
                continue
            echo(f"deleted model {model}")
            deleted.append(f"model/{model}")
    return deleted
