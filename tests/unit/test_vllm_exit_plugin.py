"""lmforge.engines.vllm.exit_plugin: a vLLM process lmforge starts freezes its heap at exit, so the
interpreter's last collection skips it; its exit code is unchanged, and other processes are untouched."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from lmforge.engines.vllm import exit_plugin

#: a cycle that only the exit's last collection reaches, whose __del__ says so on a pipe
CHILD = textwrap.dedent(
    """
    import gc, os, sys
    from lmforge.engines.vllm import exit_plugin

    exit_plugin.register()
    fd = int(sys.argv[1])

    class Node:
        def __del__(self):
            os.write(fd, b"collected")

    node = Node(); node.me = node; del node
    gc.disable()  # nothing collects it before the exit does
    sys.exit(3)
    """
)


def _exit(env_value: str | None) -> tuple[int, bytes]:
    read, write = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != exit_plugin.ENV}
    if env_value is not None:
        env[exit_plugin.ENV] = env_value
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(write)], pass_fds=(write,), env=env, capture_output=True, timeout=60
    )
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read()
    return proc.returncode, said


@pytest.mark.parametrize(("value", "walked"), [(None, True), ("0", True), ("1", False)])
def test_the_exit_skips_the_last_walk_of_the_heap_only_where_lmforge_asks(
    value: str | None, walked: bool
) -> None:
    code, said = _exit(value)
    assert code == 3, "the exit code is the process's own"
    assert (said == b"collected") is walked


def test_the_plugin_is_an_entry_point_vllm_loads() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get(exit_plugin.PLUGIN_NAME) == "lmforge.engines.vllm.exit_plugin:register"
