"""``lmforge compile DIR --image IMAGE``: compile a model folder inside the image that will serve it.

A compiled vLLM graph is tied to the exact software that made it: vLLM and torch, and the exact Python
release (torch refuses a compiled package from another one, "Compile package was created with a
different Python version", and vLLM then compiles again at every start). The image that ships is the
one place where all three are what the endpoint runs, so the compile runs there: the container engine
runs the image's own ``lmforge compile`` on the folder, mounted read-write at ``/opt/ml/model`` (where
SageMaker mounts it), with the ``OPTION_*``/``SERVING_*`` environment the endpoint will get. The CPU (or
GPU) is this machine's: whether that suits the instance type is the caller's check
(:mod:`lmforge.deploy.compile_match`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from lmforge.container.engine import ContainerEngine, EngineError

#: where lmforge's images keep their virtual environment (templates/Dockerfile.j2)
IMAGE_LMFORGE = "/opt/lmforge/bin/lmforge"
MOUNT = "/opt/ml/model"
SHM_SIZE = "2g"


def compile_command(
    engine: ContainerEngine, image: str, model_dir: Path, env: Mapping[str, str] | None = None
) -> list[str]:
    """The engine command that compiles ``model_dir`` in place inside ``image``. It runs as the image's
    root user so that it can write into a folder this machine's user owns (the files keep that owner
    with rootless podman; with a rootful engine they belong to root, as the folder's did not need to)."""
    args = [engine.binary, *engine.run_args(), "--rm", "--network", "none", "--user", "0", "--no-healthcheck"]
    # vLLM's processes exchange messages through shared memory (160 MiB for a small model), more than an
    # engine's default /dev/shm (64 MiB); the endpoint's instance gets a share of its memory likewise
    args += ["--shm-size", SHM_SIZE]
    args += ["--volume", f"{model_dir.resolve()}:{MOUNT}:rw", "--entrypoint", IMAGE_LMFORGE]
    for key, value in sorted((env or {}).items()):
        args += ["--env", f"{key}={value}"]
    return [*args, image, "compile", MOUNT]


def compile_in_image(
    engine: ContainerEngine,
    image: str,
    model_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], None],
) -> None:
    """Run the image's ``lmforge compile`` on ``model_dir`` (in place); its output is shown as it comes.
    Raises :class:`EngineError` when the image is not there or the compile fails."""
    if not engine.image_exists(image):
        raise EngineError(
            f"{image} is not in {engine.kind}'s image store; build it first (lmforge container build)"
        )
    progress(f"compiling {model_dir} inside {image} ({engine.kind})")
    proc = subprocess.run(compile_command(engine, image, model_dir, env), stdout=sys.stderr, check=False)
    if proc.returncode != 0:
        raise EngineError(f"lmforge compile inside {image} exited {proc.returncode} (its output is above)")
