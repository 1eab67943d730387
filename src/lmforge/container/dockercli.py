"""Which docker CLI builds: of the ``docker`` executables on ``PATH``, the first that can drive BuildKit.

lmforge's Dockerfiles need BuildKit (``RUN --mount=type=secret``). A docker CLI reaches it in one of
two ways: the buildx plugin (``docker buildx build``, any CLI that has the plugin), or, on a CLI older
than 23.0, ``docker build`` with ``DOCKER_BUILDKIT=1``, which drives the daemon's own BuildKit. From
23.0 on, ``docker build`` with BuildKit *is* buildx: without the plugin the CLI refuses
(``BuildKit is enabled but the buildx component is missing or broken``) and only the legacy builder,
which has no ``RUN --mount``, is left. Debian bookworm packages no buildx, but its ``docker.io``
(20.10) CLI has BuildKit built in; a newer CLI earlier on ``PATH`` (``/usr/local/bin/docker`` 28.x,
say) is then passed over for building, and the one CLI chosen runs every command.

Nothing here talks to a daemon: ``docker --version`` and ``docker buildx version`` need none.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Builder = Literal["podman", "buildx", "buildkit", "none"]
"""How an engine builds: podman; ``docker buildx build``; ``DOCKER_BUILDKIT=1 docker build`` (a CLI
older than 23.0); or not at all (a docker CLI 23.0 or later without the buildx plugin)."""

#: the first docker CLI release whose ``docker build`` reaches BuildKit only through buildx
BUILDX_ONLY_FROM = (23, 0)
#: the first one whose ``docker build`` has BuildKit (and ``--secret``)
BUILDKIT_FROM = (18, 9)
_PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class DockerCli:
    path: str
    version: str
    """As ``docker --version`` says it (``20.10.24+dfsg1``), or ``""`` when it did not answer."""
    builder: Builder

    def label(self) -> str:
        return f"{self.path} ({self.version or 'unknown version'})"


def on_path(path: str | None = None) -> list[str]:
    """Every executable named ``docker`` on ``PATH``, in order, each real file once."""
    found: list[str] = []
    seen: set[str] = set()
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        candidate = Path(folder or ".") / "docker"
        if not (candidate.is_file() and os.access(candidate, os.X_OK)):
            continue
        real = os.path.realpath(candidate)
        if real not in seen:
            seen.add(real)
            found.append(str(candidate))
    return found


def parse_version(text: str) -> tuple[int, ...] | None:
    """``Docker version 20.10.24+dfsg1, build 297e128`` -> (20, 10, 24)."""
    match = re.search(r"version v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part) for part in match.groups() if part is not None) if match else None


def _output(argv: list[str]) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return -1, ""
    return proc.returncode, proc.stdout + proc.stderr


def probe(binary: str) -> DockerCli:
    """What ``binary`` is and how it builds."""
    code, text = _output([binary, "--version"])
    numbers = parse_version(text) if code == 0 else None
    shown = re.search(r"version (\S+?),", text)
    version = shown.group(1) if shown else ".".join(map(str, numbers or ()))
    if _output([binary, "buildx", "version"])[0] == 0:
        return DockerCli(binary, version, "buildx")
    if numbers is not None and BUILDKIT_FROM <= numbers[:2] < BUILDX_ONLY_FROM:
        return DockerCli(binary, version, "buildkit")
    return DockerCli(binary, version, "none")


def choose(clis: list[DockerCli]) -> tuple[DockerCli, list[DockerCli]]:
    """The CLI to use (the first that can build, else the first) and those passed over for it."""
    for index, cli in enumerate(clis):
        if cli.builder != "none":
            return cli, clis[:index]
    return clis[0], []
