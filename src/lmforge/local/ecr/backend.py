"""moto's ``ECRBackend`` image calls, served from the local registry (see :mod:`lmforge.local.ecr`).

Each call is a named function that serves from the registry :func:`live` names, or calls moto's own
method when there is none; :data:`PATCHES` installs them (each turning a registry that does not answer
into a ``ServerException``), :data:`REACHES` lists what else of moto they use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from lmforge.local.ecr.errors import live, moto_errors, registry_errors, service_error
from lmforge.local.ecr.images import RegistryImage, failure, filter_tag_status, find, registry_images
from lmforge.local.ecr.store import recorded_delete
from lmforge.local.moto_patch import Patch, Reach, original
from lmforge.local.registry import RegistryError

BACKEND = "moto.ecr.models:ECRBackend"


def _serve_delete_repository(
    self: Any, repository_name: str, registry_id: str | None = None, force: bool = False
) -> Any:
    """The registry's part of :func:`delete_repository`: its images counted, or deleted with ``force``."""
    registry = live()
    if registry is None:
        return original(BACKEND, "delete_repository")(self, repository_name, registry_id, force)
    repo = self._get_repository(repository_name, registry_id)
    if force:
        registry.remove_repository(repo.name)
    elif repo.images or registry.manifest_digests(repo.name):
        raise moto_errors().RepositoryNotEmptyException(repository_name, registry_id or self.account_id)
    return original(BACKEND, "delete_repository")(self, repository_name, registry_id, True)


def list_images(
    self: Any, repository_name: str, registry_id: str | None = None, tag_status: str = "ANY"
) -> Any:
    """``ListImages`` of the registry's images (``tag_status`` filters)."""
    registry = live()
    if registry is None:
        return original(BACKEND, "list_images")(self, repository_name, registry_id, tag_status)
    repo = self._get_repository(repository_name, registry_id)
    return filter_tag_status(registry_images(registry, repo), tag_status)


def describe_images(
    self: Any,
    repository_name: str,
    registry_id: str | None = None,
    image_ids: list[dict[str, str]] | None = None,
    tag_status: str | None = None,
) -> Any:
    """``DescribeImages`` of the registry's images: those ``image_ids`` name, or all by ``tag_status``."""
    registry = live()
    if registry is None:
        return original(BACKEND, "describe_images")(self, repository_name, registry_id, image_ids)
    repo = self._get_repository(repository_name, registry_id)
    images = registry_images(registry, repo)
    if not image_ids:
        return filter_tag_status(images, tag_status)
    found: list[RegistryImage] = []
    for image_id in image_ids:
        image, code = find(images, image_id)
        if code in ("MissingDigestAndTag", "InvalidImageDigest"):
            raise moto_errors().InvalidParameterException(
                f"Invalid parameter at 'imageIds' failed to satisfy constraint: '{code}'"
            )
        if image is None:
            shown = (
                f"{{imageDigest:'{image_id.get('imageDigest') or 'null'}', "
                f"imageTag:'{image_id.get('imageTag') or 'null'}'}}"
            )
            raise moto_errors().ImageNotFoundException(
                image_id=shown, repository_name=repository_name, registry_id=repo.registry_id
            )
        if all(image is not other for other in found):
            found.append(image)
    return found


def _found(
    images: list[RegistryImage], image_ids: list[dict[str, str]] | None, failures: list[Any]
) -> Iterator[tuple[dict[str, str], RegistryImage]]:
    """Each of ``image_ids`` with the image it names; a ``failures`` entry (ECR's shape) for each that
    names none."""
    for image_id in image_ids or []:
        image, code = find(images, image_id)
        if image is None:
            failures.append(failure(image_id, code))
        else:
            yield image_id, image


