"""Patching moto, guarded: what lmforge's patches reach into, checked at start, and the patches applied once.

moto is pinned (``moto[server]==5.2.5`` in the ``local`` extra) and lmforge's extensions
(:mod:`.moto_ext`, :mod:`.inference_components`, :mod:`.ecr`, :mod:`.iam_ext`) replace or add methods
of its classes and read attributes of its objects. Each extension lists

- its :class:`Patch` es: one moto method replaced (or added) by one named lmforge function, and
- its :class:`Reach` es: every moto attribute its patches use (methods called, attributes read or set),

and :func:`check` fails at start with the attributes a moto upgrade removed and the version tested.
:class:`Reach` and the check are :mod:`lmforge.reachins`'s (one record and one check for every library
lmforge reaches into); the moto tables are the extensions' ``REACHES``, checked by each extension's
``check_compatible`` when the local SageMaker installs it.
:func:`apply` installs patches once per process and keeps the replaced methods in lmforge's own table
(:func:`original`), not on moto's classes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lmforge import reachins
from lmforge.reachins import Reach, resolve

__all__ = [
    "TESTED_MOTO",
    "Patch",
    "Reach",
    "apply",
    "check",
    "missing",
    "original",
    "patched_reaches",
    "resolve",
]

#: the moto release lmforge's patches were written and tested against (the ``local`` extra pins it)
TESTED_MOTO = "5.2.5"


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


def missing(reaches: Iterable[Reach]) -> list[str]:
    """The attributes of ``reaches`` the installed moto lacks, as ``owner.name``."""
    return [label for label, _ in reachins.missing(reaches)]


def patched_reaches(patches: Iterable[Patch]) -> list[Reach]:
    """The methods ``patches`` replace, which must exist (and the classes of those they add)."""
    return [Reach(p.owner, () if p.adds else (p.name,)) for p in patches]


def moto(who: str, reaches: Iterable[Reach] = ()) -> reachins.Library:
    """moto as ``who`` (an extension) uses it."""
    return reachins.Library(
        name="moto",
        tested=TESTED_MOTO,
        user=who,
        reaches=tuple(reaches),
        fix="pip install -e '.[local]'",
        version_module="moto",
    )


def check(who: str, reaches: Iterable[Reach]) -> None:
    """Raise :class:`lmforge.reachins.ReachError` (a RuntimeError) naming every attribute of ``reaches``
    the installed moto lacks."""
    reachins.check(moto(who, reaches))


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
