"""The build lock (lmforge.engines.trtllm.lock) with real processes: two builders of one key build once and
the second says whom it waits for; a lock kept by a process whose recorded holder is dead is broken; a
live holder is waited for up to the deadline, never broken."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmforge.engines.trtllm.lock import LockTimeoutError, build_lock, lock_path

SRC = str(Path(__file__).resolve().parents[2] / "src")

BUILDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lmforge.engines.trtllm.lock import build_lock
    out, count = Path(sys.argv[1]), Path(sys.argv[2])
    with build_lock(out, timeout_s=60, progress=lambda m: print(m, flush=True), every_s=0.5):
        if out.exists():
            print("reused", flush=True)
        else:
            with open(count, "a") as f:
                f.write("build\\n")
            time.sleep(2)
            out.mkdir()
            print("built", flush=True)
    """
)

#: holds the lock like a stray child that inherited it, with a holder record naming someone else
HOLDER = textwrap.dedent(
    """
    import fcntl, json, os, socket, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    record = {"pid": int(sys.argv[2]), "host": socket.gethostname(), "since": time.time()}
    os.write(fd, json.dumps(record).encode())
    print("held", flush=True)
    time.sleep(60)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}


def test_two_processes_build_one_key_once(tmp_path: Path) -> None:
    out, count = tmp_path / "cache" / "key", tmp_path / "builds.txt"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILDER, str(out), str(count)],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert count.read_text().splitlines() == ["build"]
    assert sorted(o.strip().splitlines()[-1] for o in outputs) == ["built", "reused"]
    waiter = next(o for o in outputs if "reused" in o)
    assert "waiting for pid" in waiter and "which is building key" in waiter
    assert out.is_dir() and lock_path(out).is_file()


def _holder(path: Path, recorded_pid: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(recorded_pid)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_whose_recorded_holder_is_dead_is_broken(tmp_path: Path) -> None:
    out = tmp_path / "key"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stray = _holder(lock_path(out), gone.pid)
    try:
        lines: list[str] = []
        # taken, not waited out: a lock still held at timeout_s raises LockTimeoutError
        with build_lock(out, timeout_s=20, progress=lines.append, poll_s=0.05):
            record = json.loads(lock_path(out).read_text())
            assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert any("breaking the stale build lock" in line and str(gone.pid) in line for line in lines)
    finally:
        stray.kill()
        stray.wait()


def test_a_live_holder_is_waited_for_until_the_deadline(tmp_path: Path) -> None:
    out = tmp_path / "key"
    holder = _holder(lock_path(out), os.getpid())  # names a live process: never stale
    try:
        lines: list[str] = []
        with (
            pytest.raises(LockTimeoutError, match=r"longer than 1 s \(option.model_loading_timeout\)"),
            build_lock(out, timeout_s=1, progress=lines.append, every_s=0.2, poll_s=0.05),
        ):
            pytest.fail("the lock was taken from a live holder")
        assert any(f"waiting for pid {os.getpid()}" in line for line in lines)
    finally:
        holder.kill()
        holder.wait()
    with build_lock(out, timeout_s=5):  # the kernel released the killed holder's lock
        pass
