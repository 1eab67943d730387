"""The compiled vLLM artifact of a model folder: where it lives, whether a start may use it, and how.

``lmforge compile DIR`` (:mod:`.compile_run`) starts vLLM once with the configuration DIR is served
with, with vLLM's cache folder pointed at an empty one, and keeps what vLLM wrote there:

``DIR/lmforge-compiled/vllm/``
  ``manifest.json``  what was compiled and for what (:class:`~.compile_manifest.Manifest`)
  ``cache/``         a ``VLLM_CACHE_ROOT``: ``torch_compile_cache/torch_aot_compile/<key>/`` (the AOT
                     graph and its Inductor kernels) and ``modelinfos/`` (vLLM's inspection of the
                     model class, which otherwise costs a subprocess at every start with an empty cache)

At every vLLM start :func:`prepare` decides (:class:`~.compile_manifest.Decision`) and logs one line,
``compile cache: hit``, ``compile cache: miss (<field>: <compiled> != <now>, ...)`` or
``compile cache: none``; ``option.compile_cache=required`` refuses to start on anything but a hit. On
a hit the compiled cache is copied to a fresh writable folder (vLLM writes lock files and runtime
kernels next to what it loads; the model folder may be read-only) and vLLM's processes get
``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` pointed there, whatever they were. After the start
:meth:`CompileCache.after_start` checks that vLLM loaded the graph rather than compiling it again
(a hit that compiled is logged as an error, never silent); with ``required`` vLLM is also told to fail
rather than recompile (``VLLM_FORCE_AOT_LOAD``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.engines.vllm.compile_manifest import (
    MANIFEST_NAME,
    Decision,
    Manifest,
    Target,
    check_files,
    compare,
    compiled_settings,
    current_target,
    model_digest,
    scan_files,
)
from lmforge.engines.vllm.compile_plugin import PORTABLE_ENV
from lmforge.errors import LmforgeError
from lmforge.process import pid_alive

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

log = logging.getLogger("lmforge.engines.vllm")

COMPILED_DIR = "lmforge-compiled"
BACKEND_DIR = "vllm"
CACHE_DIR = "cache"
#: where vLLM keeps AOT-compiled graphs inside a VLLM_CACHE_ROOT
AOT_DIR = Path("torch_compile_cache") / "torch_aot_compile"
#: written by vLLM while it runs, never needed by the next start
_TRANSIENT_SUFFIXES = (".lock", ".tmp")
_TRANSIENT_DIRS = frozenset({"__pycache__", "dummy_cache"})


class CompileCacheError(LmforgeError):
    """``option.compile_cache=required`` and the compiled artifact does not fit this start."""

    kind = "model_error"


def compiled_folder(model_dir: Path) -> Path:
    """``DIR/lmforge-compiled/vllm``."""
    return model_dir / COMPILED_DIR / BACKEND_DIR


def vllm_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``VLLM_*`` variables set now that enter vLLM's compile key (``vllm.envs.compile_factors``:
    every vLLM variable but those it knows to be irrelevant, such as ``VLLM_CACHE_ROOT``)."""
    from vllm import envs

    env = os.environ if environ is None else environ
    return {name: env[name] for name in sorted(envs.compile_factors()) if name in env}


@dataclass
class StartFacts:
    """What a start compares with the manifest: its settings, the machine, the env, the model."""

    settings: dict[str, Any]
    target: Target
    env: dict[str, str]
    model: str | None

    @classmethod
    def collect(cls, config: ServingConfig, engine_kwargs: Mapping[str, Any]) -> StartFacts:
        model = config.model_path
        return cls(
            settings=compiled_settings(engine_kwargs),
            target=current_target(),
            env=vllm_env(),
            model=model_digest(Path(model)) if model is not None else None,
        )


