"""``lmforge deploy DIR`` and ``lmforge delete NAME``: SageMaker endpoints in one step.

Deploy validates the configuration, plans memory against the instance type, packages, uploads and
creates (or updates) the endpoint, then waits for it. It talks to whatever boto3 is pointed at: real
AWS by default, the local SageMaker after ``eval "$(lmforge local up --print-env)"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from lmforge.cli.common import ARTIFACT_FORMAT, aws_error, cli_progress, region_or_fail
from lmforge.cli.progress import note as _echo
from lmforge.quantize import choices as quantize_choices

if TYPE_CHECKING:
    from lmforge.deploy import Autoscale, Deployment, DeployResult, DeploySettings
    from lmforge.deploy.components import ComponentResult
    from lmforge.deploy.settings import ArtifactFormat, ContainerEngineName, RoutingStrategy


def _env_pairs(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env")
        out[key] = value
    return out


@click.command("deploy")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--endpoint-name", required=True, help="SageMaker endpoint to create, or to update if it exists."
)
@click.option("--instance-type", required=True, help="For example ml.g5.2xlarge (see `lmforge plan`).")
@click.option("--instance-count", type=click.IntRange(1), default=1, show_default=True)
@click.option(
    "--routing-strategy",
    type=click.Choice(["RANDOM", "LEAST_OUTSTANDING_REQUESTS"]),
    help="How SageMaker spreads requests over the instances [default: SageMaker's, RANDOM].",
)
@click.option(
    "--autoscale",
    metavar="MIN:MAX",
    help="Register Application Auto Scaling on the variant: MIN to MAX instances, target tracking on "
    "invocations per instance; with --inference-component: MIN to MAX copies (MIN may be 0, then a "
    "refused request scales it from zero), target tracking on invocations per copy.",
)
@click.option(
    "--autoscale-target",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="With --autoscale: invocations per instance (per copy, for a component) per minute to keep.",
)
@click.option("--role", "role_arn", help="Execution role ARN [default: $LMFORGE_ROLE_ARN].")
@click.option("--bucket", help="S3 bucket for the artifacts [default: sagemaker-REGION-ACCOUNT].")
@click.option("--s3-prefix", default="lmforge", show_default=True, help="Key prefix inside the bucket.")
@click.option(
    "--image",
    "--image-uri",
    "image",
    help="Container image: an image URI, `lmi` (AWS's LMI image for the backend) or `lmforge` "
    "[default: $LMFORGE_IMAGE_URI, else lmforge's image for the backend in the account's ECR].",
)
@click.option(
    "--build-image",
    is_flag=True,
    help="Build and push lmforge's image to the account's ECR when it is not there yet.",
)
@click.option("--engine", type=click.Choice(["auto", "podman", "docker"]), help="For --build-image.")
@ARTIFACT_FORMAT
@click.option(
    "--env", "env_items", multiple=True, metavar="KEY=VALUE", help="Container environment (repeat)."
)
@click.option("--health-check-timeout", type=click.IntRange(60, 3600), help="[default: from the plan]")
@click.option("--download-timeout", type=click.IntRange(60, 3600), help="[default: from the plan]")
@click.option(
    "--volume-size", type=click.IntRange(1, 512), help="EBS volume in GB (instances without local NVMe)."
)
@click.option(
    "--model-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="config.json to plan with.",
)
@click.option("--region", help="[default: the AWS SDK's region]")
@click.option("--force", is_flag=True, help="Deploy even when the plan says it does not fit.")
@click.option("--replace", is_flag=True, help="Delete a Failed endpoint of that name first.")
@click.option("--no-wait", is_flag=True, help="Return once SageMaker has accepted the request.")
@click.option(
    "--inference-component",
    metavar="NAME",
    help="Deploy as this inference component of the endpoint (the endpoint is created for components, "
    "with managed instance scaling, when absent; the component is created, or updated when it exists).",
)
@click.option(
    "--copies", type=click.IntRange(0), default=1, show_default=True, help="With --inference-component."
)
@click.option(
    "--cpus",
    type=click.FloatRange(0.25),
    help="With --inference-component: cores per copy [default: 1].",
)
@click.option(
    "--memory-mb",
    type=click.IntRange(128),
    help="With --inference-component: memory per copy [default: from the plan].",
)
@click.option(
    "--accelerators",
    type=click.IntRange(0),
    help="With --inference-component: accelerators per copy [default: the plan's GPUs, 0 on CPU].",
)
@click.option(
    "--max-instances",
    type=click.IntRange(1),
    help="With --inference-component, for a new endpoint: ManagedInstanceScaling.MaxInstanceCount "
    "[default: --instance-count].",
)
@click.option(
    "--compile",
    "compile_first",
    is_flag=True,
    help="vLLM: compile the folder (lmforge compile) before packing when this machine matches the "
    "instance type (same CPU instruction set, or the same GPU) and the image's versions; otherwise say "
    "why and deploy it uncompiled. With --quantize, or an LMI-Dist folder's option.quantize: quantize "
    "it first.",
)
@click.option(
    "--quantize",
    metavar="METHOD",
    help="With --compile: quantize the folder first (lmforge compile --quantize, inside the endpoint's "
    "lmforge image; on this machine in the local SageMaker's process mode or for another image) into a "
    f"folder of its own, and deploy that: {quantize_choices()}.",
)
def deploy_command(
    model_dir: Path,
    endpoint_name: str,
    instance_type: str,
    instance_count: int,
    routing_strategy: RoutingStrategy | None,
    autoscale: str | None,
    autoscale_target: float,
    role_arn: str | None,
    bucket: str | None,
    s3_prefix: str,
    image: str | None,
    build_image: bool,
    engine: ContainerEngineName | None,
    artifact_format: ArtifactFormat,
    env_items: tuple[str, ...],
    health_check_timeout: int | None,
    download_timeout: int | None,
    volume_size: int | None,
    model_config: Path | None,
    region: str | None,
    force: bool,
    replace: bool,
    no_wait: bool,
    inference_component: str | None,
    copies: int,
    cpus: float | None,
    memory_mb: int | None,
    accelerators: int | None,
    max_instances: int | None,
    compile_first: bool,
    quantize: str | None,
) -> None:
    """Validate, plan, package, upload and deploy MODEL_DIR to a SageMaker endpoint, then wait for it.

    A compiled artifact in the folder (lmforge-compiled/, from lmforge compile or --compile) is packed
    with it; the container checks it against its own machine at every start."""
    from lmforge.aws.names import name_problem
    from lmforge.deploy import DeploySettings
    from lmforge.deploy.components import ComponentResult
    from lmforge.deploy.settings import QUANTIZE_NEEDS_COMPILE

    environment = _env_pairs(env_items)
    # deploy() checks the name too: here first, before --autoscale is read, as the options come
    if problem := name_problem("endpointName", endpoint_name):
        raise click.BadParameter(problem, param_hint="--endpoint-name")
    component_only = {
        "--copies": copies != 1,
        "--cpus": cpus is not None,
        "--memory-mb": memory_mb is not None,
        "--accelerators": accelerators is not None,
        "--max-instances": max_instances is not None,
    }
    if inference_component is None and (given := [k for k, v in component_only.items() if v]):
        raise click.UsageError(f"{', '.join(given)} go with --inference-component")
    if quantize is not None and not compile_first:
        raise click.UsageError(QUANTIZE_NEEDS_COMPILE)
    settings = DeploySettings(
        model_dir=model_dir,
        endpoint_name=endpoint_name,
        instance_type=instance_type,
        instance_count=instance_count,
        routing_strategy=routing_strategy,
        autoscale=_autoscale(autoscale, autoscale_target, no_wait),
        volume_size_gb=volume_size,
        health_check_timeout_s=health_check_timeout,
        download_timeout_s=download_timeout,
        region=region,
        role_arn=role_arn,
        image=image,
        build_image=build_image,
        container_engine=engine,
        environment=environment,
        compile_first=compile_first,
        quantize=quantize,
        bucket=bucket,
        s3_prefix=s3_prefix,
        artifact_format=artifact_format,
        model_config=model_config,
        force=force,
        replace=replace,
        wait=not no_wait,
        inference_component=inference_component,
        copies=copies,
        cpus=cpus,
        memory_mb=memory_mb,
        accelerators=accelerators,
        max_instance_count=max_instances,
    )
    result = _deploy(settings).result
    if isinstance(result, ComponentResult):
        _report_component(result, no_wait)
    else:
        _report(result, no_wait)


def _deploy(settings: DeploySettings) -> Deployment:
    """:func:`lmforge.deploy.deploy` with its progress on stderr and its errors as the command's: usage
    errors exit 2, the others 1 (AWS's refusals in one line)."""
    from lmforge.deploy import (
        BadSetting,
        DeployError,
        DeployUsageError,
        InvalidConfiguration,
        PlanDoesNotFit,
        deploy,
    )

    try:
        return deploy(settings, cli_progress())
    except InvalidConfiguration as exc:
        _echo(f"error: invalid configuration:\n{exc.error}")
        raise SystemExit(2) from None
    except PlanDoesNotFit:
        _echo("error: this deployment does not fit the instance (see above); choose another instance type or")
        _echo("       smaller limits, or pass --force to deploy anyway")
        raise SystemExit(1) from None
    except BadSetting as exc:
        raise click.BadParameter(str(exc), param_hint=exc.option) from None
    except DeployUsageError as exc:
        raise click.UsageError(str(exc)) from None
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        raise aws_error(exc) from None


def _autoscale(text: str | None, target: float, no_wait: bool) -> Autoscale | None:
    """``--autoscale MIN:MAX`` parsed (None without it); :func:`lmforge.deploy.deploy` checks it against
    the instance count before anything is uploaded."""
    from lmforge.deploy.autoscaling import Autoscale, parse_range
    from lmforge.deploy.settings import AUTOSCALE_NEEDS_WAIT

    if text is None:
        return None
    if no_wait:
        raise click.UsageError(AUTOSCALE_NEEDS_WAIT)
    try:
        low, high = parse_range(text)
        return Autoscale(low, high, target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--autoscale") from None


def _report(result: DeployResult, no_wait: bool) -> None:
    name = result.endpoint_name
    if no_wait:
        click.echo(f"{name}: {result.status}")
        _echo(f"Next: lmforge wait {name}   (or watch it in the SageMaker console)")
        return
    if result.succeeded:
        click.echo(f"{name}: InService ({'updated' if result.updated else 'created'})")
        _echo("")
        _echo("Next:")
        _echo(f"  lmforge invoke {name} 'def fibonacci(n):' --stream --details")
        _echo(f"  lmforge delete {name}      # stop paying for it")
        return
    reason = result.description.get("FailureReason") or "no reason given"
    if result.updated and result.status == "InService":
        click.echo(f"{name}: update failed (still serving {result.description.get('EndpointConfigName')})")
    else:
        click.echo(f"{name}: {result.status}")
    _echo(f"FailureReason: {reason}")
    _echo("")
    _echo("What to do:")
    _echo(
        "  - read the container log (CloudWatch /aws/sagemaker/Endpoints/"
        + name
        + ", or the local log named above)"
    )
    _echo("  - check the memory plan: lmforge plan MODEL_DIR --instance-type TYPE")
    _echo("  - try the folder locally first: lmforge serve MODEL_DIR")
    if result.updated:
        previous = result.description.get("EndpointConfigName")
        _echo(f"  - the endpoint still serves its previous configuration ({previous})")
    else:
        _echo(f"  - then: lmforge delete {name}, and deploy again")
    raise SystemExit(1)


def _report_component(result: ComponentResult, no_wait: bool) -> None:
    name, endpoint = result.component_name, result.endpoint_name
    runtime = result.description.get("RuntimeConfig") or {}
    copies = f"{runtime.get('CurrentCopyCount', 0)}/{runtime.get('DesiredCopyCount', 0)} copies"
    if no_wait:
        click.echo(f"{endpoint}/{name}: {result.status}")
        return
    if result.succeeded:
        click.echo(f"{endpoint}/{name}: InService, {copies} ({'updated' if result.updated else 'created'})")
        _echo("")
        _echo("Next:")
        _echo(f"  lmforge invoke {endpoint} 'def fibonacci(n):' --inference-component {name} --stream")
        _echo(f"  lmforge delete {endpoint} --inference-component {name}   # this component only")
        return
    click.echo(f"{endpoint}/{name}: {'update failed' if result.updated else result.status}")
    _echo(f"FailureReason: {result.description.get('FailureReason') or 'no reason given'}")
    _echo("")
    _echo("What to do:")
    _echo(f"  - read the container log (CloudWatch /aws/sagemaker/InferenceComponents/{name}, or the local")
    _echo("    log named in the FailureReason)")
    _echo("  - check the memory plan: lmforge plan MODEL_DIR --instance-type TYPE")
    if not result.updated:
        _echo(f"  - then: lmforge delete {endpoint} --inference-component {name}, and deploy again")
    raise SystemExit(1)


@click.command("wait")
@click.argument("endpoint_name")
@click.option("--region")
def wait_command(endpoint_name: str, region: str | None) -> None:
    """Wait until ENDPOINT_NAME is InService (exit 0) or Failed (exit 1)."""
    from lmforge.deploy.endpoints import sagemaker_client, wait_for_endpoint

    try:
        description = wait_for_endpoint(sagemaker_client(region_or_fail(region)), endpoint_name, echo=_echo)
    except Exception as exc:
        raise aws_error(exc) from None
    click.echo(f"{endpoint_name}: {description['EndpointStatus']}")
    if description["EndpointStatus"] != "InService":
        _echo(f"FailureReason: {description.get('FailureReason', 'no reason given')}")
        raise SystemExit(1)


@click.command("delete")
@click.argument("endpoint_name")
@click.option("--keep-config", is_flag=True, help="Keep the endpoint configuration and models.")
@click.option(
    "--inference-component", metavar="NAME", help="Delete only this inference component (and its model)."
)
@click.option("--region")
def delete_command(
    endpoint_name: str, keep_config: bool, inference_component: str | None, region: str | None
) -> None:
    """Delete ENDPOINT_NAME with its inference components and, unless --keep-config, its endpoint
    configuration and models; or only one of its inference components."""
    from lmforge.deploy import autoscaling
    from lmforge.deploy.components import delete_component, delete_endpoint_components, describe_component
    from lmforge.deploy.endpoints import DeployError, delete_endpoint, describe_endpoint, sagemaker_client

    region = region_or_fail(region)
    try:
        sm = sagemaker_client(region)
        if inference_component is not None:
            found = describe_component(sm, inference_component)
            if found is not None and found.get("EndpointName") != endpoint_name:
                raise DeployError(
                    f"inference component {inference_component} is on endpoint {found.get('EndpointName')}, "
                    f"not {endpoint_name}"
                )
            delete_component(sm, inference_component, echo=_echo)
            return
        existing = describe_endpoint(sm, endpoint_name)
        if existing is not None:  # SageMaker refuses to delete an endpoint that still has components
            delete_endpoint_components(sm, endpoint_name, echo=_echo)
        if existing is not None:  # a scalable target outliving its endpoint would keep calling it
            aas = autoscaling.client(region)
            for variant in existing.get("ProductionVariants", []):
                autoscaling.suspend(aas, endpoint_name, variant["VariantName"], _echo)
        delete_endpoint(sm, endpoint_name, keep_config=keep_config, echo=_echo)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        raise aws_error(exc) from None
    _echo(
        "Artifacts in S3 are kept (content-addressed); remove them with `aws s3 rm --recursive` if unneeded."
    )
