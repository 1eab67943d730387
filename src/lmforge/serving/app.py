"""The ASGI application: ``GET /ping``, ``POST /invocations`` (+ OpenAI's ``/v1/chat/completions``,
``/v1/completions``, ``GET /v1/models``), vLLM's peer routes (``GET /health``, ``GET /version``,
``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``), the adapters API, ``GET /metrics``,
and the WebSocket ``/invocations-bidirectional-stream`` (:mod:`lmforge.serving.bidi`).

The routes are one table (:mod:`lmforge.serving.routes`), built from what the handler implements: the
model list, the tokenizer routes and the adapters API only where the handler has that capability
(:mod:`lmforge.handlers`). Every failure leaves through :func:`lmforge.serving.asgi.send_error` with a
status from :data:`lmforge.errors.ERROR_TABLE`, in the error shape of its route; unexpected exceptions
are logged with their traceback here and reach the client as a one-line message, never as a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
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
from lmforge.handlers import ListsModels, ServesAdapters, ServesTokenizer
from lmforge.handlers.io import Input, Output
from lmforge.serving import adapters_api, asgi, bidi, sessions
from lmforge.serving.routes import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DETOKENIZE_PATH,
    INVOCATIONS_PATH,
    MODELS_PATH,
    TOKENIZE_PATH,
    TOKENIZER_INFO_PATH,
    Errors,
    Route,
    Router,
)
from lmforge.serving.state import Phase, ServerState

if TYPE_CHECKING:
    from lmforge.handlers import Handler
    from lmforge.handlers.request_common import Api
    from lmforge.serving.routes import Endpoint

log = logging.getLogger("lmforge.serving")

RETRY_AFTER_S = 1
#: how long a server whose engine died keeps answering (in-flight streams get their error line,
#: ``/ping`` says 503 and why) before it exits non-zero, so that its container is replaced
ENGINE_DEATH_EXIT_AFTER_S = 5.0
_HEALTH_EVERY_S = 0.5

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
        self.router = Router(self._routes(handler))

    def _routes(self, handler: Handler) -> list[Route]:
        """Every route: SageMaker's and OpenAI's, vLLM's peer routes (their errors in OpenAI's shape, as
        vLLM sends them), and what the handler's capabilities add."""
        lmi, openai = Errors.LMI, Errors.OPENAI
        routes = [
            Route(INVOCATIONS_PATH, ("POST",), self._invocation(None), lmi),
            Route(CHAT_PATH, ("POST",), self._invocation("chat"), openai),
            Route(COMPLETIONS_PATH, ("POST",), self._invocation("completion"), openai),
            Route("/ping", ("GET", "HEAD"), self._ping, lmi),
            Route("/metrics", ("GET",), self._send_metrics, lmi),
            Route("/health", ("GET",), self._health, openai),
            Route("/version", ("GET",), self._version, openai),
        ]
        if isinstance(handler, ListsModels):
            routes.append(Route(MODELS_PATH, ("GET",), self._answer(handler.models), openai))
        if isinstance(handler, ServesTokenizer):
            routes += [
                Route(TOKENIZE_PATH, ("POST",), self._answer_body(handler.tokenize), openai),
                Route(DETOKENIZE_PATH, ("POST",), self._answer_body(handler.detokenize), openai),
                Route(TOKENIZER_INFO_PATH, ("GET",), self._answer(handler.tokenizer_info), openai),
            ]
        if isinstance(handler, ServesAdapters):
            methods = ("GET", "POST", "PUT", "DELETE")  # each adapter path checks its own
            adapters = self._adapters(handler)
            routes.append(Route("/adapters", methods, adapters, lmi, match=adapters_api.is_adapter_path))
        return routes

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
        route = self.router.find(path)
        errors = route.errors if route is not None else Router.unmatched_errors(path)
        try:
            if route is None:
                raise NotFoundError(f"no route {method} {scope['path']}; use GET /ping or POST /invocations")
            self._require(method, *route.methods)
            await route.endpoint(scope, receive, send)
        except LmforgeError as err:
            self.state.count(err.status)
            await asgi.send_error(send, err, openai=errors is Errors.OPENAI)

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

    def _invocation(self, schema: Api | None) -> Endpoint:
        """The endpoint of an invocation route whose body schema is ``schema``."""

        async def invoke(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
            async with self.admitted():
                await self._invoke_admitted(scope, receive, send, schema)

        return invoke

    async def _invoke_admitted(
        self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send, schema: Api | None
    ) -> None:
        body = await self._body(scope, receive)
        if body is None:
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
            properties=properties,
            content={"data": body},
            route=scope["path"].rstrip("/"),
            query=query,
            api=schema,
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

    def _answer(self, answer: Callable[[], Any]) -> Endpoint:
        """A GET endpoint answered with the JSON of ``answer()``, once the model is ready."""

        async def endpoint(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
            self._require_ready()
            await self._send_answer(scope, send, answer)

        return endpoint

    def _answer_body(self, answer: Callable[[bytes], Any]) -> Endpoint:
        """A POST endpoint answered with the JSON of ``answer(body)`` (the body bounded as every body is),
        once the model is ready."""

        async def endpoint(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
            self._require_ready()
            body = await self._body(scope, receive)
            if body is None:
                return
            await self._send_answer(scope, send, lambda: answer(body))

        return endpoint

    async def _body(self, scope: asgi.Scope, receive: asgi.Receive) -> bytes | None:
        """The request's body, bounded as every body is; None when the client went away meanwhile."""
        try:
            return await asgi.read_body(scope, receive, self.state.max_request_size)
        except asgi.ClientDisconnected:
            return None

    async def _send_answer(self, scope: asgi.Scope, send: asgi.Send, answer: Callable[[], Any]) -> None:
        try:
            obj = answer()
        except LmforgeError:
            raise
        except Exception as exc:
            raise _unexpected(scope["path"].rstrip("/"), exc) from None
        self.state.count(200)
        await asgi.send_json(send, 200, obj)

    # ------------------------------------------------------------------ adapters

    def _adapters(self, handler: ServesAdapters) -> Endpoint:
        """The adapters API on ``handler``'s registry."""

        async def endpoint(scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
            self._require_ready()
            body = await self._body(scope, receive)
            if body is None:
                return
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            path = scope["path"].rstrip("/")
            query = scope.get("query_string", b"")
            status, obj = await adapters_api.handle(
                handler.adapters, handler.model_names(), scope["method"], path, query, body, headers
            )
            self.state.count(status)
            await asgi.send_json(send, status, obj)

        return endpoint

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
        typed = set()
        for key, value in sorted(stats.metrics().items() if stats is not None else ()):
            family = key.partition("{")[0]  # a key may carry labels: name{label="value"}
            if family not in typed:
                typed.add(family)
                kind = "counter" if family.endswith("_total") else "gauge"
                lines.append(f"# TYPE lmforge_engine_{family} {kind}")
            lines.append(f"lmforge_engine_{key} {value:g}")
        return "\n".join(lines) + "\n"


def _unexpected(what: str, exc: Exception) -> LmforgeError:
    """An exception no part of lmforge meant for the client: logged with its traceback, answered as a
    one-line error from the error table."""
    err = classify(exc)
    log.error("%s failed (%s %s): %s", what, err.status, err.type, err.message, exc_info=True)
    return err