def decide(model_dir: Path | None, mode: str, facts: Callable[[], StartFacts]) -> Decision:
    """Whether the compiled artifact in ``model_dir`` (if any) fits a start with the facts ``facts()``
    collects (called only when there is an artifact to compare)."""
    if mode == "off":
        return Decision("none", reason="option.compile_cache=off")
    folder = compiled_folder(model_dir) if model_dir is not None else None
    if folder is None or not folder.is_dir():
        return Decision("none", reason="no lmforge-compiled/vllm in the model folder")
    try:
        manifest = Manifest.from_json((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
    except OSError:
        return Decision(
            "miss", reason=f"{COMPILED_DIR}/{BACKEND_DIR}/{MANIFEST_NAME} is missing", folder=folder
        )
    except ValueError as exc:
        return Decision(
            "miss", reason=f"{COMPILED_DIR}/{BACKEND_DIR}/{MANIFEST_NAME} is unreadable: {exc}", folder=folder
        )
    now = facts()
    differences = compare(manifest, settings=now.settings, target=now.target, env=now.env, model=now.model)
    if differences:
        return Decision("miss", tuple(differences), manifest=manifest, folder=folder)
    damage = check_files(folder / CACHE_DIR, manifest.files)
    if damage is not None:
        return Decision("miss", reason=f"compiled folder damaged: {damage}", manifest=manifest, folder=folder)
    return Decision("hit", manifest=manifest, folder=folder)


def _aot_artifacts(root: Path) -> dict[str, tuple[int, int]]:
    """Every AOT graph file under a VLLM_CACHE_ROOT: relative path -> (size, mtime_ns)."""
    base = root / AOT_DIR
    if not base.is_dir():
        return {}
    out = {}
    for path in base.glob("*/rank_*/*"):
        if path.is_file() and not path.name.endswith(_TRANSIENT_SUFFIXES):
            info = path.stat()
            out[path.relative_to(root).as_posix()] = (info.st_size, info.st_mtime_ns)
    return out


def _ignore_transient(_dir: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _TRANSIENT_DIRS or n.endswith(_TRANSIENT_SUFFIXES)}


@dataclass
class CompileCache:
    """One vLLM start's use of the compiled artifact (see the module docstring)."""

    decision: Decision
    facts: StartFacts
    mode: str
    runtime_root: Path | None = None
    """The writable copy of the compiled cache that vLLM uses on a hit (removed by :meth:`cleanup`)."""
    capture_root: Path | None = None
    """``lmforge compile``: the empty cache folder vLLM compiles into."""
    model_infos_home: Path | None = None
    """``lmforge compile``: the ``modelinfos/`` of the ``VLLM_CACHE_ROOT`` in effect before, which seeded
    the capture's and gets back what vLLM learns there (:meth:`share_model_infos`)."""
    recompiled: bool = False
    _before: dict[str, tuple[int, int]] = field(default_factory=dict)

    def after_start(self) -> None:
        """On a hit: vLLM must have loaded the compiled graph. A graph it wrote at this start means it
        compiled after all (its own key differed, or the load failed): logged as an error."""
        if self.runtime_root is None:
            return
        now = _aot_artifacts(self.runtime_root)
        written = sorted(p for p, stamp in now.items() if self._before.get(p) != stamp)
        if written:
            self.recompiled = True
            log.error(
                "the compiled artifact was a hit, but vLLM compiled the model again at this start (it wrote "
                "%s): vLLM's own cache key or the compiled graph did not fit (see vLLM's log above); run "
                "lmforge compile again with this vLLM, or set option.compile_cache=required to refuse such "
                "starts",
                ", ".join(written),
            )
        else:
            log.info("vLLM loaded the compiled graph: nothing was compiled at this start")

    def share_model_infos(self) -> None:
        """``lmforge compile``: what vLLM learned of model classes in the capture (``modelinfos/``,
        written while it builds its configuration, before its engine starts) also goes to the cache it
        was seeded from, so that the next start there of the same class does not inspect it again in a
        subprocess (~8 CPU-s). Entries already there are left alone; a cache that cannot be written is
        skipped (logged)."""
        if self.capture_root is None or self.model_infos_home is None:
            return
        learned = self.capture_root / "modelinfos"
        if not learned.is_dir():
            return
        try:
            self.model_infos_home.mkdir(parents=True, exist_ok=True)
            for entry in sorted(learned.glob("*.json")):
                target = self.model_infos_home / entry.name
                if target.exists():
                    continue
                partial = target.with_name(f".{entry.name}.{os.getpid()}.tmp")
                shutil.copyfile(entry, partial)
                os.replace(partial, target)  # whole or not at all, for a start reading it meanwhile
                log.info("vLLM's inspection of %s kept in %s", entry.stem, self.model_infos_home)
        except OSError as exc:
            log.info("vLLM's model inspections not kept in %s: %s", self.model_infos_home, exc)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` gauges: which of hit, miss and none this start was, and whether a hit compiled."""
        status = self.decision.status
        return {
            "compile_cache_hit": float(status == "hit"),
            "compile_cache_miss": float(status == "miss"),
            "compile_cache_none": float(status == "none"),
            "compile_cache_recompiled": float(self.recompiled),
        }

    def cleanup(self) -> None:
        root, self.runtime_root = self.runtime_root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def prepare(
    config: ServingConfig, engine_kwargs: Mapping[str, Any], capture_to: Path | None = None
) -> CompileCache:
    """Decide, log the ``compile cache:`` line, and set up vLLM's environment for this start.

    ``capture_to`` (``lmforge compile``): compile into that empty folder, whatever the model folder has.
    Raises :class:`CompileCacheError` when ``option.compile_cache=required`` and it is not a hit."""
    os.environ[PORTABLE_ENV] = "1"  # the compile plugin: loadable AOT graphs, keyed without the path
    facts = StartFacts.collect(config, engine_kwargs)
    mode = config.compile_cache
    if capture_to is not None:
        capture_to.mkdir(parents=True, exist_ok=True)
        home = _seed_model_infos(capture_to)
        _point_vllm_at(capture_to)
        log.info("compile cache: none (lmforge compile: compiling into %s)", capture_to)
        decision = Decision("none", reason="lmforge compile")
        return CompileCache(decision, facts, mode, capture_root=capture_to, model_infos_home=home)
    decision = decide(config.model_dir, mode, lambda: facts)
    log.log(logging.WARNING if decision.status == "miss" else logging.INFO, "%s", decision.line())
    if mode == "required" and decision.status != "hit":
        raise CompileCacheError(
            f"option.compile_cache=required refuses to start: {decision.line()}; run "
            f"`lmforge compile {config.model_dir}` on this machine with this configuration, or set "
            "option.compile_cache=auto to compile just in time"
        )
    state = CompileCache(decision, facts, mode)
    if decision.status == "miss":
        log.warning("vLLM compiles just in time, in its own cache folder (VLLM_CACHE_ROOT)")
    if decision.status != "hit":
        return state
    assert decision.folder is not None
    _remove_stale_copies(Path(tempfile.gettempdir()))
    root = Path(tempfile.mkdtemp(prefix=f"{_COPY_PREFIX}{os.getpid()}-"))
    shutil.copytree(decision.folder / CACHE_DIR, root, dirs_exist_ok=True, ignore=_ignore_transient)
    for path in root.rglob("*"):  # a read-only model folder gives read-only copies; vLLM writes beside them
        path.chmod(path.stat().st_mode | 0o200)
    _point_vllm_at(root)
    if mode == "required":
        os.environ["VLLM_FORCE_AOT_LOAD"] = "1"  # a graph that does not load fails the start
    state.runtime_root = root
    state._before = _aot_artifacts(root)
    return state


_COPY_PREFIX = "lmforge-vllm-compiled-"


def _remove_stale_copies(tmp: Path) -> None:
    """Writable copies left by starts that were killed (``<prefix><pid>-<random>``, the pid gone)."""
    for path in tmp.glob(f"{_COPY_PREFIX}*-*"):
        pid = path.name.removeprefix(_COPY_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _seed_model_infos(root: Path) -> Path | None:
    """Start a compile from what vLLM already learned of model classes (``modelinfos/`` of the
    ``VLLM_CACHE_ROOT`` in effect): vLLM checks each entry against its module's hash when it reads it,
    and without one it inspects the model class in a subprocess (several CPU-seconds). Returns that
    folder (None when it is the capture's own)."""
    current = os.environ.get("VLLM_CACHE_ROOT") or str(Path.home() / ".cache" / "vllm")
    source = Path(current).expanduser() / "modelinfos"
    if source.resolve() == (root / "modelinfos").resolve():
        return None
    if source.is_dir():
        shutil.copytree(source, root / "modelinfos", dirs_exist_ok=True, ignore=_ignore_transient)
    return source


def _point_vllm_at(root: Path) -> None:
    """vLLM's processes (started after this) keep their caches under ``root``."""
    os.environ["VLLM_CACHE_ROOT"] = str(root)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")


def write_compiled(
    model_dir: Path,
    state: CompileCache,
    *,
    compile_seconds: float,
    created_by: str,
    probe: dict[str, Any] | None = None,
) -> Manifest:
    """Keep what vLLM wrote into ``state.capture_root`` as ``model_dir``'s compiled artifact (replacing
    any earlier one; written beside it first, then swapped in)."""
    assert state.capture_root is not None
    final = compiled_folder(model_dir)
    partial = final.with_name(f".{final.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shutil.copytree(state.capture_root, partial / CACHE_DIR, ignore=_ignore_transient)
    aot = partial / CACHE_DIR / AOT_DIR
    manifest = Manifest(
        settings=state.facts.settings,
        target=state.facts.target,
        env=state.facts.env,
        model=state.facts.model,
        files=scan_files(partial / CACHE_DIR),
        vllm_cache_keys=tuple(sorted(p.name for p in aot.iterdir() if p.is_dir())) if aot.is_dir() else (),
        compile_seconds=compile_seconds,
        created_by=created_by,
        probe=dict(probe or {}),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    (partial / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return manifest
