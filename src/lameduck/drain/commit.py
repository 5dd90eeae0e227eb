"""Commit-once, decided without I/O: both stores (and the Redis script, which mirrors it) apply a
sequence number only when it is the next one, so a replayed request cannot apply twice."""

from __future__ import annotations

from enum import Enum

# Redis' Lua numbers are doubles: above 2**53 the two stores would disagree.
MAX_SEQ = 2**53 - 1


class Verdict(Enum):
    APPLY = "apply"    # seq == last + 1: commit it
    REPLAY = "replay"  # seq <= last: already committed; a no-op that returns the stored result
    GAP = "gap"        # seq > last + 1: something before it never committed


def verdict(last: int, seq: int) -> Verdict:
    if seq <= last:
        return Verdict.REPLAY
    if seq == last + 1:
        return Verdict.APPLY
    return Verdict.GAP


class SeqGap(Exception):
    """A commit skipped a sequence number: the client must replay from ``last + 1``."""

    def __init__(self, token: str, last: int, seq: int) -> None:
        super().__init__(f"resume token {token!r}: seq {seq} does not follow the last committed "
                         f"seq {last} (replay from {last + 1})")
        self.token = token
        self.last = last
        self.seq = seq


def parse_seq(value: str | bytes | None) -> int:
    """A ``Resume-Seq`` value: a decimal integer >= 0 (0: nothing acknowledged yet)."""
    if value is None:
        raise ValueError("missing Resume-Seq")
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text.isdigit() or len(text) > 16 or int(text) > MAX_SEQ:
        raise ValueError(f"Resume-Seq must be an integer from 0 to {MAX_SEQ}, "
                         f"got {text[:40]!r}")
    return int(text)
