"""SageMaker's bidirectional streaming: the WebSocket route ``/invocations-bidirectional-stream``.

SageMaker (``InvokeEndpointWithBidirectionalStream``) opens one WebSocket to the container for a
client's stream, expects it accepted within 250 ms, pings it every 60 s, and relays each request
payload part as one message and each message back as one response payload part. The image carries
the label ``com.amazonaws.sagemaker.capabilities.bidirectional-streaming=true``.

lmforge's framing on that socket:

* each message the client sends (text or binary, UTF-8 JSON) is one request, in any form
  ``POST /invocations`` takes (LMI ``{"inputs": ...}``, chat ``{"messages": ...}``); it is answered
  streamed, whatever its ``stream`` field says;
* the answer comes back as text messages, one per streamed object: the same JSON objects the
  jsonlines stream of ``/invocations`` carries (LMI token objects, or OpenAI ``chat.completion.chunk``
  objects for chat), then one ``[DONE]`` message that ends that request's answer;
* a request that fails is answered with one error object (``{"code", "type", "message", "param"}``,
  the same body an HTTP error has) and ``[DONE]``; the connection stays open;
* requests on one connection are answered in order; closing the socket aborts the request being
  generated. Handshake headers (``X-Amzn-SageMaker-Session-Id``, the adapter headers, ...) apply to
  every request of the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from lmforge.errors import LmforgeError, NotReadyError, PayloadTooLargeError
from lmforge.handlers.io import Input, Output
from lmforge.serving import asgi
from lmforge.serving.state import Phase, ServerState

BIDI_PATH = "/invocations-bidirectional-stream"
DONE = "[DONE]"
MAX_QUEUED = 64
"""Requests a connection may have waiting behind the one being answered."""
_CLOSE_TRY_AGAIN = 1013  # RFC 6455: try again later (the model is not loaded yet)


class Invocations(Protocol):
    """What this route needs of the server: :class:`lmforge.serving.app.App`, which routes the
    WebSocket here (so this module does not import it back)."""

    @property
    def state(self) -> ServerState: ...

    def admitted(self) -> AbstractAsyncContextManager[None]:
        """One invocation in flight until the block ends (503 when not ready or at capacity)."""
        ...

    async def run(self, inputs: Input) -> Output:
        """The handler's answer to one admitted invocation (errors as :class:`LmforgeError`)."""
        ...


async def serve(app: Invocations, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    """One WebSocket connection: accept at once, then answer each request message in turn."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if app.state.phase != Phase.READY:
        await send(
            {"type": "websocket.close", "code": _CLOSE_TRY_AGAIN, "reason": f"not ready: {app.state.detail}"}
        )
        return
    await send({"type": "websocket.accept"})
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    headers["content-type"] = "application/json"
    requests: asyncio.Queue[bytes] = asyncio.Queue(maxsize=MAX_QUEUED)  # full: reading waits
    worker = asyncio.create_task(_answer_all(app, headers, requests, send), name="bidi-worker")
    try:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message["type"] != "websocket.receive":
                continue
            data = message.get("bytes")
            if data is None:
                data = (message.get("text") or "").encode("utf-8")
            await requests.put(data)
    finally:
        worker.cancel()  # an answer being streamed: its engine request is aborted
        with contextlib.suppress(BaseException):
            await worker


async def _answer_all(
    app: Invocations, headers: dict[str, str], requests: asyncio.Queue[bytes], send: asgi.Send
) -> None:
    while True:
        data = await requests.get()
        try:
            await _answer(app, headers, data, send)
        except LmforgeError as err:
            app.state.count(err.status)
            await _send_text(send, json.dumps(err.to_dict(), ensure_ascii=False))
        await _send_text(send, DONE)


async def _answer(app: Invocations, headers: dict[str, str], data: bytes, send: asgi.Send) -> None:
    state = app.state
    if state.phase != Phase.READY:
        raise NotReadyError(f"not ready: {state.detail}")
    if len(data) > state.max_request_size:
        raise PayloadTooLargeError(
            f"message has {len(data)} bytes, more than max_request_size={state.max_request_size}",
            param="body",
        )
    async with app.admitted():
        inputs = Input(properties=dict(headers), content={"data": _streamed(data)}, route="/invocations")
        output = await app.run(inputs)
        if output.stream is None:  # a user handler that does not stream: its body is one message
            await _send_text(send, output.body().decode("utf-8", errors="replace").strip())
            return
        async with contextlib.aclosing(_lines(output.stream)) as lines:  # closed at once if cancelled
            async for line in lines:
                await _send_text(send, line)


def _streamed(data: bytes) -> bytes:
    """The request with ``"stream": true`` (a body that is not a JSON object goes as it is, for the
    handler to refuse or take)."""
    try:
        body = json.loads(data)
    except ValueError:
        return data
    if not isinstance(body, dict):
        return data
    body["stream"] = True
    return json.dumps(body).encode("utf-8")


async def _lines(stream: AsyncIterable[Any] | Iterable[Any]) -> AsyncGenerator[str, None]:
    """The JSON objects of a jsonlines (or SSE) stream, one at a time; SSE's own ``[DONE]`` dropped."""
    source: AsyncIterator[Any] = (
        aiter(stream) if isinstance(stream, AsyncIterable) else asgi.from_sync(stream)
    )
    pending = ""
    try:
        async for item in source:
            pending += item.decode("utf-8") if isinstance(item, bytes | bytearray) else str(item)
            *complete, pending = pending.split("\n")
            for raw in complete:
                if line := _payload(raw):
                    yield line
        if line := _payload(pending):
            yield line
    finally:
        close = getattr(source, "aclose", None)
        if close is not None:
            with contextlib.suppress(BaseException):
                await close()


def _payload(line: str) -> str:
    """A stream line's object: jsonlines as it is, SSE's ``data:`` field; SSE's other fields, comments
    and ``[DONE]`` are nothing."""
    if line.startswith(("event:", "id:", "retry:", ":")):
        return ""
    text = line.removeprefix("data:").strip()
    return "" if text == DONE else text


async def _send_text(send: asgi.Send, text: str) -> None:
    await send({"type": "websocket.send", "text": text})
