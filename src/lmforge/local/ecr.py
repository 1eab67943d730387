"""A local ECR: moto's ECR control plane with the images in a real registry (:mod:`lmforge.local.registry`).

A client does exactly what it does with real ECR: ``CreateRepository``, ``GetAuthorizationToken``,
``docker login``/``podman login`` to the returned ``proxyEndpoint``, push ``HOST:PORT/REPO:TAG`` (the
endpoint's host), then ``DescribeImages`` & co. Here ``proxyEndpoint`` is the local registry
(``http://127.0.0.1:PORT``), so the push lands in it, and the image calls read what is really there.

What :func:`install` changes in moto's ECR (moto 5.2; everything else is moto's own behaviour):

- ``GetAuthorizationToken``: ``authorizationToken`` is base64 of ``AWS:<random token>``,
  ``proxyEndpoint`` the local registry's URL, ``expiresAt`` 12 hours ahead. The registry has no auth
  and accepts any credentials. Without a running registry the call fails with ``ServerException``
  saying why.
- ``DescribeImages``, ``ListImages``, ``BatchGetImage``, ``BatchDeleteImage`` answer from the
  registry (registry repository name == ECR repository name) for repositories that exist in moto:
  every manifest in the repository, tagged or not (an index's platform manifests count as untagged
  images, as in ECR), with ``imageSizeInBytes`` (layers + config; an index: its largest manifest),
  ``imagePushedAt`` (the time the registry stored the manifest in that repository),
  ``imageManifestMediaType`` and ``artifactMediaType``. ``filter.tagStatus``, ``maxResults`` and
  ``nextToken`` work (100 results a page by default, as in ECR). A missing image is
  ``ImageNotFoundException`` (DescribeImages) or a ``failures`` entry (the batch calls). Deleting by
  tag removes only that tag when the image has others.
- ``PutImage`` stores the manifest in the registry (so ``BatchGetImage`` + ``PutImage`` retags an
  image, as with ECR); a manifest whose blobs are not in the repository is ``LayersNotFoundException``.
- ``DeleteRepository`` counts the registry's images (``RepositoryNotEmptyException`` without
  ``force``); with ``force`` it deletes them and drops the repository from the registry.

:func:`parse_ecr_uri` splits an ECR image URI; :func:`resolve` maps one of the local account to the
name to pull from the local registry.

Limitations: one registry serves every region and account, by repository name (the same name in two
regions shares images; :func:`resolve` ignores the region). The registry accepts pushes to any name,
including repositories that do not exist in moto (ECR refuses them), and does not enforce tag
immutability or lifecycle policies. moto's repositories live in memory while the registry's storage
persists, so a repository created again after a restart shows the images still stored under its name.
The layer-upload calls (``InitiateLayerUpload`` & co.) and image scans stay moto's in-memory
emulation. ``BatchGetImage`` ignores ``acceptedMediaTypes`` (no manifest conversion).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import logging
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from lmforge.local.registry import INDEX_TYPES, LocalRegistry, ManifestInfo, RegistryError

log = logging.getLogger("lmforge.local")
_PATCHED = "_lmforge_ecr_patched"
TOKEN_LIFETIME = timedelta(hours=12)
DEFAULT_PAGE = 100
MAX_PAGE = 1000

_NAME = r"(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*"
_ECR_URI = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)"
    r"\.(?P<domain>amazonaws\.com(?:\.cn)?)"
    rf"/(?P<repository>{_NAME})"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?"
)
_DIGEST_SYNTAX = re.compile(r"[a-zA-Z0-9_+.-]+:[a-fA-F0-9]+")


# ---- image URIs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class EcrImage:
    """``ACCOUNT.dkr.ecr.REGION.amazonaws.com[.cn]/REPOSITORY[:TAG][@DIGEST]``, split."""

    account: str
    region: str
    repository: str
    tag: str | None
    """The tag; ``latest`` when the URI names neither a tag nor a digest."""
    digest: str | None
    domain: str = "amazonaws.com"

    @property
    def host(self) -> str:
        return f"{self.account}.dkr.ecr.{self.region}.{self.domain}"

    @property
    def reference(self) -> str:
        """What to ask a registry for: the digest when there is one (it wins over a tag), else the tag."""
        return self.digest or self.tag or "latest"


def parse_ecr_uri(uri: str) -> EcrImage | None:
    """Split an ECR image URI; None when ``uri`` is not one (another registry, a bare name, ...)."""
    match = _ECR_URI.fullmatch(uri.strip())
    if match is None:
        return None
    tag, digest = match["tag"], match["digest"]
    return EcrImage(
        account=match["account"],
        region=match["region"],
        repository=match["repository"],
        tag=tag if tag or digest else "latest",
        digest=digest,
        domain=match["domain"],
    )


def resolve(image_uri: str, account: str, registry: LocalRegistry) -> str | None:
    """``ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPO[:TAG|@DIGEST]`` of ``account`` -> the name in
    ``registry`` (``127.0.0.1:PORT/REPO:TAG`` or ``...@DIGEST``); None for any other image.

    Every region maps to the same registry (see the module's limitations).
    """
    image = parse_ecr_uri(image_uri)
    if image is None or image.account != account:
        return None
    if image.digest:
        return f"{registry.address}/{image.repository}@{image.digest}"
    return f"{registry.address}/{image.repository}:{image.tag}"


# ---- the images of a repository, as the registry holds them ----------------------------------------


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


def _registry_images(registry: LocalRegistry, repo: Any) -> list[RegistryImage]:
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


def _filter_tag_status(images: list[RegistryImage], tag_status: str | None) -> list[RegistryImage]:
    if tag_status == "TAGGED":
        return [image for image in images if image.image_tags]
    if tag_status == "UNTAGGED":
        return [image for image in images if not image.image_tags]
    return images


def _find(images: Sequence[RegistryImage], image_id: dict[str, str]) -> tuple[RegistryImage | None, str]:
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


def _failure(image_id: dict[str, str], code: str) -> dict[str, Any]:
    requested = {k: image_id[k] for k in ("imageDigest", "imageTag") if image_id.get(k)}
    return {"imageId": requested, "failureCode": code, "failureReason": _FAILURE_REASONS[code]}


# ---- pagination -------------------------------------------------------------------------------


def _page(
    items: list[Any], max_results: int | None, next_token: str | None, invalid: Callable[[str], Exception]
) -> tuple[list[Any], str | None]:
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


# ---- the patches -----------------------------------------------------------------------------------


def _moto() -> tuple[Any, Any, Any]:
    from moto.ecr import exceptions, models, responses

    return models, responses, exceptions


def check_compatible() -> None:
    """Raise RuntimeError when the installed moto lacks what the patches below rely on."""
    models, responses, exceptions = _moto()
    needed: dict[Any, list[str]] = {
        models: ["ECRBackend"],
        models.ECRBackend: [
            "_get_repository",
            "delete_repository",
            "list_images",
            "describe_images",
            "batch_get_image",
            "batch_delete_image",
            "put_image",
        ],
        models.Repository: ["is_tag_immutable"],
        responses.ECRResponse: ["describe_images", "list_images", "get_authorization_token", "_get_param"],
        responses: ["ActionResult"],
        exceptions: [
            "ImageAlreadyExistsException",
            "ImageNotFoundException",
            "InvalidParameterException",
            "RepositoryNotEmptyException",
        ],
    }
    missing = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, names in needed.items()
        for name in names
        if not hasattr(owner, name)
    ]
    if missing:
        import moto

        raise RuntimeError(
            f"moto {moto.__version__} lacks {', '.join(missing)}; install the version lmforge pins "
            "(pip install -e '.[local]')"
        )


@functools.cache
def _error_class() -> type[Exception]:
    from moto.core.exceptions import ServiceException

    # defined here, not taken from moto.core: moto looks an error up by its module's service too
    class LocalEcrError(ServiceException):  # type: ignore[misc]
        pass

    return LocalEcrError


def _service_error(code: str, message: str) -> Exception:
    """An ECR error of ``code`` (one of the ECR model's error shapes)."""
    return _error_class()(code, message)


def _not_running(backend_cls: Any) -> Exception:
    from lmforge.local.registry import find_registry_binary, missing_binary_message

    registry: LocalRegistry | None = backend_cls._lmforge_registry
    if registry is not None:
        why = f"it stopped (its log: {registry.log_path})"
    elif reason := backend_cls._lmforge_registry_reason:
        why = reason
    elif find_registry_binary() is None:
        why = missing_binary_message()
    else:
        why = "the local SageMaker was started without one"
    return _service_error("ServerException", f"The local ECR registry is not running: {why}")


def install(registry: LocalRegistry | None, *, unavailable_reason: str | None = None) -> None:
    """Serve moto's ECR image calls from ``registry`` (idempotent per process; the last one given wins).

    ``registry`` None: moto's own image calls, and ``GetAuthorizationToken`` fails with
    ``unavailable_reason`` (or a reason found here, such as a missing registry binary).
    """
    models, responses, exceptions = _moto()
    check_compatible()
    backend_cls = models.ECRBackend
    backend_cls._lmforge_registry = registry
    backend_cls._lmforge_registry_reason = unavailable_reason
    if getattr(backend_cls, _PATCHED, False):
        return
    setattr(backend_cls, _PATCHED, True)
    _patch_backend(backend_cls, exceptions)
    _patch_responses(responses.ECRResponse, responses.ActionResult, backend_cls, exceptions)
    _patch_persistence(backend_cls)


def restore_repositories(registry: LocalRegistry) -> int:
    """Re-create the repositories recorded in ``registry``'s folder (an earlier run created them): the
    registry's storage outlives the local SageMaker, so its repositories must too. Returns how many."""
    from moto.ecr.models import ecr_backends

    restored = 0
    for entry in _recorded(registry):
        try:
            backend = ecr_backends[entry["account"]][entry["region"]]
            if entry["name"] in backend.repositories:
                continue
            mutability = str(entry.get("mutability") or "MUTABLE").rsplit(".", 1)[-1]
            backend.create_repository(entry["name"], None, {}, {}, mutability, [])
        except Exception as exc:  # a damaged record must not stop the local SageMaker
            log.warning("local ECR: repository %s not restored: %s", entry.get("name"), exc)
            continue
        restored += 1
    return restored


def _record_path(registry: LocalRegistry) -> Path:
    return registry.dir / "repositories.json"


def _recorded(registry: LocalRegistry) -> list[dict[str, str]]:
    try:
        data = json.loads(_record_path(registry).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def _record(registry: LocalRegistry, entry: dict[str, str], present: bool) -> None:
    key = (entry["account"], entry["region"], entry["name"])
    entries = [e for e in _recorded(registry) if (e.get("account"), e.get("region"), e.get("name")) != key]
    if present:
        entries.append(entry)
    path = _record_path(registry)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(entries, indent=1) + "\n")
    tmp.replace(path)


def _patch_persistence(backend_cls: Any) -> None:
    """Record created and deleted repositories beside the registry's storage."""
    create, delete = backend_cls.create_repository, backend_cls.delete_repository

    def create_repository(self: Any, repository_name: str, *args: Any, **kwargs: Any) -> Any:
        repo = create(self, repository_name, *args, **kwargs)
        if (registry := _live(backend_cls)) is not None:
            value = getattr(repo, "image_tag_mutability", "MUTABLE")
            mutability = str(getattr(value, "value", value))  # moto keeps an enum
            entry = {"account": self.account_id, "region": self.region_name, "name": repository_name}
            _record(registry, {**entry, "mutability": mutability}, present=True)
        return repo

    def delete_repository(self: Any, repository_name: str, *args: Any, **kwargs: Any) -> Any:
        repo = delete(self, repository_name, *args, **kwargs)
        if (registry := _live(backend_cls)) is not None:
            entry = {"account": self.account_id, "region": self.region_name, "name": repository_name}
            _record(registry, entry, present=False)
        return repo

    backend_cls.create_repository = create_repository
    backend_cls.delete_repository = delete_repository


def _live(backend_cls: Any) -> LocalRegistry | None:
    registry: LocalRegistry | None = backend_cls._lmforge_registry
    return registry


def _registry_errors(backend_cls: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a registry that does not answer into a ServerException that says so."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except RegistryError as exc:
            registry = _live(backend_cls)
            if registry is not None and not registry.running:
                raise _not_running(backend_cls) from exc
            raise _service_error("ServerException", f"The local ECR registry failed: {exc}") from exc

    call.__name__ = getattr(method, "__name__", "call")
    return call


def _patch_backend(backend_cls: Any, exceptions: Any) -> None:
    original = {
        name: getattr(backend_cls, name)
        for name in (
            "delete_repository",
            "list_images",
            "describe_images",
            "batch_get_image",
            "batch_delete_image",
            "put_image",
        )
    }
    invalid = exceptions.InvalidParameterException

    def delete_repository(
        self: Any, repository_name: str, registry_id: str | None = None, force: bool = False
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["delete_repository"](self, repository_name, registry_id, force)
        repo = self._get_repository(repository_name, registry_id)
        if force:
            registry.remove_repository(repo.name)
        elif repo.images or registry.manifest_digests(repo.name):
            raise exceptions.RepositoryNotEmptyException(repository_name, registry_id or self.account_id)
        return original["delete_repository"](self, repository_name, registry_id, True)

    def list_images(
        self: Any, repository_name: str, registry_id: str | None = None, tag_status: str = "ANY"
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["list_images"](self, repository_name, registry_id, tag_status)
        repo = self._get_repository(repository_name, registry_id)
        return _filter_tag_status(_registry_images(registry, repo), tag_status)

    def describe_images(
        self: Any,
        repository_name: str,
        registry_id: str | None = None,
        image_ids: list[dict[str, str]] | None = None,
        tag_status: str | None = None,
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["describe_images"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = _registry_images(registry, repo)
        if not image_ids:
            return _filter_tag_status(images, tag_status)
        found: list[RegistryImage] = []
        for image_id in image_ids:
            image, code = _find(images, image_id)
            if code in ("MissingDigestAndTag", "InvalidImageDigest"):
                raise invalid(f"Invalid parameter at 'imageIds' failed to satisfy constraint: '{code}'")
            if image is None:
                shown = (
                    f"{{imageDigest:'{image_id.get('imageDigest') or 'null'}', "
                    f"imageTag:'{image_id.get('imageTag') or 'null'}'}}"
                )
                raise exceptions.ImageNotFoundException(
                    image_id=shown, repository_name=repository_name, registry_id=repo.registry_id
                )
            if all(image is not other for other in found):
                found.append(image)
        return found

    def batch_get_image(
        self: Any,
        repository_name: str,
        registry_id: str | None = None,
        image_ids: list[dict[str, str]] | None = None,
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["batch_get_image"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = _registry_images(registry, repo)
        response: dict[str, list[Any]] = {"images": [], "failures": []}
        for image_id in image_ids or []:
            image, code = _find(images, image_id)
            if image is None:
                response["failures"].append(_failure(image_id, code))
                continue
            requested = {"imageDigest": image.image_digest}
            if image_id.get("imageTag"):
                requested["imageTag"] = image_id["imageTag"]
            response["images"].append(
                {
                    "registryId": repo.registry_id,
                    "repositoryName": repo.name,
                    "imageId": requested,
                    "imageManifest": image.image_manifest,
                    "imageManifestMediaType": image.image_manifest_media_type,
                }
            )
        return response

    def batch_delete_image(
        self: Any,
        repository_name: str,
        registry_id: str | None = None,
        image_ids: list[dict[str, str]] | None = None,
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["batch_delete_image"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = _registry_images(registry, repo)
        response: dict[str, list[Any]] = {"imageIds": [], "failures": []}
        for image_id in image_ids or []:
            image, code = _find(images, image_id)
            if image is None:
                response["failures"].append(_failure(image_id, code))
                continue
            tag = image_id.get("imageTag")
            if tag and not image_id.get("imageDigest") and len(image.image_tags) > 1:
                registry.untag(repo.name, tag)  # ECR removes just this tag
                image.image_tags.remove(tag)
                response["imageIds"].append({"imageDigest": image.image_digest, "imageTag": tag})
                continue
            registry.delete_manifest(repo.name, image.image_digest)  # the registry drops its tags too
            images.remove(image)
            response["imageIds"].extend(
                {"imageDigest": image.image_digest, "imageTag": t} for t in image.image_tags
            )
            if not image.image_tags:
                response["imageIds"].append({"imageDigest": image.image_digest})
        return response

    def put_image(
        self: Any,
        repository_name: str,
        image_manifest: str,
        image_tag: str | None,
        image_manifest_mediatype: str | None = None,
        digest: str | None = None,
    ) -> Any:
        registry = _live(backend_cls)
        if registry is None:
            return original["put_image"](
                self, repository_name, image_manifest, image_tag, image_manifest_mediatype, digest
            )
        repo = self._get_repository(repository_name)
        try:
            document = json.loads(image_manifest)
        except ValueError:
            raise invalid(
                "Invalid parameter at 'ImageManifest' failed to satisfy constraint: 'Invalid JSON syntax'"
            ) from None
        if not isinstance(document, dict):
            raise invalid(
                "Invalid parameter at 'ImageManifest' failed to satisfy constraint: 'not an object'"
            )
        media_type = image_manifest_mediatype or document.get("mediaType")
        if not media_type:
            raise invalid("image manifest mediatype not provided in manifest or parameter")
        raw = image_manifest.encode()
        computed = "sha256:" + hashlib.sha256(raw).hexdigest()
        if digest and digest != computed:
            raise _service_error(
                "ImageDigestDoesNotMatchException",
                f"Invalid parameter at 'imageDigest' failed to satisfy constraint: "
                f"'the image digest {digest} does not match the digest {computed} of the manifest'",
            )
        if image_tag:
            current = registry.manifest(repo.name, image_tag)
            if current is not None and current.digest == computed:
                raise exceptions.ImageAlreadyExistsException(
                    registry_id=repo.registry_id,
                    image_tag=image_tag,
                    digest=computed,
                    repository_name=repo.name,
                )
            if current is not None and repo.is_tag_immutable():
                raise _service_error(
                    "ImageTagAlreadyExistsException",
                    f"The image tag '{image_tag}' already exists in the '{repo.name}' repository and "
                    "cannot be overwritten because the repository is immutable.",
                )
        try:
            stored = registry.put_manifest(repo.name, image_tag or computed, raw, media_type)
        except RegistryError as exc:
            if exc.status is not None and {"MANIFEST_BLOB_UNKNOWN", "BLOB_UNKNOWN"} & set(exc.codes):
                raise _service_error(
                    "LayersNotFoundException",
                    f"Layers required for pushing image into repository with name '{repo.name}' in "
                    f"registry with id '{repo.registry_id}' do not exist ({exc})",
                ) from None
            if exc.status is not None and exc.status < 500:
                raise invalid(f"Invalid parameter at 'ImageManifest': {exc}") from None
            raise
        image_id = {"imageDigest": stored}
        if image_tag:
            image_id["imageTag"] = image_tag
        return {
            "registryId": repo.registry_id,
            "repositoryName": repo.name,
            "imageId": image_id,
            "imageManifest": image_manifest,
            "imageManifestMediaType": media_type,
        }

    for name, method in (
        ("delete_repository", delete_repository),
        ("list_images", list_images),
        ("describe_images", describe_images),
        ("batch_get_image", batch_get_image),
        ("batch_delete_image", batch_delete_image),
        ("put_image", put_image),
    ):
        setattr(backend_cls, name, _registry_errors(backend_cls, method))


def _patch_responses(response_cls: Any, action_result: Any, backend_cls: Any, exceptions: Any) -> None:
    invalid = exceptions.InvalidParameterException
    original_describe = response_cls.describe_images
    original_list = response_cls.list_images

    def describe_images(self: Any) -> Any:
        if _live(backend_cls) is None:
            return original_describe(self)
        image_ids = self._get_param("imageIds")
        max_results, next_token = self._get_param("maxResults"), self._get_param("nextToken")
        if image_ids and (max_results is not None or next_token):
            raise invalid(
                "Invalid parameter at 'imageIds': maxResults and nextToken cannot be used with imageIds"
            )
        images = self.ecr_backend.describe_images(
            self._get_param("repositoryName"),
            self._get_param("registryId"),
            image_ids,
            tag_status=(self._get_param("filter") or {}).get("tagStatus"),
        )
        token = None
        if not image_ids:
            images, token = _page(list(images), max_results, next_token, invalid)
        result: dict[str, Any] = {"imageDetails": [image.detail() for image in images]}
        if token:
            result["nextToken"] = token
        return action_result(result)

    def list_images(self: Any) -> Any:
        if _live(backend_cls) is None:
            return original_list(self)
        images = self.ecr_backend.list_images(
            self._get_param("repositoryName"),
            self._get_param("registryId"),
            tag_status=(self._get_param("filter") or {}).get("tagStatus", "ANY"),
        )
        ids: list[dict[str, str]] = []
        for image in images:
            ids.extend({"imageDigest": image.image_digest, "imageTag": tag} for tag in image.image_tags)
            if not image.image_tags:
                ids.append({"imageDigest": image.image_digest})
        page, token = _page(ids, self._get_param("maxResults"), self._get_param("nextToken"), invalid)
        result: dict[str, Any] = {"imageIds": page}
        if token:
            result["nextToken"] = token
        return action_result(result)

    def get_authorization_token(self: Any) -> Any:
        registry = _live(backend_cls)
        if registry is None or not registry.running:
            raise _not_running(backend_cls)
        expires = datetime.now(UTC) + TOKEN_LIFETIME
        data = [
            {
                "authorizationToken": base64.b64encode(f"AWS:{secrets.token_urlsafe(48)}".encode()).decode(),
                "expiresAt": expires,
                "proxyEndpoint": registry.url,
            }
            for _ in self._get_param("registryIds") or [self.current_account]
        ]
        return action_result({"authorizationData": data})

    response_cls.describe_images = describe_images
    response_cls.list_images = list_images
    response_cls.get_authorization_token = get_authorization_token
