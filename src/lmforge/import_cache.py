"""transformers' import-time scans, kept on disk for lmforge's processes.

Each ``import transformers`` (5.19) reads what is installed, every time, in every process:

- ``importlib.metadata.packages_distributions()`` at the import of ``transformers.utils.import_utils``
  (every distribution's metadata on ``sys.path``: ~250 here, 0.25-0.4 CPU-s);
- the import table of ``transformers/models`` (``define_import_structure``: ~1,565 source files
  opened and read), built twice: once by ``transformers/__init__.py``, and once more at the first
  model or tokenizer class, when ``transformers.models`` is imported (its own ``lru_cache`` misses:
  the first call passes a ``Path`` and the second a ``str``), ~0.25 CPU-s each.

That is ~0.8 CPU-s of every process that loads a model or a tokenizer (an LMI-Dist engine core, a
server, a CLI command that reads a model), for an answer that changes only when something is
installed. :func:`install` (called by :func:`lmforge.process.run_main` before a process's entry point
runs, and by the test suite's workers) puts an import hook in front of
``transformers.utils.import_utils``: it gives that module the mapping and the two tables from a file
in lmforge's cache (``python-imports/`` under :func:`lmforge.paths.cache_root`: ``$LMFORGE_CACHE_DIR``,
else ``lmforge`` under ``$XDG_CACHE_HOME`` or ``~/.cache``), and a first process scans and writes it.
The file is named by a digest of what the answers depend on: transformers' version and folder, the
modification times of its model folders (a file added to or removed from one changes its time), and
the distributions' metadata folders on ``sys.path`` with their times (an install, an upgrade or an
uninstall adds or removes one). Code folders on ``sys.path`` are not
part of it: a working folder's time changes with every file made in it.

Kept for the starts it cuts (CPU-s of the started process tree to the first ``/ping`` 200 of ``lmforge
serve`` on the tiny model, medians, 2026-12, this 2-core machine): LMI-Dist 5.1 -> 3.6 CPU-s (server
1.3 -> 0.9, engine core 3.8 -> 2.8; 5 starts each), vLLM 19.9 -> 16.7 (server process 8.6 -> 6.5; 3
starts each). The test suite's workers no longer install it.

These are transformers' internals (a module-level name and a function), so the hook is only for the
release it was written against (:data:`TESTED`, checked when the module is imported): another release
imports as usual, uncached. What it reaches for is a :mod:`lmforge.reachins` table (:func:`_reaches`),
checked by the hook's loader when transformers is imported: a missing name fails that import, naming
it. ``LMFORGE_IMPORT_CACHE=off`` turns it off. A damaged or unreadable file is a miss, and a cache
folder that cannot be written only costs the scan.
"""

from __future__ import annotations

import marshal
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import importlib.abc
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType

# Every lmforge process installs the hook (lmforge.process.run_main), most never import transformers:
# what only a transformers import needs (importlib.metadata, hashlib, tempfile, logging: ~30 ms) is
# imported when it happens.

#: the transformers release whose import scans this reproduces (pyproject.toml pins it)
TESTED = "5.19."
#: the module whose import runs the scans
MODULE = "transformers.utils.import_utils"
#: bump when the file's layout changes
_FORMAT = 1


def _reaches() -> Any:
    """What the hook reaches for, as :mod:`lmforge.reachins` entries (checked by the hook's loader, in
    the process that imports transformers: nothing is imported for it)."""
    from lmforge.reachins import Library, Reach

    return Library(
        name="transformers",
        tested=f"{TESTED}x",
        user="lmforge's import cache (LMFORGE_IMPORT_CACHE=off turns it off)",
        reaches=(
            Reach(
                "importlib.metadata",
                ("packages_distributions",),
                "swapped for the cached answer while transformers.utils.import_utils runs",
            ),
            Reach(
                MODULE,
                ("define_import_structure",),
                "wrapped to answer the models table from the cache",
            ),
        ),
        version_module="transformers",
    )


def install() -> None:
    """Cache transformers' import scans in this process (before ``transformers`` is imported; a no-op
    after it, when ``LMFORGE_IMPORT_CACHE=off``, or when already installed)."""
    if os.environ.get("LMFORGE_IMPORT_CACHE", "").lower() in ("off", "0", "false", "no"):
        return
    if MODULE in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


def cache_dir() -> Path:
    from lmforge import paths

    return paths.cache_dir("python-imports")


def _log() -> Any:
    import logging

    return logging.getLogger("lmforge.import_cache")


