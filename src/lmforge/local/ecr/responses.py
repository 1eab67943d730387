"""moto's ``ECRResponse`` handlers: paginated DescribeImages/ListImages and GetAuthorizationToken
pointing at the local registry (see :mod:`lmforge.local.ecr`)."""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from lmforge.local.ecr.errors import live, moto_errors, not_running
from lmforge.local.ecr.images import paginate
from lmforge.local.moto_patch import Patch, Reach, original

TOKEN_LIFETIME = timedelta(hours=12)

RESPONSE = "moto.ecr.responses:ECRResponse"


def _result(body: dict[str, Any]) -> Any:
    from moto.ecr.responses import ActionResult

    return ActionResult(body)


def describe_images(self: Any) -> Any:
    """``DescribeImages``, paginated, from the registry (moto's own without one)."""
    if live() is None:
        return original(RESPONSE, "describe_images")(self)
    image_ids = self._get_param("imageIds")
    max_results, next_token = self._get_param("maxResults"), self._get_param("nextToken")
    if image_ids and (max_results is not None or next_token):
        raise moto_errors().InvalidParameterException(
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
        images, token = paginate(
            list(images), max_results, next_token, moto_errors().InvalidParameterException
        )
    result: dict[str, Any] = {"imageDetails": [image.detail() for image in images]}
    if token:
        result["nextToken"] = token
    return _result(result)


def list_images(self: Any) -> Any:
    """``ListImages``, paginated, from the registry (moto's own without one)."""
    if live() is None:
        return original(RESPONSE, "list_images")(self)
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
    page, token = paginate(
        ids,
        self._get_param("maxResults"),
        self._get_param("nextToken"),
        moto_errors().InvalidParameterException,
    )
    result: dict[str, Any] = {"imageIds": page}
    if token:
        result["nextToken"] = token
    return _result(result)


def get_authorization_token(self: Any) -> Any:
    """``GetAuthorizationToken``: any token, ``proxyEndpoint`` the local registry (an error without one)."""
    registry = live()
    if registry is None or not registry.running:
        raise not_running()
    expires = datetime.now(UTC) + TOKEN_LIFETIME
    data = [
        {
            "authorizationToken": base64.b64encode(f"AWS:{secrets.token_urlsafe(48)}".encode()).decode(),
            "expiresAt": expires,
            "proxyEndpoint": registry.url,
        }
        for _ in self._get_param("registryIds") or [self.current_account]
    ]
    return _result({"authorizationData": data})


#: the ``ECRResponse`` handlers replaced
PATCHES: tuple[Patch, ...] = tuple(
    Patch(RESPONSE, handler.__name__, handler)
    for handler in (describe_images, list_images, get_authorization_token)
)

#: what else of moto the handlers use
REACHES: tuple[Reach, ...] = (
    Reach("moto.ecr.responses", ("ActionResult",)),
    Reach(RESPONSE, ("ecr_backend", "_get_param")),
    Reach(RESPONSE, ("current_account",), set_in="setup_class"),
)
