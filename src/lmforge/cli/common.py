"""What several ``lmforge`` commands share: the AWS region, account and bucket, AWS errors as one-line
CLI errors, the artifact format option, the model upload with progress, the container engine and the
ECR push. Command modules import from here and never from each other."""

from __future__ import annotations

import os
import tempfile
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
    import boto3

    region = explicit or boto3.session.Session().region_name
    if not region:
        raise click.UsageError("no AWS region: pass --region or set AWS_DEFAULT_REGION")
    return str(region)


def default_bucket(region: str) -> str:
    """``sagemaker-REGION-ACCOUNT``, the SageMaker SDK's default bucket naming."""
    return f"sagemaker-{region}-{account_id(region)}"


def account_id(region: str) -> str:
    """The AWS account of the credentials boto3 finds (STS GetCallerIdentity)."""
    import boto3

    return str(boto3.client("sts", region_name=region).get_caller_identity()["Account"])


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


def where() -> str:
    """Which SageMaker boto3 will talk to, in words."""
    url = os.environ.get("AWS_ENDPOINT_URL_SAGEMAKER") or os.environ.get("AWS_ENDPOINT_URL")
    if url and url.startswith(("http://127.", "http://localhost")):
        return f"the local SageMaker at {url}"
    if url:
        return f"the SageMaker API at {url}"
    return "AWS SageMaker"


def upload_model(model_dir: Path, target: str, region: str, artifact_format: str, step: str = "") -> Any:
    """Validate, pack (or not) and upload ``model_dir`` under ``target`` with progress; an UploadResult."""
    from lmforge.artifacts import PackageError, package_model, scan_model_folder
    from lmforge.deploy.upload import (
        PREFIX_THRESHOLD_BYTES,
        ensure_bucket,
        s3_client,
        split_s3_uri,
        upload_archive,
        upload_prefix,
    )

    try:
        bucket, _ = split_s3_uri(target)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    s3 = s3_client(region)
    lead = f"{step} " if step else ""
    pad = " " * len(lead)
    if ensure_bucket(s3, bucket, region):
        note(f"{pad}created bucket s3://{bucket}")
    try:
        scanned = scan_model_folder(model_dir)
        total = sum(f.size for _, f in scanned)
        form = artifact_format
        if form == "auto":
            form = "prefix" if total > PREFIX_THRESHOLD_BYTES else "tar.gz"
        if form == "prefix":
            note(f"{lead}uploading {len(scanned)} files ({total / 2**20:.1f} MB) uncompressed to {target}/")
            with progress_bar(f"{pad}upload", total) as advance:
                result = upload_prefix(model_dir, target, s3=s3, progress=advance)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                archive = Path(tmp) / "model.tar.gz"
                with progress_to(f"{lead}packing", total) as report:
                    packaged = package_model(model_dir, archive, progress=report)
                size = archive.stat().st_size
                note(f"{pad}model.tar.gz {size / 2**20:.1f} MB, sha256 {packaged.sha256[:16]}")
                with progress_bar(f"{pad}upload", size) as advance:
                    result = upload_archive(archive, packaged.sha256, target, s3=s3, progress=advance)
    except PackageError as exc:
        raise click.ClickException(str(exc)) from None
    sent = (
        "already there, nothing sent"
        if result.sent_bytes == 0
        else f"{result.sent_bytes / 2**20:.1f} MB sent"
    )
    note(f"{pad}{result.uri} ({sent})")
    return result


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
