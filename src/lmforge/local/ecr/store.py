"""Repository persistence: moto's ECR repositories are recorded beside the registry's storage
(``repositories.json``) and re-created by :func:`restore_repositories` after a restart."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lmforge.local.ecr.errors import live
from lmforge.local.moto_patch import Patch, Reach, original
from lmforge.local.registry import LocalRegistry

log = logging.getLogger("lmforge.local")

BACKEND = "moto.ecr.models:ECRBackend"


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


def create_repository(self: Any, repository_name: str, *args: Any, **kwargs: Any) -> Any:
    """``CreateRepository``: moto's, and the repository recorded beside the registry's storage."""
    repo = original(BACKEND, "create_repository")(self, repository_name, *args, **kwargs)
    if (registry := live()) is not None:
        value = getattr(repo, "image_tag_mutability", "MUTABLE")
        mutability = str(getattr(value, "value", value))  # moto keeps an enum
        entry = {"account": self.account_id, "region": self.region_name, "name": repository_name}
        _record(registry, {**entry, "mutability": mutability}, present=True)
    return repo


def recorded_delete(backend: Any, repository_name: str) -> None:
    """Drop the record of ``backend``'s repository ``repository_name`` (``DeleteRepository`` succeeded)."""
    if (registry := live()) is not None:
        entry = {"account": backend.account_id, "region": backend.region_name, "name": repository_name}
        _record(registry, entry, present=False)


#: the ``ECRBackend`` method replaced here (``delete_repository``'s patch, in :mod:`.backend`, records too)
PATCHES: tuple[Patch, ...] = (Patch(BACKEND, "create_repository", create_repository),)

#: what else of moto the persistence uses
REACHES: tuple[Reach, ...] = (
    Reach("moto.ecr.models", ("ecr_backends",)),
    Reach(BACKEND, ("account_id", "region_name", "repositories"), set_in="__init__"),
)
