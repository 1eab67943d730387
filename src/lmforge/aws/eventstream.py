"""AWS event-stream framing (``application/vnd.amazon.eventstream``), the encoding side.

botocore only decodes this format, and the local SageMaker runtime must produce it, so lmforge owns a
small encoder. A message is::

    total_len:u32 | headers_len:u32 | prelude_crc:u32 | headers | payload | message_crc:u32

with big-endian integers, CRC32 of the first 8 bytes as ``prelude_crc`` and of everything before it
as ``message_crc``; a header is ``name_len:u8 | name | type:u8 | value`` (type 7: ``len:u16 | utf8``).
``invoke_endpoint_with_response_stream`` sends ``PayloadPart`` events whose payload is the raw bytes,
and ends a failed stream with a ``ModelStreamError`` exception message.
"""

from __future__ import annotations

import binascii
import json
import struct

_STRING = 7
MAX_HEADERS = 128 * 1024
MAX_PAYLOAD = 24 * 1024 * 1024


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode("utf-8"), value.encode("utf-8")
    if len(raw_name) > 255:
        raise ValueError(f"header name {name!r} is longer than 255 bytes")
    if len(raw_value) > 0xFFFF:
        raise ValueError(f"header {name!r} has a value longer than 65535 bytes")
    return (
        struct.pack(">B", len(raw_name)) + raw_name + struct.pack(">BH", _STRING, len(raw_value)) + raw_value
    )


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string headers."""
    raw_headers = b"".join(_header(k, v) for k, v in headers.items())
    if len(raw_headers) > MAX_HEADERS:
        raise ValueError(f"headers are {len(raw_headers)} bytes, more than {MAX_HEADERS}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"payload is {len(payload)} bytes, more than {MAX_PAYLOAD}")
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", binascii.crc32(body))


def payload_part(data: bytes) -> bytes:
    """A ``PayloadPart`` event carrying ``data``."""
    return encode_message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"},
        data,
    )


def model_stream_error(message: str, error_code: str = "ModelStreamError") -> bytes:
    """A ``ModelStreamError`` exception event: boto3 raises ``EventStreamError`` when it reads it."""
    body = json.dumps({"Message": message, "ErrorCode": error_code}).encode("utf-8")
    return encode_message(
        {
            ":exception-type": "ModelStreamError",
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        body,
    )
