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
