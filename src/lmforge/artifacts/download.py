"""Bring a model that ``option.model_id`` names remotely into a local cache folder.

- ``s3://bucket/prefix``: with ``s5cmd`` when it is on ``PATH`` (parallel, what LMI images use),
  else boto3's transfer manager; the objects under the prefix, verified against an lmforge
  manifest when there is one. A finished download is marked, so a restart reuses it.
- a Hugging Face hub id (``org/name``): ``huggingface_hub.snapshot_download`` with ``HF_TOKEN`` and
  ``option.revision``; in offline mode (``HF_HUB_OFFLINE=1``) only a copy already in the cache is
  used, and a missing one is a clear error instead of a hang.

The cache is the ``models`` folder of lmforge's cache (:func:`lmforge.paths.cache_dir`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from lmforge import paths

log = logging.getLogger("lmforge.download")
_DONE = ".lmforge-complete"


class DownloadError(Exception):
    """The model could not be fetched; the message says why and what to do."""


def is_remote(model_id: str) -> bool:
    """True for ``s3://`` URIs and hub ids (``org/name``) that are not local folders."""
    if model_id.startswith("s3://"):
        return True
    if "://" in model_id or Path(model_id).expanduser().exists():
        return False
    parts = model_id.split("/")
    return len(parts) == 2 and all(parts) and not model_id.startswith((".", "/", "~"))


def fetch_model(
    model_id: str,
    *,
    revision: str | None = None,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] = log.info,
    s3_client: Any = None,
) -> Path:
    """The local folder holding ``model_id``'s files, downloading them first when needed."""
    root = cache_dir or paths.cache_dir("models")
    if model_id.startswith("s3://"):
        return _fetch_s3(model_id, root, progress, s3_client)
    return _fetch_hub(model_id, revision, root, progress)


def _fetch_s3(uri: str, root: Path, progress: Callable[[str], None], s3_client: Any) -> Path:
    bucket, _, prefix = uri[5:].partition("/")
    if not bucket:
        raise DownloadError(f"option.model_id={uri!r} names no bucket")
    prefix = prefix.strip("/")
    target = root / "s3" / bucket / (prefix or "_root") / hashlib.sha256(uri.encode()).hexdigest()[:12]
    if (target / _DONE).exists():
        progress(f"using the cached copy of {uri} in {target}")
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    s5cmd = shutil.which("s5cmd")
    progress(f"downloading {uri} to {target} with {'s5cmd' if s5cmd else 'boto3'}")
    try:
        if s5cmd:
            _s5cmd(s5cmd, bucket, prefix, target)
        else:
            _boto3(s3_client, bucket, prefix, target, progress)
        from lmforge.artifacts.package import PackageError, verify_folder

        try:
            verify_folder(target)
        except PackageError as exc:
            raise DownloadError(f"{uri}: {exc}") from exc
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / _DONE).write_text(uri + "\n")
    return target


def _s5cmd(s5cmd: str, bucket: str, prefix: str, target: Path) -> None:
    source = f"s3://{bucket}/{prefix}/*" if prefix else f"s3://{bucket}/*"
    env = dict(os.environ)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    cmd = [s5cmd, *(["--endpoint-url", endpoint] if endpoint else []), "cp", source, f"{target}/"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DownloadError(f"s5cmd could not copy {source}: {proc.stderr.strip()[-500:]}")


def _boto3(client: Any, bucket: str, prefix: str, target: Path, progress: Callable[[str], None]) -> None:
    if client is None:
        import boto3

        client = boto3.client("s3")
    count, total = download_prefix(client, bucket, prefix, target)
    progress(f"downloaded {count} files ({total / 2**20:.1f} MB)")


def download_prefix(
    client: Any,
    bucket: str,
    prefix: str,
    target: Path,
    *,
    deadline: float | None = None,
    whole_objects: bool = False,
) -> tuple[int, int]:
    """Copy every object under ``s3://bucket/prefix/`` into ``target`` (keys that climb out of the
    prefix are refused; ``deadline`` is a ``time.monotonic()`` value). Returns (files, bytes).

    Large objects come in parallel ranged GETs of 64 MiB, unless ``whole_objects``: one GET each, for
    the local S3 (moto), which reads a whole object for every ranged GET (a 540 MB file in 9 ranges
    cost its server 3.9 CPU-s, against 0.5 in one GET)."""
    import time

    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(
        max_concurrency=8,
        multipart_chunksize=64 * 2**20,
        **({"multipart_threshold": 2**62} if whole_objects else {}),
    )
    start = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    count = total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=start):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(start) :]
            if not rel or rel.endswith("/"):
                continue
            parts = PurePosixPath(rel).parts
            if ".." in parts or rel.startswith("/"):
                raise DownloadError(f"refusing s3://{bucket}/{obj['Key']}: the key escapes the prefix")
            dest = target.joinpath(*parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(dest), Config=config)
            count += 1
            total += int(obj.get("Size", 0))
            if deadline is not None and time.monotonic() > deadline:
                raise DownloadError(f"downloading s3://{bucket}/{start} took longer than allowed")
    if count == 0:
        raise DownloadError(f"no objects under s3://{bucket}/{start}")
    return count, total


def _fetch_hub(model_id: str, revision: str | None, root: Path, progress: Callable[[str], None]) -> Path:
    offline = any(
        os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "LMFORGE_OFFLINE")
    )
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:  # pragma: no cover - transformers brings it
        raise DownloadError("downloading from the Hugging Face hub needs huggingface_hub") from exc
    verb = "looking up" if offline else "downloading"
    progress(f"{verb} {model_id} from the Hugging Face hub into {root / 'hub'}")
    try:
        path = snapshot_download(
            model_id,
            revision=revision,
            cache_dir=str(root / "hub"),
            token=os.environ.get("HF_TOKEN") or None,
            local_files_only=offline,
            allow_patterns=[
                "*.json",
                "*.safetensors",
                "*.bin",
                "*.model",
                "*.txt",
                "*.jinja",
                "*.py",
                "*.tiktoken",
            ],
        )
    except LocalEntryNotFoundError:
        raise DownloadError(
            f"option.model_id={model_id!r} is a Hugging Face hub id, offline mode is on (HF_HUB_OFFLINE=1 or "
            f"LMFORGE_OFFLINE) and the model is not in the cache ({root / 'hub'}): put the weights in the "
            "model folder, point option.model_id at s3://..., or allow network access"
        ) from None
    except Exception as exc:
        raise DownloadError(f"could not download {model_id} from the Hugging Face hub: {exc}") from exc
    return Path(path)
