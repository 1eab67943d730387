"""LMI-Dist's n-gram prompt-lookup proposer (pure Python: no model)."""

from __future__ import annotations

from array import array

from lmforge.engines.lmi_dist.speculative import propose_ngram


def _a(*ids: int) -> array[int]:
    return array("i", ids)


def test_the_longest_suffix_found_earlier_proposes_what_followed_it() -> None:
    tokens = _a(1, 2, 3, 4, 5, 9, 2, 3)
    assert propose_ngram(tokens, 3, 1, 4) == [4, 5, 9]
    assert propose_ngram(tokens, 1, 1, 4) == [4]


def test_the_latest_earlier_match_wins_and_proposals_stop_at_the_end() -> None:
    tokens = _a(7, 1, 8, 7, 1, 6, 7, 1)
    assert propose_ngram(tokens, 5, 1, 2) == [6, 7, 1]


def test_no_match_no_proposal_and_the_suffix_itself_is_not_a_match() -> None:
    assert propose_ngram(_a(1, 2, 3, 4), 3, 1, 3) == []
    assert propose_ngram(_a(5), 3, 1, 3) == []
    assert propose_ngram(_a(1, 2, 1), 0, 1, 3) == []


def test_matches_are_on_token_boundaries_not_bytes() -> None:
    # 256 and 1 share bytes (00 01 00 00 / 01 00 00 00): a byte-level match across two tokens must not count
    tokens = _a(256, 0, 5, 1)
    assert propose_ngram(tokens, 2, 1, 1) == []
    assert propose_ngram(_a(3, 1, 4, 3), 2, 1, 1) == [1, 4]


def test_prompt_lookup_min_is_respected() -> None:
    tokens = _a(1, 2, 9, 3, 2)  # only a 1-gram (2) matches
    assert propose_ngram(tokens, 2, 2, 3) == []
    assert propose_ngram(tokens, 2, 1, 3) == [9, 3]


def test_a_gate_pauses_after_a_window_of_mostly_rejected_drafts_and_backs_off() -> None:
    """A request's gate: judged once a window of drafts is counted; under a quarter accepted pauses
    it, doubling while it stays low, up to the cap; a good window ends the back-off."""
    from lmforge.engines.lmi_dist.speculative import _GATE_PAUSE, _Gate, judge

    gate = _Gate()
    assert not judge(gate, 4, 0, 8, 64) and gate.pause == 0  # half a window: not judged yet
    assert judge(gate, 4, 1, 8, 64) and gate.pause == _GATE_PAUSE  # 1 of 8 accepted
    pauses = []
    for _ in range(4):
        gate.pause = 0
        assert judge(gate, 8, 1, 8, 64)
        pauses.append(gate.pause)
    assert pauses == [2 * _GATE_PAUSE, 4 * _GATE_PAUSE, 64, 64]  # doubling, capped
    gate.pause = 0
    assert not judge(gate, 8, 2, 8, 64) and gate.pause == 0  # a quarter accepted: fine
    assert judge(gate, 8, 0, 8, 64) and gate.pause == _GATE_PAUSE  # the back-off starts over


def test_the_proposer_pauses_for_everyone_after_four_low_windows_in_a_row_only() -> None:
    """Four requests' windows in a row judged low (none fine between) pause the proposer for every
    request, doubling; one request whose drafts pay resets the count and the back-off."""
    from types import SimpleNamespace

    from lmforge.engines.lmi_dist.speculative import _GATE_PAUSE, Speculator, _Gate

    spec = Speculator.__new__(Speculator)  # the judging state only: no batch processor behind it
    spec.gates = {f"r{i}": _Gate() for i in range(6)}
    spec.pause, spec.next_pause, spec.low_verdicts, spec.window = 0, _GATE_PAUSE, 0, 8
    spec.settings = SimpleNamespace(method="draft_model")
    for rid in ("r0", "r1", "r2"):
        spec._judge(rid, 8, 0)
    assert spec.pause == 0  # three low windows: not yet
    spec._judge("r3", 8, 6)  # one request whose drafts pay
    spec._judge("r4", 8, 0)
    assert spec.pause == 0 and spec.low_verdicts == 1
    for rid in ("r5", "r0", "r1"):
        spec._judge(rid, 8, 0)
    assert spec.pause == _GATE_PAUSE and spec.next_pause == 2 * _GATE_PAUSE
    spec._judge("r2", 4, 0)  # half a window: no verdict
    assert spec.low_verdicts == 0
    spec._judge("nobody", 8, 0)  # a request already gone
    assert spec.low_verdicts == 0
