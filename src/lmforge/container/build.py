"""Build a flavour's image: the build context, the base image, the pip inputs, the engine call.

The context is staged in a temporary folder with exactly what the Dockerfiles copy
(``pyproject.toml``, ``setup.py``, ``README.md``, ``src/``, ``containers/<flavour>/``), so a
checkout's virtual environments, caches, models and locally built libraries never travel to the
engine, and a ``.dockerignore`` is not needed.

The base image is, in order: ``--base-image``; the flavour's pinned default when the engine already
has it; the Debian-made :data:`~lmforge.container.base.LOCAL_BASE` when it exists (CPU flavours);
else the pinned default, which the engine pulls.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from lmforge.container.base import LOCAL_BASE
from lmforge.container.engine import BuildRequest, ContainerEngine, Echo, EngineError
from lmforge.container.flavours import Flavour, image_name, load_flavour, repo_root
from lmforge.container.pipsettings import BuildPipInputs, describe, read_pip_settings

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info", ".mypy_cache")


class BuildError(EngineError):
    pass


@dataclass(frozen=True)
class BuildResult:
    tag: str
    base_image: str
    seconds: float
    size_bytes: int
    engine: str
    secret_marker: str = ""
    """The marker line both build secrets carried (to check that no layer holds them)."""


def has_nvidia_gpu() -> bool:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return False
    try:
        return subprocess.run([binary, "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def stage_context(root: Path, flavour: str, dest: Path) -> Path:
    """Copy what the Dockerfile of ``flavour`` reads into ``dest``; returns ``dest``."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(root / name, dest / name)
    shutil.copytree(root / "src", dest / "src", ignore=_IGNORE)
    shutil.copytree(root / "containers" / flavour, dest / "containers" / flavour, ignore=_IGNORE)
    return dest


def resolve_base(engine: ContainerEngine, flavour: Flavour, explicit: str | None) -> tuple[str, str]:
    """(base image, why it was chosen)."""
    if explicit:
        return explicit, "--base-image"
    if engine.image_exists(flavour.base_image):
        return flavour.base_image, "the pinned default, already in the local image store"
    if not flavour.gpu and flavour.python == "python3.11" and engine.image_exists(LOCAL_BASE):
        return LOCAL_BASE, "made from Debian packages by `lmforge container base`"
    return flavour.base_image, "the pinned default (pulled)"


def check_buildable(name: str, *, allow_no_gpu: bool = False, root: Path | None = None) -> Flavour:
    """The flavour, once its files are current and (for a GPU flavour) a GPU is here; BuildError else."""
    from lmforge.container.render import stale_files

    base_root = root or repo_root()
    stale = [p for p in stale_files(base_root) if p.parent.name == name]
    if stale:
        raise BuildError(f"{stale[0]} differs from the templates: run `lmforge container render {name}`")
    flavour = load_flavour(name, base_root)
    if flavour.gpu and not allow_no_gpu and not has_nvidia_gpu():
        raise BuildError(
            f"the {name} image is for NVIDIA GPUs (CUDA {flavour.cuda}) and this machine has none "
            "(nvidia-smi finds no GPU), so it could be built but not run or tested here. Build it on a GPU "
            f"machine, or pass --allow-no-gpu to build anyway (its base {flavour.base_image} must be "
            "pullable). On this machine: lmforge container build cpu (or vllm-cpu)"
        )
    return flavour


def build_flavour(
    name: str,
    engine: ContainerEngine,
    echo: Echo,
    *,
    tag: str | None = None,
    base_image: str | None = None,
    no_cache: bool = False,
    platform: str | None = None,
    allow_no_gpu: bool = False,
    root: Path | None = None,
) -> BuildResult:
    """Build flavour ``name`` with ``engine``; BuildError says why not."""
    base_root = root or repo_root()
    flavour = check_buildable(name, allow_no_gpu=allow_no_gpu, root=base_root)
    try:
        engine.check_can_build()
    except EngineError as exc:
        raise BuildError(str(exc)) from None
    image = tag or image_name(name)
    base, why = resolve_base(engine, flavour, base_image)
    settings = read_pip_settings()
    echo(f"engine: {engine.describe()}")
    echo(f"base image: {base} ({why})")
    echo(f"pip in the build: {describe(settings)}")
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="lmforge-context-") as tmp,
        BuildPipInputs(settings, flavour.pip_extra_index_urls, echo=echo) as pip,
    ):
        context = stage_context(base_root, name, Path(tmp))
        request = BuildRequest(
            context=context,
            dockerfile=context / "containers" / name / "Dockerfile",
            tag=image,
            build_args={"BASE_IMAGE": base},
            secrets=pip.secrets,
            network_host=pip.network_host,
            no_cache=no_cache,
            platform=platform,
        )
        try:
            engine.build(request, echo)
        except EngineError as exc:
            hint = ""
            if base == flavour.base_image and not engine.image_exists(base):
                hint = (
                    f"\nThe base image {base} is not in the local image store; if no public registry is "
                    "reachable from here, make one from Debian packages first: lmforge container base"
                )
            raise BuildError(f"{exc}{hint}") from None
    seconds = time.monotonic() - started
    size = engine.image_size(image)
    return BuildResult(image, base, seconds, size, engine.kind, pip.marker)
