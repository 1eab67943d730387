"""What one deployment is asked to do (:class:`DeploySettings`), the errors that stop it before
SageMaker is asked anything, and the checks made before anything is uploaded.

Messages name the settings by their ``lmforge deploy`` options (``--instance-count``, ``--no-wait``), as
the other deploy errors do: the command is the documented way in, and its options map one to one onto
these fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lmforge.deploy.autoscaling import Autoscale
from lmforge.deploy.endpoints import DeployError

if TYPE_CHECKING:
    from lmforge.config import ConfigError
    from lmforge.deploy.plan import DeployPlan

ArtifactFormat = Literal["auto", "tar.gz", "prefix"]
RoutingStrategy = Literal["RANDOM", "LEAST_OUTSTANDING_REQUESTS"]
ContainerEngineName = Literal["auto", "podman", "docker"]

AUTOSCALE_NEEDS_WAIT = "--autoscale registers scaling once the endpoint is InService: drop --no-wait"
QUANTIZE_NEEDS_COMPILE = (
    "--quantize goes with --compile: lmforge deploy DIR --compile --quantize METHOD quantizes the folder "
    "(lmforge compile --quantize) before it is packed"
)


@dataclass(frozen=True, kw_only=True)
class DeploySettings:
    """One ``lmforge deploy``: the model folder, where it runs, the image, the artifacts, the checks.

    Defaults are the command's. ``None`` means "decide as the command does": the role from
    ``$LMFORGE_ROLE_ARN``, the bucket ``sagemaker-REGION-ACCOUNT``, the image from ``$LMFORGE_IMAGE_URI``
    or lmforge's for the backend, the timeouts from the memory plan, the region from the AWS SDK."""

    model_dir: Path
    endpoint_name: str
    """Created, or updated when it exists and is InService."""
    instance_type: str
    # where it runs
    instance_count: int = 1
    routing_strategy: RoutingStrategy | None = None
    autoscale: Autoscale | None = None
    """Application Auto Scaling registered on the variant once it is InService (needs ``wait``)."""
    volume_size_gb: int | None = None
    health_check_timeout_s: int | None = None
    download_timeout_s: int | None = None
    region: str | None = None
    role_arn: str | None = None
    # what it runs
    image: str | None = None
    """An image URI, ``lmi`` (AWS's LMI image for the backend) or ``lmforge``."""
    build_image: bool = False
    """Build and push lmforge's image to the account's ECR when it is not there yet."""
    container_engine: ContainerEngineName | None = None
    """For ``build_image`` and ``compile_first``."""
    environment: Mapping[str, str] = field(default_factory=dict)
    """The container's environment."""
    compile_first: bool = False
    """vLLM: compile the folder in the endpoint's image before packing, when this machine matches the
    instance type (:mod:`lmforge.deploy.precompile`)."""
    quantize: str | None = None
    """With ``compile_first``: quantize the folder first (``lmforge compile --quantize``) into a folder of
    its own, which is what is compiled, planned, packed and deployed."""
    # the artifacts
    bucket: str | None = None
    s3_prefix: str = "lmforge"
    artifact_format: ArtifactFormat = "auto"
    # the checks
    model_config: Path | None = None
    """The ``config.json`` to plan with (default: the folder's)."""
    force: bool = False
    """Deploy even when the plan says it does not fit."""
    replace: bool = False
    """Delete a Failed endpoint of that name first."""
    wait: bool = True
    """Wait until the endpoint settles; False returns once SageMaker has accepted the request."""
    # another shape: the model as an inference component of the endpoint
    inference_component: str | None = None
    """Deploy the model as this inference component of ``endpoint_name`` (created for components, with
    managed instance scaling, when absent; the component is created, or updated when it exists)."""
    copies: int = 1
    """The component's ``RuntimeConfig.CopyCount`` (0 reserves nothing and serves nothing)."""
    cpus: float | None = None
    """Cores one copy reserves (``NumberOfCpuCoresRequired``; default 1)."""
    memory_mb: int | None = None
    """Memory one copy reserves (``MinMemoryRequiredInMb``; default: from the plan)."""
    accelerators: int | None = None
    """Accelerators one copy reserves (default: the plan's GPUs on a GPU instance type, else 0)."""
    max_instance_count: int | None = None
    """The endpoint's ``ManagedInstanceScaling.MaxInstanceCount`` when it is created for components
    (default: ``instance_count``)."""


