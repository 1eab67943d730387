"""Installing the local ECR into moto: :func:`check_compatible` and :func:`install`.

The patches are named functions in :mod:`.backend`, :mod:`.responses` and :mod:`.store`, each listing
its :class:`~lmforge.local.moto_patch.Patch` es and the moto attributes it reaches into; the registry
they serve from is held in :mod:`.errors` (:func:`~lmforge.local.ecr.errors.serve`), not on moto's
classes.
"""

from __future__ import annotations

from lmforge.local.ecr import backend, responses, store
from lmforge.local.ecr.errors import serve
from lmforge.local.moto_patch import Patch, Reach, apply, check, patched_reaches
from lmforge.local.registry import LocalRegistry

#: every patch of moto's ECR
PATCHES: tuple[Patch, ...] = (*backend.PATCHES, *responses.PATCHES, *store.PATCHES)

#: every moto attribute the patches use: those they replace and those they call or read
REACHES: tuple[Reach, ...] = (
    *patched_reaches(PATCHES),
    *backend.REACHES,
    *responses.REACHES,
    *store.REACHES,
)


def check_compatible() -> None:
    """Raise RuntimeError, naming each attribute and the moto version tested, when the installed moto
    lacks what the patches rely on."""
    check("lmforge.local.ecr", REACHES)


def install(registry: LocalRegistry | None, *, unavailable_reason: str | None = None) -> None:
    """Serve moto's ECR image calls from ``registry`` (idempotent per process; the last one given wins).

    ``registry`` None: moto's own image calls, and ``GetAuthorizationToken`` fails with
    ``unavailable_reason`` (or a reason found here, such as a missing registry binary).
    """
    check_compatible()
    serve(registry, unavailable_reason)
    apply(PATCHES)
