from __future__ import annotations

import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from lmforge.client import iter_lines, iter_stream_objects
from lmforge.engines.protocol import FinishReason, GenerationEvent, Token
from lmforge.handlers import formatters as fmt


def recorded_stream(media: str) -> bytes:
    """What the server sends for a short generation (multi-byte text included), via the real formatter."""
    f = fmt.LmiFormatter("def ", details=True, return_full_text=False)
    events = [
        GenerationEvent(Token(5, "naïve", -0.5), 2, 1),
        GenerationEvent(Token(6, " 😀\n", -1.5), 2, 2),
        GenerationEvent(Token(7, "end", -0.1), 2, 3, finish_reason=FinishReason.LENGTH),
    ]
    return b"".join(fmt.frame(f.stream_line(e), media) for e in events)


def parts(data: bytes, cuts: list[int]) -> list[dict[str, dict[str, bytes]]]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [{"PayloadPart": {"Bytes": data[a:b]}} for a, b in itertools.pairwise(bounds)]


def test_every_single_split_of_a_recorded_stream() -> None:
    for media in (fmt.JSONLINES, fmt.SSE):
        data = recorded_stream(media)
        expected = list(iter_stream_objects([data]))
        assert len(expected) == 3
        assert expected[-1]["generated_text"] == "naïve 😀\nend"
        for cut in range(len(data) + 1):
            assert list(iter_stream_objects(parts(data, [cut]))) == expected, (media, cut)


def test_one_byte_parts_and_many_lines_in_one_part() -> None:
    data = recorded_stream(fmt.JSONLINES)
    expected = [json.loads(line) for line in data.splitlines()]
    assert list(iter_stream_objects(parts(data, list(range(len(data)))))) == expected
    assert list(iter_stream_objects([{"PayloadPart": {"Bytes": data}}])) == expected


@given(st.lists(st.integers(min_value=0, max_value=2000), max_size=40))
def test_any_splits(cuts: list[int]) -> None:
    data = recorded_stream(fmt.SSE)
    cuts = [c % (len(data) + 1) for c in cuts]
    assert list(iter_lines(parts(data, cuts))) == [ln for ln in data.split(b"\n") if ln]


def test_sse_done_and_comments() -> None:
    data = b': keep-alive\n\ndata: {"a": 1}\n\ndata: [DONE]\n\ndata: {"b": 2}\n\n'
    assert list(iter_stream_objects([data])) == [{"a": 1}]


def test_last_line_without_newline() -> None:
    assert list(iter_lines([b'{"a":', b" 1}"])) == [b'{"a": 1}']
