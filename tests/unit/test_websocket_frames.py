"""The WebSocket frame tracker on hand-built frames (RFC 6455 examples included), any chunking.

Frames are built here with struct; when the ``websockets`` library is installed, a second set built
by it checks that both agree.
"""

from __future__ import annotations

import itertools
import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.tunnel.websocket import (
    GOING_AWAY,
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameTracker,
    accept_key,
    apply_mask,
    close_frame,
)

FAST = settings(max_examples=150, deadline=None)
QUICK = settings(max_examples=30, deadline=None)  # for tests parametrized over many cases
KEY = b"\x37\xfa\x21\x3d"  # the mask key of the RFC 6455 §5.7 example


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True, key: bytes | None = None,
          rsv: int = 0, bits: int | None = None) -> bytes:
    """One frame by hand; ``bits`` forces the 7/16/64-bit length form, ``key`` masks it."""
    n = len(payload)
    if bits is None:
        bits = 7 if n < 126 else 16 if n < 65536 else 64
    b0 = (0x80 if fin else 0) | rsv | opcode
    m = 0x80 if key is not None else 0
    if bits == 7:
        head = struct.pack("!BB", b0, m | n)
    elif bits == 16:
        head = struct.pack("!BBH", b0, m | 126, n)
    else:
        head = struct.pack("!BBQ", b0, m | 127, n)
    if key is None:
        return head + payload
    return head + key + apply_mask(payload, key)


def close_payload(code: int, reason: bytes = b"") -> bytes:
    return struct.pack("!H", code) + reason


def feed_all(t: FrameTracker, data: bytes, cuts: list[int] | None = None) -> int:
    """Feed in chunks split at ``cuts``; return how many bytes were forwarded in all."""
    bounds = [0, *sorted(set(cuts or [])), len(data)]
    forwarded = 0
    for a, b in itertools.pairwise(bounds):
        if a == b:
            continue
        k = t.feed(data[a:b])
        forwarded += k
        if t.error is not None:
            break
        assert k == b - a
    return forwarded


# -- RFC 6455 §5.7 examples ---------------------------------------------------------------------


RFC_HELLO = bytes.fromhex("810548656c6c6f")
RFC_HELLO_MASKED = bytes.fromhex("818537fa213d7f9f4d5158")
RFC_FRAGMENTS = bytes.fromhex("010348656c" "80026c6f")
RFC_PING = bytes.fromhex("890548656c6c6f")
RFC_PONG_MASKED = bytes.fromhex("8a8537fa213d7f9f4d5158")


def test_rfc_examples_built_by_hand_match() -> None:
    assert frame(OP_TEXT, b"Hello") == RFC_HELLO
    assert frame(OP_TEXT, b"Hello", key=KEY) == RFC_HELLO_MASKED
    assert frame(OP_TEXT, b"Hel", fin=False) + frame(OP_CONT, b"lo") == RFC_FRAGMENTS
    assert frame(OP_PONG, b"Hello", key=KEY) == RFC_PONG_MASKED


@pytest.mark.parametrize(("from_client", "data", "frames"), [
    (False, RFC_HELLO, 1),
    (True, RFC_HELLO_MASKED, 1),
    (False, RFC_FRAGMENTS, 2),
    (False, RFC_PING, 1),
    (True, RFC_PONG_MASKED, 1),
    (False, frame(OP_BINARY, bytes(256)), 1),  # 16-bit length
    (False, frame(OP_BINARY, bytes(65536)), 1),  # 64-bit length
    (True, frame(OP_BINARY, os.urandom(70000), key=KEY), 1),
    (False, frame(OP_TEXT, b"x", bits=64) + frame(OP_TEXT, b"", bits=16), 2),  # lenient forms
])
def test_valid_frames(from_client: bool, data: bytes, frames: int) -> None:
    t = FrameTracker(from_client)
    assert t.at_boundary
    assert t.feed(data) == len(data)
    assert (t.frames, t.error, t.at_boundary, t.in_message) == (frames, None, True, False)


