"""lmforge's vLLM plugin that caps how long vLLM-CPU's message-queue readers busy-wait
(:mod:`lmforge.engines.vllm.idle_wait`), against vLLM's own ``SpinCondition``. The effect on a running
server (the worker's CPU time between requests) is in ``docs/performance.md``; a timing test would be
at the mercy of this machine's neighbours."""

from __future__ import annotations

import shutil
import tempfile
import time
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

    original, wait = SpinCondition.__init__, SpinCondition.wait
    if hasattr(original, idle_wait._PATCHED):
        SpinCondition.__init__ = original.__wrapped__  # type: ignore[method-assign]
    if hasattr(wait, idle_wait._PATCHED):
        SpinCondition.wait = wait.__wrapped__  # type: ignore[method-assign]
    yield SpinCondition
    SpinCondition.__init__, SpinCondition.wait = original, wait  # type: ignore[method-assign]


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


class RecordingPoller:
    """A reader's ZeroMQ poller that records the timeout of each poll (and polls for real)."""

    def __init__(self, poller: Any) -> None:
        self.poller = poller
        self.timeouts: list[int | None] = []

    def poll(self, timeout: int | None = None) -> Any:
        self.timeouts.append(timeout)
        return self.poller.poll(timeout=0)  # nothing is written: answer at once, whatever was asked


def test_a_reader_asleep_within_vllms_window_wakes_after_a_nap_not_the_recheck(
    spin_condition: Any, pair: Any
) -> None:
    """A dropped notification (vLLM's PUB socket drops one while the one before it is queued) must
    not leave a capped reader asleep until vLLM's 5 s recheck while the engine is generating (issue 60:
    every stream of a run stopped for 5.05 s at once). Within vLLM's own one-second window since its
    last read the reader sleeps in naps of the cap; after it, as vLLM does."""
    from vllm.distributed.device_communicators import shm_broadcast

    assert idle_wait.apply(0.01)
    writer, reader = pair()
    assert not hasattr(writer, idle_wait._WINDOW)
    poller = reader.poller = RecordingPoller(reader.poller)
    recheck = shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS
    # just past the busy wait, within vLLM's window: a nap, whether vLLM asked for its recheck or
    # for no limit at all
    reader.last_read = time.monotonic() - 0.05
    reader.wait(timeout_ms=recheck)
    reader.wait()
    assert poller.timeouts == [10, 10]
    # a shorter limit of vLLM's own stands
    reader.wait(timeout_ms=3)
    assert poller.timeouts[-1] == 3
    # idle for longer than vLLM's own window: vLLM's wait, unchanged
    reader.last_read = time.monotonic() - 5
    reader.wait(timeout_ms=recheck)
    assert poller.timeouts[-1] == recheck
    # within the busy wait itself the reader does not poll at all
    reader.record_read()
    reader.wait()
    assert len(poller.timeouts) == 4


def test_vllms_own_poll_is_left_alone(spin_condition: Any, pair: Any) -> None:
    """With a limit at or above vLLM's one second (``LMFORGE_VLLM_CPU_SPIN_MS=1000``), readers are
    vLLM's: no window, no naps."""
    assert idle_wait.apply(1.0)
    _, reader = pair()
    assert not hasattr(reader, idle_wait._WINDOW)  # not capped (the first test checks vLLM's 1 s)
    poller = reader.poller = RecordingPoller(reader.poller)
    reader.last_read = time.monotonic() - 1.5
    reader.wait(timeout_ms=5000)
    assert poller.timeouts == [5000]
