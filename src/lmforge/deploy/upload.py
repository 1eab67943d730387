"""Upload model artifacts to S3: a ``model.tar.gz`` or an uncompressed S3 prefix.

Keys are content-addressed (``<prefix>/<sha256[:16]>/...``), so a new upload never overwrites the
data a running endpoint may still need for scale-out, and the same content is not sent twice: an
object whose ``lmforge-sha256`` metadata already matches is skipped. boto3's transfer manager does
multipart, parallel parts and retries (adaptive mode, 10 attempts).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lmforge.artifacts import MANIFEST_NAME, manifest_bytes, scan_model_folder

if TYPE_CHECKING:
    from lmforge.deploy.progress import Progress as DeployProgress

SHA_METADATA = "lmforge-sha256"
PREFIX_THRESHOLD_BYTES = 1 << 30
"""``auto`` uploads an uncompressed prefix above 1 GiB: weights barely compress, and SageMaker then
copies files instead of unpacking one archive at every start and scale-out."""

ArtifactForm = Literal["tar.gz", "prefix"]
Progress = Callable[[int], None]


@dataclass(frozen=True)
class UploadResult:
    uri: str
    form: ArtifactForm
    sha256: str
    total_bytes: int
    sent_bytes: int
    skipped_files: int

    def model_data(self) -> dict[str, Any]:
        """The ``PrimaryContainer`` members that point SageMaker at this upload."""
        if self.form == "tar.gz":
            return {"ModelDataUrl": self.uri}
        return {
            "ModelDataSource": {
                "S3DataSource": {"S3Uri": self.uri, "S3DataType": "S3Prefix", "CompressionType": "None"}
            }
        }


def s3_client(region: str | None = None) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", region_name=region, config=Config(retries={"max_attempts": 10, "mode": "adaptive"})
    )


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=64 * 2**20, multipart_chunksize=64 * 2**20, max_concurrency=8, use_threads=True
    )


def split_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key.strip("/")


def ensure_bucket(s3: Any, bucket: str, region: str | None) -> bool:
    """Create ``bucket`` when it does not exist; True when it was created."""
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=bucket)
        return False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket", "NotFound"):
            raise
    if region and region != "us-east-1":
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": region})
    else:
        s3.create_bucket(Bucket=bucket)
    return True


def _same_object(s3: Any, bucket: str, key: str, sha256: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError:
        return False
    return bool(head.get("Metadata", {}).get(SHA_METADATA) == sha256)


def _put_file(s3: Any, path: Path, bucket: str, key: str, sha256: str, progress: Progress | None) -> None:
    s3.upload_file(
        str(path),
        bucket,
        key,
        ExtraArgs={"Metadata": {SHA_METADATA: sha256}},
        Config=_transfer_config(),
        Callback=progress,
    )


def upload_archive(
    archive: Path, sha256: str, s3_prefix: str, *, s3: Any, progress: Progress | None = None
) -> UploadResult:
    """Upload ``archive`` (its digest ``sha256``) to ``<s3_prefix>/<sha[:16]>/model.tar.gz``."""
    bucket, prefix = split_s3_uri(s3_prefix)
    key = "/".join(p for p in (prefix, sha256[:16], "model.tar.gz") if p)
    size = archive.stat().st_size
    uri = f"s3://{bucket}/{key}"
    if _same_object(s3, bucket, key, sha256):
        if progress is not None:
            progress(size)
        return UploadResult(uri, "tar.gz", sha256, size, 0, 1)
    _put_file(s3, archive, bucket, key, sha256, progress)
    return UploadResult(uri, "tar.gz", sha256, size, size, 0)


def upload_prefix(
    model_dir: Path, s3_prefix: str, *, s3: Any, progress: Progress | None = None, validate: bool = True
) -> UploadResult:
    """Upload ``model_dir`` uncompressed, with its manifest, to ``<s3_prefix>/<manifest sha[:16]>/``."""
    bucket, prefix = split_s3_uri(s3_prefix)
    scanned = scan_model_folder(model_dir, validate=validate)
    manifest = manifest_bytes([f for _, f in scanned])
    digest = hashlib.sha256(manifest).hexdigest()
    base = "/".join(p for p in (prefix, digest[:16]) if p)
    lock = threading.Lock()
    counts = {"sent": 0, "skipped": 0}

    def report(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    def one(item: tuple[Path, Any]) -> None:
        path, packed = item
        key = f"{base}/{packed.path}"
        if _same_object(s3, bucket, key, packed.sha256):
            report(packed.size)
            with lock:
                counts["skipped"] += 1
            return
        _put_file(s3, path, bucket, key, packed.sha256, report)
        with lock:
            counts["sent"] += packed.size

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, scanned))  # re-raises the first failure
    s3.put_object(
        Bucket=bucket,
        Key=f"{base}/{MANIFEST_NAME}",
        Body=manifest,
        Metadata={SHA_METADATA: digest},
    )
    total = sum(f.size for _, f in scanned)
    return UploadResult(f"s3://{bucket}/{base}/", "prefix", digest, total, counts["sent"], counts["skipped"])


def upload_model_folder(
    model_dir: Path,
    target: str,
    region: str | None,
    artifact_format: Literal["auto", "tar.gz", "prefix"],
    progress: DeployProgress,
    step: str = "",
) -> UploadResult:
    """Validate, pack (or not: ``auto`` sends a prefix above :data:`PREFIX_THRESHOLD_BYTES`) and upload
    ``model_dir`` under ``target`` (``s3://bucket/prefix``, the bucket created when missing), reporting
    through ``progress``; ``step`` heads the first line (``[3/5]``). ValueError for a target that is
    not an S3 URI; :class:`lmforge.artifacts.PackageError` for a folder that cannot be packed."""
    import tempfile

    from lmforge.artifacts import package_model

    bucket, _ = split_s3_uri(target)
    s3 = s3_client(region)
    lead = f"{step} " if step else ""
    pad = " " * len(lead)
    if ensure_bucket(s3, bucket, region):
        progress.note(f"{pad}created bucket s3://{bucket}")
    scanned = scan_model_folder(model_dir)
    total = sum(f.size for _, f in scanned)
    form = artifact_format
    if form == "auto":
        form = "prefix" if total > PREFIX_THRESHOLD_BYTES else "tar.gz"
    if form == "prefix":
        progress.note(
            f"{lead}uploading {len(scanned)} files ({total / 2**20:.1f} MB) uncompressed to {target}/"
        )
        with progress.bar(f"{pad}upload", total) as advance:
            result = upload_prefix(model_dir, target, s3=s3, progress=advance)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            archive = Path(tmp) / "model.tar.gz"
            with progress.bar_to(f"{lead}packing", total) as report:
                packaged = package_model(model_dir, archive, progress=report)
            size = archive.stat().st_size
            progress.note(f"{pad}model.tar.gz {size / 2**20:.1f} MB, sha256 {packaged.sha256[:16]}")
            with progress.bar(f"{pad}upload", size) as advance:
                result = upload_archive(archive, packaged.sha256, target, s3=s3, progress=advance)
    sent = (
        "already there, nothing sent"
        if result.sent_bytes == 0
        else f"{result.sent_bytes / 2**20:.1f} MB sent"
    )
    progress.note(f"{pad}{result.uri} ({sent})")
    return result
