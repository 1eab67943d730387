"""LMI-Dist's engine core: the model, transformers' batching loop and lmforge's sampler in a process of
their own (``python -m lmforge.engines.lmi_dist.core``, started by :class:`.client.CoreProcess`).

The server process keeps HTTP, parsing, tokenization, detokenization and stop strings; this process
only schedules and computes, so the two no longer share one interpreter lock. It reads
:mod:`.ipc` messages from the frontend on its main thread; transformers' generation thread runs the
steps and, through :class:`CoreRouter`, sends every step's new tokens of all requests as one message.
Work that may take a while (compiling a request's grammar, reading an adapter's weights) runs on a
helper thread, so requests and cancels keep flowing.

It ends with exit code 0 after a :class:`.ipc.Shutdown`; it reports :class:`.ipc.Dead` and exits 1
when the generation loop or a tensor-parallel rank fails or a message from the frontend cannot be
read (:class:`.ipc.MalformedMessage`), and exits 1 when the frontend is gone. With
``option.tensor_parallel_degree`` N it is rank 0 and starts ranks 1..N-1 (:mod:`.distributed`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, assert_never

from lmforge.engines.lmi_dist import ipc
from lmforge.engines.lmi_dist.ipc import Method
from lmforge.engines.lmi_dist.profiling import CoreProfiler
from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.distributed import FollowerGroup
    from lmforge.engines.lmi_dist.loading import Built
    from lmforge.engines.lmi_dist.sampler import Record
    from lmforge.engines.lmi_dist.speculative import Speculator

log = logging.getLogger("lmforge.engines.lmi_dist")

_POLL_MS = 250


class _ScoreJob(NamedTuple):
    """A ``score_prompt`` call, read."""

    call_id: int
    ids: list[int]
    top_n: int
    adapter: int


@dataclass
class _Track:
    key: int
    record: Record
    top_n: int
    sent: int = 0
    cancelled: bool = field(default=False)


def _router_class() -> type:
    from transformers.generation.continuous_batching.continuous_api import OutputRouter
    from transformers.generation.continuous_batching.requests import RequestStatus

    class CoreRouter(OutputRouter):  # type: ignore[misc]
        """Replaces the manager's router: each step's outputs become one :class:`.ipc.Outputs`."""

        def __init__(self, core: Core) -> None:
            super().__init__()
            self.core = core
            self.tracks: dict[str, _Track] = {}

        def deliver(self, output: Any) -> None:
            self.deliver_batch([output])

        def deliver_batch(self, outputs: list[Any]) -> None:
            items = []
            for output in outputs:
                if output.status == RequestStatus.FAILED and self.core.loop_ending():
                    continue  # the loop is dying: every request learns why from the Dead message
                track = self.tracks.get(output.request_id)
                if track is None:
                    continue  # cancelled: nobody listens
                generated = output.generated_tokens
                new = generated[track.sent :]
                end = track.sent + len(new)
                logprobs = track.record.logprobs[track.sent : end]
                logprobs += [float("nan")] * (len(new) - len(logprobs))
                top = track.record.top_logprobs[track.sent : end] if track.top_n else None
                track.sent = end
                status = ipc.RUNNING
                if output.status == RequestStatus.FINISHED:
                    status = ipc.FINISHED
                elif output.status == RequestStatus.FAILED:
                    status = ipc.FAILED
                if status != ipc.RUNNING:
                    self.core.forget(output.request_id)
                error = str(output.error) if status == ipc.FAILED else None
                items.append(ipc.Out(output.request_id, new, logprobs, top, status, error))
            if items:
                speculator = self.core.speculator
                counts = speculator.stats.wire() if speculator is not None else None
                self.core.send(ipc.Outputs(items, counts))

    return CoreRouter


class Core:
    def __init__(self, config: ServingConfig, push: Any) -> None:
        self.config = config
        self._push = push
        self._send_lock = threading.Lock()
        self._helper = ThreadPoolExecutor(1, thread_name_prefix="lmi-dist-core-helper")
        self._to_score: list[ipc.Call] = []
        self._to_score_lock = threading.Lock()
        self.built: Built | None = None
        self.followers: FollowerGroup | None = None
        self.router: Any = None
        self.speculator: Speculator | None = None
        self.stopping = False
        self.profiler = CoreProfiler()

    def send(self, message: Any) -> None:
        with self._send_lock:
            self._push.send(ipc.encode(message), copy=False)

    # ------------------------------------------------------------------ start

    def load(self) -> None:
        from lmforge.engines.lmi_dist.distributed import FollowerGroup, tensor_parallel_size
        from lmforge.engines.lmi_dist.loading import build
        from lmforge.process import freeze_startup_heap

        world = tensor_parallel_size(self.config)
        if world > 1:
            self.followers = FollowerGroup(self.config, world)
        try:
            built = build(self.config)
        except BaseException:
            if self.followers is not None:
                for proc in self.followers.procs:
                    proc.kill()
            raise
        self.router = _router_class()(self)
        self.speculator = self._speculate(built)
        built.manager.output_router = self.router
        if built.manager.batch_processor is not None:  # made by the warm-up; start() reuses it
            built.manager.batch_processor.output_router = self.router
        freeze_startup_heap(collect=True)  # what the load made since the imports' freeze: small
        built.manager.start()
        self.built = built
        self.send(
            ipc.Ready(
                max_model_len=built.max_model_len,
                eos_ids=built.eos_ids,
                lora_layers=built.lora.layers() if built.lora is not None else {},
                pid=os.getpid(),
                world=world,
            )
        )

    def _speculate(self, built: Built) -> Speculator | None:
        """Speculative decoding (:mod:`.speculative`) as ``option.speculative_config`` asks, or None."""
        from lmforge.engines.lmi_dist.speculative import install

        # the ranks (follower.py) install it too: each schedules the same drafts, as each makes the
        # same choices (the sampler's draws are pure functions of the request)
        return install(built, self.config)

    # ------------------------------------------------------------------ messages

    def serve(self, pull: Any, parent: int) -> int:
        """Handle the frontend's messages until shutdown (0) or a failure (1); ``parent`` is the server
        process's pid, read before the model loaded (a server killed during the load counts as gone)."""
        import zmq

        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        while True:
            if poller.poll(_POLL_MS):
                while True:
                    try:
                        raw = pull.recv(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    try:
                        message = ipc.decode_to_core(raw.buffer)
                    except ipc.MalformedMessage as err:  # a frontend this core cannot trust: stop
                        log.error("lmi-dist engine core: %s", err)
                        self.send(ipc.Dead(str(err)))
                        self.stop()
                        return 1
                    if isinstance(message, ipc.Shutdown):
                        self.stop()
                        return 0
                    self.handle(message)
            failure = self.failure()
            if failure is not None:
                log.error("lmi-dist engine core: %s", failure)
                self.send(ipc.Dead(failure))
                self.stop()
                return 1
            if os.getppid() != parent:
                log.error("lmi-dist engine core: the server process is gone; exiting")
                try:
                    self.stop()
                finally:
                    # the server never will
                    ipc.remove_socket_folder(ipc.folder_of(os.environ[ipc.REQUESTS_ENV]))
                return 1

    def handle(self, message: ipc.Add | ipc.Cancel | ipc.Call) -> None:
        if isinstance(message, ipc.Add):
            self.add(message)
        elif isinstance(message, ipc.Cancel):
            track = self.router.tracks.get(message.rid)
            if track is not None:
                track.cancelled = True
            self.forget(message.rid)
            assert self.built is not None
            self.built.manager.cancel_request(message.rid)
        elif message.method is Method.SCORE_PROMPT:
            with self._to_score_lock:
                self._to_score.append(message)
                first = len(self._to_score) == 1
            if first:  # else a turn of the helper that has not taken the waiting prompts yet will
                self._helper.submit(self.score_waiting)
        else:
            self._helper.submit(self.call, message)

    def add(self, message: ipc.Add) -> None:
        from lmforge.engines.lmi_dist.sampler import LORA_KWARG, request_kwargs

        assert self.built is not None
        sampling = message.sampling
        key, record = self.built.sampler.register()
        track = _Track(key, record, sampling.top_n)
        self.router.tracks[message.rid] = track
        kwargs = request_kwargs(key, sampling)
        if message.lora:
            kwargs[LORA_KWARG] = message.lora
        manager = self.built.manager
        ends = sampling.end_ids(self.built.eos_ids)

        def submit() -> None:
            manager.add_request(
                message.prompt,
                request_id=message.rid,
                max_new_tokens=sampling.max_new_tokens,
                streaming=True,
                eos_token_id=ends or -1,
                **kwargs,
            )

        if sampling.structured is None:
            submit()
            return
        constraint, sampler = sampling.structured, self.built.sampler

        def compile_then_submit() -> None:  # compiling may take seconds: off the message loop
            try:
                sampler.grammars.compile(constraint)
            except LmforgeError as err:
                self.forget(message.rid)
                self.send(
                    ipc.Outputs([ipc.Out(message.rid, [], [], None, ipc.REJECTED, err.message, err.param)])
                )
                return
            except Exception as exc:  # never leave the request waiting for an answer
                log.exception("lmi-dist engine core: compiling request %s's grammar failed", message.rid)
                self.forget(message.rid)
                reason = f"the structured-output grammar failed: {type(exc).__name__}: {exc}"
                self.send(ipc.Outputs([ipc.Out(message.rid, [], [], None, ipc.FAILED, reason)]))
                return
            if not track.cancelled:
                submit()

        self._helper.submit(compile_then_submit)

    def forget(self, rid: str) -> None:
        track = self.router.tracks.pop(rid, None)
        if track is not None and self.built is not None:
            self.built.sampler.remove(track.key)

    def score_waiting(self) -> None:
        """Score every prompt waiting (``score_prompt`` calls), those of one adapter together
        (:func:`.prompt_scores.passes`), and answer each call. When a shared pass fails, each of its
        prompts is scored alone: one bad prompt never fails the others."""
        from lmforge.engines.lmi_dist.prompt_scores import passes, score_prompts

        with self._to_score_lock:
            calls, self._to_score = self._to_score, []
        built = self.built
        assert built is not None
        jobs: list[_ScoreJob] = []
        for call in calls:
            try:
                args = call.args
                jobs.append(
                    _ScoreJob(
                        call.call_id, list(args["ids"]), int(args["top_n"]), int(args.get("adapter", 0))
                    )
                )
            except Exception as exc:  # never from lmforge's frontend; answered all the same
                self._fail([call.call_id], exc)

        def score(members: list[int]) -> list[Any]:
            prompts = [(jobs[i].ids, jobs[i].top_n) for i in members]
            adapter = jobs[members[0]].adapter
            return score_prompts(built.model, built.gate, prompts, lora=built.lora, adapter_id=adapter)

        for members in passes([(len(job.ids), job.adapter) for job in jobs], built.vocab_size):
            if len(members) > 1:
                try:
                    values = score(members)
                except Exception:
                    log.warning(
                        "lmi-dist engine core: a pass scoring %d prompts failed; each alone",
                        len(members),
                        exc_info=True,
                    )
                else:
                    for i, value in zip(members, values, strict=True):
                        self.send(ipc.Reply(jobs[i].call_id, value))
                    continue
            for i in members:
                self._answer([jobs[i].call_id], functools.partial(score, [i]))

    def call(self, message: ipc.Call) -> None:
        self._answer([message.call_id], lambda: [self._method(message)])

    def _answer(self, call_ids: list[int], run: Callable[[], list[Any]]) -> None:
        """Reply to each call with its value from ``run()``, or to every call with the error it raised."""
        try:
            values = run()
        except Exception as exc:
            self._fail(call_ids, exc)
        else:
            for call_id, value in zip(call_ids, values, strict=True):
                self.send(ipc.Reply(call_id, value))

    def _fail(self, call_ids: list[int], exc: Exception) -> None:
        """Reply to each call with ``exc``: an :class:`LmforgeError` as its kind says, anything else (a
        file that cannot be read, ...) as the caller's ``model_error``, not the core's."""
        for call_id in call_ids:
            if isinstance(exc, LmforgeError):
                self.send(ipc.Reply(call_id, None, exc.message, exc.kind, exc.param))
            else:
                self.send(ipc.Reply(call_id, None, f"{type(exc).__name__}: {exc}", "model_error"))

    def _method(self, message: ipc.Call) -> Any:
        """A call's value (:attr:`Method.SCORE_PROMPT` aside: :meth:`score_waiting`)."""
        assert self.built is not None
        method, args, lora = message.method, message.args, self.built.lora
        if method is Method.PROFILE_START:
            self.profiler.start()
            return None
        if method is Method.PROFILE_STOP:
            return self.profiler.stop(str(args["path"]))
        if method is Method.SCORE_PROMPT:
            raise LmforgeError("score_prompt calls are answered by score_waiting")
        if lora is None:
            raise LmforgeError("LoRA adapters are not enabled in the engine core")
        if method is Method.INSTALL or method is Method.PRELOAD:
            ref = ipc.AdapterRef.from_wire(args["adapter"])
            lora.check(ref)
            if method is Method.INSTALL:
                lora.install(ref)
            else:
                lora.host_weights(ref)
            return {"load_ms": lora.last_load_ms}
        if method is Method.UNINSTALL:
            lora.uninstall(int(args["adapter_id"]))
            return None
        if method is Method.FORGET:
            lora.forget(int(args["adapter_id"]))
            return None
        assert_never(method)

    # ------------------------------------------------------------------ health and stop

    def failure(self) -> str | None:
        """Why the core cannot go on (a dead rank, a fatal loop error), or None."""
        # A dead rank also breaks the loop's collectives; name the rank, the cause, first.
        if self.followers is not None and (failure := self.followers.failure()) is not None:
            return failure
        assert self.built is not None
        manager = self.built.manager
        fatal = manager.background_thread_status.fatal_error
        if fatal is not None:
            return f"{type(fatal).__name__}: {fatal}"
        if not manager.is_running():
            return "the generation thread exited"
        return None

    def loop_ending(self) -> bool:
        """The generation loop is hard-stopping and nobody asked it to (a fatal error on its way)."""
        status = self.built.manager.background_thread_status if self.built is not None else None
        return not self.stopping and status is not None and status.local_status >= status.HARD_STOP

    def stop(self) -> None:
        self.stopping = True
        if self.built is not None:
            self.built.manager.stop(block=True, timeout=10, hard_stop=True)
        if self.followers is not None:
            self.followers.stop()
        self._helper.shutdown(wait=False, cancel_futures=True)


def ignore_stop_signals() -> None:
    """SIGINT and SIGTERM are the server's to act on, not this process's: the server drains its
    in-flight requests, then sends :class:`.ipc.Shutdown` (or kills a core that does not stop), and a
    core whose server is gone exits by itself. The same signal sent to the whole process group (Ctrl-C
    in a terminal, ``timeout``, systemd stopping the unit's control group) would otherwise end the
    engine under the requests the server is draining. A tensor-parallel rank inherits the setting."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def main() -> int:
    from lmforge.process import pause_gc_for_startup

    # for the imports (loading.build turns it back on before the weights): with the frozen start-up heap
    # it cuts the engine core's start from 3.9 to 2.8 CPU-s (tiny model, median of 5, 2026-12)
    pause_gc_for_startup()
    import zmq

    from lmforge.config import ServingConfig

    parent = os.getppid()
    ignore_stop_signals()
    logging.basicConfig(
        level=os.environ.get("LMFORGE_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = ServingConfig.model_validate_json(os.environ[ipc.CONFIG_ENV])
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.connect(os.environ[ipc.REQUESTS_ENV])
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(os.environ[ipc.OUTPUTS_ENV])
    core = Core(config, push)
    try:
        core.load()
    except BaseException as exc:
        reason = exc.message if isinstance(exc, LmforgeError) else f"{type(exc).__name__}: {exc}"
        log.exception("lmi-dist engine core failed to start")
        core.send(ipc.Dead(reason))
        code = 2 if isinstance(exc, LmforgeError) else 1
    else:
        code = core.serve(pull, parent)
    push.close()
    pull.close(linger=0)
    context.term()
    return code


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
