"""The event-stream encoder, checked against botocore's own decoder and boto3's response parser."""

from __future__ import annotations

from collections.abc import Iterator

import botocore.session
import pytest
from botocore.eventstream import ChecksumMismatch, EventStream, EventStreamBuffer
from botocore.exceptions import EventStreamError
from botocore.parsers import EventStreamJSONParser
from hypothesis import given
from hypothesis import strategies as st

from lmforge.aws.eventstream import encode_message, model_stream_error, payload_part


def decode(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buf = EventStreamBuffer()
    buf.add_data(data)
    return [(msg.headers, msg.payload) for msg in buf]


@given(
    headers=st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=50), max_size=5),
    payload=st.binary(max_size=2000),
)
def test_botocore_decodes_what_we_encode(headers: dict[str, str], payload: bytes) -> None:
    [(got_headers, got_payload)] = decode(encode_message(headers, payload))
    assert got_headers == headers
    assert got_payload == payload


def test_corruption_is_detected_by_the_crc() -> None:
    data = bytearray(payload_part(b'{"token": {"id": 1}}\n'))
    data[-6] ^= 0xFF
    with pytest.raises(ChecksumMismatch):
        decode(bytes(data))


class _Raw:
    def __init__(self, data: bytes, chunk: int) -> None:
        self.data, self.chunk = data, chunk

    def stream(self) -> Iterator[bytes]:
        for i in range(0, len(self.data), self.chunk):
            yield self.data[i : i + self.chunk]

    def close(self) -> None:
        pass


def boto3_events(data: bytes, chunk: int = 7) -> EventStream:
    model = botocore.session.get_session().get_service_model("sagemaker-runtime")
    op = model.operation_model("InvokeEndpointWithResponseStream")
    shape = op.output_shape.members["Body"]
    return EventStream(_Raw(data, chunk), shape, EventStreamJSONParser(), op.name)


def test_boto3_reads_payload_parts_and_model_stream_error() -> None:
    data = payload_part(b"first\n") + payload_part(b"second\n") + model_stream_error("boom", "StreamBroken")
    events = boto3_events(data)
    got = []
    with pytest.raises(EventStreamError) as err:
        got.extend(events)
    assert got == [{"PayloadPart": {"Bytes": b"first\n"}}, {"PayloadPart": {"Bytes": b"second\n"}}]
    assert err.value.response["Error"]["Code"] == "ModelStreamError"
    assert err.value.response["Error"]["Message"] == "boom"


def test_header_limits() -> None:
    with pytest.raises(ValueError, match="longer than 255"):
        encode_message({"x" * 256: "v"}, b"")