class DeployUsageError(DeployError):
    """Settings that are missing or do not go together (the command exits 2, as for a usage error)."""


class BadSetting(DeployUsageError):
    """One setting's value is wrong; ``option`` is the command's option for it, when there is one."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class InvalidConfiguration(DeployError):
    """The folder's ``serving.properties`` (with the settings' environment unset) does not resolve."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(f"invalid configuration:\n{error}")
        self.error = error


class PlanDoesNotFit(DeployError):
    """The memory plan says the model does not fit the instance type, and ``force`` was not given."""

    def __init__(self, plan: DeployPlan) -> None:
        super().__init__(
            "this deployment does not fit the instance (see the plan); choose another instance type or "
            "smaller limits, or deploy anyway (--force)"
        )
        self.plan = plan


def check_settings(settings: DeploySettings) -> None:
    """Refuse settings SageMaker would refuse, or that conflict, before anything is read or sent."""
    from lmforge.aws.names import name_problem

    if problem := name_problem("endpointName", settings.endpoint_name):
        raise BadSetting(problem, "--endpoint-name")
    if settings.inference_component is not None:
        _check_component(settings)
    if settings.quantize is not None and not settings.compile_first:
        raise DeployUsageError(QUANTIZE_NEEDS_COMPILE)
    scale = settings.autoscale
    if scale is None:
        return
    if not settings.wait:
        raise DeployUsageError(AUTOSCALE_NEEDS_WAIT)
    low, high = scale.min_capacity, scale.max_capacity
    if settings.inference_component is not None:
        if not low <= settings.copies <= high:
            raise BadSetting(f"--copies {settings.copies} is outside {low}:{high}", "--autoscale")
        return
    if low < 1:
        raise BadSetting(
            f"--autoscale {low}:{high}: an endpoint's production variant keeps at least one instance "
            "(scale to zero is for inference components: add --inference-component)",
            "--autoscale",
        )
    count = settings.instance_count
    if not low <= count <= high:
        raise BadSetting(f"--instance-count {count} is outside {low}:{high}", "--autoscale")


def _check_component(settings: DeploySettings) -> None:
    """The component's settings, as SageMaker would refuse them (and what lmforge does not do yet)."""
    from lmforge.aws.names import name_problem

    assert settings.inference_component is not None
    if problem := name_problem("inferenceComponentName", settings.inference_component):
        raise BadSetting(problem, "--inference-component")
    if isinstance(settings.copies, bool) or not isinstance(settings.copies, int) or settings.copies < 0:
        raise BadSetting(f"--copies {settings.copies!r} is not a whole number of copies >= 0", "--copies")
    if settings.cpus is not None and not settings.cpus >= 0.25:
        raise BadSetting(f"--cpus {settings.cpus} is below SageMaker's minimum of 0.25 cores", "--cpus")
    if settings.memory_mb is not None and not settings.memory_mb >= 128:
        raise BadSetting(
            f"--memory-mb {settings.memory_mb} is below SageMaker's minimum of 128", "--memory-mb"
        )
    if settings.accelerators is not None and settings.accelerators < 0:
        raise BadSetting(f"--accelerators {settings.accelerators} is negative", "--accelerators")
    if settings.max_instance_count is not None and settings.max_instance_count < settings.instance_count:
        raise BadSetting(
            f"--max-instances {settings.max_instance_count} is below "
            f"--instance-count {settings.instance_count}",
            "--max-instances",
        )
