"""``lmforge upload DIR [s3://bucket/prefix]``: the model folder in S3, ready for SageMaker."""

from __future__ import annotations

import json
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
    import boto3

    account = boto3.client("sts", region_name=region).get_caller_identity()["Account"]
    return f"sagemaker-{region}-{account}"


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


@click.command("upload")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("target", required=False, metavar="[s3://BUCKET/PREFIX]")
@ARTIFACT_FORMAT
@click.option("--region", help="[default: the AWS SDK's region]")
def upload_command(model_dir: Path, target: str | None, artifact_format: str, region: str | None) -> None:
    """Upload MODEL_DIR to S3 for SageMaker (validated, content-addressed, skipped when already there).

    Prints the PrimaryContainer members (ModelDataUrl or ModelDataSource) that point a SageMaker
    model at it. TARGET defaults to s3://sagemaker-REGION-ACCOUNT/lmforge.
    """
    from lmforge.cli.deploy_cmd import aws_error

    region = region_or_fail(region)
    try:
        result = upload_model(
            model_dir, target or f"s3://{default_bucket(region)}/lmforge", region, artifact_format
        )
    except click.ClickException:
        raise
    except Exception as exc:
        raise aws_error(exc) from None
    click.echo(json.dumps(result.model_data(), indent=2))
    note("Next: lmforge deploy DIR --endpoint-name NAME --instance-type TYPE, or use these members in")
    note("      CreateModel's PrimaryContainer (the SageMaker SDK: Model(model_data=...)).")
