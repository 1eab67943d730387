"""What several ``lmforge`` commands share: the AWS region, account and bucket, AWS errors as one-line
CLI errors, the artifact format option, the model upload with progress, the container engine and the
ECR push. Command modules import from here and never from each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from lmforge.cli.progress import note, progress_bar, progress_to

ARTIFACT_FORMAT = click.option(
    "--artifact-format",
    type=click.Choice(["auto", "tar.gz", "prefix"]),
    default="auto",
    show_default=True,
    help="model.tar.gz, or an uncompressed S3 prefix (auto: prefix above 1 GiB).",
)


def region_or_fail(explicit: str | None) -> str:
    """``explicit``, else the AWS SDK's region; a usage error when there is none."""
    from lmforge.deploy.account import resolve_region
    from lmforge.deploy.settings import DeployUsageError

    try:
        return resolve_region(explicit)
    except DeployUsageError as exc:
        raise click.UsageError(str(exc)) from None


def default_bucket(region: str) -> str:
    """``sagemaker-REGION-ACCOUNT``, the SageMaker SDK's default bucket naming."""
    from lmforge.deploy.account import default_bucket as bucket_of

    return bucket_of(region)


def account_id(region: str) -> str:
    """The AWS account of the credentials boto3 finds (STS GetCallerIdentity)."""
    from lmforge.deploy.account import account_id as account_of

    return account_of(region)


def aws_error(exc: Exception) -> Exception:
    """A boto3/botocore failure as a one-line CLI error; anything else unchanged."""
    from botocore.exceptions import NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return click.ClickException(
            "no AWS credentials: configure them (aws configure, AWS_PROFILE), or deploy to the local "
            'SageMaker: eval "$(lmforge local up --print-env)"'
        )
    if type(exc).__module__.startswith(("botocore", "boto3")):
        return click.ClickException(f"AWS refused the request: {exc}")
    return exc


def cli_progress() -> Any:
    """A deployment's :class:`lmforge.deploy.progress.Progress` on the command's stderr and bars."""
    from lmforge.deploy.progress import Progress

    return Progress(note=note, bar=progress_bar, bar_to=progress_to)


def upload_model(model_dir: Path, target: str, region: str, artifact_format: str, step: str = "") -> Any:
    """Validate, pack (or not) and upload ``model_dir`` under ``target`` with progress; an UploadResult."""
    from lmforge.artifacts import PackageError
    from lmforge.deploy.upload import upload_model_folder

    try:
        return upload_model_folder(model_dir, target, region, artifact_format, cli_progress(), step)  # type: ignore[arg-type]
    except ValueError as exc:  # not an s3:// target
        raise click.BadParameter(str(exc)) from None
    except PackageError as exc:
        raise click.ClickException(str(exc)) from None


def container_engine(choice: str | None) -> Any:
    from lmforge.container.engine import EngineError, detect

    try:
        return detect(choice)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None


def ecr_client(region: str | None) -> tuple[Any, str, str]:
    """(an ECR client, the account id, the region) for the credentials boto3 finds."""
    import boto3

    region = region_or_fail(region)
    return boto3.client("ecr", region_name=region), account_id(region), region


def ecr_repository(option: str | None, flavour: str, account: str, region: str) -> Any:
    """The ECR repository ``lmforge-FLAVOUR`` under ``--repository`` (a registry, maybe with a prefix)."""
    from lmforge.container.publish import EcrRepository, ecr_host, parse_repository
    from lmforge.deploy.images import lmforge_repository

    if not option:
        return EcrRepository(ecr_host(account, region), lmforge_repository(flavour))
    host, _, prefix = option.strip().rstrip("/").partition("/")
    if parse_repository(f"{host}/x") is None:
        raise click.BadParameter(
            f"{option!r} is not an ECR registry (ACCOUNT.dkr.ecr.REGION.amazonaws.com[/PREFIX])",
            param_hint="--repository",
        )
    return EcrRepository(
        host, f"{prefix}/{lmforge_repository(flavour)}" if prefix else lmforge_repository(flavour)
    )


def push_flavour(engine: Any, flavour: str, local: str, repository: str | None, region: str | None) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    from lmforge import __version__
    from lmforge.container.engine import EngineError
    from lmforge.container.publish import push_to_ecr

    try:
        ecr, account, region = ecr_client(region)
        repo = ecr_repository(repository, flavour, account, region)
        note(f"pushing {local} to {repo.uri}:{__version__}")
        return push_to_ecr(engine, ecr, local, repo, __version__, note)
    except EngineError as exc:
        raise click.ClickException(str(exc)) from None
    except (BotoCoreError, ClientError) as exc:
        raise aws_error(exc) from None
