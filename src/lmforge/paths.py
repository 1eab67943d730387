"""Where lmforge keeps what it caches on this machine: one root, one named folder per kind of thing.

``$LMFORGE_CACHE_DIR`` is the root itself (the images set it to ``/home/lmforge/.cache/lmforge``);
without it the root is ``lmforge`` under ``$XDG_CACHE_HOME`` or ``~/.cache``. Every cache lmforge
fills is a folder of :func:`cache_dir` under it, so moving the root moves all of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

CacheKind = Literal["models", "adapters", "trtllm", "trtllm-quant", "python-imports", "wheels"]
"""``models``: downloaded models (``s3/``, ``hub/``) and converted ones; ``adapters``: downloaded LoRA
adapters; ``trtllm``/``trtllm-quant``: TensorRT-LLM engines and quantized checkpoints built at a start;
``python-imports``: :mod:`lmforge.import_cache`; ``wheels``: wheels fetched from the package index."""


def cache_root() -> Path:
    """lmforge's cache: ``$LMFORGE_CACHE_DIR``, else ``lmforge`` under ``$XDG_CACHE_HOME`` or
    ``~/.cache``."""
    explicit = os.environ.get("LMFORGE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lmforge"


def cache_dir(kind: CacheKind) -> Path:
    """The folder of the cache for ``kind`` (not created here)."""
    return cache_root() / kind
