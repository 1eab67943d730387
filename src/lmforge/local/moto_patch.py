"""Patching moto, guarded: what lmforge's patches reach into, checked at start, and the patches applied once.

moto is pinned (``moto[server]==5.2.5`` in the ``local`` extra) and lmforge's extensions
(:mod:`.moto_ext`, :mod:`.inference_components`, :mod:`.ecr`, :mod:`.iam_ext`) replace or add methods
of its classes and read attributes of its objects. Each extension lists

- its :class:`Patch` es: one moto method replaced (or added) by one named lmforge function, and
- its :class:`Reach` es: every moto attribute its patches use (methods called, attributes read or set),

and :func:`check` fails at start with the attributes a moto upgrade removed and the version tested.
:func:`apply` installs patches once per process and keeps the replaced methods in lmforge's own table
(:func:`original`), not on moto's classes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: the moto release lmforge's patches were written and tested against (the ``local`` extra pins it)
TESTED_MOTO = "5.2.5"


@dataclass(frozen=True)
class Reach:
    """Attributes ``names`` of the moto object ``owner`` names (``"moto.ecr.models"`` or
    ``"moto.ecr.models:Repository"``) that a patch relies on. ``set_in``: instance attributes, which
    the class's (or a base's) method of that name assigns (``"__init__"``); None: on the class itself."""

    owner: str
    names: tuple[str, ...]
    set_in: str | None = None


@dataclass(frozen=True)
class Patch:
    """moto's ``owner`` (``"module:Class"``) gets ``replacement`` as its ``name``; ``adds``: moto has no
    such method (an action it lacks), so there is nothing to check or keep."""

    owner: str
    name: str
    replacement: Callable[..., Any]
    adds: bool = False


#: the methods :func:`apply` replaced, by (owner, name): what the patches call through to
_ORIGINALS: dict[tuple[str, str], Callable[..., Any]] = {}
#: the patches :func:`apply` has installed in this process, by (owner, name)
_APPLIED: set[tuple[str, str]] = set()


def resolve(path: str) -> Any:
    """The module or class ``path`` names (``"module"`` or ``"module:Class"``)."""
    module, _, cls = path.partition(":")
    found: Any = importlib.import_module(module)
    return getattr(found, cls) if cls else found


def _assigned(owner: Any, method: str) -> set[str]:
    names: set[str] = set()
    for cls in getattr(owner, "__mro__", ()):
        code = getattr(cls.__dict__.get(method), "__code__", None)
        if code is not None:
            names.update(code.co_names)
    return names


def missing(reaches: Iterable[Reach]) -> list[str]:
    """The attributes of ``reaches`` the installed moto lacks, as ``owner.name``."""
    out: list[str] = []
    for reach in reaches:
        try:
            owner = resolve(reach.owner)
        except (ImportError, AttributeError):
            out.append(reach.owner.replace(":", "."))
            continue
        assigned = _assigned(owner, reach.set_in) if reach.set_in else set()
        out += [
            f"{reach.owner.replace(':', '.')}.{name}" + (f" (set in {reach.set_in})" if reach.set_in else "")
            for name in reach.names
            if not hasattr(owner, name) and name not in assigned
        ]
    return out


def patched_reaches(patches: Iterable[Patch]) -> list[Reach]:
    """The methods ``patches`` replace, which must exist (and the classes of those they add)."""
    return [Reach(p.owner, () if p.adds else (p.name,)) for p in patches]


def check(who: str, reaches: Iterable[Reach]) -> None:
    """Raise RuntimeError naming every attribute of ``reaches`` the installed moto lacks."""
    if lacking := missing(reaches):
        import moto

        raise RuntimeError(
            f"moto {moto.__version__} lacks {', '.join(lacking)}, which {who} relies on; it was written "
            f"and tested against moto {TESTED_MOTO} (pip install -e '.[local]')"
        )


def apply(patches: Iterable[Patch]) -> None:
    """Install ``patches`` (each once per process; installing again changes nothing)."""
    for patch in patches:
        key = (patch.owner, patch.name)
        if key in _APPLIED:
            continue
        owner = resolve(patch.owner)
        if not patch.adds:
            _ORIGINALS[key] = getattr(owner, patch.name)
        setattr(owner, patch.name, patch.replacement)
        _APPLIED.add(key)


def original(owner: str, name: str) -> Callable[..., Any]:
    """moto's own method that :func:`apply` replaced with ``owner``'s ``name`` patch."""
    return _ORIGINALS[(owner, name)]
