from __future__ import annotations

import pytest

from lmforge.engines.text import StopMatcher


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[tuple[int, str]], bool, str]:
    m = StopMatcher(stops)
    out: list[tuple[int, str]] = []
    for i, piece in enumerate(pieces):
        out.extend(m.push(i, piece))
        if m.stopped:
            break
    if not m.stopped:
        out.extend(m.flush())
    return out, m.stopped, m.text


def test_no_stops_passes_everything_through() -> None:
    out, stopped, text = run((), ["a", "b", "c"])
    assert out == [(0, "a"), (1, "b"), (2, "c")]
    assert not stopped and text == "abc"


def test_stop_inside_one_token_cuts_it() -> None:
    out, stopped, text = run(("XY",), ["ab", "cXYd", "e"])
    assert stopped
    assert text == "abc"
    assert out == [(0, "ab"), (1, "c")]


def test_stop_across_tokens_holds_back_the_prefix() -> None:
    m = StopMatcher(("\n\n",))
    assert m.push(0, "hi") == [(0, "hi")]
    assert m.push(1, "\n") == []  # could be the start of the stop string
    out = m.push(2, "\nmore")
    assert m.stopped
    assert m.text == "hi"
    assert out == [(1, ""), (2, "")]


def test_held_prefix_is_released_when_it_does_not_match() -> None:
    m = StopMatcher(("\n\n",))
    assert m.push(0, "a\n") == []
    assert m.push(1, "b") == [(0, "a\n"), (1, "b")]
    assert not m.stopped


def test_flush_releases_held_text_at_the_end() -> None:
    out, stopped, text = run(("END",), ["x", "EN"])
    assert not stopped
    assert out == [(0, "x"), (1, "EN")]
    assert text == "xEN"


def test_earliest_of_several_stops_wins() -> None:
    _, stopped, text = run(("cd", "b"), ["abcd"])
    assert stopped and text == "a"


@pytest.mark.parametrize("split", range(1, 9))
def test_concatenation_is_text_for_every_split(split: int) -> None:
    full = "hello STOP world"
    pieces = [full[i : i + split] for i in range(0, len(full), split)]
    out, stopped, text = run(("STOP",), pieces)
    assert stopped
    assert text == "hello "
    assert "".join(t for _, t in out) == "hello "
