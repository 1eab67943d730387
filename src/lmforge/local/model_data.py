"""Fetch a model's data from the local S3 into a container's model folder, as SageMaker does:
``ModelDataUrl`` (a ``.tar.gz``, extracted safely) or ``ModelDataSource.S3DataSource`` (an
uncompressed ``S3Prefix`` copied file by file, or a compressed object), within
``ModelDataDownloadTimeoutInSeconds``. A folder with an lmforge manifest is checked against it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ModelDataError(Exception):
    """The model data could not be fetched, or must not be used; the message is a FailureReason."""


def _split_s3(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ModelDataError(f"model data {uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ModelDataError(f"model data {uri!r} names no bucket")
    return bucket, key


def s3_client(endpoint_url: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 2}),
    )


def fetch_model_data(spec: Mapping[str, Any], model_dir: Path, *, s3: Any, timeout_s: float) -> None:
    """Fill ``model_dir`` from the container definition ``spec`` (nothing to fetch: it stays empty)."""
    deadline = time.monotonic() + timeout_s
    model_dir.mkdir(parents=True, exist_ok=True)
    source = (spec.get("ModelDataSource") or {}).get("S3DataSource")
    url = spec.get("ModelDataUrl")
    try:
        if source is not None:
            uncompressed = source.get("CompressionType", "None") == "None"
            if source.get("S3DataType", "S3Prefix") == "S3Prefix" and uncompressed:
                _download_prefix(s3, source["S3Uri"], model_dir, deadline)
            else:
                _download_archive(s3, source["S3Uri"], model_dir, deadline)
        elif url:
            _download_archive(s3, url, model_dir, deadline)
    except ModelDataError:
        raise
    except Exception as exc:
        raise ModelDataError(f"Failed to download model data: {type(exc).__name__}: {exc}") from exc


def _check_deadline(deadline: float, uri: str) -> None:
    if time.monotonic() > deadline:
        raise ModelDataError(f"Downloading {uri} took longer than ModelDataDownloadTimeoutInSeconds allows")


def _download_archive(s3: Any, uri: str, model_dir: Path, deadline: float) -> None:
    from lmforge.artifacts import PackageError, safe_extract

    bucket, key = _split_s3(uri)
    with tempfile.TemporaryDirectory(dir=model_dir.parent) as tmp:
        archive = Path(tmp) / "model.tar.gz"
        s3.download_file(bucket, key, str(archive))
        _check_deadline(deadline, uri)
        try:
            safe_extract(archive, model_dir)
        except PackageError as exc:
            raise ModelDataError(f"Refusing model data {uri}: {exc}") from exc


def _download_prefix(s3: Any, uri: str, model_dir: Path, deadline: float) -> None:
    from lmforge.artifacts import PackageError, verify_folder
    from lmforge.artifacts.download import DownloadError, download_prefix

    bucket, prefix = _split_s3(uri)
    try:
        download_prefix(s3, bucket, prefix, model_dir, deadline=deadline, whole_objects=True)
    except DownloadError as exc:
        if "took longer" in str(exc):
            raise ModelDataError(
                f"Downloading {uri} took longer than ModelDataDownloadTimeoutInSeconds allows"
            ) from None
        if "escapes" in str(exc):
            raise ModelDataError(f"Refusing model data {uri}: {exc}") from None
        raise ModelDataError(f"Failed to download model data: {exc}") from None
    try:
        verify_folder(model_dir)
    except PackageError as exc:
        raise ModelDataError(f"Refusing model data {uri}: {exc}") from exc
