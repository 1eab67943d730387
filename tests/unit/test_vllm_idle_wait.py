"""lmforge's vLLM plugin that caps how long vLLM-CPU's message-queue readers busy-wait
(:mod:`lmforge.engines.vllm.idle_wait`), against vLLM's own ``SpinCondition``. The effect on a running
server (the worker's CPU time between requests) is in ``docs/performance.md``; a timing test would be
at the mercy of this machine's neighbours."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest

from lmforge.engines.vllm import idle_wait
from tests.shared_vllm import needs_vllm

pytestmark = [needs_vllm, pytest.mark.xdist_group("vllm-unit")]


@pytest.fixture
def spin_condition() -> Iterator[Any]:
    """vLLM's class as vLLM wrote it (this process may have loaded vLLM's plugins already), with its
    ``__init__`` as it was put back after the test."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    original = SpinCondition.__init__
    if hasattr(original, idle_wait._PATCHED):
        SpinCondition.__init__ = original.__wrapped__  # type: ignore[method-assign]
    yield SpinCondition
    SpinCondition.__init__ = original  # type: ignore[method-assign]


@pytest.fixture
def pair(spin_condition: Any) -> Iterator[Any]:
    """``pair()``: a writer and a reader of one notification address, as vLLM's queues make them."""
    import zmq

    context = zmq.Context()
    folder = tempfile.mkdtemp(prefix="lmf-spin-")  # short: a Unix socket's path has ~107 bytes
    made = 0

    def make() -> tuple[Any, Any]:
        nonlocal made
        made += 1
        address = f"ipc://{folder}/notify-{made}"
        writer = spin_condition(is_reader=False, context=context, notify_address=address)
        return writer, spin_condition(is_reader=True, context=context, notify_address=address)

    yield make
    context.destroy(linger=0)
    shutil.rmtree(folder, ignore_errors=True)


def test_readers_poll_for_at_most_the_limit_and_writers_are_untouched(spin_condition: Any, pair: Any) -> None:
    _, reader = pair()
    assert reader.busy_loop_s == 1, "vLLM's own default changed: re-measure before keeping this plugin"
    assert idle_wait.apply(0.01)
    writer, reader = pair()
    assert reader.busy_loop_s == pytest.approx(0.01)
    assert writer.busy_loop_s == 0
    # applied again: the new limit holds and the wrapper does not stack
    assert idle_wait.apply(0.5)
    _, reader = pair()
    assert reader.busy_loop_s == pytest.approx(0.5)
    assert not hasattr(spin_condition.__init__.__wrapped__, idle_wait._PATCHED)


def test_the_limit_is_read_from_the_environment() -> None:
    assert idle_wait.spin_seconds({}) == pytest.approx(idle_wait.DEFAULT_SPIN_MS / 1000)
    assert idle_wait.spin_seconds({idle_wait.ENV: "1000"}) == pytest.approx(1.0)
    assert idle_wait.spin_seconds({idle_wait.ENV: "0"}) == 0.0
    assert idle_wait.spin_seconds({idle_wait.ENV: "-5"}) == 0.0
    assert idle_wait.spin_seconds({idle_wait.ENV: "soon"}) == pytest.approx(idle_wait.DEFAULT_SPIN_MS / 1000)


def test_the_plugin_is_installed_where_vllm_looks_for_it() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get(idle_wait.PLUGIN_NAME) == "lmforge.engines.vllm.idle_wait:register"
