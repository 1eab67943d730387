"""``lmforge upload DIR [s3://bucket/prefix]``: the model folder in S3, ready for SageMaker."""

from __future__ import annotations

import json
from pathlib import Path

import click

from lmforge.cli.common import ARTIFACT_FORMAT, aws_error, default_bucket, region_or_fail, upload_model
from lmforge.cli.progress import note


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