def test_fragmented_message_with_interleaved_ping() -> None:
    """Control frames may come between fragments; a close may be injected at those boundaries."""
    t = FrameTracker(from_client=True)
    steps = [
        (frame(OP_TEXT, b"one ", fin=False, key=KEY), True),
        (frame(OP_PING, b"?", key=KEY), True),
        (frame(OP_CONT, b"two ", fin=False, key=KEY), True),
        (frame(OP_PONG, b"", key=KEY), True),
        (frame(OP_CONT, b"three", key=KEY), False),
        (frame(OP_BINARY, b"\x00", key=KEY), False),
    ]
    for data, in_message in steps:
        assert t.feed(data) == len(data)
        assert (t.at_boundary, t.in_message, t.error) == (True, in_message, None)
    assert t.frames == len(steps)


def test_boundary_only_at_frame_ends() -> None:
    data = frame(OP_BINARY, b"abcdef") + frame(OP_TEXT, b"g")
    ends = {8, 11}
    t = FrameTracker(from_client=False)
    for i in range(len(data)):
        t.feed(data[i:i + 1])
        assert t.at_boundary is (i + 1 in ends), i


def test_stop_at_boundary_leaves_room_for_a_close() -> None:
    a, b, c = frame(OP_BINARY, b"aaaa"), frame(OP_PING, b""), frame(OP_TEXT, b"ccc")
    data = a + b + c
    t = FrameTracker(from_client=False)
    assert t.feed(data[:3]) == 3
    assert t.feed(data[3:], stop_at_boundary=True) == len(a) - 3  # the end of frame a
    assert t.at_boundary
    assert t.feed(data[len(a):], stop_at_boundary=True) == 0  # already at a boundary
    assert t.feed(data[len(a):], stop_at_boundary=True) == 0
    assert t.feed(data[len(a):]) == len(b + c)
    assert t.frames == 3


def test_big_payload_is_skipped_not_scanned() -> None:
    """A 64 MiB frame costs what a small one costs: the payload is skipped by its length."""
    size = 64 << 20
    header = struct.pack("!BBQ", 0x82, 127, size)
    payload = memoryview(bytes(size))
    t = FrameTracker(from_client=False)
    begin = time.perf_counter()
    assert t.feed(header + b"\x00") == len(header) + 1
    assert t.feed(payload[1:]) == size - 1
    assert time.perf_counter() - begin < 0.05
    assert (t.frames, t.at_boundary) == (1, True)


# -- closes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("payload", "code"), [
    (b"", 1005),
    (close_payload(1000), 1000),
    (close_payload(1001, b"going away"), 1001),
    (close_payload(1014), 1014),
    (close_payload(3000, "ça va".encode()), 3000),
    (close_payload(4999), 4999),
])
@pytest.mark.parametrize("from_client", [False, True])
def test_close_code_read(payload: bytes, code: int, from_client: bool) -> None:
    data = frame(OP_CLOSE, payload, key=KEY if from_client else None)
    t = FrameTracker(from_client)
    assert not t.close_seen
    assert feed_all(t, data, list(range(len(data)))) == len(data)  # byte by byte
    assert (t.close_seen, t.close_code, t.error) == (True, code, None)


@pytest.mark.parametrize("mask", [False, True])
def test_close_frame_round_trips(mask: bool) -> None:
    data = close_frame(GOING_AWAY, b"draining", mask=mask)
    t = FrameTracker(from_client=mask)
    assert t.feed(data) == len(data)
    assert (t.close_seen, t.close_code, t.at_boundary, t.frames) == (True, 1001, True, 1)


