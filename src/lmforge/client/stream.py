"""Reassemble lines from ``invoke_endpoint_with_response_stream``.

SageMaker forwards the container's body in ``PayloadPart`` events cut wherever the bytes happened to
flush: one JSON line can span several parts and one part can hold several lines. botocore does not
re-buffer, so::

    resp = runtime.invoke_endpoint_with_response_stream(EndpointName=..., Body=..., ContentType=...)
    for obj in iter_stream_objects(resp["Body"]):
        print(obj["token"]["text"], end="", flush=True)

instead of writing a line iterator by hand. Errors the endpoint reports mid-stream
(``ModelStreamError``) are raised by botocore as ``EventStreamError`` while iterating.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any


def _parts(events: Iterable[Any]) -> Iterator[bytes]:
    for event in events:
        if isinstance(event, bytes | bytearray):
            yield bytes(event)
        elif isinstance(event, Mapping) and "PayloadPart" in event:
            yield event["PayloadPart"].get("Bytes", b"")
        # other event kinds (future members of the union) carry no body bytes


def iter_lines(events: Iterable[Any]) -> Iterator[bytes]:
    """Complete lines (without the newline) from ``PayloadPart`` events or raw byte chunks.

    Empty lines (SSE separators) are dropped; a last line without a newline is still returned.
    """
    pending = b""
    for chunk in _parts(events):
        pending += chunk
        if b"\n" not in chunk:
            continue
        *lines, pending = pending.split(b"\n")
        for line in lines:
            line = line.rstrip(b"\r")
            if line:
                yield line
    if pending.strip():
        yield pending.rstrip(b"\r")


def iter_stream_objects(events: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """JSON objects of an LMI jsonlines or SSE stream (``data:`` prefixes and ``[DONE]`` handled)."""
    for line in iter_lines(events):
        if line.startswith(b"data:"):
            line = line[5:].lstrip()
            if line == b"[DONE]":
                return
        elif line.startswith((b"event:", b"id:", b"retry:", b":")):
            continue
        obj = json.loads(line)
        if isinstance(obj, dict):
            yield obj
