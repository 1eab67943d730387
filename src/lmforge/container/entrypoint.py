"""What a lmforge container does on ``serve`` (``python -m lmforge.container.entrypoint serve [DIR]``).

1. The model folder is ``DIR``, else ``$LMFORGE_MODEL_DIR``, else ``/opt/ml/model`` (where SageMaker
   puts the extracted ``model.tar.gz`` or the copied S3 prefix).
2. The image's default ``serving.properties`` (``$LMFORGE_DEFAULT_PROPERTIES``) fills in what the
   model's own file and the environment leave unset: it is applied as ``OPTION_*`` variables, which
   rank below the model's file; variables the user set are kept.
3. A ``requirements.txt`` in the model folder is installed into a private folder on ``sys.path``
   when allowed (``LMFORGE_INSTALL_REQUIREMENTS``, default true) and the container is online; in
   offline mode (``HF_HUB_OFFLINE=1`` or ``LMFORGE_OFFLINE=1``) it is skipped with a warning, and pip
   runs with a short timeout and no retries, so a container without network never hangs on it.
4. The server starts in this process (it is PID 1's exec target, so it gets SIGTERM itself and drains
   within SageMaker's 30 s; a SIGTERM that comes before the server's own handler, while the imports or
   the requirements run, ends the process at once with code 143: PID 1 would otherwise ignore it, and
   the stop would wait out its 30 s for SIGKILL) on ``$SAGEMAKER_BIND_TO_PORT`` or 8080;
   ``option.model_id`` naming ``s3://`` or a hub id is downloaded into the cache first
   (:mod:`lmforge.artifacts.download`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path

log = logging.getLogger("lmforge.container")

DEFAULT_MODEL_DIR = "/opt/ml/model"
DEFAULT_PROPERTIES = "/opt/lmforge/default/serving.properties"
_TRUE = ("1", "true", "yes", "on")


def _flag(env: MutableMapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    return default if value is None or value == "" else value.strip().lower() in _TRUE


def apply_default_properties(path: Path, env: MutableMapping[str, str]) -> list[str]:
    """Set ``OPTION_<KEY>`` (and ``OPTION_ENGINE``) for each key of the image's default properties that
    the environment does not set; returns the variables set."""
    from lmforge.config import parse_properties

    if not path.is_file():
        return []
    applied = []
    for entry in parse_properties(path.read_text()):
        key = entry.key
        if key == "engine":
            name = "OPTION_ENGINE"
        elif key.startswith("option."):
            name = "OPTION_" + key[len("option.") :].upper()
        else:
            continue
        if name not in env:
            env[name] = entry.value
            applied.append(name)
    return applied


def install_requirements(model_dir: Path, env: MutableMapping[str, str]) -> Path | None:
    """Install the model's requirements.txt into a private folder when allowed; returns the folder."""
    requirements = model_dir / "requirements.txt"
    if not requirements.is_file():
        return None
    if not _flag(env, "LMFORGE_INSTALL_REQUIREMENTS", True):
        log.warning("not installing %s: LMFORGE_INSTALL_REQUIREMENTS is off", requirements)
        return None
    if _flag(env, "HF_HUB_OFFLINE", False) or _flag(env, "LMFORGE_OFFLINE", False):
        log.warning("not installing %s: offline mode (HF_HUB_OFFLINE / LMFORGE_OFFLINE)", requirements)
        return None
    target = Path(env.get("LMFORGE_REQUIREMENTS_DIR") or Path.home() / ".cache" / "lmforge" / "requirements")
    target.mkdir(parents=True, exist_ok=True)
    log.info("installing %s into %s", requirements, target)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--timeout",
        "15",
        "--retries",
        "1",
        "--target",
        str(target),
        "-r",
        str(requirements),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install {requirements}:\n{proc.stderr.strip()[-2000:]}")
    sys.path.insert(0, str(target))
    # child processes (tensor-parallel ranks, the TensorRT-LLM build) must see them too
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return target


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def serve(model_dir: str | None = None) -> int:
    """Steps 1-4 of the module docstring; returns the server's exit code."""
    signal.signal(signal.SIGTERM, _terminated)  # until the server installs its own (step 4)
    from lmforge.serving.launcher import configure_logging
    from lmforge.serving.launcher import serve as run_server

    configure_logging(os.environ.get("LMFORGE_LOG_LEVEL", "info"))
    folder = Path(model_dir or os.environ.get("LMFORGE_MODEL_DIR") or DEFAULT_MODEL_DIR)
    if not folder.is_dir():
        print(f"error: the model folder {folder} does not exist", file=sys.stderr)
        return 2
    applied = apply_default_properties(
        Path(os.environ.get("LMFORGE_DEFAULT_PROPERTIES", DEFAULT_PROPERTIES)), os.environ
    )
    if applied:
        log.info("image defaults applied: %s", ", ".join(applied))
    try:
        install_requirements(folder, os.environ)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    host = os.environ.get("LMFORGE_HOST", "0.0.0.0")
    return run_server(
        str(folder), host=host, port=None, log_level=os.environ.get("LMFORGE_LOG_LEVEL", "info")
    )


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "serve":
        return serve(args[1] if len(args) > 1 else None)
    print(
        f"usage: python -m lmforge.container.entrypoint serve [MODEL_DIR] (got {' '.join(args)})",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