def test_close_frame_bytes() -> None:
    assert close_frame(1001) == b"\x88\x02\x03\xe9"
    assert close_frame(1001, mask_key=KEY) == b"\x88\x02\x03\xe9"  # the key only serves masking
    masked = close_frame(1002, b"x", mask=True, mask_key=b"\x01\x02\x03\x04")
    assert masked == b"\x88\x83\x01\x02\x03\x04" + bytes((0x03 ^ 1, 0xEA ^ 2, ord("x") ^ 3))
    assert close_frame(1001, mask=True, mask_key=KEY) == close_frame(1001, mask=True,
                                                                     mask_key=KEY)  # pure
    assert close_frame(1001, mask=True)[2:6] != close_frame(1001, mask=True)[2:6]  # fresh keys


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"code": 1005}, "code"),
    ({"code": 999}, "code"),
    ({"code": 1001, "reason": b"x" * 124}, "too long"),
    ({"code": 1001, "reason": b"\xff"}, "utf-8"),
    ({"code": 1001, "mask": True, "mask_key": b"abc"}, "4 bytes"),
])
def test_close_frame_refuses_what_a_peer_rejects(kwargs: dict[str, object], why: str) -> None:
    with pytest.raises(ValueError, match=f"(?i){why}"):
        close_frame(**kwargs)  # type: ignore[arg-type]


def test_accept_key_rfc_example() -> None:
    assert accept_key(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


# -- invalid frames --------------------------------------------------------------------------------

GOOD_S = frame(OP_TEXT, b"ok")
GOOD_C = frame(OP_TEXT, b"ok", key=KEY)


def bad_cases() -> list[tuple[str, bool, bytes, str]]:
    """(name, from_client, bad frame, error substring); each goes after one good frame."""
    s, c = False, True
    return [
        ("rsv1 without extension", s, frame(OP_TEXT, b"x", rsv=0x40), "reserved bits 0x40"),
        ("rsv2", s, frame(OP_TEXT, b"x", rsv=0x20), "reserved bits 0x20"),
        ("rsv3", c, frame(OP_BINARY, b"x", rsv=0x10, key=KEY), "reserved bits 0x10"),
        ("opcode 3", s, frame(0x3, b"x"), "unknown opcode 0x3"),
        ("opcode 7", s, frame(0x7), "unknown opcode 0x7"),
        ("opcode 0xb", c, frame(0xB, key=KEY), "unknown opcode 0xb"),
        ("opcode 0xf", s, frame(0xF), "unknown opcode 0xf"),
        ("ping of 126 bytes", s, frame(OP_PING, bytes(126)), "longer than 125"),
        ("close of 126 bytes", c, frame(OP_CLOSE, bytes(126), key=KEY), "longer than 125"),
        ("ping, 7-bit 125 as 16-bit form", s, frame(OP_PING, b"", bits=16),
         "longer than 125"),
        ("fragmented ping", s, frame(OP_PING, b"x", fin=False), "fragmented control"),
        ("fragmented close", c, frame(OP_CLOSE, b"", fin=False, key=KEY), "fragmented control"),
        ("unmasked from client", c, frame(OP_TEXT, b"x"), "unmasked frame from the client"),
        ("masked from server", s, frame(OP_TEXT, b"x", key=KEY), "masked frame from the server"),
        ("lone continuation", s, frame(OP_CONT, b"x"), "continuation frame without"),
        ("new message inside one", s, frame(OP_TEXT, b"a", fin=False) + frame(OP_BINARY, b"b"),
         "new data frame inside"),
        ("64-bit length top bit", s, struct.pack("!BBQ", 0x82, 127, 1 << 63), "most significant"),
        ("close of 1 byte", s, frame(OP_CLOSE, b"\x03"), "1 byte"),
        ("close code 999", s, frame(OP_CLOSE, close_payload(999)), "invalid close code 999"),
        ("close code 1004", c, frame(OP_CLOSE, close_payload(1004), key=KEY), "code 1004"),
        ("close code 1005", s, frame(OP_CLOSE, close_payload(1005)), "code 1005"),
        ("close code 1006", s, frame(OP_CLOSE, close_payload(1006)), "code 1006"),
        ("close code 1015", s, frame(OP_CLOSE, close_payload(1015)), "code 1015"),
        ("close code 2999", s, frame(OP_CLOSE, close_payload(2999)), "code 2999"),
        ("close code 5000", s, frame(OP_CLOSE, close_payload(5000)), "code 5000"),
        ("close reason not utf-8", c, frame(OP_CLOSE, close_payload(1000, b"\xc3("), key=KEY),
         "not valid UTF-8"),
    ]


BAD = bad_cases()


def bad_offset(name: str, bad: bytes) -> int:
    """Where the bad frame starts inside ``bad`` (one case carries a good first fragment)."""
    return 3 if name == "new message inside one" else 0


@pytest.mark.parametrize(("name", "from_client", "bad", "why"), BAD, ids=[b[0] for b in BAD])
def test_invalid_frame_stops_before_it(name: str, from_client: bool, bad: bytes,
                                       why: str) -> None:
    good = GOOD_C if from_client else GOOD_S
    t = FrameTracker(from_client)
    data = good + bad + good
    k = t.feed(data)
    assert k == len(good) + bad_offset(name, bad)
    assert t.error is not None
    assert why in t.error
    assert t.at_boundary  # nothing of the bad frame went out: a close may follow here
    assert not t.close_seen
    assert t.feed(good) == 0  # stopped for good


@pytest.mark.parametrize(("name", "from_client", "bad", "why"), BAD, ids=[b[0] for b in BAD])
@given(data=st.data())
@QUICK
def test_invalid_frame_any_chunking(name: str, from_client: bool, bad: bytes, why: str,
                                    data: st.DataObject) -> None:
    good = GOOD_C if from_client else GOOD_S
    stream = good + bad + good
    start = len(good) + bad_offset(name, bad)
    cuts = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=6))
    t = FrameTracker(from_client)
    forwarded = feed_all(t, stream, cuts)
    assert t.error is not None and why in t.error
    if t.at_boundary:
        assert forwarded == start
    else:  # the bad frame began in an earlier chunk, which went out before its end was read
        assert start < forwarded < len(good) + len(bad)


