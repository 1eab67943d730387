"""``lmforge deploy DIR`` and ``lmforge delete NAME``: SageMaker endpoints in one step.

Deploy validates the configuration, plans memory against the instance type, packages, uploads and
creates (or updates) the endpoint, then waits for it. It talks to whatever boto3 is pointed at: real
AWS by default, the local SageMaker after ``eval "$(lmforge local up --print-env)"``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from lmforge.cli.common import (
    ARTIFACT_FORMAT,
    account_id,
    aws_error,
    container_engine,
    default_bucket,
    push_flavour,
    region_or_fail,
    upload_model,
    where,
)
from lmforge.cli.progress import note as _echo


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
    "invocations per instance.",
)
@click.option(
    "--autoscale-target",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="With --autoscale: invocations per instance per minute to keep.",
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
    "--compile",
    "compile_first",
    is_flag=True,
    help="vLLM: compile the folder (lmforge compile) before packing when this machine matches the "
    "instance type (same CPU instruction set, or the same GPU) and the image's versions; otherwise say "
    "why and deploy it uncompiled.",
)
def deploy_command(
    model_dir: Path,
    endpoint_name: str,
    instance_type: str,
    instance_count: int,
    routing_strategy: str | None,
    autoscale: str | None,
    autoscale_target: float,
    role_arn: str | None,
    bucket: str | None,
    s3_prefix: str,
    image: str | None,
    build_image: bool,
    engine: str | None,
    artifact_format: str,
    env_items: tuple[str, ...],
    health_check_timeout: int | None,
    download_timeout: int | None,
    volume_size: int | None,
    model_config: Path | None,
    region: str | None,
    force: bool,
    replace: bool,
    no_wait: bool,
    compile_first: bool,
) -> None:
    """Validate, plan, package, upload and deploy MODEL_DIR to a SageMaker endpoint, then wait for it.

    A compiled artifact in the folder (lmforge-compiled/, from lmforge compile or --compile) is packed
    with it; the container checks it against its own machine at every start."""
    from lmforge.aws.names import name_problem
    from lmforge.config import ConfigError, load_config
    from lmforge.deploy import autoscaling
    from lmforge.deploy.endpoints import (
        DeployError,
        EndpointSpec,
        delete_endpoint,
        deploy_endpoint,
        describe_endpoint,
        preflight,
        sagemaker_client,
    )

    environment = _env_pairs(env_items)
    if problem := name_problem("endpointName", endpoint_name):
        raise click.BadParameter(problem, param_hint="--endpoint-name")
    scaling = _autoscale(autoscale, autoscale_target, instance_count, no_wait)
    try:
        resolved = load_config(model_dir, env={})
    except ConfigError as exc:
        _echo(f"error: invalid configuration:\n{exc}")
        raise SystemExit(2) from None
    region = region_or_fail(region)
    _echo(f"[1/5] configuration OK ({model_dir}); target: {where()} in {region}")

    image_uri = _image(image, resolved.config, instance_type, region, build_image, engine, model_dir)
    if compile_first:
        _compile_before_packing(model_dir, instance_type, image_uri, environment, engine)
    plan = _plan(model_dir, resolved.config, instance_type, model_config, force)
    health_timeout = health_check_timeout or (plan.health_check_timeout_s if plan else None)
    download_timeout = download_timeout or (plan.download_timeout_s if plan else None)

    role_arn = role_arn or os.environ.get("LMFORGE_ROLE_ARN")
    if not role_arn:
        raise click.UsageError(
            "no execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME (a role SageMaker can assume "
            "with read access to the bucket) or set LMFORGE_ROLE_ARN"
        )
    sm = sagemaker_client(region)
    try:
        existing = describe_endpoint(sm, endpoint_name)
        if existing is not None and existing["EndpointStatus"] == "Failed" and replace:
            delete_endpoint(sm, endpoint_name, echo=_echo)
        existing = preflight(sm, endpoint_name)  # refuse before uploading anything
        target = f"s3://{bucket or default_bucket(region)}/{s3_prefix.strip('/')}"
        upload = upload_model(model_dir, target, region, artifact_format, step="[3/5]")
        spec = EndpointSpec(
            endpoint_name=endpoint_name,
            instance_type=instance_type,
            instance_count=instance_count,
            image_uri=image_uri,
            role_arn=role_arn,
            model_data=upload.model_data(),
            environment=environment,
            health_check_timeout_s=health_timeout,
            download_timeout_s=download_timeout,
            volume_size_gb=volume_size,
            routing_strategy=routing_strategy,
        )
        _echo(f"[4/5] image {spec.image_uri}")
        _echo("[5/5] deploying")
        aas = autoscaling.client(region)
        # SageMaker refuses to update a variant registered for autoscaling: off now, back on after
        previous = autoscaling.suspend(aas, endpoint_name, spec.variant_name, _echo) if existing else None
        result = deploy_endpoint(sm, spec, wait=not no_wait, echo=_echo)
        keep = scaling or previous
        if result.status == "InService" and keep is not None:
            autoscaling.register(aas, endpoint_name, spec.variant_name, keep, _echo)
    except DeployError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        raise aws_error(exc) from None
    _report(result, no_wait)


def _compile_before_packing(
    model_dir: Path, instance_type: str, image_uri: str, environment: dict[str, str], engine: str | None
) -> None:
    """``--compile``: compile MODEL_DIR in place for vLLM, inside the image the endpoint will run (so the
    graphs match its vLLM, torch and exact Python: :mod:`lmforge.container.compile_in_image`), with
    the ``--env`` variables, when this machine's CPU or GPU suits the instance type
    (:func:`lmforge.deploy.compile_match.compile_here_problem`); else say why not."""
    from lmforge.config import ConfigError, load_config
    from lmforge.container.compile_in_image import compile_in_image
    from lmforge.container.engine import EngineError, detect
    from lmforge.container.flavours import image_name
    from lmforge.container.refs import lmforge_flavour_of
    from lmforge.deploy.compile_match import compile_here_problem
    from lmforge.engines.vllm.compile_manifest import current_target

    skip = "      --compile: not compiling ({}); the endpoint compiles at its first start"
    try:
        resolved = load_config(model_dir, env=environment)
    except ConfigError as exc:
        _echo(skip.format(f"invalid configuration: {exc}"))
        return
    if resolved.config.rolling_batch != "vllm":
        _echo(skip.format(f"option.rolling_batch={resolved.config.rolling_batch}: only vLLM compiles ahead"))
        return
    flavour = lmforge_flavour_of(image_uri)
    if flavour is None:
        _echo(
            skip.format(f"{image_uri} is not an lmforge image, whose lmforge compile would run the compile")
        )
        return
    problem = compile_here_problem(instance_type, current_target())
    if problem is not None:
        _echo(skip.format(problem))
        return
    try:
        compile_in_image(
            detect(engine),
            image_name(flavour),
            model_dir,
            env=environment,
            progress=lambda m: _echo(f"      {m}"),
        )
    except EngineError as exc:
        raise click.ClickException(f"--compile: {exc}") from None


def _autoscale(text: str | None, target: float, instance_count: int, no_wait: bool) -> Any:
    """``--autoscale MIN:MAX`` checked before anything is uploaded (None without it)."""
    from lmforge.deploy import autoscaling

    if text is None:
        return None
    if no_wait:
        raise click.UsageError("--autoscale registers scaling once the endpoint is InService: drop --no-wait")
    try:
        low, high = autoscaling.parse_range(text)
        scale = autoscaling.Autoscale(low, high, target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--autoscale") from None
    if not low <= instance_count <= high:
        raise click.BadParameter(
            f"--instance-count {instance_count} is outside {low}:{high}", param_hint="--autoscale"
        )
    return scale


def _image(
    option: str | None,
    config: Any,
    instance_type: str,
    region: str,
    build: bool,
    engine: str | None,
    model_dir: Path,
) -> str:
    """The image to deploy, refused before anything is uploaded when it cannot serve ``config``; lmforge's
    default image is checked in ECR (and built and pushed with ``build``)."""
    from lmforge.deploy.images import ImageError, choose_image, image_problem

    try:
        account = account_id(region)
        choice = choose_image(option, config, instance_type, region, account)
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        raise aws_error(exc) from None
    if problem := image_problem(choice, config, instance_type):
        raise click.ClickException(f"image {choice.uri} cannot serve this model: {problem}")
    if choice.kind == "lmforge" and choice.flavour is not None:
        from lmforge.local.control import targeted_mode

        mode = targeted_mode()
        if mode == "process":
            _echo(
                f"      the local SageMaker runs in process mode: lmforge's server stands in for {choice.uri}"
            )
        else:
            if mode == "image":
                _refuse_gpu_image_without_gpu(
                    choice.flavour, config, instance_type, model_dir, account, region
                )
            _ensure_in_ecr(choice.uri, choice.flavour, region, build, engine)
    return choice.uri


def _refuse_gpu_image_without_gpu(
    name: str, config: Any, instance_type: str, model_dir: Path, account: str, region: str
) -> None:
    """The local SageMaker runs images on this machine: a GPU image cannot start where there is no
    NVIDIA GPU. Say so first (not that the image is missing from ECR, whose build would then refuse),
    and how to try the same model here."""
    from lmforge.container.build import has_nvidia_gpu
    from lmforge.container.flavours import FlavourError, load_flavour
    from lmforge.deploy.images import CPU_FLAVOURS, lmforge_image_uri

    try:
        if not load_flavour(name).gpu or has_nvidia_gpu():
            return
    except FlavourError:
        return
    head = (
        f"{instance_type} takes lmforge's {name} image, which needs an NVIDIA GPU, and the local SageMaker "
        "runs endpoints on this machine, which has none (nvidia-smi finds no GPU)."
    )
    cpu = CPU_FLAVOURS.get(config.rolling_batch)
    if cpu is None:
        raise click.ClickException(
            f"{head} option.rolling_batch={config.rolling_batch} has no CPU image; to try this model here, "
            "set option.rolling_batch=lmi-dist (or vllm) and use a CPU instance type such as ml.m5.xlarge"
        )
    stand_in = lmforge_image_uri(cpu, account, region)
    raise click.ClickException(
        f"{head} To try this model here, either\n"
        f"  use a CPU instance type (lmforge's {cpu} image):\n"
        f"    lmforge deploy {model_dir} --instance-type ml.m5.xlarge ...\n"
        f"  or keep {instance_type} with the {cpu} image standing in for the GPU image (what runs is the "
        f"{cpu} image, not what a real {instance_type} endpoint would run):\n"
        f"    lmforge deploy {model_dir} --instance-type {instance_type} --image {stand_in} ...\n"
        f"Add --build-image if the {cpu} image is not in the local ECR yet."
    )


def _ensure_in_ecr(uri: str, flavour: str, region: str, build: bool, engine: str | None) -> None:
    """An lmforge image named in the caller's ECR must be there: SageMaker would fail minutes later."""
    import boto3

    from lmforge.container.publish import image_in_ecr, parse_repository

    name, _, tag = uri.rpartition(":")
    repo = parse_repository(name)
    if repo is None:
        return  # not ECR (a local name for the local SageMaker, another registry)
    ecr = boto3.client("ecr", region_name=repo.region)
    try:
        if image_in_ecr(ecr, repo, tag):
            return
    except Exception as exc:
        raise aws_error(exc) from None
    if not build:
        raise click.ClickException(
            f"{uri} is not in ECR yet. Build and push it first:\n"
            f"  lmforge container build {flavour} && lmforge container push {flavour}\n"
            f"or pass --build-image to do both now, or --image lmi for AWS's LMI image"
        )
    from lmforge.container.build import build_flavour
    from lmforge.container.engine import EngineError

    chosen = container_engine(engine)
    _echo(f"      {uri} is not in ECR: building and pushing it (--build-image)")
    try:
        result = build_flavour(flavour, chosen, _echo)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    prefix = repo.name.rpartition("/")[0]
    push_flavour(chosen, flavour, result.tag, f"{repo.host}/{prefix}" if prefix else repo.host, region)


