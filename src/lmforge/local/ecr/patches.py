"""Installing the local ECR into moto: :func:`check_compatible` and :func:`install`."""

from __future__ import annotations

from typing import Any

from lmforge.local.ecr.backend import PATCHED_METHODS, patch_backend
from lmforge.local.ecr.responses import patch_responses
from lmforge.local.ecr.store import patch_persistence
from lmforge.local.registry import LocalRegistry

_PATCHED = "_lmforge_ecr_patched"


def _moto() -> tuple[Any, Any, Any]:
    from moto.ecr import exceptions, models, responses

    return models, responses, exceptions


def check_compatible() -> None:
    """Raise RuntimeError when the installed moto lacks what the patches rely on."""
    models, responses, exceptions = _moto()
    needed: dict[Any, list[str]] = {
        models: ["ECRBackend"],
        models.ECRBackend: ["_get_repository", *PATCHED_METHODS],
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
    patch_backend(backend_cls, exceptions)
    patch_responses(responses.ECRResponse, responses.ActionResult, backend_cls, exceptions)
    patch_persistence(backend_cls)
