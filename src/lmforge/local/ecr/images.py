"""A repository's images as the registry holds them, image-id lookups and ECR-style pagination."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lmforge.local.registry import INDEX_TYPES, LocalRegistry, ManifestInfo

DEFAULT_PAGE = 100
MAX_PAGE = 1000

_DIGEST_SYNTAX = re.compile(r"[a-zA-Z0-9_+.-]+:[a-fA-F0-9]+")


@dataclass
class RegistryImage:
    """One manifest of a repository; attribute names follow moto's (its serializer reads them)."""

    registry_id: str
    repository_name: str
    image_digest: str
    image_tags: list[str]
    image_manifest: str
    image_manifest_media_type: str
    image_size_in_bytes: int
    image_pushed_at: datetime
    artifact_media_type: str | None = None

    def detail(self) -> dict[str, Any]:
        """The ``ImageDetail`` of DescribeImages (no ``imageTags`` when untagged, as ECR answers)."""
        out: dict[str, Any] = {
            "registryId": self.registry_id,
            "repositoryName": self.repository_name,
            "imageDigest": self.image_digest,
            "imageSizeInBytes": self.image_size_in_bytes,
            "imagePushedAt": self.image_pushed_at,
            "imageManifestMediaType": self.image_manifest_media_type,
        }
        if self.image_tags:
            out["imageTags"] = list(self.image_tags)
        if self.artifact_media_type:
            out["artifactMediaType"] = self.artifact_media_type
        return out


def _artifact_type(info: ManifestInfo) -> str | None:
    if info.media_type in INDEX_TYPES:
        return None
    config = info.json().get("config") or {}
    value = config.get("mediaType")
    return str(value) if value else None


def registry_images(registry: LocalRegistry, repo: Any) -> list[RegistryImage]:
    """Every manifest in ``repo.name`` with its tags, oldest first."""
    infos: dict[str, ManifestInfo] = {}
    tags: dict[str, list[str]] = {}
    for tag in registry.tags(repo.name):
        info = registry.manifest(repo.name, tag)
        if info is not None:  # None: deleted meanwhile
            infos.setdefault(info.digest, info)
            tags.setdefault(info.digest, []).append(tag)
    for digest in registry.manifest_digests(repo.name):
        if digest not in infos and (info := registry.manifest(repo.name, digest)) is not None:
            infos[digest] = info
    now = datetime.now(UTC)
    images = [
        RegistryImage(
            registry_id=repo.registry_id,
            repository_name=repo.name,
            image_digest=digest,
            image_tags=tags.get(digest, []),
            image_manifest=info.raw.decode(),
            image_manifest_media_type=info.media_type,
            image_size_in_bytes=info.size,
            image_pushed_at=registry.pushed_at(repo.name, digest) or now,
            artifact_media_type=_artifact_type(info),
        )
        for digest, info in infos.items()
    ]
    images.sort(key=lambda image: (image.image_pushed_at, image.image_digest))
    return images


def filter_tag_status(images: list[RegistryImage], tag_status: str | None) -> list[RegistryImage]:
    if tag_status == "TAGGED":
        return [image for image in images if image.image_tags]
    if tag_status == "UNTAGGED":
        return [image for image in images if not image.image_tags]
    return images


def find(images: Sequence[RegistryImage], image_id: dict[str, str]) -> tuple[RegistryImage | None, str]:
    """The image ``image_id`` names, or None and an ECR ``failureCode``."""
    tag, digest = image_id.get("imageTag"), image_id.get("imageDigest")
    if not tag and not digest:
        return None, "MissingDigestAndTag"
    if digest and not _DIGEST_SYNTAX.fullmatch(digest):
        return None, "InvalidImageDigest"
    by_tag = next((i for i in images if tag in i.image_tags), None) if tag else None
    by_digest = next((i for i in images if i.image_digest == digest), None) if digest else None
    if tag and digest:
        if by_tag is None or by_digest is None:
            return None, "ImageNotFound"
        if by_tag is not by_digest:
            return None, "ImageTagDoesNotMatchDigest"
    found = by_tag or by_digest
    return (found, "") if found else (None, "ImageNotFound")


_FAILURE_REASONS = {
    "MissingDigestAndTag": "Invalid request parameters: both tag and digest cannot be null",
    "InvalidImageDigest": "Invalid request parameters: image digest should satisfy the regex "
    "'[a-zA-Z0-9-_+.]+:[a-fA-F0-9]+'",
    "ImageTagDoesNotMatchDigest": "Invalid request parameters: given tag does not map to the given digest",
    "ImageNotFound": "Requested image not found",
}


def failure(image_id: dict[str, str], code: str) -> dict[str, Any]:
    """A ``failures`` entry of the batch calls for ``image_id`` and ``code`` (from :func:`find`)."""
    requested = {k: image_id[k] for k in ("imageDigest", "imageTag") if image_id.get(k)}
    return {"imageId": requested, "failureCode": code, "failureReason": _FAILURE_REASONS[code]}


def paginate(
    items: list[Any], max_results: int | None, next_token: str | None, invalid: Callable[[str], Exception]
) -> tuple[list[Any], str | None]:
    """One page of ``items`` and the ``nextToken`` of the next (None on the last page)."""
    start = 0
    if next_token:
        try:
            start = int(base64.urlsafe_b64decode(next_token.encode()).decode().removeprefix("lmforge:"))
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise invalid(
                "Invalid parameter at 'nextToken' failed to satisfy constraint: 'Invalid pagination token'"
            ) from None
        if start < 0:
            raise invalid("Invalid parameter at 'nextToken' failed to satisfy constraint: 'Invalid token'")
    size = DEFAULT_PAGE if max_results is None else int(max_results)
    if not 1 <= size <= MAX_PAGE:
        raise invalid(
            "Invalid parameter at 'maxResults' failed to satisfy constraint: "
            f"'Member must have value between 1 and {MAX_PAGE}'"
        )
    end = start + size
    token = base64.urlsafe_b64encode(f"lmforge:{end}".encode()).decode() if end < len(items) else None
    return items[start:end], token
