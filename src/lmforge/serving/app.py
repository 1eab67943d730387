"""The ASGI application: ``GET /ping``, ``POST /invocations`` (+ OpenAI's ``/v1/chat/completions``,
``/v1/completions``, ``GET /v1/models``), vLLM's peer routes (``GET /health``, ``GET /version``,
``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``), the adapters API, ``GET /metrics``,
and the WebSocket ``/invocations-bidirectional-stream`` (:mod:`lmforge.serving.bidi`).

Every failure leaves through :func:`lmforge.serving.asgi.send_error` with a status from
:data:`lmforge.errors.ERROR_TABLE`, in OpenAI's body shape on every ``/v1/...`` path and vLLM's peer
routes (as vLLM sends them) and LMI's elsewhere; unexpected exceptions are logged with their traceback
here and reach the client as a one-line message, never as a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from lmforge import __version__
from lmforge.errors import (
    EngineDeadError,
    LmforgeError,
    MethodNotAllowedError,
    NotFoundError,
    NotReadyError,
    OverloadedError,
    classify,
)
from lmforge.handlers.io import Input, Output
from lmforge.handlers.requests import ROUTE_SCHEMAS
from lmforge.serving import adapters_api, asgi, bidi, sessions
from lmforge.serving.state import Phase, ServerState

if TYPE_CHECKING:
    from lmforge.handlers import Handler

log = logging.getLogger("lmforge.serving")

RETRY_AFTER_S = 1
#: how long a server whose engine died keeps answering (in-flight streams get their error line,
#: ``/ping`` says 503 and why) before it exits non-zero, so that its container is replaced
ENGINE_DEATH_EXIT_AFTER_S = 5.0
_HEALTH_EVERY_S = 0.5
INVOCATION_PATHS = tuple(ROUTE_SCHEMAS)
MODELS_PATH = "/v1/models"
#: paths under it answer errors in OpenAI's shape (``{"error": {...}}``)
OPENAI_PREFIX = "/v1/"
#: vLLM's tokenizer routes -> (method, the default handler's method that answers it: from the body
#: for POST)
TOKENIZER_ROUTES = {
    "/tokenize": ("POST", "tokenize"),
    "/detokenize": ("POST", "detokenize"),
    "/tokenizer_info": ("GET", "tokenizer_info"),
}
#: vLLM's routes beside OpenAI's; their errors are OpenAI's shape too, as vLLM sends them
PEER_PATHS = frozenset({"/health", "/version", *TOKENIZER_ROUTES})

Route = Callable[[asgi.Scope, asgi.Receive, asgi.Send], Awaitable[None]]


#: request headers a SageMaker container hands back on its reply (unless the handler set its own):
#: the custom attributes, and the inference id the request was logged under
ECHOED_HEADERS = ("X-Amzn-SageMaker-Custom-Attributes", "X-Amzn-SageMaker-Inference-Id")


class App:
    def __init__(self, handler: Handler, state: ServerState) -> None:
        self.handler = handler
        self.state = state
        self.started = time.time()
        self.on_load_failure: Any = None
        self.on_loaded: Any = None
        """Called once the model is loaded, before the server reports ready (the process's owner:
        ``lmforge.process.freeze_startup_heap``)."""
        self.on_engine_death: Any = None
        """Called once with the cause, ENGINE_DEATH_EXIT_AFTER_S after the engine was found dead."""
        self._load_task: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._handler_stop: asyncio.Future[None] | None = None
        #: path -> (methods, route) for every route with a fixed path but the invocations
        self._routes: dict[str, tuple[tuple[str, ...], Route]] = {
            "/ping": (("GET", "HEAD"), self._ping),
            "/health": (("GET",), self._health),
            "/version": (("GET",), self._version),
            MODELS_PATH: (("GET",), self._models),
            "/metrics": (("GET",), self._send_metrics),
            **{path: ((method,), self._tokenizer) for path, (method, _) in TOKENIZER_ROUTES.items()},
        }

    # ------------------------------------------------------------------ lifespan

    async def _load(self) -> None:
        t0 = time.monotonic()
        try:
            await self.handler.start()
        except BaseException as exc:
            err = classify(exc)
            self.state.phase = Phase.FAILED
            self.state.detail = f"model failed to load: {err.message}"
            log.error("%s", self.state.detail, exc_info=not isinstance(exc, LmforgeError))
            if self.on_load_failure is not None:
                self.on_load_failure(self.state.detail)
            return
        if self.on_loaded is not None:
            self.on_loaded()
        self.state.phase = Phase.READY
        self.state.detail = "ready"
        log.info("model loaded in %.1f s; serving with handler %s", time.monotonic() - t0, self.handler.name)
        if self.on_engine_death is not None:
            await self._watch_engine()

    async def _watch_engine(self) -> None:
        """Once the engine is dead (a dead engine core or rank: it cannot come back), exit non-zero."""
        while True:
            await asyncio.sleep(_HEALTH_EVERY_S)
            try:
                self.handler.check_health()
            except EngineDeadError as err:
                log.error(
                    "%s; the server exits in %.0f s so that its container is replaced",
                    err.message,
                    ENGINE_DEATH_EXIT_AFTER_S,
                )
                await asyncio.sleep(ENGINE_DEATH_EXIT_AFTER_S)
                self.on_engine_death(err.message)
                return
            except LmforgeError:
                continue

    async def _lifespan(self, receive: asgi.Receive, send: asgi.Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._load_task = asyncio.create_task(self._load(), name="model-load")
                self._drain_task = asyncio.create_task(self._end_in_flight_at_deadline(), name="drain")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.state.phase = Phase.DRAINING
                if self._load_task is not None and not self._load_task.done():
                    self._load_task.cancel()
                if self._drain_task is not None:
                    self._drain_task.cancel()
                await self._stop_handler()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _stop_handler(self) -> None:
        """Shut the handler (and its engine) down, once, however many callers ask."""
        if self._handler_stop is None:
            self._handler_stop = asyncio.ensure_future(self._shutdown_handler_once())
        await asyncio.shield(self._handler_stop)

    async def _shutdown_handler_once(self) -> None:
        t0 = time.monotonic()
        try:
            await self.handler.shutdown()
        except Exception:
            log.exception("handler shutdown failed")
        log.info("handler %s shut down in %.1f s", self.handler.name, time.monotonic() - t0)

    async def _end_in_flight_at_deadline(self) -> None:
        """Once draining passes ``state.drain_deadline``, stop the engine: its in-flight streams end with
        an error line and queued requests get 503, before uvicorn cancels what is left."""
        while self.state.drain_deadline is None:
            await asyncio.sleep(0.1)
        await asyncio.sleep(max(0.0, self.state.drain_deadline - time.monotonic()))
        if self.state.in_flight:
            log.warning("drain deadline: ending %d requests still in flight", self.state.in_flight)
            await self._stop_handler()

    # ------------------------------------------------------------------ routing

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            if scope["path"].rstrip("/") == bidi.BIDI_PATH:
                await bidi.serve(self, scope, receive, send)
            else:  # refused in the handshake (the client sees 403)
                await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        try:
            if path in INVOCATION_PATHS:
                self._require(method, "POST")
                await self._invoke(scope, receive, send)
            elif adapters_api.is_adapter_path(path):
                await self._adapters(scope, receive, send, path)
            elif path in self._routes:
                methods, route = self._routes[path]
                self._require(method, *methods)
                await route(scope, receive, send)
            else:
                raise NotFoundError(f"no route {method} {scope['path']}; use GET /ping or POST /invocations")
        except LmforgeError as err:
            self.state.count(err.status)
            await asgi.send_error(send, err, openai=path.startswith(OPENAI_PREFIX) or path in PEER_PATHS)

    @staticmethod
    def _require(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise MethodNotAllowedError(f"method {method} is not allowed here; use {' or '.join(allowed)}")

    def _require_ready(self) -> None:
        if self.state.phase != Phase.READY:
            raise NotReadyError(f"not ready: {self.state.detail}", retry_after=RETRY_AFTER_S)

    def _unhealthy(self) -> tuple[str, str] | None:
        """Why the server cannot serve now, as ``(status, message)``: not loaded (yet), or an engine that
        failed its health check; None when it can. ``/ping`` and ``/health`` both answer from it."""
        if self.state.phase != Phase.READY:
            return str(self.state.phase), self.state.detail
        try:
            self.handler.check_health()
        except Exception as exc:
            return "unhealthy", classify(exc).message
        return None

    async def _ping(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        problem = self._unhealthy()
        if problem is not None:
            status, message = problem
            await asgi.send_json(send, 503, {"status": status, "message": message})
            return
        await asgi.send_json(send, 200, {"status": "healthy"})

    async def _health(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        """vLLM's ``GET /health``: 200 with an empty body when the model serves, else 503."""
        await asgi.send_body(send, 503 if self._unhealthy() else 200, b"", "text/plain; charset=utf-8")

    async def _version(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        """vLLM's ``GET /version``, with lmforge's version."""
        await asgi.send_json(send, 200, {"version": __version__})

    async def _send_metrics(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        await asgi.send_body(send, 200, self._metrics().encode(), "text/plain; version=0.0.4")

    # ------------------------------------------------------------------ invocations

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """One invocation in flight until the block ends (its answer streamed included): 503 when the
        model is not ready, 503 + ``Retry-After`` at capacity (the running batch plus
        ``job_queue_size``). The HTTP invocations and :mod:`lmforge.serving.bidi` are admitted here."""
        self._require_ready()
        state = self.state
        if state.in_flight >= state.max_in_flight:
            raise OverloadedError(
                f"server is at capacity ({state.in_flight} requests in flight, the running batch plus "
                "job_queue_size); retry later",
                retry_after=RETRY_AFTER_S,
            )
        state.in_flight += 1
        try:
            yield
        finally:
            state.in_flight -= 1

    async def run(self, inputs: Input) -> Output:
        """The handler's answer to one admitted invocation, its status counted; an exception the handler
        did not mean for the client is logged with its traceback and raised as a one-line error. The
        HTTP invocations and :mod:`lmforge.serving.bidi` both call the handler here."""
        try:
            output = await self.handler.handle(inputs)
        except LmforgeError:
            raise
        except Exception as exc:
            raise _unexpected("handler", exc) from None
        self.state.count(output.code)
        return output

    async def _invoke(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        async with self.admitted():
            await self._invoke_admitted(scope, receive, send)

    async def _invoke_admitted(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        try:
            body = await asgi.read_body(scope, receive, self.state.max_request_size)
        except asgi.ClientDisconnected:
            return
        properties = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        session = sessions.answer(self.state.sessions, body, properties)
        if session is not None:  # opened or closed: no model call
            self.state.count(200)
            text = session.text.encode()
            await asgi.send_body(send, 200, text, "text/plain; charset=utf-8", session.headers)
            return
        echo = {n: properties[n.lower()] for n in ECHOED_HEADERS if n.lower() in properties}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        inputs = Input(
            properties=properties, content={"data": body}, route=scope["path"].rstrip("/"), query=query
        )
        try:
            output = await asgi.run_unless_disconnected(receive, self.run(inputs))
        except asgi.ClientDisconnected:
            self.state.count(499)
            return
        content_type = output.properties.get("Content-Type", "application/octet-stream")
        headers = {k: v for k, v in output.properties.items() if k.lower() != "content-type"}
        present = {k.lower() for k in headers}
        headers.update({k: v for k, v in echo.items() if k.lower() not in present})
        if output.stream is None:
            await asgi.send_body(send, output.code, output.body(), content_type, headers)
            return
        try:
            await asgi.stream_response(receive, send, output.code, content_type, headers, output.stream)
        except Exception:
            log.exception("response stream failed after the status line was sent")

    async def _models(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        self._require_ready()
        models = getattr(self.handler, "models", None)
        if models is None:
            raise NotFoundError(f"{MODELS_PATH}: the {self.handler.name} handler serves no model list")
        self.state.count(200)
        await asgi.send_json(send, 200, models())

    async def _tokenizer(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        """vLLM's tokenizer routes, answered by the default handler on the engine's tokenizer."""
        path = scope["path"].rstrip("/")
        self._require_ready()
        method, name = TOKENIZER_ROUTES[path]
        answer = getattr(self.handler, name, None)
        if answer is None:
            raise NotFoundError(f"{path}: the {self.handler.name} handler has no tokenizer to serve")
        args = []
        if method == "POST":  # the body, bounded as every body is
            try:
                args.append(await asgi.read_body(scope, receive, self.state.max_request_size))
            except asgi.ClientDisconnected:
                return
        try:
            obj = answer(*args)
        except LmforgeError:
            raise
        except Exception as exc:
            raise _unexpected(path, exc) from None
        self.state.count(200)
        await asgi.send_json(send, 200, obj)

    # ------------------------------------------------------------------ adapters

    async def _adapters(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send, path: str) -> None:
        self._require_ready()
        try:
            body = await asgi.read_body(scope, receive, self.state.max_request_size)
        except asgi.ClientDisconnected:
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        registry = getattr(self.handler, "adapters", None)
        engine = getattr(self.handler, "engine", None)
        names = {"model"} | ({engine.model_name} if engine is not None else set())
        status, obj = await adapters_api.handle(
            registry, names, scope["method"], path, scope.get("query_string", b""), body, headers
        )
        self.state.count(status)
        await asgi.send_json(send, status, obj)

    # ------------------------------------------------------------------ metrics

    def _metrics(self) -> str:
        lines = [
            "# TYPE lmforge_up gauge",
            f"lmforge_up {int(self.state.phase == Phase.READY)}",
            "# TYPE lmforge_in_flight_requests gauge",
            f"lmforge_in_flight_requests {self.state.in_flight}",
            "# TYPE lmforge_responses_total counter",
        ]
        lines += [
            f'lmforge_responses_total{{code="{c}"}} {n}' for c, n in sorted(self.state.responses.items())
        ]
        stats = self.handler.stats() if self.state.phase == Phase.READY else None
        for key, value in sorted(stats.metrics().items() if stats is not None else ()):
            kind = "counter" if key.endswith("_total") else "gauge"
            lines += [f"# TYPE lmforge_engine_{key} {kind}", f"lmforge_engine_{key} {value:g}"]
        return "\n".join(lines) + "\n"


def _unexpected(what: str, exc: Exception) -> LmforgeError:
    """An exception no part of lmforge meant for the client: logged with its traceback, answered as a
    one-line error from the error table."""
    err = classify(exc)
    log.error("%s failed (%s %s): %s", what, err.status, err.type, err.message, exc_info=True)
    return err
