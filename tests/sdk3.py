"""The SageMaker Python SDK v3 beside v2, for the tests that run it (test_sdk_v3, the image tests).

v3 and v2 are the same top-level package, ``sagemaker``: .venv has v2, and v3 is installed beside it
in .venv/sdk3 (``make sdk3``: pinned, without dependencies; what it imports comes from .venv). v3 runs
in subprocesses with .venv/sdk3 first on ``PYTHONPATH`` and only v3's ``sagemaker`` visible
(:data:`V3_ONLY`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDK3 = Path(sys.prefix) / "sdk3"

#: Runs ``argv[2]`` with only v3's ``sagemaker`` importable. v3's package ``__init__`` extends its
#: ``__path__`` over every ``sagemaker/`` folder on ``sys.path`` (``pkgutil.extend_path``), which here
#: includes .venv's v2: a module v3 lacks would load from v2 instead of failing as it does where only
#: v3 is installed. Trimming ``__path__`` once, before anything else imports, closes that.
V3_ONLY = (
    # a short script: the collector would only walk v3's import-time heap, the exit's last collection
    # too (0.45 CPU-s of each run) unless that heap is frozen first
    "import atexit, gc; gc.disable(); atexit.register(gc.freeze); "
    "import os, runpy, sys, sagemaker; "
    "sagemaker.__path__[:] = [p for p in sagemaker.__path__ if os.path.dirname(p) == sys.argv[1]]; "
    "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def ensure_sdk3() -> Path:
    """.venv/sdk3, installed by ``make sdk3`` when it is not there yet."""
    if not (SDK3 / ".installed-stamp").exists():
        proc = subprocess.run(
            ["make", "-s", "sdk3", f"VENV={sys.prefix}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"make sdk3 failed:\n{proc.stdout}\n{proc.stderr}"
    return SDK3


def sdk3_env(local: dict[str, str], sdk3: Path, folder: Path) -> dict[str, str]:
    """``local`` (what ``lmforge local up --print-env`` sets) for SDK v3, its telemetry off (it would
    send a request to AWS with the local account's id); its config file goes in ``folder``."""
    config = folder / "config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
    )
    return {**local, "PYTHONPATH": str(sdk3), "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config)}


def run_v3(
    env: dict[str, str], script: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT ARGS`` with SDK v3 (and only v3) as ``sagemaker``."""
    return subprocess.run(
        [sys.executable, "-c", V3_ONLY, env["PYTHONPATH"], str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
