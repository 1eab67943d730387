"""tests/interleaving.py's judgement on orders made up to show each way a crowd can be served."""

from __future__ import annotations

from tests.interleaving import Crowd, findings


def _lockstep(streams: int, tokens: int) -> list[int]:
    return [s for _ in range(tokens) for s in range(streams)]


def test_a_crowd_served_together_has_no_finding() -> None:
    assert findings(Crowd(_lockstep(64, 64), tokens=64, streams=64)) == []
    # a few steps of lag for some (a prefill in chunks, a late arrival) is still together
    order = [s for s in range(8) for _ in range(4)] + _lockstep(8, 60)
    assert findings(Crowd(order, tokens=64, streams=8)) == []


def test_streams_served_one_after_another_are_found() -> None:
    serial = [s for s in range(4) for _ in range(16)]
    found = findings(Crowd(serial, tokens=16, streams=4))
    assert found == ["streams [1, 2, 3] began after stream 0 had all its tokens"]


def test_a_queue_behind_a_full_batch_is_found() -> None:
    order = _lockstep(2, 16) + _lockstep(2, 16)  # streams 0-1 run, then 2-3
    order = [s if i < 32 else s + 2 for i, s in enumerate(order)]
    assert findings(Crowd(order, tokens=16, streams=4))[0].startswith("streams [2, 3] began after")


def test_a_starved_stream_is_found() -> None:
    # stream 3 gets one token for every four of the others' until they end, then the rest at once
    order = [s for step in range(40) for s in ([0, 1, 2, 3] if step % 4 == 0 else [0, 1, 2])]
    order += [3] * (40 - order.count(3))
    assert findings(Crowd(order, tokens=40, streams=4)) == [
        "streams [3] had [10] of 40 tokens when stream 0 had all of its own"
    ]


def test_lost_tokens_are_found() -> None:
    order = _lockstep(3, 8)[:-1]  # the last token of stream 2 never came
    assert findings(Crowd(order, tokens=8, streams=3))[0] == "streams [2] did not get 8 tokens: [7]"
