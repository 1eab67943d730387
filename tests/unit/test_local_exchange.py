"""The local sagemaker-runtime's relay of a container's body, both paths' one loop: every chunk framed
as it comes, and a body that breaks or runs past its limit ended by the path's own last chunk."""

from __future__ import annotations

import http.client
import io
import json
import time
from typing import Any, cast

from lmforge.local import openai_path
from lmforge.local.exchange import Exchange, StreamBreak


class _Response:
    """Hands out ``chunks``; then raises ``error`` (if any) or ends."""

    def __init__(self, chunks: list[bytes], error: Exception | None = None) -> None:
        self.chunks, self.error = list(chunks), error

    def read1(self, size: int) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        if self.error is not None:
            raise self.error
        return b""


class _Conn:
    sock = None


def _relay(response: _Response, deadline: float, broke: Any) -> tuple[bytes, list[StreamBreak]]:
    exchange = Exchange.__new__(Exchange)  # no socket: the relay only writes to wfile
    exchange.wfile = io.BytesIO()
    ends: list[StreamBreak] = []

    def record(end: StreamBreak) -> bytes | None:
        ends.append(end)
        return cast(bytes | None, broke(end))

    conn = cast(http.client.HTTPConnection, _Conn())
    exchange.relay(conn, cast(http.client.HTTPResponse, response), deadline, lambda c: c.upper(), record)
    return cast(io.BytesIO, exchange.wfile).getvalue(), ends


def test_a_whole_body_is_framed_chunk_by_chunk_and_ended() -> None:
    out, ends = _relay(_Response([b"ab", b"cde"]), time.monotonic() + 60, lambda end: b"never")
    assert out == b"2\r\nAB\r\n3\r\nCDE\r\n0\r\n\r\n"
    assert ends == []


def test_a_broken_body_ends_with_the_paths_last_chunk() -> None:
    broken = _Response([b"ab"], ConnectionResetError("gone"))
    out, ends = _relay(broken, time.monotonic() + 60, lambda end: b"X")
    assert out == b"2\r\nAB\r\n1\r\nX\r\n0\r\n\r\n"
    assert ends == [StreamBreak(timed_out=False, detail="gone")]


def test_a_read_that_times_out_and_a_passed_deadline_are_time_outs() -> None:
    _, ends = _relay(_Response([], TimeoutError("slow")), time.monotonic() + 60, lambda end: None)
    assert ends == [StreamBreak(timed_out=True, detail="slow")]
    out, ends = _relay(_Response([b"ab"]), time.monotonic() - 1, lambda end: None)
    assert out == b"0\r\n\r\n"
    assert ends == [StreamBreak(timed_out=True, detail="")]


def test_the_openai_path_ends_a_broken_sse_stream_with_an_error_event() -> None:
    out, _ = _relay(_Response([], OSError("reset")), time.monotonic() + 60, openai_path._error_event)
    event = out.split(b"\r\n")[1]
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event.removeprefix(b"data: ")) == {
        "error": {
            "message": "The stream from the container broke: reset",
            "type": "ModelStreamError",
            "param": None,
            "code": 424,
        }
    }
    assert openai_path._nothing(StreamBreak(timed_out=True, detail="")) is None
