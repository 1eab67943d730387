"""The Registry HTTP API v2 client (stdlib only) that :class:`~lmforge.local.registry.LocalRegistry`
builds on, the manifest media types, :class:`RegistryError` and :class:`ManifestInfo`."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class RegistryError(RuntimeError):
    """The local registry cannot be started, or did not answer as expected.

    ``status`` and ``codes`` (the registry's error codes, e.g. ``MANIFEST_BLOB_UNKNOWN``) are set when
    the registry answered with an HTTP error.
    """

    def __init__(self, message: str, status: int | None = None, codes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.codes = codes


@dataclass(frozen=True)
class ManifestInfo:
    """A manifest as the registry serves it."""

    digest: str
    media_type: str
    raw: bytes
    size: int
    """Bytes of the image: its layers plus its config; for an index, the largest of its manifests."""

    def json(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.raw)
        return loaded


def check_repo(repo: str) -> str:
    # the name goes into URLs and storage paths: keep to what a registry accepts, no "..", no "/" ends
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", repo):
        raise ValueError(f"invalid repository name {repo!r}")
    return repo


class RegistryApi:
    """Registry HTTP API v2 calls to the registry at ``host``:``_bound_port``."""

    host: str
    _bound_port: int

    @property
    def address(self) -> str:
        """``HOST:PORT``, the registry part of an image name pushed here."""
        return f"{self.host}:{self._bound_port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def _request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = http.client.HTTPConnection(self.host, self._bound_port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.headers, response.read()
        finally:
            conn.close()

    def _api(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        try:
            return self._request(method, path, headers, body)
        except OSError as exc:
            raise RegistryError(f"the local registry at {self.url} is not answering: {exc}") from exc

    def _paged(self, path: str, key: str) -> list[str]:
        """Follow ``Link: <...>; rel="next"`` pages; [] when the registry answers 404."""
        out: list[str] = []
        next_path: str | None = path
        while next_path:
            status, headers, body = self._api("GET", next_path)
            if status == 404:
                return []
            if status != 200:
                raise _api_error(f"GET {next_path}", status, body)
            out.extend(json.loads(body).get(key) or [])
            link = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', headers.get("Link", ""))
            next_path = link.group(1) if link else None
        return out

    def repositories(self) -> list[str]:
        """The registry's catalog (``/v2/_catalog``): repositories that hold layers."""
        return sorted(self._paged("/v2/_catalog?n=1000", "repositories"))

    def tags(self, repo: str) -> list[str]:
        """The tags of ``repo``; [] when the repository is unknown."""
        return sorted(self._paged(f"/v2/{check_repo(repo)}/tags/list?n=1000", "tags"))

    def manifest(self, repo: str, reference: str) -> ManifestInfo | None:
        """The manifest ``repo:reference`` (a tag or a digest), or None when there is none."""
        path = f"/v2/{check_repo(repo)}/manifests/{quote(reference, safe=':')}"
        status, headers, body = self._api("GET", path, {"Accept": ", ".join(MANIFEST_TYPES)})
        if status == 404:
            return None
        if status != 200:
            raise _api_error(f"GET {path}", status, body)
        document = json.loads(body)
        media_type = document.get("mediaType") or headers.get_content_type()
        digest = headers.get("Docker-Content-Digest") or _sha256(body)
        if media_type in INDEX_TYPES:
            sizes = [
                child.size
                for entry in document.get("manifests") or []
                if _DIGEST.fullmatch(str(entry.get("digest")))
                and (child := self.manifest(repo, entry["digest"])) is not None
            ]
            size = max(sizes, default=0)
        else:
            config = document.get("config") or {}
            size = int(config.get("size") or 0) + sum(
                int(layer.get("size") or 0) for layer in document.get("layers") or []
            )
        return ManifestInfo(digest=digest, media_type=media_type, raw=body, size=size)

    def put_manifest(self, repo: str, reference: str, raw: bytes, media_type: str) -> str:
        """Store ``raw`` as ``repo:reference`` (a tag, or its own digest); returns its digest.

        Raises :class:`RegistryError` with the registry's error ``codes`` when it refuses (for example
        ``MANIFEST_BLOB_UNKNOWN`` when a layer or the config is not in the repository).
        """
        path = f"/v2/{check_repo(repo)}/manifests/{quote(reference, safe=':')}"
        status, headers, body = self._api("PUT", path, {"Content-Type": media_type}, raw)
        if status in (200, 201):
            return headers.get("Docker-Content-Digest") or _sha256(raw)
        raise _api_error(f"PUT {path}", status, body)

    def delete_manifest(self, repo: str, digest: str) -> bool:
        """Delete a manifest (and every tag on it); False when it was not there."""
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        path = f"/v2/{check_repo(repo)}/manifests/{digest}"
        status, _, body = self._api("DELETE", path)
        if status in (200, 202):
            return True
        if status == 404:
            return False
        raise _api_error(f"DELETE {path}", status, body)


def _api_error(what: str, status: int, body: bytes) -> RegistryError:
    codes: list[str] = []
    messages: list[str] = []
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        for error in json.loads(body).get("errors") or []:
            codes.append(str(error.get("code")))
            detail = error.get("detail")
            messages.append(
                f"{error.get('code')}: {error.get('message')}" + (f" ({detail})" if detail else "")
            )
    text = "; ".join(messages) or repr(body[:500])
    return RegistryError(f"{what}: HTTP {status}: {text}", status=status, codes=tuple(codes))


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
