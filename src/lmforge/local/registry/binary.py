"""Finding the registry binary: ``$LMFORGE_REGISTRY_BINARY``, else ``docker-registry`` or ``registry``."""

from __future__ import annotations

import os
import shutil

BINARY_ENV = "LMFORGE_REGISTRY_BINARY"
BINARY_NAMES = ("docker-registry", "registry")

_INSTALL_HINT = (
    "install it with `apt-get install docker-registry` (Debian/Ubuntu), put any CNCF distribution "
    f"`registry` binary on PATH, or set {BINARY_ENV} to its path"
)


def find_registry_binary() -> str | None:
    """The registry binary to run: ``$LMFORGE_REGISTRY_BINARY``, else ``docker-registry``/``registry``."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        return shutil.which(configured)
    for name in BINARY_NAMES:
        if found := shutil.which(name):
            return found
    return None


def missing_binary_message() -> str:
    """What to tell a user who has no registry binary."""
    configured = os.environ.get(BINARY_ENV)
    if configured:
        return f"{BINARY_ENV}={configured} is not an executable file; {_INSTALL_HINT}"
    return f"no OCI registry binary (docker-registry or registry) on PATH; {_INSTALL_HINT}"
