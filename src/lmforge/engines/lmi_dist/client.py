"""The frontend's handle on LMI-Dist's engine core process (:mod:`.core`): start it, talk to it, watch it.

:class:`CoreProcess` binds the two :mod:`.ipc` pipes in a private folder, starts the core with the
configuration in its environment, and waits for :class:`.ipc.Ready`. While it runs, one task reads
the core's messages: a step's outputs go to the request they belong to (``on_outputs``), replies
resolve the matching :meth:`call`, and a :class:`.ipc.Dead`, a message it cannot read
(:class:`.ipc.MalformedMessage`) or the process's exit ends everything in flight (``on_death``) with
the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lmforge.engines.lmi_dist import ipc
from lmforge.errors import ERROR_TABLE, EngineDeadError, LmforgeError, error_for_status

if TYPE_CHECKING:
    from lmforge.config import ServingConfig

log = logging.getLogger("lmforge.engines.lmi_dist")

_WATCH_EVERY_S = 0.25
#: How long :meth:`CoreProcess.close` lets the core stop by itself before it is killed. A draining
#: server stops its engine 5 s before ``SERVING_SHUTDOWN_TIMEOUT`` (``END_IN_FLIGHT_MARGIN_S``) and
#: must be gone by then, so the polite stop has to fit well inside those 5 s even on a loaded host
#: (an idle core stops in well under a second; a killed one loses nothing, and its tensor-parallel
#: ranks follow it within a second).
_SHUTDOWN_WAIT_S = 3.0


class CoreStartError(LmforgeError):
    """The engine core could not load the model (the message is the core's reason)."""


class CoreProcess:
    def __init__(
        self,
        config: ServingConfig,
        on_outputs: Callable[[list[ipc.Out]], None],
        on_death: Callable[[str], None],
    ) -> None:
        self.config = config
        self.on_outputs = on_outputs
        self.on_death = on_death
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: ipc.Ready | None = None
        self.dead: str | None = None
        self.speculation: ipc.SpeculationCounts | None = None
        """The core's speculative-decoding counters, as its latest :class:`.ipc.Outputs` gave them."""
        self._folder = ipc.socket_folder()
        self._context: Any = None
        self._push: Any = None
        self._pull: Any = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._next_call = 0
        self._ready: asyncio.Future[ipc.Ready] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    # ------------------------------------------------------------------ start

    async def start(self) -> ipc.Ready:
        import zmq
        import zmq.asyncio

        self._context = zmq.asyncio.Context()
        requests = f"ipc://{self._folder}/requests"
        outputs = f"ipc://{self._folder}/outputs"
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.bind(requests)
        self._pull = self._context.socket(zmq.PULL)
        self._pull.bind(outputs)
        env = {
            # PyTorch's CPU allocator asks for transparent huge pages for blocks of 2 MiB and more
            # (prepacked weights, the LM head, LoRA factor sets): fewer TLB misses in a step that
            # streams the weights (SmolLM2-135M on this CPU: ~5 % faster base steps, ~20 % cheaper
            # mixed-LoRA factors); set it to 0 to opt out
            "THP_MEM_ALLOC_ENABLE": "1",
            **os.environ,
            ipc.CONFIG_ENV: self.config.model_dump_json(),
            ipc.REQUESTS_ENV: requests,
            ipc.OUTPUTS_ENV: outputs,
            "LMFORGE_LOG_LEVEL": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        }
        self.proc = subprocess.Popen([sys.executable, "-m", "lmforge.engines.lmi_dist.core"], env=env)
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._tasks = [
            loop.create_task(self._receive(), name="lmi-dist-core-receive"),
            loop.create_task(self._watch(), name="lmi-dist-core-watch"),
        ]
        try:
            self.ready = await self._ready
        except BaseException:
            await self.close(kill=True)
            raise
        log.info("lmi-dist engine core ready (pid %d)", self.ready.pid)
        return self.ready

    # ------------------------------------------------------------------ traffic

    def send(self, message: ipc.Add | ipc.Cancel | ipc.Call | ipc.Shutdown) -> None:
        """Queue a message for the core (never blocks: ZeroMQ buffers it)."""
        if self._push is not None:
            self._push.send(ipc.encode(message), copy=False)

    async def call(self, method: ipc.Method, **args: Any) -> Any:
        """Run one of the core's calls and return its value; its error is raised here, as its kind."""
        if self.dead is not None:
            raise EngineDeadError(f"lmi-dist engine is dead: {self.dead}")
        self._next_call += 1
        call_id = self._next_call
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self.send(ipc.Call(call_id, method, args))
        try:
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def _receive(self) -> None:
        assert self._pull is not None
        while True:
            raw = await self._pull.recv(copy=False)
            try:
                message = ipc.decode_from_core(raw.buffer)
            except ipc.MalformedMessage as err:  # a core this frontend cannot follow: it is dead to it
                self._died(str(err))
                return
            if isinstance(message, ipc.Outputs):
                if message.speculation is not None:
                    self.speculation = message.speculation
                self.on_outputs(message.items)
            elif isinstance(message, ipc.Reply):
                future = self._calls.get(message.call_id)
                if future is not None and not future.done():
                    if message.error is None:
                        future.set_result(message.value)
                    else:
                        future.set_exception(_error(message))
            elif isinstance(message, ipc.Ready):
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(message)
            else:  # Dead
                self._died(message.reason)

    async def _watch(self) -> None:
        assert self.proc is not None
        while True:
            code = self.proc.poll()
            if code is not None:
                await asyncio.sleep(0.05)  # a Dead message sent just before exiting names the cause
                self._died(f"the engine core process exited with code {code}")
                return
            await asyncio.sleep(_WATCH_EVERY_S)

    def _died(self, reason: str) -> None:
        if self.dead is not None or self._stopping:
            return
        self.dead = reason
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(CoreStartError(reason))
            return
        log.error("lmi-dist engine core failed: %s", reason)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(f"lmi-dist engine is dead: {reason}"))
        self.on_death(reason)

    # ------------------------------------------------------------------ stop

    async def close(self, kill: bool = False) -> None:
        """Stop the core (politely unless ``kill``), the reader and the sockets."""
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            if not kill:
                self.send(ipc.Shutdown())
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(proc.wait, _SHUTDOWN_WAIT_S)
            if proc.poll() is None:
                if not kill:
                    log.warning("lmi-dist engine core still running after %.0f s: killed", _SHUTDOWN_WAIT_S)
                proc.kill()
                await asyncio.to_thread(proc.wait)
        for task in self._tasks:
            task.cancel()
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        if self._context is not None:
            self._context.term()
        self._push = self._pull = self._context = None
        ipc.remove_socket_folder(self._folder)


def _error(reply: ipc.Reply) -> LmforgeError:
    kind = reply.kind if reply.kind in ERROR_TABLE else "model_error"
    err = error_for_status(ERROR_TABLE[kind].status, reply.error or "engine core call failed")
    err.param = reply.param
    return err
