"""vLLM's ZeroMQ IPC sockets go in a folder of lmforge's, removed at the engine's shutdown
(:func:`lmforge.engines.vllm.process_start.private_socket_folder`). vLLM unlinks none of them; before
this every ``lmforge serve`` or ``lmforge compile`` on vLLM left about seven in the temp folder.
The compile test (tests/integration/test_vllm_compile.py) checks a real vLLM run leaves none."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from lmforge.engines.vllm.process_start import SOCKETS_ENV, private_socket_folder, remove_socket_folder


def test_a_private_folder_is_made_given_to_vllm_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SOCKETS_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile reads TMPDIR again
    folder = private_socket_folder()
    assert folder is not None and Path(folder).parent == tmp_path and os.environ[SOCKETS_ENV] == folder
    with socket.socket(socket.AF_UNIX) as sock:  # what vLLM binds there
        sock.bind(f"{folder}/0f8e5c3a-socket")
    remove_socket_folder(folder)
    assert not Path(folder).exists() and SOCKETS_ENV not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_a_folder_the_user_set_is_theirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SOCKETS_ENV, str(tmp_path))
    assert private_socket_folder() is None
    remove_socket_folder(None)
    assert os.environ[SOCKETS_ENV] == str(tmp_path) and tmp_path.is_dir()
