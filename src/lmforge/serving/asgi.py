"""Minimal ASGI helpers: JSON/error responses, bounded body reads, disconnect-aware streaming."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    MutableMapping,
)
from typing import Any

from lmforge.errors import LmforgeError, PayloadTooLargeError
from lmforge.handlers.io import LastChunk

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class ClientDisconnected(Exception):
    pass


def _headers(content_type: str, extra: dict[str, str] | None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode("latin-1"))]
    for key, value in (extra or {}).items():
        if key.lower() == "content-type":
            headers[0] = (b"content-type", value.encode("latin-1"))
        else:
            headers.append((key.lower().encode("latin-1"), str(value).encode("latin-1")))
    return headers


async def send_body(
    send: Send, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> None:
    hdrs = _headers(content_type, headers)
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n"  # see Output.add_as_json
    await send_body(send, status, body, "application/json", headers)


async def send_error(send: Send, err: LmforgeError, *, openai: bool = False) -> None:
    """``err`` with its status: OpenAI's body shape on the ``/v1`` routes (``openai``), else LMI's."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else None
    await send_json(send, err.status, err.to_openai_dict() if openai else err.to_dict(), headers)


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """Read the whole body, refusing it (413) once it exceeds ``limit`` bytes, declared or streamed."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                declared = -1
            if declared > limit:
                raise PayloadTooLargeError(
                    f"body has {declared} bytes, more than max_request_size={limit}", param="body"
                )
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"body is more than max_request_size={limit} bytes", param="body")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(receive: Receive, work: Awaitable[Any]) -> Any:
    """Await ``work``; if the client disconnects first, cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            watcher.cancel()
            raise ClientDisconnected
        watcher.cancel()
    return task.result()


async def from_sync(stream: Iterable[Any]) -> AsyncGenerator[Any, None]:
    """A synchronous iterable (a user handler's generator), each item fetched in a worker thread."""
    iterator = iter(stream)
    sentinel = object()
    while True:
        item = await asyncio.to_thread(next, iterator, sentinel)
        if item is sentinel:
            return
        yield item


async def stream_response(
    receive: Receive,
    send: Send,
    status: int,
    content_type: str,
    headers: dict[str, str] | None,
    stream: AsyncIterator[Any] | Iterable[Any],
) -> bool:
    """Send ``stream``'s items as a chunked body, one flush per item.

    A :class:`~lmforge.handlers.io.LastChunk` ends the body with it, in the same write; the stream is
    closed after that without being read further. A client disconnect cancels the producer and closes
    ``stream`` (``aclose``), which aborts the engine request behind it. Returns False when the client
    went away.
    """
    source: AsyncIterator[Any] = aiter(stream) if isinstance(stream, AsyncIterable) else from_sync(stream)
    disconnected = False

    async def pump() -> None:
        await send(
            {"type": "http.response.start", "status": status, "headers": _headers(content_type, headers)}
        )
        async for item in source:
            if isinstance(item, LastChunk):
                await send({"type": "http.response.body", "body": bytes(item), "more_body": False})
                return
            data = item.encode("utf-8") if isinstance(item, str) else bytes(item)
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    pump_task = asyncio.ensure_future(pump())
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        done, _ = await asyncio.wait({pump_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if pump_task not in done:
            disconnected = True
            pump_task.cancel()
            with contextlib.suppress(BaseException):
                await pump_task
        else:
            pump_task.result()
    finally:
        watcher.cancel()
        close = getattr(source, "aclose", None)
        if close is not None:
            with contextlib.suppress(BaseException):
                await close()
    return not disconnected
