"""moto's ``ECRResponse`` handlers: paginated DescribeImages/ListImages and GetAuthorizationToken
pointing at the local registry (see :mod:`lmforge.local.ecr`)."""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from lmforge.local.ecr.errors import live, not_running
from lmforge.local.ecr.images import paginate

TOKEN_LIFETIME = timedelta(hours=12)


def patch_responses(response_cls: Any, action_result: Any, backend_cls: Any, exceptions: Any) -> None:
    """Replace ``response_cls``'s DescribeImages, ListImages and GetAuthorizationToken handlers."""
    invalid = exceptions.InvalidParameterException
    original_describe = response_cls.describe_images
    original_list = response_cls.list_images

    def describe_images(self: Any) -> Any:
        if live(backend_cls) is None:
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
            images, token = paginate(list(images), max_results, next_token, invalid)
        result: dict[str, Any] = {"imageDetails": [image.detail() for image in images]}
        if token:
            result["nextToken"] = token
        return action_result(result)

    def list_images(self: Any) -> Any:
        if live(backend_cls) is None:
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
        page, token = paginate(ids, self._get_param("maxResults"), self._get_param("nextToken"), invalid)
        result: dict[str, Any] = {"imageIds": page}
        if token:
            result["nextToken"] = token
        return action_result(result)

    def get_authorization_token(self: Any) -> Any:
        registry = live(backend_cls)
        if registry is None or not registry.running:
            raise not_running(backend_cls)
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