class _Finder:
    """Finds :data:`MODULE` as the import system would, and hands it to :class:`_Loader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        import importlib.machinery

        sys.meta_path.remove(self)  # once: the module is imported once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.origin is None:
            return spec
        version = str(getattr(sys.modules.get("transformers"), "__version__", ""))
        if not version.startswith(TESTED):
            _log().debug("import cache off: transformers %s, written for %sx", version, TESTED)
            return spec
        # the import system asks a loader for create_module and exec_module only (no base class needed)
        loader = _Loader(spec.loader, Path(spec.origin).parents[1], version)
        spec.loader = cast("importlib.abc.Loader", loader)
        return spec


class _Loader:
    """Runs the module as its own loader would, with ``packages_distributions`` answered from the cache
    meanwhile, then wraps the module's ``define_import_structure`` to answer from it too."""

    def __init__(self, inner: Any, package_dir: Path, version: str) -> None:
        self.inner = inner
        self.cache = ScanCache(package_dir, version)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        import importlib.metadata

        from lmforge.reachins import check

        library = _reaches()
        check(library, library.reaches[:1])
        scan = importlib.metadata.packages_distributions
        importlib.metadata.packages_distributions = self.cache.distributions(scan)  # type: ignore[assignment]
        try:
            self.inner.exec_module(module)
        finally:
            importlib.metadata.packages_distributions = scan  # type: ignore[assignment]
        check(library, library.reaches[1:])
        define = module.define_import_structure
        module.define_import_structure = self.cache.structures(define)  # type: ignore[attr-defined]


class ScanCache:
    """The answers of one transformers install's scans, in one file named by what they depend on."""

    def __init__(self, package_dir: Path, version: str, directory: Path | None = None) -> None:
        self.package_dir = package_dir
        self.version = version
        self._dir = directory
        self._path: Path | None = None
        self._data: dict[str, bytes] | None = None
        self.searched: tuple[str, ...] = ()
        """``sys.path`` as :meth:`key` read it (where the distributions were looked for)."""

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = (self._dir or cache_dir()) / f"{self.key()}.marshal"
        return self._path

    def key(self) -> str:
        """A digest of transformers' version and folder, its model folders' times, and the metadata
        folders of the distributions on ``sys.path`` with their times."""
        import hashlib

        digest = hashlib.sha256(f"{_FORMAT}\0{self.version}\0{self.package_dir}\0".encode())

        def add(folder: Path, keep: Callable[[os.DirEntry[str]], bool]) -> None:
            try:
                with os.scandir(folder) as scan:
                    entries = sorted((e for e in scan if keep(e)), key=lambda e: e.name)
                    for entry in entries:
                        digest.update(f"{folder}/{entry.name}\0{entry.stat().st_mtime_ns}\0".encode())
            except OSError:
                pass  # not a folder (a zip on sys.path, a path that is gone): nothing installed there

        add(self.package_dir / "models", lambda e: e.name != "__pycache__" and e.is_dir())
        self.searched = tuple(sys.path)
        for entry in self.searched:
            if entry:
                add(Path(entry), lambda e: e.name.endswith((".dist-info", ".egg-info")))
        return digest.hexdigest()[:32]

    def _load(self) -> dict[str, bytes]:
        if self._data is None:
            try:
                data = marshal.loads(self.path.read_bytes())
                ok = isinstance(data, dict) and all(isinstance(v, bytes) for v in data.values())
                self._data = data if ok else {}
            except (OSError, ValueError, EOFError, TypeError):
                self._data = {}
        return self._data

    def get(self, name: str) -> Any:
        """The answer stored under ``name`` as a new object (its callers change what they get:
        transformers adds its own entries to the models table), else ``None``."""
        blob = self._load().get(name)
        try:
            return None if blob is None else marshal.loads(blob)
        except (ValueError, EOFError, TypeError):
            return None

    def put(self, name: str, value: Any) -> None:
        """Keep ``value`` as it is now under ``name``, and rewrite the file with it."""
        data = self._load()
        try:
            data[name] = marshal.dumps(value)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            import tempfile

            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(data))
            os.replace(tmp, self.path)
        except (OSError, ValueError) as exc:  # a read-only cache: the scans run each time
            _log().debug("import cache not written (%s): %s", self.path, exc)

    def distributions(self, scan: Callable[[], Any]) -> Callable[[], Any]:
        """``packages_distributions`` from the file, else ``scan()`` stored in it."""

        def cached() -> Any:
            value = self.get("distributions")
            if not isinstance(value, dict):
                value = scan()
                self.put("distributions", dict(value))
            return value

        return cached

    def structures(self, define: Callable[..., Any]) -> Callable[..., Any]:
        """``define_import_structure`` from the file, else ``define(...)`` stored in it, by its
        arguments."""

        def cached(module_path: str | os.PathLike[str], prefix: str | None = None) -> Any:
            name = f"structure\0{os.fspath(module_path)}\0{prefix}"
            value = self.get(name)
            if not isinstance(value, dict):
                value = define(module_path, prefix)
                self.put(name, value)
            return value

        cached.__wrapped__ = define  # type: ignore[attr-defined]
        return cached
