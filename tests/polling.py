"""Waiting for a state, not for a time: :func:`eventually` polls until a check holds.

The check is what a test judges by (a status, a count, a set of containers); the timeout only keeps a
broken run from hanging, and its failure names the state last seen, never a duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    check: Callable[[], T],
    *,
    timeout: float,
    state: Callable[[], object] | None = None,
    interval: float = 0.2,
) -> T:
    """``check()``'s first truthy answer. ``state()`` (what the failure shows: by default the last
    answer) is reported in the TimeoutError of a run that never gets there within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer:
            return answer
        if time.monotonic() >= deadline:  # a hang guard
            seen = state() if state is not None else answer
            raise TimeoutError(f"not reached within {timeout:g} s; last seen: {seen!r}")
        time.sleep(interval)
