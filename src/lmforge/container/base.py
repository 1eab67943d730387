"""A base image made from Debian packages, for machines that reach no public image registry.

``lmforge container base`` runs ``mmdebstrap`` (Debian's bootstrapper; it reads packages from the
apt mirror this machine already uses) to make a minimal Debian bookworm root filesystem with
Python 3.11, its ``venv`` module and the CA certificates, then imports it into the container engine
as :data:`LOCAL_BASE`. Docs, man pages and locales are left out. ``SOURCE_DATE_EPOCH`` is fixed, so
two runs against the same mirror state give the same files.

The flavours whose ``base_image`` is a Debian bookworm Python 3.11 image (cpu, vllm-cpu, and the
python-slim GPU flavours) build on it unchanged: the Dockerfiles need ``python3.11 -m venv``,
``groupadd``/``useradd`` and ``/bin/sh``, all of which it has.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from lmforge.container.engine import ContainerEngine, Echo, EngineError

LOCAL_BASE = "localhost/lmforge-base:bookworm-python3.11"
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
#: the Debian point release date the filesystem's timestamps are clamped to (reproducible runs)
SOURCE_DATE_EPOCH = "1767225600"  # 2026-01-01T00:00:00Z
_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
)
_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)


class BaseImageError(EngineError):
    pass


def mmdebstrap_command(rootfs: Path, suite: str = SUITE) -> list[str]:
    binary = shutil.which("mmdebstrap")
    if binary is None:
        raise BaseImageError(
            "mmdebstrap is not installed (Debian/Ubuntu: apt-get install mmdebstrap); it makes the base "
            "image from Debian packages. Or pass --base-image with an image your engine already has"
        )
    cmd = [binary, "--variant=minbase", "--include=" + ",".join(PACKAGES)]
    cmd += [f"--dpkgopt=path-exclude={pattern}" for pattern in _EXCLUDES]
    cmd += ["--dpkgopt=path-include=/usr/share/doc/*/copyright"]
    cmd += ["--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*.bin"]
    cmd += [suite, str(rootfs)]
    return cmd


def build_base(engine: ContainerEngine, echo: Echo, *, tag: str = LOCAL_BASE, rebuild: bool = False) -> str:
    """Make :data:`LOCAL_BASE` (unless the engine already has it and not ``rebuild``); returns its tag."""
    if not rebuild and engine.image_exists(tag):
        echo(f"{tag} is already there (--rebuild makes it again)")
        return tag
    with tempfile.TemporaryDirectory(prefix="lmforge-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd = mmdebstrap_command(rootfs)
        echo(f"[1/2] Debian {SUITE} + {', '.join(PACKAGES)} with mmdebstrap (about a minute)")
        echo("$ " + " ".join(cmd))
        started = time.monotonic()
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            hint = " (it needs root, or unshare mode for a normal user)" if "root" in tail.lower() else ""
            raise BaseImageError(f"mmdebstrap failed{hint}:\n{tail}")
        size_mb = rootfs.stat().st_size / 1e6
        echo(f"      root filesystem {size_mb:.0f} MB in {time.monotonic() - started:.0f} s")
        echo(f"[2/2] importing it as {tag}")
        engine.import_rootfs(rootfs, tag, _CHANGES)
    return tag
