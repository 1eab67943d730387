"""One build per cache key across processes: a file lock beside the key's output folder.

Two servers (or a server and ``lmforge compile``) that ask for the same TensorRT-LLM engine or quantized
checkpoint at once must build it once: the first takes ``<cache>/.<key>.lock`` (``fcntl.flock``), the
others wait, saying every few seconds who holds it and for how long, then find the finished folder.

The kernel drops a ``flock`` when its holder dies, so a crashed builder never blocks anyone. A lock can
still outlive its builder when a process that inherited the descriptor keeps running (a stray child);
the holder's pid and host are written into the lock file, and a waiter on the same host that finds the
recorded pid dead breaks the lock (the file is unlinked and made anew; whoever then holds the lock on the
file at the path owns it). A live holder is never broken, however long it takes: the caller's deadline
(``option.model_loading_timeout``) bounds the wait.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.process import pid_alive

log = logging.getLogger("lmforge.engines.trtllm")


class LockTimeoutError(LmforgeError):
    kind = "model_error"


def lock_path(output: Path) -> Path:
    """The lock file of the build that writes ``output``."""
    return output.with_name(f".{output.name}.lock")


def _holder(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(path: Path, inode: int) -> bool:
    """True when the lock file still at ``path`` names a dead holder on this host."""
    holder = _holder(path)
    pid = holder.get("pid")
    try:
        same = os.stat(path).st_ino == inode
    except FileNotFoundError:
        return False
    return same and isinstance(pid, int) and holder.get("host") == socket.gethostname() and not pid_alive(pid)


def _try_lock(path: Path) -> int | None:
    """A descriptor holding the lock on the file now at ``path``, or None when someone else holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    try:
        if os.fstat(fd).st_ino != os.stat(path).st_ino:  # the file was replaced (a broken lock) meanwhile
            os.close(fd)
            return None
    except FileNotFoundError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def build_lock(
    output: Path,
    *,
    timeout_s: float,
    progress: Callable[[str], None] = log.info,
    every_s: float = 5.0,
    poll_s: float = 0.2,
) -> Iterator[None]:
    """Hold the build lock of ``output`` for the ``with`` block; waits (reporting every ``every_s``)
    while another process holds it; LockTimeoutError after ``timeout_s``."""
    path = lock_path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    next_report = started
    fd = _try_lock(path)
    while fd is None:
        now = time.monotonic()
        holder = _holder(path)
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            inode = -1
        if inode != -1 and _stale(path, inode):
            progress(f"breaking the stale build lock {path}: its holder (pid {holder.get('pid')}) is gone")
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == inode:
                    path.unlink()
        elif now - started >= timeout_s:
            who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            raise LockTimeoutError(
                f"another process ({who}) has been building {output.name} for longer than {timeout_s:.0f} s "
                f"(option.model_loading_timeout); its lock is {path}"
            )
        elif now >= next_report:
            since = holder.get("since")
            age = f" for {time.time() - since:.0f} s" if isinstance(since, int | float) else ""
            progress(
                f"waiting for pid {holder.get('pid', '?')} on {holder.get('host', '?')}, which is building "
                f"{output.name}{age} (waited {now - started:.0f} s)"
            )
            next_report = now + every_s
        time.sleep(poll_s)
        fd = _try_lock(path)
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)