def test_rsv1_with_permessage_deflate() -> None:
    ok = frame(OP_TEXT, b"z", rsv=0x40, fin=False) + frame(OP_CONT, b"z") + \
        frame(OP_BINARY, b"z", rsv=0x40)
    t = FrameTracker(from_client=False, rsv1_allowed=True)
    assert t.feed(ok) == len(ok) and t.error is None
    for bad in (frame(OP_CONT, b"z", rsv=0x40), frame(OP_PING, rsv=0x40),
                frame(OP_TEXT, b"z", rsv=0x60)):
        t = FrameTracker(from_client=False, rsv1_allowed=True)
        data = frame(OP_TEXT, b"a", fin=False) + bad
        assert t.feed(data) == 3
        assert t.error is not None and "reserved bits" in t.error


# -- any chunking gives the same result ------------------------------------------------------------


@st.composite
def frame_streams(draw: st.DrawFn, from_client: bool) -> list[bytes]:
    """Valid frames: messages of 1-3 fragments with control frames between, maybe a close."""
    def key() -> bytes | None:
        return draw(st.binary(min_size=4, max_size=4)) if from_client else None

    def payload() -> bytes:
        size = draw(st.sampled_from([0, 1, 5, 125, 126, 300, 70000]))
        return b"\xa5" * size

    def control() -> bytes:
        op = draw(st.sampled_from([OP_PING, OP_PONG]))
        return frame(op, draw(st.binary(max_size=125)), key=key())

    frames: list[bytes] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            frames.append(control())
            continue
        parts = draw(st.integers(1, 3))
        for i in range(parts):
            op = draw(st.sampled_from([OP_TEXT, OP_BINARY])) if i == 0 else OP_CONT
            bits = draw(st.sampled_from([None, None, 64]))
            frames.append(frame(op, payload(), fin=i == parts - 1, key=key(), bits=bits))
            if i < parts - 1 and draw(st.booleans()):
                frames.append(control())
    if draw(st.booleans()):
        frames.append(close_frame(1000, b"bye", mask=from_client, mask_key=key()))
    return frames


