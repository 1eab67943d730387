"""Where an adapter may come from: a folder under an allowed root, or an allowed ``s3://`` prefix.

Adapter sources are an admin surface (a registration names files the server will read), so the rules
are narrow: no URLs other than ``s3://``, no ``..`` segments, no path (or symlink) that resolves
outside the allowed roots, and S3 prefixes only below an allow-listed prefix. Downloaded adapters land
in the lmforge cache, one folder per source, and are re-downloaded on every registration (an adapter
under the same prefix may have been retrained).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from lmforge.adapters.validate import AdapterError

PLATFORM_ADAPTER_ROOTS_ENV = "LMFORGE_ADAPTER_ROOTS"
"""Folders a platform downloads adapters into for the container (SageMaker adapter inference
components, the local SageMaker): added to ``option.adapter_roots``, never replaced by it."""


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def adapter_folders(config: Any) -> list[Path]:
    """The ``adapters/`` folders of a model: next to serving.properties and, when the weights live
    elsewhere (``option.model_id`` a folder or a downloaded S3 prefix / hub snapshot), inside that."""
    folders: list[Path] = []
    for base in (config.model_dir, config.model_path):
        if base is not None and (Path(base) / "adapters") not in folders:
            folders.append(Path(base) / "adapters")
    return folders


@dataclass
class SourcePolicy:
    roots: list[Path]
    """Folders adapters may be read from (resolved)."""
    s3_prefixes: list[str] = field(default_factory=list)
    """``s3://bucket/prefix/`` values adapters may be downloaded from."""
    cache_dir: Path = Path()
    download_timeout_s: float = 600.0
    s3_client: Any = None

    @classmethod
    def from_config(cls, config: Any) -> SourcePolicy:
        from lmforge.paths import cache_dir

        roots = adapter_folders(config)
        roots += [Path(p).expanduser() for p in _split(config.adapter_roots)]
        roots += [Path(p) for p in _split(os.environ.get(PLATFORM_ADAPTER_ROOTS_ENV))]
        prefixes = [p if p.endswith("/") else p + "/" for p in _split(config.adapter_s3_prefixes)]
        for prefix in prefixes:
            if not prefix.startswith("s3://") or len(prefix) <= len("s3://") + 1 or ".." in prefix.split("/"):
                raise AdapterError(
                    f"option.adapter_s3_prefixes: {prefix!r} is not an s3://bucket/prefix/ value",
                    param="option.adapter_s3_prefixes",
                )
        return cls(
            roots=list(dict.fromkeys(Path(os.path.realpath(r)) for r in roots)),
            s3_prefixes=prefixes,
            cache_dir=cache_dir("adapters"),
            download_timeout_s=float(config.model_loading_timeout or 600),
        )

    def owns(self, path: Path) -> bool:
        """True for folders this policy downloaded (removed with their adapter)."""
        cache = os.path.realpath(self.cache_dir)
        return os.path.commonpath([cache, os.path.realpath(path)]) == cache

    def describe(self) -> str:
        places = [str(r) for r in self.roots] + self.s3_prefixes
        return (
            ", ".join(places)
            if places
            else "nowhere (set option.adapter_roots or option.adapter_s3_prefixes)"
        )

    def resolve(self, src: str) -> tuple[Path, Path]:
        """The local folder for ``src`` and the root it must stay inside (downloading S3 sources)."""
        if not isinstance(src, str) or not src.strip():
            raise AdapterError(
                "src is required: a folder or an s3:// prefix holding the adapter", param="src"
            )
        src = src.strip()
        if src.startswith("s3://"):
            return self._from_s3(src)
        if "://" in src or src.startswith("file:"):
            raise AdapterError(
                f"src {src!r} is not allowed: adapters come from a folder or an s3:// prefix under "
                f"{self.describe()}",
                param="src",
            )
        if "\x00" in src or ".." in Path(src).parts:
            raise AdapterError(f"src {src!r} may not contain '..'", param="src")
        candidate = Path(src).expanduser()
        if not candidate.is_absolute():
            if not self.roots:
                raise AdapterError(f"src {src!r} is relative and no adapter root is set", param="src")
            candidate = self.roots[0] / candidate
        real = Path(os.path.realpath(candidate))
        for root in self.roots:
            if os.path.commonpath([str(root), str(real)]) == str(root) and real != root:
                if not real.is_dir():
                    raise AdapterError(f"src {src!r} is not a folder", param="src")
                return real, root
        raise AdapterError(
            f"src {src!r} is outside the allowed adapter locations ({self.describe()})", param="src"
        )

    def _from_s3(self, src: str) -> tuple[Path, Path]:
        from lmforge.artifacts.download import DownloadError, download_prefix

        uri = src if src.endswith("/") else src + "/"
        if ".." in PurePosixPath(uri[5:]).parts or "//" in uri[5:]:
            raise AdapterError(f"src {src!r} may not contain '..' or empty path segments", param="src")
        if not any(uri.startswith(prefix) for prefix in self.s3_prefixes):
            raise AdapterError(
                f"src {src!r} is not under an allowed S3 prefix (option.adapter_s3_prefixes: "
                f"{', '.join(self.s3_prefixes) or 'none set'})",
                param="src",
            )
        bucket, _, prefix = uri[5:].partition("/")
        root = self.cache_dir / "s3"
        # one folder per registration: a re-registration never changes the files of a live adapter
        target = root / f"{hashlib.sha256(uri.encode()).hexdigest()[:16]}-{uuid.uuid4().hex[:8]}"
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        client = self.s3_client
        if client is None:
            import boto3

            client = boto3.client("s3")
        try:
            download_prefix(
                client,
                bucket,
                prefix.rstrip("/"),
                staging,
                deadline=time.monotonic() + self.download_timeout_s,
            )
        except DownloadError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise AdapterError(f"src {src!r}: {exc}", param="src") from None
        except Exception as exc:  # botocore: no credentials, access denied, no bucket, ...
            shutil.rmtree(staging, ignore_errors=True)
            raise AdapterError(f"src {src!r} could not be downloaded: {exc}", param="src") from None
        staging.rename(target)
        return Path(os.path.realpath(target)), Path(os.path.realpath(root))