def _plan(model_dir: Path, config: Any, instance_type: str, model_config: Path | None, force: bool) -> Any:
    """The memory plan, echoed; exits 1 when it does not fit unless forced; None when it cannot be made."""
    from lmforge.deploy.plan import PlanError, make_plan, render_plan

    try:
        plan = make_plan(model_dir, config, instance_type, model_config_path=model_config)
    except PlanError as exc:
        _echo(f"[2/5] plan skipped: {exc}")
        return None
    except ValueError as exc:  # not in the planning table
        from lmforge.deploy.instances import sagemaker_instance_types

        if instance_type not in sagemaker_instance_types():
            raise click.UsageError(str(exc)) from None
        _echo(f"[2/5] plan skipped: lmforge does not know the memory of {instance_type} (not in its table)")
        return None
    _echo("[2/5] plan")
    for line in render_plan(plan).splitlines():
        _echo("      " + line)
    if not plan.fits:
        if not force:
            _echo(
                "error: this deployment does not fit the instance (see above); choose another instance "
                "type or"
            )
            _echo("       smaller limits, or pass --force to deploy anyway")
            raise SystemExit(1)
        _echo("warning: deploying although the plan does not fit (--force)")
    return plan


def _report(result: Any, no_wait: bool) -> None:
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
@click.option("--region")
def delete_command(endpoint_name: str, keep_config: bool, region: str | None) -> None:
    """Delete ENDPOINT_NAME and, unless --keep-config, its endpoint configuration and models."""
    from lmforge.deploy import autoscaling
    from lmforge.deploy.endpoints import DeployError, delete_endpoint, describe_endpoint, sagemaker_client

    region = region_or_fail(region)
    try:
        sm = sagemaker_client(region)
        existing = describe_endpoint(sm, endpoint_name)
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
