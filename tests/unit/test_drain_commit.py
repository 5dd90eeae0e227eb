"""Commit-once decided without I/O (drain/commit.py): what both stores apply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lameduck.drain.commit import SeqGap, Verdict, parse_seq, verdict


def test_verdicts() -> None:
    assert verdict(0, 1) is Verdict.APPLY
    assert verdict(4, 5) is Verdict.APPLY
    assert verdict(5, 5) is Verdict.REPLAY
    assert verdict(5, 1) is Verdict.REPLAY
    assert verdict(0, 0) is Verdict.REPLAY
    assert verdict(1, 3) is Verdict.GAP


@given(st.lists(st.integers(min_value=0, max_value=12), max_size=60))
def test_any_order_of_attempts_applies_each_seq_once(attempts: list[int]) -> None:
    last, applied = 0, []
    for seq in attempts:
        v = verdict(last, seq)
        if v is Verdict.APPLY:
            applied.append(seq)
            last = seq
        else:
            assert (v is Verdict.REPLAY) == (seq <= last)
    assert applied == list(range(1, last + 1))


def test_parse_seq() -> None:
    assert parse_seq("0") == 0
    assert parse_seq(b" 42 ") == 42
    assert parse_seq(str(2**53 - 1)) == 2**53 - 1
    for bad in (None, "", "-1", "1.5", "x", "9" * 19, str(2**53)):
        with pytest.raises(ValueError):
            parse_seq(bad)


def test_gap_message_says_where_to_replay_from() -> None:
    e = SeqGap("tok", 3, 7)
    assert (e.last, e.seq) == (3, 7)
    assert "replay from 4" in str(e)
