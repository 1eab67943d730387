"""Run the model server: resolve the config, build the handler, serve on the SageMaker port.

The port is bound before the model loads, so ``/ping`` answers 503 while loading (SageMaker polls it
within ``ContainerStartupHealthCheckTimeoutInSeconds``). Loading has ``option.model_loading_timeout``;
a model that fails or times out makes the process exit non-zero, as a container would. On SIGTERM the
server stops admitting (503), lets in-flight requests finish until 5 s before ``shutdown_timeout``
(25 s by default), then ends the rest (their streams end with an error line, queued requests get 503)
and shuts the engine down, so every client has a complete answer and the process exits 0 before
SageMaker's SIGKILL (30 s after SIGTERM). uvicorn closes its listening socket at once, so new
connections are refused while draining.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lmforge.process import freeze_startup_heap, pause_gc_for_startup
from lmforge.serving.app import App
from lmforge.serving.state import Phase, ServerState

if TYPE_CHECKING:
    from lmforge.config import ServingConfig
    from lmforge.engines.protocol import Engine
    from lmforge.handlers import Handler

log = logging.getLogger("lmforge.serving")

DEFAULT_PORT = 8080
#: Seconds before the end of the drain (``shutdown_timeout``) at which requests still in flight are
#: ended with an error: uvicorn cancels what is left at the end (a cut stream, a 500 for a queued
#: request), and the engine needs time to stop.
END_IN_FLIGHT_MARGIN_S = 5


def resolve_port(port: int | None) -> int:
    if port is not None:
        return port
    env = os.environ.get("SAGEMAKER_BIND_TO_PORT")
    return int(env) if env else DEFAULT_PORT


def default_num_threads() -> int:
    """Leave one core to the HTTP loop and tokenization: torch on all cores collapses under load."""
    return max(1, (os.cpu_count() or 2) - 1)


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def serve(
    model_dir: str,
    *,
    host: str,
    port: int | None,
    log_level: str = "info",
    engine_factory: Callable[[ServingConfig], Engine] | None = None,
) -> int:
    """Serve the model folder until stopped; returns the process exit code.

    ``engine_factory`` replaces the engine ``option.rolling_batch`` selects (the default handler runs on
    what it returns); benchmarks use it to serve a no-op engine through the real HTTP path."""
    # the collector off until the model is loaded (app.on_loaded): vLLM's imports here are 5.0 CPU-s
    # instead of 6.6. The weights live in other processes (LMI-Dist's core, vLLM's workers); what a
    # user's model.py makes while it starts is collected once, at the freeze
    pause_gc_for_startup()
    import uvicorn

    from lmforge.config import ConfigError, load_config
    from lmforge.errors import LmforgeError
    from lmforge.handlers import create_handler

    configure_logging(log_level)
    try:
        resolved = load_config(model_dir)
    except ConfigError as exc:
        print(f"error: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    for warning in resolved.warnings:
        log.warning("%s", warning)
    config = resolved.config
    if config.model_id is not None and config.model_path is None:
        from lmforge.artifacts.download import DownloadError, fetch_model

        try:
            local = fetch_model(config.model_id, revision=config.revision)
        except DownloadError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        config = config.model_copy(update={"model_id": str(local)})
        resolved.config = config
    if config.num_threads is None:
        config = config.model_copy(update={"num_threads": default_num_threads()})
        resolved.config = config
    try:
        if engine_factory is not None:
            from lmforge.handlers.default import DefaultHandler

            handler: Handler = DefaultHandler(config, engine_factory(config))
        else:
            handler = create_handler(resolved)
    except LmforgeError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2

    state = ServerState.for_config(config)
    app = App(handler, state)
    bind_port = resolve_port(port)
    uv_config = uvicorn.Config(
        app,
        host=host,
        port=bind_port,
        log_level=log_level.lower(),
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=config.shutdown_timeout,
        timeout_keep_alive=75,
        h11_max_incomplete_event_size=4 * 2**20,
        ws_max_size=state.max_request_size,  # a bigger WebSocket message closes the socket (1009)
    )
    server = make_server(uv_config, state)
    exit_code = {"code": 0}

    def on_load_failure(detail: str) -> None:  # also when a loaded engine dies: exit 1
        exit_code["code"] = 1
        server.should_exit = True

    app.on_load_failure = on_load_failure
    # this process serves from now on: its start-up heap is for good (its garbage collected first: an
    # in-process engine or a model.py may have loaded weights here, with the collector paused)
    app.on_loaded = functools.partial(freeze_startup_heap, collect=True)
    app.on_engine_death = on_load_failure

    async def main() -> None:
        loader_deadline = asyncio.create_task(_deadline(state, config.model_loading_timeout, on_load_failure))
        try:
            await server.serve()
        finally:
            loader_deadline.cancel()

    log.info("lmforge serving %s on http://%s:%d (/ping, /invocations)", model_dir, host, bind_port)
    # uvicorn's own loop choice (uvloop when installed), as uvicorn.Server.run would make it: the
    # asyncio default loop costs ~10 us more of CPU per streamed token (bench/streaming_ceiling.py).
    with asyncio.Runner(loop_factory=uv_config.get_loop_factory()) as runner:
        runner.run(main())
    if not server.started and exit_code["code"] == 0:
        return 1  # could not bind
    return exit_code["code"]


async def _deadline(state: ServerState, timeout_s: int, fail: Any) -> None:
    await asyncio.sleep(timeout_s)
    if state.phase == Phase.LOADING:
        state.phase = Phase.FAILED
        state.detail = f"model did not load within option.model_loading_timeout={timeout_s}s"
        log.error("%s", state.detail)
        fail(state.detail)


def make_server(config: Any, state: ServerState) -> Any:
    """A ``uvicorn.Server`` that drains before it stops and exits 0 after a clean SIGTERM shutdown.

    uvicorn is imported here, not at module import; the class is made on the one call per process."""
    import contextlib
    import signal
    import threading
    from collections.abc import Iterator

    import uvicorn

    from lmforge.reachins import UVICORN, check

    check(UVICORN)  # what DrainingServer overrides

    class DrainingServer(uvicorn.Server):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state.phase in (Phase.READY, Phase.LOADING):
                state.phase = Phase.DRAINING
                state.detail = "shutting down"
            if state.drain_deadline is None:
                drain_s = config.timeout_graceful_shutdown
                state.drain_deadline = time.monotonic() + drain_s - END_IN_FLIGHT_MARGIN_S
                log.info("signal %d: draining in-flight requests (up to %d s)", sig, drain_s)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # uvicorn's own version raises the captured signal again after shutdown, so the process
            # would die by SIGTERM; a drained, clean shutdown exits 0 instead.
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return DrainingServer(config)
