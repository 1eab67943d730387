"""lmforge.process: an entry point's exit keeps what a normal exit does (status, atexit handlers,
buffered output, temporary folders) and skips the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = """
import atexit, logging, sys, tempfile
from pathlib import Path
from lmforge.process import run_main

def main():
    keep = tempfile.TemporaryDirectory(dir={tmp!r})  # removed by its finalizer, an atexit hook
    Path(keep.name, "f").write_text("x")
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    logging.basicConfig(stream=sys.stderr, format="%(message)s")
    logging.getLogger("t").warning("logged")
    sys.stdout.write("buffered, no newline")
    {end}

run_main(main)
print("not reached")
"""


def run(tmp_path: Path, end: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(SCRIPT).format(tmp=str(tmp_path), end=end)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("end", "status", "message"),
    [
        ("return 3", 3, ""),
        ("return None", 0, ""),
        ("sys.exit(4)", 4, ""),
        ("sys.exit('bad input')", 1, "bad input"),
    ],
)
def test_status_output_atexit_and_temporary_folders_as_a_normal_exit(
    tmp_path: Path, end: str, status: int, message: str
) -> None:
    proc = run(tmp_path, end)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert "atexit ran" in proc.stderr and "logged" in proc.stderr
    assert message in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_exception_still_ends_with_its_traceback(tmp_path: Path) -> None:
    proc = run(tmp_path, "raise ValueError('boom')")
    assert proc.returncode == 1
    assert "ValueError: boom" in proc.stderr and "atexit ran" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_freeze_startup_heap_hides_the_heap_from_the_collector_collecting_its_cycles_if_asked() -> None:
    code = textwrap.dedent(
        """
        import gc, weakref
        from lmforge.process import freeze_startup_heap

        class Node:
            pass

        def garbage():  # start-up's garbage: a cycle nothing else reaches
            cycle = Node(); cycle.me = cycle
            return weakref.ref(cycle)

        live = [Node() for _ in range(1000)]  # what start-up keeps
        gc.disable()
        kept = garbage()
        freeze_startup_heap(collect=False)
        assert kept() is not None, "collect=False walked the heap"
        assert gc.get_freeze_count() >= len(live)
        assert not any(o is live for o in gc.get_objects())  # a full collection no longer walks it
        gc.collect()
        assert kept() is not None, "frozen garbage is kept for good"
        dead = garbage()
        freeze_startup_heap(collect=True)
        assert dead() is None, "cyclic garbage was frozen instead of collected"
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_collector_is_off_for_the_start_up_on_after_it_and_on_in_a_child_forked_meanwhile() -> None:
    code = textwrap.dedent(
        """
        import gc, os
        from lmforge.process import freeze_imports, freeze_startup_heap, pause_gc_for_startup

        pause_gc_for_startup()
        assert not gc.isenabled()
        pid = os.fork()
        if pid == 0:  # vLLM's engine core, forked from the server process while it starts
            os._exit(0 if gc.isenabled() else 3)
        assert os.waitpid(pid, 0)[1] == 0, "the forked child runs without the collector"
        assert not gc.isenabled(), "the fork turned the parent's collector back on"
        live = [object() for _ in range(10)]
        freeze_imports()  # mid-start: frozen, and the collector stays off
        assert not gc.isenabled() and gc.get_freeze_count() >= len(live)
        freeze_startup_heap(collect=False)
        assert gc.isenabled()
        gc.disable()  # someone else's choice: kept by both
        pause_gc_for_startup()
        freeze_startup_heap(collect=True)
        assert not gc.isenabled()
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
