"""The modes of the model folders lmforge writes.

safetensors (and ``tempfile.mkdtemp``) create files 0600 and folders 0700 whatever the umask, but a
folder lmforge writes is served by other users too: the images run their server as uid 1000 over a
folder mounted from the host, and SageMaker's model data is read by the container's user."""

from __future__ import annotations

import os
from pathlib import Path

#: a model file: its owner writes it, everyone reads it
FILE_MODE = 0o644
#: a model folder: its owner writes in it, everyone lists and enters it
DIR_MODE = 0o755


def make_readable(folder: Path) -> None:
    """``folder`` and everything under it readable by every user (files :data:`FILE_MODE`, folders
    :data:`DIR_MODE`); links are left as they are."""
    os.chmod(folder, DIR_MODE)
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            path = Path(root, name)
            if not path.is_symlink():
                os.chmod(path, DIR_MODE)
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                os.chmod(path, FILE_MODE)
