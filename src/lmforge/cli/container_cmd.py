"""``lmforge container render|build|push`` and ``lmforge image-uri``."""

from __future__ import annotations

from pathlib import Path

import click

from lmforge.cli.progress import note
from lmforge.container.flavours import BACKEND_FLAVOURS, FLAVOURS

_FLAVOUR = click.argument("flavour", type=click.Choice(FLAVOURS))


@click.group("container")
def container_group() -> None:
    """Container images, one flavour per backend: cpu, lmi-dist, vllm, tensorrt-llm."""


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
    note("Next: lmforge container build FLAVOUR   (needs a Docker engine)")


@container_group.command("build")
@_FLAVOUR
@click.option("--tag", help="[default: lmforge/FLAVOUR:VERSION]")
@click.option("--platform", default="linux/amd64", show_default=True)
@click.option("--push", is_flag=True, help="Push instead of loading into the local engine (needs --tag).")
def build_command(flavour: str, tag: str | None, platform: str, push: bool) -> None:
    """Build FLAVOUR's image with docker buildx from the repository root."""
    from lmforge.container import docker
    from lmforge.container.flavours import FlavourError, image_name, repo_root
    from lmforge.container.render import stale_files

    try:
        root = repo_root()
        stale = [p for p in stale_files(root) if p.parent.name == flavour]
        if stale:
            raise click.ClickException(
                f"{stale[0]} differs from the templates: run `lmforge container render {flavour}`"
            )
        binary = docker.check_engine()
        image = tag or image_name(flavour)
        docker.run(docker.build_command(binary, root, flavour, image, platform, push), note)
    except (FlavourError, docker.DockerError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(image)
    note(f"Next: lmforge container push {flavour} --repository ACCOUNT.dkr.ecr.REGION.amazonaws.com/lmforge")


@container_group.command("push")
@_FLAVOUR
@click.option(
    "--repository",
    required=True,
    help="Registry path, e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/lmforge",
)
@click.option("--tag", help="Local image to push [default: lmforge/FLAVOUR:VERSION].")
def push_command(flavour: str, repository: str, tag: str | None) -> None:
    """Tag FLAVOUR's local image for REPOSITORY, log in to ECR with boto3, and push it."""
    from lmforge.container import docker
    from lmforge.container.flavours import image_name

    local = tag or image_name(flavour)
    remote = image_name(flavour, repository)
    try:
        binary = docker.check_engine()
        docker.ecr_login(binary, repository, note)
        docker.run([binary, "tag", local, remote], note)
        docker.run([binary, "push", remote], note)
    except docker.DockerError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(remote)
    note(f"Next: lmforge deploy MODEL_DIR --endpoint-name NAME --instance-type TYPE --image-uri {remote}")


@click.command("image-uri")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--instance-type", help="A CPU instance type selects the cpu flavour.")
@click.option("--aws", "aws_image", is_flag=True, help="AWS's LMI image (DLC) instead of lmforge's.")
@click.option("--repository", help="Registry that holds lmforge's images (see `lmforge container push`).")
@click.option("--region", help="[default: the AWS SDK's region] (for --aws)")
def image_uri_command(
    model_dir: Path, instance_type: str | None, aws_image: bool, repository: str | None, region: str | None
) -> None:
    """Print the container image to serve MODEL_DIR with: lmforge's flavour for its backend, or
    (--aws) the matching AWS LMI image."""
    from lmforge.config import ConfigError, load_config
    from lmforge.container.flavours import image_name

    try:
        config = load_config(model_dir, env={}).config
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration:\n{exc}") from None
    if aws_image:
        from lmforge.cli.upload_cmd import region_or_fail
        from lmforge.deploy.images import default_image_uri

        click.echo(default_image_uri(config, region_or_fail(region)))
        return
    flavour = flavour_for(config.rolling_batch, instance_type)
    if flavour == "cpu" and config.rolling_batch in ("vllm", "trtllm"):
        raise click.ClickException(
            f"option.rolling_batch={config.rolling_batch} needs an NVIDIA GPU; {instance_type} has none "
            "(use a GPU instance type, or option.rolling_batch=lmi-dist for the cpu image)"
        )
    click.echo(image_name(flavour, repository))


def flavour_for(rolling_batch: str, instance_type: str | None) -> str:
    """The image flavour that serves ``rolling_batch`` on ``instance_type``."""
    if instance_type is not None:
        from lmforge.deploy.instances import get_instance

        try:
            if get_instance(instance_type).is_cpu:
                return "cpu"
        except ValueError:
            pass
    return BACKEND_FLAVOURS.get(rolling_batch, "lmi-dist")
