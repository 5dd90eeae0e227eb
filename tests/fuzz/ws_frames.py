"""Fuzz target: relayed bytes into the WebSocket frame tracker (``FrameTracker``, RFC 6455 §5),
in reads cut as the input says, against the same bytes in one read.

Invariants: nothing raises; the chunking changes nothing (the same frames, close code, error,
and bytes forwarded up to the error, but for the first bytes of a bad frame that came in an
earlier read, which are reported as not at a boundary); ``feed`` forwards every byte until an
error and none after; the tracker never holds more than a split header (< 14 bytes) and a
close payload (<= 125 bytes); ``stop_at_boundary`` stops exactly where a frame ends.
"""

from __future__ import annotations

import random

from lameduck.tunnel.websocket import FrameTracker

MAX_INPUT = 1 << 14


def outcome(t: FrameTracker, forwarded: int) -> tuple[object, ...]:
    return (t.frames, t.close_seen, t.close_code, t.error, forwarded, t.at_boundary,
            t.in_message if t.error is None else None)


def bounded(t: FrameTracker) -> None:
    assert len(t._hdr) < 14, t._hdr
    assert t._close_buf is None or len(t._close_buf) <= 125, len(t._close_buf)
    assert t._remaining >= 0


def fuzz_one(data: bytes) -> None:
    """First byte: direction and RSV1 (permessage-deflate, RFC 7692); two more seed the cuts."""
    if len(data) < 3:
        return
    from_client, rsv1 = bool(data[0] & 1), bool(data[0] & 2)
    rng = random.Random(data[1:3])
    body = data[3:MAX_INPUT]

    whole = FrameTracker(from_client, rsv1)
    fwd = whole.feed(body)
    bounded(whole)
    if whole.error is None:
        assert fwd == len(body)
    expected = outcome(whole, fwd)
    if whole.error is not None:
        assert whole.feed(b"\x81\x00") == 0  # stopped for good after an error
        assert outcome(whole, fwd) == expected

    split = FrameTracker(from_client, rsv1)
    forwarded = 0
    pos = 0
    while pos < len(body) and split.error is None:
        n = rng.choice((1, 2, 3, 13, 14, 200, 1 << 20))
        chunk = body[pos:pos + n]
        k = split.feed(memoryview(chunk) if n == 3 else chunk)
        bounded(split)
        if split.error is None:
            assert k == len(chunk), (k, len(chunk))
        forwarded += k
        pos += n
    got = outcome(split, forwarded)
    if got != expected and split.error is not None and forwarded > fwd:
        # As the class says: a bad frame that began in an earlier read had its first bytes
        # forwarded then (at most a header and a close payload); the relay then knows it is
        # not at a boundary and cannot put a close frame after them.
        assert forwarded - fwd <= 14 + 125 and not split.at_boundary, (got, expected)
        got = outcome(split, fwd)[:5] + expected[5:]
    assert got == expected, (got, expected)

    # Frame by frame: each stop lands where a frame ends, and the frames add up.
    step = FrameTracker(from_client, rsv1)
    pos = 0
    frames = 0
    for _ in range(len(body) + 1):
        if pos >= len(body) or step.error is not None:
            break
        k = step.feed(body[pos:], stop_at_boundary=True)
        bounded(step)
        if step.error is None:
            assert step.at_boundary or pos + k == len(body), (pos, k)
            assert k > 0 or step.at_boundary
            frames = step.frames
            if k == 0:
                k = step.feed(body[pos:])  # already at a boundary: the rest in one go
        pos += k
    if step.error is None:
        assert frames == whole.frames or step.frames == whole.frames
    assert step.error == whole.error
