"""Progress output shared by the long-running commands (packing, uploading): all on stderr, so
stdout keeps only results that scripts read."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click


def note(message: str) -> None:
    click.echo(message, err=True)


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar over ``total`` units; the yielded function advances it by a delta."""
    with click.progressbar(length=max(total, 1), label=label, file=sys.stderr, show_pos=False) as bar:
        yield bar.update


@contextmanager
def progress_to(label: str, total: int = 1) -> Iterator[Callable[[int, int], None]]:
    """A bar for callbacks that report ``(done, total)``; the total may become known late."""
    with click.progressbar(length=max(total, 1), label=label, file=sys.stderr, show_pos=False) as bar:

        def report(done: int, new_total: int) -> None:
            bar.length = max(new_total, 1)
            bar.update(done - bar.pos)

        yield report