def batch_get_image(
    self: Any,
    repository_name: str,
    registry_id: str | None = None,
    image_ids: list[dict[str, str]] | None = None,
) -> Any:
    """``BatchGetImage``: the registry's manifests ``image_ids`` name; a ``failures`` entry per missing."""
    registry = live()
    if registry is None:
        return original(BACKEND, "batch_get_image")(self, repository_name, registry_id, image_ids)
    repo = self._get_repository(repository_name, registry_id)
    images = registry_images(registry, repo)
    response: dict[str, list[Any]] = {"images": [], "failures": []}
    for image_id, image in _found(images, image_ids, response["failures"]):
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
    """``BatchDeleteImage``: deleting by tag removes only that tag when the image has others."""
    registry = live()
    if registry is None:
        return original(BACKEND, "batch_delete_image")(self, repository_name, registry_id, image_ids)
    repo = self._get_repository(repository_name, registry_id)
    images = registry_images(registry, repo)
    response: dict[str, list[Any]] = {"imageIds": [], "failures": []}
    for image_id, image in _found(images, image_ids, response["failures"]):
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
    """``PutImage``: the manifest stored in the registry (so it retags an image, as with ECR)."""
    registry = live()
    if registry is None:
        return original(BACKEND, "put_image")(
            self, repository_name, image_manifest, image_tag, image_manifest_mediatype, digest
        )
    repo = self._get_repository(repository_name)
    try:
        document = json.loads(image_manifest)
    except ValueError:
        raise moto_errors().InvalidParameterException(
            "Invalid parameter at 'ImageManifest' failed to satisfy constraint: 'Invalid JSON syntax'"
        ) from None
    if not isinstance(document, dict):
        raise moto_errors().InvalidParameterException(
            "Invalid parameter at 'ImageManifest' failed to satisfy constraint: 'not an object'"
        )
    media_type = image_manifest_mediatype or document.get("mediaType")
    if not media_type:
        raise moto_errors().InvalidParameterException(
            "image manifest mediatype not provided in manifest or parameter"
        )
    raw = image_manifest.encode()
    computed = "sha256:" + hashlib.sha256(raw).hexdigest()
    if digest and digest != computed:
        raise service_error(
            "ImageDigestDoesNotMatchException",
            f"Invalid parameter at 'imageDigest' failed to satisfy constraint: "
            f"'the image digest {digest} does not match the digest {computed} of the manifest'",
        )
    if image_tag:
        current = registry.manifest(repo.name, image_tag)
        if current is not None and current.digest == computed:
            raise moto_errors().ImageAlreadyExistsException(
                registry_id=repo.registry_id,
                image_tag=image_tag,
                digest=computed,
                repository_name=repo.name,
            )
        if current is not None and repo.is_tag_immutable():
            raise service_error(
                "ImageTagAlreadyExistsException",
                f"The image tag '{image_tag}' already exists in the '{repo.name}' repository and "
                "cannot be overwritten because the repository is immutable.",
            )
    try:
        stored = registry.put_manifest(repo.name, image_tag or computed, raw, media_type)
    except RegistryError as exc:
        if exc.status is not None and {"MANIFEST_BLOB_UNKNOWN", "BLOB_UNKNOWN"} & set(exc.codes):
            raise service_error(
                "LayersNotFoundException",
                f"Layers required for pushing image into repository with name '{repo.name}' in "
                f"registry with id '{repo.registry_id}' do not exist ({exc})",
            ) from None
        if exc.status is not None and exc.status < 500:
            raise moto_errors().InvalidParameterException(
                f"Invalid parameter at 'ImageManifest': {exc}"
            ) from None
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


def delete_repository(
    self: Any, repository_name: str, registry_id: str | None = None, force: bool = False
) -> Any:
    """``DeleteRepository`` counting the registry's images (``force``: they are deleted too), and the
    repository's record beside the registry's storage dropped (:mod:`.store`)."""
    repo = _served_delete_repository(self, repository_name, registry_id, force)
    recorded_delete(self, repository_name)
    return repo


_served_delete_repository = registry_errors(_serve_delete_repository)

#: the ``ECRBackend`` methods replaced (``create_repository``'s patch is :mod:`.store`'s)
PATCHES: tuple[Patch, ...] = (
    Patch(BACKEND, "delete_repository", delete_repository),
    *(
        Patch(BACKEND, method.__name__, registry_errors(method))
        for method in (list_images, describe_images, batch_get_image, batch_delete_image, put_image)
    ),
)

#: what else of moto the calls use
REACHES: tuple[Reach, ...] = (
    Reach(BACKEND, ("_get_repository",)),
    Reach(BACKEND, ("account_id",), set_in="__init__"),
    Reach("moto.ecr.models:Repository", ("is_tag_immutable",)),
    Reach("moto.ecr.models:Repository", ("name", "registry_id", "images"), set_in="__init__"),
    Reach(
        "moto.ecr.exceptions",
        (
            "ImageAlreadyExistsException",
            "ImageNotFoundException",
            "InvalidParameterException",
            "RepositoryNotEmptyException",
        ),
    ),
    Reach("moto.core.exceptions", ("ServiceException",)),
)
