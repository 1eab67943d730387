"""moto's ``ECRBackend`` image calls, served from the local registry (see :mod:`lmforge.local.ecr`)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from lmforge.local.ecr.errors import live, registry_errors, service_error
from lmforge.local.ecr.images import RegistryImage, failure, filter_tag_status, find, registry_images
from lmforge.local.registry import RegistryError

#: the ``ECRBackend`` methods :func:`patch_backend` replaces
PATCHED_METHODS = (
    "delete_repository",
    "list_images",
    "describe_images",
    "batch_get_image",
    "batch_delete_image",
    "put_image",
)


def patch_backend(backend_cls: Any, exceptions: Any) -> None:
    """Serve ``backend_cls``'s image calls and ``delete_repository`` from the registry :func:`live` names."""
    original = {name: getattr(backend_cls, name) for name in PATCHED_METHODS}
    invalid = exceptions.InvalidParameterException

    def delete_repository(
        self: Any, repository_name: str, registry_id: str | None = None, force: bool = False
    ) -> Any:
        registry = live(backend_cls)
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
        registry = live(backend_cls)
        if registry is None:
            return original["list_images"](self, repository_name, registry_id, tag_status)
        repo = self._get_repository(repository_name, registry_id)
        return filter_tag_status(registry_images(registry, repo), tag_status)

    def describe_images(
        self: Any,
        repository_name: str,
        registry_id: str | None = None,
        image_ids: list[dict[str, str]] | None = None,
        tag_status: str | None = None,
    ) -> Any:
        registry = live(backend_cls)
        if registry is None:
            return original["describe_images"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = registry_images(registry, repo)
        if not image_ids:
            return filter_tag_status(images, tag_status)
        found: list[RegistryImage] = []
        for image_id in image_ids:
            image, code = find(images, image_id)
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
        registry = live(backend_cls)
        if registry is None:
            return original["batch_get_image"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = registry_images(registry, repo)
        response: dict[str, list[Any]] = {"images": [], "failures": []}
        for image_id in image_ids or []:
            image, code = find(images, image_id)
            if image is None:
                response["failures"].append(failure(image_id, code))
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
        registry = live(backend_cls)
        if registry is None:
            return original["batch_delete_image"](self, repository_name, registry_id, image_ids)
        repo = self._get_repository(repository_name, registry_id)
        images = registry_images(registry, repo)
        response: dict[str, list[Any]] = {"imageIds": [], "failures": []}
        for image_id in image_ids or []:
            image, code = find(images, image_id)
            if image is None:
                response["failures"].append(failure(image_id, code))
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
        registry = live(backend_cls)
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
            raise service_error(
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
        setattr(backend_cls, name, registry_errors(backend_cls, method))
