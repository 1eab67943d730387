"""Where lmforge keeps what it caches on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """lmforge's cache: ``$LMFORGE_CACHE_DIR``, else ``lmforge`` under ``$XDG_CACHE_HOME`` or
    ``~/.cache``."""
    explicit = os.environ.get("LMFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lmforge"
