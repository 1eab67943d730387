"""Reassemble lines from ``invoke_endpoint_with_response_stream``.

SageMaker forwards the container's body in ``PayloadPart`` events cut wherever the bytes happened to
flush: one JSON line can span several parts and one part can hold several lines. botocore does not
re-buffer, so::

    resp = runtime.invoke_endpoint_with_response_stream(EndpointName=..., Body=..., ContentType=...)
    for obj in iter_stream_objects(resp["Body"]):
        print(obj["token"]["text"], end="", flush=True)

instead of writing a line iterator by hand. Errors the endpoint reports mid-stream
(``ModelStreamError``) are raised by botocore as ``EventStreamError`` while iterating.

What the readers accept, from boto3 and both SageMaker Python SDK majors:

- boto3's ``EventStream`` (``resp["Body"]``) or any iterable of its events
  (``{"PayloadPart": {"Bytes": b"..."}}``), or the whole response dict (its ``Body`` is read);
- sagemaker-core's (SDK v3) shapes: an ``InvokeEndpointWithResponseStreamOutput`` (its ``body``), a
  ``ResponseStream`` event or an iterable of them, ``PayloadPart`` (``bytes``: bytes or a file);
- the SDKs' ``LineIterator`` (v2 ``sagemaker.iterators``, v3 ``sagemaker.core.iterators``), whose
  items are whole lines with their newline removed, and ``ByteIterator`` or any raw byte chunks.

An error event (``ModelStreamError``, ``InternalStreamFailure``) that reaches the reader as data
rather than as botocore's exception raises :class:`StreamError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

#: the error members of the ``ResponseStream`` union: the event's key, and the SDK shapes' attribute
ERROR_EVENTS = {"ModelStreamError": "model_stream_error", "InternalStreamFailure": "internal_stream_failure"}


class StreamError(RuntimeError):
    """An error event of the response stream (``kind`` is ``ModelStreamError`` or
    ``InternalStreamFailure``; ``code`` is SageMaker's ``ErrorCode``, when it sent one)."""

    def __init__(self, kind: str, message: str, code: str | None = None) -> None:
        super().__init__(f"{kind}{f' ({code})' if code else ''}: {message}")
        self.kind, self.message, self.code = kind, message, code


def _field(obj: Any, key: str, attr: str) -> Any:
    """``obj[key]`` of a dict event, or ``obj.attr`` of an SDK shape (None when absent or unset)."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    value = getattr(obj, attr, None)
    # sagemaker-core marks unset members with an ``Unassigned`` instance rather than None
    return None if value is None or type(value).__name__ == "Unassigned" else value


def _blob(value: Any) -> bytes:
    if hasattr(value, "read"):  # sagemaker-core turns blobs into BytesIO
        value = value.read()
    if isinstance(value, str):
        return value.encode()
    return bytes(value or b"")


def _is_event(obj: Any) -> bool:
    """One event of the stream (dict or SDK shape), rather than a stream of them."""
    if isinstance(obj, Mapping):
        return "PayloadPart" in obj or any(k in obj for k in ERROR_EVENTS)
    return hasattr(obj, "payload_part") or type(obj).__name__ == "PayloadPart"


def _is_line_iterator(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "LineIterator" and cls.__module__.startswith("sagemaker.")


def _source(events: Any) -> Any:
    """The stream inside a response (boto3's dict, or sagemaker-core's output shape), else ``events``."""
    if isinstance(events, Mapping) and "Body" in events:
        return events["Body"]
    if not _is_event(events) and not isinstance(events, bytes | bytearray | str):
        body = _field(events, "Body", "body")
        if body is not None and not isinstance(events, Iterator):
            return body
    return events


def _event_bytes(event: Any) -> bytes | None:
    """The body bytes of one event; None for an event kind that carries none; raises for errors."""
    if isinstance(event, bytes | bytearray | memoryview | str):
        return _blob(event)
    if type(event).__name__ == "PayloadPart" and not isinstance(event, Mapping):
        return _blob(_field(event, "Bytes", "bytes"))
    part = _field(event, "PayloadPart", "payload_part")
    if part is not None:
        return _blob(_field(part, "Bytes", "bytes"))
    for kind, attr in ERROR_EVENTS.items():
        error = _field(event, kind, attr)
        if error is not None:
            message = _field(error, "Message", "message") or ""
            code = _field(error, "ErrorCode", "error_code")
            raise StreamError(kind, str(message), str(code) if code else None)
    return None  # other event kinds (future members of the union) carry no body bytes


def _parts(events: Any) -> Iterator[bytes]:
    source = _source(events)
    if _is_event(source):
        source = [source]
    whole_lines = _is_line_iterator(source)
    for event in source:
        chunk = _event_bytes(event)
        if chunk is not None:
            yield chunk + b"\n" if whole_lines else chunk


def iter_lines(events: Iterable[Any] | Any) -> Iterator[bytes]:
    """Complete lines (without the newline) from any stream the module docstring lists.

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


def iter_stream_objects(events: Iterable[Any] | Any) -> Iterator[dict[str, Any]]:
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
