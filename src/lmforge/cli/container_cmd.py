"""``lmforge container render|base|build|push`` and ``lmforge image-uri``."""

from __future__ import annotations

from pathlib import Path

import click

from lmforge.cli.common import container_engine, push_flavour, region_or_fail
from lmforge.cli.progress import note
from lmforge.container.flavours import FLAVOURS

_FLAVOUR = click.argument("flavour", type=click.Choice(FLAVOURS))
_ENGINE = click.option(
    "--engine",
    type=click.Choice(["auto", "podman", "docker"]),
    default=None,
    help="Container engine [default: $LMFORGE_CONTAINER_ENGINE, else podman if it answers, else docker].",
)


@click.group("container")
def container_group() -> None:
    """Container images, one flavour per backend: cpu, vllm-cpu, lmi-dist, vllm, tensorrt-llm."""


@container_group.command("render")
@click.argument("flavours", nargs=-1, type=click.Choice(FLAVOURS))
@click.option("--check", is_flag=True, help="Only report files that differ from the templates (exit 1).")
def render_command(flavours: tuple[str, ...], check: bool) -> None:
    """Render FLAVOURS (default: all) from templates/ into containers/<flavour>/."""
    from lmforge.container.flavours import FlavourError
    from lmforge.container.render import stale_files, write_flavour

    try:
        if check:
            stale = stale_files()
            for path in stale:
                click.echo(f"stale: {path}")
            raise SystemExit(1 if stale else 0)
        for name in flavours or FLAVOURS:
            changed = write_flavour(name)
            click.echo(f"{name}: {len(changed)} file(s) changed" if changed else f"{name}: up to date")
    except FlavourError as exc:
        raise click.ClickException(str(exc)) from None
    note("Next: lmforge container build FLAVOUR")


@container_group.command("base")
@_ENGINE
@click.option("--rebuild", is_flag=True, help="Make it again even when the engine has it.")
def base_command(engine: str | None, rebuild: bool) -> None:
    """Make a Debian bookworm + Python 3.11 base image from Debian packages (mmdebstrap), for machines
    that reach no public image registry; `container build` then uses it for the CPU flavours."""
    from lmforge.container.base import build_base
    from lmforge.container.engine import EngineError

    try:
        tag = build_base(container_engine(engine), note, rebuild=rebuild)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(tag)
    note("Next: lmforge container build cpu   (it builds on this base when the pinned one is not here)")


@container_group.command("build")
@_FLAVOUR
@_ENGINE
@click.option("--tag", help="[default: lmforge/FLAVOUR:VERSION]")
@click.option("--base-image", help="The Dockerfile's BASE_IMAGE [default: see docs/containers.md].")
@click.option("--no-cache", is_flag=True, help="Build every layer again.")
@click.option("--platform", help="e.g. linux/amd64 [default: this machine's].")
@click.option("--allow-no-gpu", is_flag=True, help="Build a GPU flavour on a machine without a GPU.")
@click.option("--push", is_flag=True, help="Then push it to the account's ECR (as `container push`).")
@click.option("--region", help="[default: the AWS SDK's region] (with --push)")
def build_command(
    flavour: str,
    engine: str | None,
    tag: str | None,
    base_image: str | None,
    no_cache: bool,
    platform: str | None,
    allow_no_gpu: bool,
    push: bool,
    region: str | None,
) -> None:
    """Build FLAVOUR's image with podman or docker."""
    from lmforge.container.build import build_flavour, check_buildable
    from lmforge.container.engine import EngineError
    from lmforge.container.flavours import FlavourError

    try:
        check_buildable(flavour, allow_no_gpu=allow_no_gpu)
    except (FlavourError, EngineError) as exc:
        raise click.ClickException(str(exc)) from None
    chosen = container_engine(engine)
    try:
        result = build_flavour(
            flavour,
            chosen,
            note,
            tag=tag,
            base_image=base_image,
            no_cache=no_cache,
            platform=platform,
            allow_no_gpu=allow_no_gpu,
        )
    except (FlavourError, EngineError) as exc:
        raise click.ClickException(str(exc)) from None
    note(
        f"built {result.tag} in {result.seconds:.0f} s ({result.size_bytes / 1e9:.2f} GB, "
        f"base {result.base_image})"
    )
    if push:
        click.echo(push_flavour(chosen, flavour, result.tag, None, region))
        return
    click.echo(result.tag)
    note("Next:")
    note(f"  podman run --rm -p 8080:8080 -v MODEL_DIR:/opt/ml/model:ro {result.tag}   # or docker run")
    note(
        f"  lmforge container push {flavour}    # to the account's ECR (or the local ECR of lmforge local up)"
    )


@container_group.command("push")
@_FLAVOUR
@_ENGINE
@click.option(
    "--repository",
    help="ECR registry (and prefix) to push to, e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/team "
    "[default: the account's registry for the region]",
)
@click.option("--tag", "local", help="Local image to push [default: lmforge/FLAVOUR:VERSION].")
@click.option("--region", help="[default: the AWS SDK's region]")
def push_command(
    flavour: str, engine: str | None, repository: str | None, local: str | None, region: str | None
) -> None:
    """Push FLAVOUR's image to ECR as lmforge-FLAVOUR:VERSION: the repository is created when missing,
    the engine logs in with a token from ecr:GetAuthorizationToken, the push is checked with
    DescribeImages. With `lmforge local up`'s environment, this is the local ECR."""
    from lmforge.container.flavours import image_name

    uri = push_flavour(container_engine(engine), flavour, local or image_name(flavour), repository, region)
    click.echo(uri)
    note(f"Next: lmforge deploy MODEL_DIR --endpoint-name NAME --instance-type TYPE --image {uri}")
    note("      (or leave --image out: lmforge deploy picks this image for the backend by itself)")


@click.command("image-uri")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--instance-type", help="A CPU instance type selects a CPU flavour.")
@click.option("--aws", "aws_image", is_flag=True, help="AWS's LMI image (DLC) instead of lmforge's.")
@click.option("--region", help="[default: the AWS SDK's region]")
@click.option("--account", help="[default: the account of the AWS credentials]")
def image_uri_command(
    model_dir: Path, instance_type: str | None, aws_image: bool, region: str | None, account: str | None
) -> None:
    """Print the image that serves MODEL_DIR: lmforge's flavour for its backend in the account's ECR,
    or (--aws) the matching AWS LMI image."""
    from lmforge.config import ConfigError, load_config
    from lmforge.deploy.images import ImageError, choose_image, image_problem

    try:
        config = load_config(model_dir, env={}).config
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration:\n{exc}") from None
    region = region_or_fail(region)
    if account is None and not aws_image:
        from lmforge.cli.common import account_id

        account = account_id(region)
    try:
        choice = choose_image("lmi" if aws_image else "lmforge", config, instance_type, region, account or "")
    except ImageError as exc:
        raise click.ClickException(str(exc)) from None
    if problem := image_problem(choice, config, instance_type):
        raise click.ClickException(problem)
    click.echo(choice.uri)
