"""How lmforge's processes end (their own clean-up, then no interpreter teardown), and how a long-lived
one keeps its start-up heap out of the garbage collector's way (:func:`pause_gc_for_startup`, then
:func:`freeze_startup_heap`).

A process that imported torch and transformers holds several hundred thousand Python objects. At a
normal exit CPython's finalization runs a last full garbage collection over all of them and then
tears the modules down one by one: about a CPU-second for every engine core (1 to 1.7 on this
2-core machine; py-spy ``--native``: nearly all of it in ``gc_collect_main``), less for a server or
a CLI command, work that frees memory the kernel is about to take back anyway.

The entry points (``python -m lmforge``, the engine core and its ranks, the container entrypoint,
the local SageMaker) therefore finish their own work, then call :func:`exit_process`: it runs the
``atexit`` handlers as a normal exit would (temporary folders, logging's last flush, anything a
library registered), flushes stdout and stderr, and ends the process with :func:`os._exit`. Sockets,
pipes and files are closed by the kernel as for any exit. What it skips is joining threads that
are still running at that point (a normal exit waits for non-daemon threads), so it is only for
callers whose work is done when they call it.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick; free until someone else takes it)."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: it exists (even as another user's) and is not a zombie that
    has exited and waits for its parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
    except (OSError, IndexError):
        pass  # no /proc (not Linux), or gone: the signal below decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_gc_paused = False
_fork_hook = False


def pause_gc_for_startup() -> None:
    """Turn CPython's cyclic garbage collector off until :func:`freeze_startup_heap` (at the end of the
    start-up, or between the imports and a model's weights: a cycle that holds tensors must be freed
    as usual, not at the end).

    Importing torch and transformers (or vLLM) makes some 400 000 objects that live as long as the
    process, and the collector walks the growing heap again and again meanwhile, finding next to no
    garbage: with it off, an LMI-Dist engine core's imports take 2.8 CPU-s instead of 3.4 on this
    2-core machine, vLLM's 5.0 instead of 6.6. Reference counting still frees all acyclic garbage; the
    few cycles made meanwhile wait for the one collection :func:`freeze_startup_heap` runs. A child
    forked meanwhile (vLLM's engine core, forked from the server process) gets the collector back on at
    once. Does nothing when the collector is already off (someone else's choice, kept).

    Kept where it cuts a start a user waits for (with :func:`freeze_startup_heap`, CPU-s of the
    started process tree to the first ``/ping`` 200 of ``lmforge serve`` on the tiny model, medians,
    2026-12, this 2-core machine): the LMI-Dist engine core's start 3.9 -> 2.8 CPU-s (5 starts each),
    the vLLM server process's 7.9 -> 6.5 (3 starts each). The local SageMaker's start gained 0.07 CPU-s
    of 1.06 (5 starts each, within the noise): it no longer uses them."""
    global _gc_paused, _fork_hook
    if _gc_paused or not gc.isenabled():
        return
    if not _fork_hook:
        os.register_at_fork(after_in_child=_resume_gc)
        _fork_hook = True
    gc.disable()
    _gc_paused = True


def _resume_gc() -> None:
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.enable()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off within the block, as it was after it: for a bounded burst of
    work that makes many long-lived objects and next to no cycles (a model conversion: torch and
    transformers imported, a GGUF's 49 k-token vocabulary parsed), where the collector would walk the
    growing heap again and again for nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def freeze_imports() -> None:
    """Move what the imports so far made out of the collector's view (:func:`gc.freeze`), without a
    collection and leaving a paused collector paused: for a start with more to do before
    :func:`freeze_startup_heap` (building an engine, loading weights), whose final collection then
    walks only what came after. Imports make next to no cyclic garbage (vLLM's, in a server process:
    ~17 000 of ~980 000 objects, kept for good), and walking them cost 0.6 CPU-s."""
    gc.freeze()


def freeze_startup_heap(*, collect: bool) -> None:
    """Move every object the process holds (modules, the tokenizer, the engine's state: what lives as
    long as the process) out of the garbage collector's view (:func:`gc.freeze`), and turn the
    collector back on if :func:`pause_gc_for_startup` turned it off. A full collection while serving
    then walks only what serving made, not the start-up heap: the server's full collections were ~40 ms
    pauses of its event loop every ~15 s at 32 concurrent streams, and an engine core's start-up heap
    (~600 000 objects) takes ~0.3 s to walk, a pause of the generation loop. For the end of a
    process's start-up (or of its imports), once.

    ``collect`` first collects the cyclic garbage, which walks the whole heap once. Without it, that
    garbage is frozen with the rest and kept for the life of the process: after the imports it is
    little (an engine core: 9 000 of 600 000 objects, ~15 000 allocator blocks, about 1 MB; vLLM's
    server process: 17 000 of 980 000) and the walk is what costs (0.3 and 0.6 CPU-s here). Collect
    where the garbage may hold something big (a cycle through tensors, once weights are loaded) and
    where the heap since the last freeze is small anyway."""
    if collect:
        gc.collect()
    gc.freeze()
    _resume_gc()


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` would give: ``None`` is 0, an int is itself, anything else is
    printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def exit_process(code: object = 0) -> NoReturn:
    """End this process now with ``code`` (as :func:`sys.exit` reads it), after the ``atexit``
    handlers and a flush of stdout and stderr, without the interpreter's teardown."""
    status = exit_code(code)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(status)


def run_main(main: Callable[[], object]) -> NoReturn:
    """Call ``main()`` (a process's entry point), then :func:`exit_process` with what it returned or
    the code of the :class:`SystemExit` it raised. Any other exception propagates as usual (its
    traceback printed, a normal exit). transformers' import scans come from lmforge's cache in the
    process (:mod:`lmforge.import_cache`)."""
    from lmforge import import_cache

    import_cache.install()
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    exit_process(code)
