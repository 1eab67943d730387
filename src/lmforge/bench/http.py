"""A lean HTTP/1.1 client for the load generator: keep-alive connections, streamed bodies
(chunked or sized), one ``bytes`` piece per HTTP chunk.

The load generator shares the machine with the server it measures, so its own cost per streamed
token counts: a general-purpose async client (httpx on httpcore + anyio) spent ~300 us of CPU per
token on this project's 2-core machine, against a few us here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit


class HttpError(Exception):
    """The connection failed or the server broke the protocol."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Response:
    def __init__(self, status: int, headers: dict[str, str], conn: _Conn, client: HttpClient) -> None:
        self.status = status
        self.headers = headers
        self._conn: _Conn | None = conn
        self._client = client
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, as the server framed it (one piece per HTTP chunk)."""
        assert self._conn is not None, "the body was already read"
        reader = self._conn.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        elif "content-length" in self.headers:
            length = int(self.headers["content-length"])
            if length:
                yield await reader.readexactly(length)
        else:  # until the server closes
            while data := await reader.read(65536):
                yield data
            self._close()
            return
        self._done = True

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def release(self) -> None:
        """Give the connection back for reuse when the body was read to its end, else close it."""
        if self._conn is None:
            return
        if self._done and self.headers.get("connection", "").lower() != "close":
            self._client.idle.append(self._conn)
            self._conn = None
        else:
            self._close()


class HttpClient:
    """POSTs to one origin (``http://host:port`` or ``https://...``) over a pool of keep-alive connections."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.host_header = parts.netloc
        self.idle: list[_Conn] = []

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=2**20)
        except OSError as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        return _Conn(reader, writer)

    @contextlib.asynccontextmanager
    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Response]:
        """``async with client.post(...) as resp``: the status and headers, then ``resp.chunks()``."""
        head = [
            f"POST {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in headers.items()]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        response = await self._send(request)
        try:
            yield response
        finally:
            response.release()

    async def _send(self, request: bytes) -> Response:
        while True:
            reused = bool(self.idle)
            conn = self.idle.pop() if reused else await self._connect()
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                conn.close()
                if reused:  # the server closed an idle keep-alive connection: retry on a new one
                    continue
                raise HttpError(f"{type(exc).__name__}: {exc}") from None
            except BaseException:
                conn.close()
                raise
            lines = raw.decode("latin-1").split("\r\n")
            try:
                status = int(lines[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                conn.close()
                raise HttpError(f"not an HTTP response: {lines[0][:80]!r}") from None
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            return Response(status, headers, conn, self)

    async def aclose(self) -> None:
        while self.idle:
            self.idle.pop().close()
