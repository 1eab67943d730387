"""How a deployment reports its progress: a few callables the caller hands in (:class:`Progress`).

The deploy API never prints. ``lmforge deploy`` passes click's stderr output and progress bars
(``lmforge.cli.progress``); an SDK-style caller passes its own, or takes the default: each message to
the ``lmforge.deploy`` logger at INFO, and no progress bars.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

Note = Callable[[str], None]
Advance = Callable[[int], None]
"""Moves a bar on by a number of units (bytes sent)."""
ReportDone = Callable[[int, int], None]
"""Sets a bar to ``(done, total)``; the total may become known late."""

_log = logging.getLogger("lmforge.deploy")


def _log_note(message: str) -> None:
    _log.info("%s", message)


@contextmanager
def _no_bar(label: str, total: int) -> Iterator[Advance]:
    yield lambda n: None


@contextmanager
def _no_bar_to(label: str, total: int = 1) -> Iterator[ReportDone]:
    yield lambda done, total: None


@dataclass(frozen=True)
class Progress:
    """Where a deployment's messages and progress bars go.

    ``note`` gets each line (the step headers ``[1/5]`` ... ``[5/5]``, the plan, the endpoint's status
    changes); ``bar(label, total)`` is a context manager for a bar over ``total`` units that yields a
    function advancing it by a delta (the upload); ``bar_to(label, total)`` one that yields a function
    taking ``(done, total)`` (the packing)."""

    note: Note = _log_note
    bar: Callable[[str, int], AbstractContextManager[Advance]] = _no_bar
    bar_to: Callable[[str, int], AbstractContextManager[ReportDone]] = _no_bar_to
