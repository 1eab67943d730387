"""vLLM's ahead-of-time compiled graphs, made loadable and relocatable (a vLLM plugin).

vLLM (0.32, torch >= 2.10) saves the model's ``torch.compile`` result as an AOT artifact under
``$VLLM_CACHE_ROOT/torch_compile_cache/torch_aot_compile/<key>/`` and loads it at the next start. Two
things keep that from working for a compiled model folder, fixed here in each of vLLM's processes
(:func:`register` is the ``lmforge_compile_cache`` entry point of ``vllm.general_plugins``):

* **The load fails on vLLM's CPU platform**, every start: the CPU platform compiles with torch's own
  ``inductor`` backend, whose artifact torch wraps in ``BundledAOTAutogradSerializableCallable``, and
  vLLM's loader then calls ``finalize_loading`` on it, a method only vLLM's own backend has
  ("'function' object has no attribute 'finalize_loading'"), so vLLM compiles again and again. The
  bundle is complete once deserialized (the Inductor code, and its compiled C++ kernels in the key's
  ``inductor_cache/``), so :func:`allow_bundled_load` gives that class a ``finalize_loading`` that does
  nothing. Where torch's class has no such wrapper, or vLLM's loader no longer needs it, nothing changes.
* **The key holds the model's path** (``ModelConfig.model`` is one of the factors vLLM hashes), so a
  folder compiled at one path misses at any other: ``/opt/ml/model`` in a container, a copy made by
  ``lmforge compile --output``, an extracted ``model.tar.gz``. When lmforge runs vLLM it sets
  :data:`PORTABLE_ENV`, and :func:`portable_key` hashes the model's ``config.json`` in place of its path
  (what the graph depends on: the architecture and its sizes); every other factor stays vLLM's own.

Both patches are no-ops for anything else, and this module must stay cheap to import: vLLM imports it
in every process before the model loads.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.engines.vllm.compat import TESTED as VLLM_TESTED
from lmforge.engines.vllm.compat import TESTED_TORCH

log = logging.getLogger("vllm.plugins.lmforge_compile_cache")

PLUGIN_NAME = "lmforge_compile_cache"
PORTABLE_ENV = "LMFORGE_VLLM_PORTABLE_AOT"
"""Set to 1 by lmforge for its vLLM processes: the AOT key ignores where the model folder is."""
_PATCHED = "__lmforge_compile_cache__"
#: the releases whose private names this module reaches (torch's bundled artifact class, vLLM's
#: ``caching.aot_compile_hash_factors``: entries of :mod:`.compat`'s tables, checked at the engine's
#: start); another release is still patched where the names are there, with a warning, and a compile
#: that happens on a hit is caught after the start (compile_cache)
TESTED = {"vllm": VLLM_TESTED, "torch": TESTED_TORCH}


def model_token(model: str) -> str | None:
    """What stands for a local model folder in the AOT key: its ``config.json``'s digest; None for a
    hub id or a folder without one (the path is kept then)."""
    config = Path(model) / "config.json"
    try:
        digest = hashlib.sha256(config.read_bytes()).hexdigest()
    except OSError:
        return None
    return f"lmforge-model-config:{digest[:32]}"


def allow_bundled_load() -> bool:
    """Give torch's bundled Inductor artifact the ``finalize_loading`` vLLM's loader calls; True when in
    place (or not needed)."""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as bundled
    except ImportError:
        return False
    if "finalize_loading" in vars(bundled):
        return True

    def finalize_loading(self: Any, vllm_config: Any) -> None:
        """Nothing to do: the bundle was loaded whole when it was deserialized."""

    bundled.finalize_loading = finalize_loading  # type: ignore[attr-defined]
    return True


def portable_key() -> bool:
    """Hash the model's ``config.json`` instead of its path in vLLM's AOT key (when :data:`PORTABLE_ENV`
    is 1); True when in place."""
    from vllm.compilation import caching

    original: Callable[[Any], list[str]] = caching.aot_compile_hash_factors
    if getattr(original, _PATCHED, False):
        return True

    @functools.wraps(original)
    def factors(vllm_config: Any) -> list[str]:
        model_config = getattr(vllm_config, "model_config", None)
        path = getattr(model_config, "model", None)
        token = model_token(path) if isinstance(path, str) and os.path.isdir(path) else None
        if token is None or model_config is None:
            return original(vllm_config)
        model_config.model = token
        try:
            return original(vllm_config)
        finally:
            model_config.model = path

    setattr(factors, _PATCHED, True)
    caching.aot_compile_hash_factors = factors
    return True


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    try:
        if os.environ.get(PORTABLE_ENV) != "1":
            return
        _warn_if_untested()
        loads = allow_bundled_load()
        portable = portable_key()
        log.info(
            "lmforge: vLLM's AOT compile cache %s, keyed by the model's config.json, not its path%s",
            "loadable" if loads else "left as vLLM has it",
            "" if portable else " (not patched: vLLM's key function has moved)",
        )
    except Exception:  # a plugin must never stop vLLM from starting
        log.exception("lmforge: could not prepare vLLM's AOT compile cache")


def _warn_if_untested() -> None:
    from importlib.metadata import PackageNotFoundError, version

    for package, tested in TESTED.items():
        try:
            installed = version(package) if package == "torch" else _vllm_version()
        except PackageNotFoundError:
            continue
        if not installed.split("+")[0].startswith(f"{tested}."):
            log.warning(
                "lmforge: the AOT compile-cache fixes were tested with %s %s, this is %s: a hit that "
                "compiles after all is reported after the start",
                package,
                tested,
                installed,
            )


def _vllm_version() -> str:
    from vllm import __version__

    return str(__version__)
