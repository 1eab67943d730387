"""vLLM's ZeroMQ IPC sockets go in a folder of lmforge's, removed at the engine's shutdown
(:func:`lmforge.engines.vllm.process_start.private_socket_folder`). vLLM unlinks none of them; before
this every ``lmforge serve`` or ``lmforge compile`` on vLLM left about seven in the temp folder.
The compile test (tests/integration/test_vllm_compile.py) checks a real vLLM run leaves none."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmforge.engines.vllm.process_start import SOCKETS_ENV, private_socket_folder, remove_socket_folder


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """A temp folder with a short path (pytest's tmp_path can be too long for a socket under it)."""
    folder = Path(tempfile.mkdtemp(prefix="lmf-u-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_private_folder_is_made_given_to_vllm_and_removed(
    short_temp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOCKETS_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(short_temp))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile reads TMPDIR again
    folder = private_socket_folder()
    assert folder is not None and Path(folder).parent == short_temp and os.environ[SOCKETS_ENV] == folder
    with socket.socket(socket.AF_UNIX) as sock:  # what vLLM binds there, as long as vLLM's names
        sock.bind(f"{folder}/{uuid.uuid4()}")
    remove_socket_folder(folder)
    assert not Path(folder).exists() and SOCKETS_ENV not in os.environ
    assert list(short_temp.iterdir()) == []


def test_a_folder_the_user_set_is_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOCKETS_ENV, str(tmp_path))
    assert private_socket_folder() is None
    remove_socket_folder(None)
    assert os.environ[SOCKETS_ENV] == str(tmp_path) and tmp_path.is_dir()


def test_a_temp_folder_too_deep_for_a_socket_path_keeps_vllms_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.delenv(SOCKETS_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert private_socket_folder() is None
    assert SOCKETS_ENV not in os.environ and list(deep.iterdir()) == []