@given(data=st.data(), from_client=st.booleans())
@FAST
def test_any_chunking_same_result(data: st.DataObject, from_client: bool) -> None:
    frames = data.draw(frame_streams(from_client))
    stream = b"".join(frames)
    ends, pos = set(), 0
    for f in frames:
        pos += len(f)
        ends.add(pos)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(stream)), max_size=8))))
    t = FrameTracker(from_client)
    prev = 0
    for cut in [*cuts, len(stream)]:
        assert t.feed(memoryview(stream)[prev:cut]) == cut - prev
        assert t.at_boundary is (cut in ends or cut == 0), (cut, ends)
        prev = cut
    assert (t.error, t.frames, t.at_boundary, t.in_message) == (None, len(frames), True, False)
    closes = [f for f in frames if f[0] == 0x88]
    assert t.close_seen is bool(closes)
    assert t.close_code == (1000 if closes else None)


@given(data=st.data(), from_client=st.booleans())
@FAST
def test_stop_at_boundary_finds_every_frame_end(data: st.DataObject, from_client: bool) -> None:
    frames = data.draw(frame_streams(from_client))
    stream = memoryview(b"".join(frames))
    t = FrameTracker(from_client)
    pos, seen = 0, []
    while pos < len(stream):
        assert t.feed(stream[pos:], stop_at_boundary=True) == 0  # at a boundary: stop at once
        assert t.feed(stream[pos:pos + 1]) == 1  # a frame has 2 bytes at least
        k = t.feed(stream[pos + 1:], stop_at_boundary=True)
        assert t.at_boundary
        pos += 1 + k
        seen.append(pos)
    expected, end = [], 0
    for f in frames:
        end += len(f)
        expected.append(end)
    assert seen == expected


# -- cross-check with the websockets library, when installed ---------------------------------------


def test_frames_built_by_websockets() -> None:
    frames_mod = pytest.importorskip("websockets.frames")
    Frame, Opcode, Close = frames_mod.Frame, frames_mod.Opcode, frames_mod.Close
    built = [
        Frame(Opcode.TEXT, b"hel", fin=False),
        Frame(Opcode.PING, b"p"),
        Frame(Opcode.CONT, b"lo"),
        Frame(Opcode.BINARY, b"x" * 300),
        Frame(Opcode.BINARY, b"y" * 70000),
        Frame(Opcode.PONG, b""),
        Frame(Opcode.CLOSE, Close(1001, "bye").serialize()),
    ]
    for mask in (False, True):
        stream = b"".join(f.serialize(mask=mask) for f in built)
        t = FrameTracker(from_client=mask)
        assert feed_all(t, stream, list(range(0, len(stream), 7))) == len(stream)
        assert (t.error, t.frames, t.close_code, t.at_boundary) == (None, 7, 1001, True)
    unmasked = Frame(Opcode.TEXT, b"x").serialize(mask=False)
    t = FrameTracker(from_client=True)
    assert t.feed(unmasked) == 0 and t.error == "unmasked frame from the client"


def test_websockets_reads_close_frame() -> None:
    frames_mod = pytest.importorskip("websockets.frames")
    streams = pytest.importorskip("websockets.streams")
    for mask in (False, True):
        reader = streams.StreamReader()
        reader.feed_data(close_frame(GOING_AWAY, b"draining", mask=mask))
        parser = frames_mod.Frame.parse(reader.read_exact, mask=mask)
        with pytest.raises(StopIteration) as done:
            next(parser)
        close = frames_mod.Close.parse(done.value.value.data)
        assert (close.code, close.reason) == (1001, "draining")
