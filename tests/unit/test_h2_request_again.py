"""The server's memory of the last request head (``connection._Again``): the same block again,
with the dynamic table as it was, is neither decoded nor checked again. Whatever the client
sends, the server must report (and answer) exactly what it does when it forgets every time:
a block whose meaning changed with the table, a malformed one, one that END_STREAM makes
malformed, trailers, a table size update."""

from __future__ import annotations

from typing import Any

import hpack
from hyperframe.frame import HeadersFrame, SettingsFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.http2.connection import (
    PREFACE,
    ErrorCode,
    H2Limits,
    H2Server,
    HeadersTooLarge,
    RequestReceived,
    StreamReset,
)
from tests.unit.test_h2_connection import GET

EH = ["END_HEADERS"]
EHS = ["END_HEADERS", "END_STREAM"]


class Twins:
    """Two servers fed the same bytes; ``ref`` forgets the last head before every read."""

    def __init__(self, limits: H2Limits | None = None) -> None:
        self.srv = H2Server(limits)
        self.ref = H2Server(limits)
        self.sid = 1
        hello = PREFACE + SettingsFrame(0).serialize()
        for s in (self.srv, self.ref):
            s.initiate()
            s.receive(hello, 0.0)
            s.data_to_send()

    def send(self, block: bytes, end_stream: bool = True, sid: int | None = None) -> list[Any]:
        if sid is None:
            sid = self.sid
            self.sid += 2
        data = HeadersFrame(sid, block, flags=EHS if end_stream else EH).serialize()
        self.ref._again = None
        self.ref._last_gen = -1
        got = self.srv.receive(data, 0.0)
        want = self.ref.receive(data, 0.0)
        assert got == want
        assert self.srv.data_to_send() == self.ref.data_to_send()
        assert self.srv.closed == self.ref.closed
        return got


def indexed(*idx: int) -> bytes:
    return bytes(0x80 | i for i in idx)


# :method GET, :scheme https, :path /, then whatever follows (static indices 2, 7, 4).
GET_HTTPS = indexed(2, 7, 4)


def literal(name: bytes, value: bytes) -> bytes:
    """A literal with incremental indexing, new name (RFC 7541 §6.2.1): inserted as entry 62."""
    return b"\x40" + bytes((len(name),)) + name + bytes((len(value),)) + value


def test_a_repeated_block_is_reported_as_decoded() -> None:
    t = Twins()
    first = t.send(GET_HTTPS + literal(b":authority", b"example.com")
                   + literal(b"user-agent", b"t"))
    block = GET_HTTPS + indexed(63, 62)  # both now from the table
    events = [t.send(block) for _ in range(5)]
    assert t.srv._again is not None  # kept: the last ones were not decoded
    for ev in [first, *events]:
        assert [type(e) for e in ev] == [RequestReceived]
        assert ev[0].authority == b"example.com" and ev[0].headers == [(b"user-agent", b"t")]
    assert events[-1][0].headers is not events[-2][0].headers  # each event its own list


def test_the_same_block_after_the_table_changed_means_something_else() -> None:
    t = Twins()
    t.send(GET_HTTPS + literal(b":authority", b"a") + literal(b"x-a", b"1"))
    block = GET_HTTPS + indexed(63, 62)
    for _ in range(3):
        assert t.send(block)[0].headers == [(b"x-a", b"1")]
    t.send(GET_HTTPS + indexed(63) + literal(b"x-a", b"2"))  # now 62 is x-a: 2, 63 x-a: 1
    for _ in range(3):
        ev = t.send(block)
        assert ev[0].authority is None and ev[0].headers == [(b"x-a", b"1"), (b"x-a", b"2")]
    t.send(b"\x3f\xe1\x1f" + GET_HTTPS + indexed(64))  # a size update to 4096: the same table
    assert t.send(block)[0].headers == [(b"x-a", b"1"), (b"x-a", b"2")]
    t.send(b"\x20" + GET_HTTPS + literal(b":authority", b"b"))  # size 0, then entry 62 again
    ev = t.send(block)  # 63 is gone: COMPRESSION_ERROR (RFC 7541 §2.3.3)
    assert ev[0].code == ErrorCode.COMPRESSION_ERROR and t.srv.closed


def test_end_stream_decides_on_a_kept_head_with_a_body() -> None:
    t = Twins()
    post = indexed(3, 7) + literal(b":path", b"/up") + literal(b":authority", b"a") + \
        literal(b"content-length", b"5")
    t.send(post, end_stream=False)
    block = indexed(3, 7, 64, 63, 62)
    for _ in range(3):
        ev = t.send(block, end_stream=False)
        assert [type(e) for e in ev] == [RequestReceived]
    ev = t.send(block, end_stream=True)  # content-length 5 and no DATA: malformed (§8.1.1)
    assert [type(e) for e in ev] == [StreamReset] and ev[0].code == ErrorCode.PROTOCOL_ERROR
    ev = t.send(block, end_stream=False)
    assert [type(e) for e in ev] == [RequestReceived]


def test_a_malformed_block_is_refused_every_time() -> None:
    t = Twins()
    t.send(GET_HTTPS + literal(b":authority", b"a") + literal(b"x-Bad", b"1"))
    for _ in range(4):
        ev = t.send(GET_HTTPS + indexed(63, 62))
        assert [type(e) for e in ev] == [StreamReset]
    for _ in range(4):
        assert t.send(GET_HTTPS + indexed(63))[0].authority == b"a"
    ev = t.send(indexed(7, 4, 63))  # the same table, no :method
    assert [type(e) for e in ev] == [StreamReset]


def test_trailers_with_the_block_of_the_last_head_are_decoded() -> None:
    t = Twins()
    t.send(GET_HTTPS + literal(b":authority", b"a"))
    block = GET_HTTPS + indexed(62)
    for _ in range(3):
        t.send(block, end_stream=False)  # the streams stay open
    assert t.srv._again is not None
    ev = t.send(block, sid=t.sid - 2)  # as trailers: pseudo-fields in them are malformed
    assert [type(e) for e in ev] == [StreamReset]


def test_a_kept_head_too_large_is_answered_as_too_large() -> None:
    t = Twins(H2Limits(max_header_list_size=200))
    t.send(GET_HTTPS + literal(b":authority", b"a") + literal(b"x-big", b"b" * 100))
    for _ in range(3):
        ev = t.send(GET_HTTPS + indexed(63, 62, 62))
        assert [type(e) for e in ev] == [HeadersTooLarge]


pool = [(b":authority", b"a"), (b":authority", b"b"), (b"user-agent", b"t"),
        (b"content-length", b"3"), (b"content-length", b"0"), (b"x-a", b"1"), (b"x-a", b"2"),
        (b"cookie", b"c=1"), (b"cookie", b"d=2"), (b"te", b"trailers"), (b"te", b"gzip"),
        (b":path", b"/x"), (b"X-Bad", b"1"), (b":method", b"POST")]
heads = st.lists(st.sampled_from(pool), max_size=5).map(lambda extra: [*GET, *extra])
steps = st.lists(st.tuples(heads, st.booleans(), st.integers(0, 3),
                           st.sampled_from([None, 0, 64, 4096])), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_any_sequence_gives_the_events_of_a_server_that_forgets(plan: list[Any]) -> None:
    t = Twins(H2Limits(max_header_list_size=400))
    enc = hpack.Encoder()
    for headers, end_stream, repeat, table in plan:
        if table is not None:
            enc.header_table_size = table  # a size update starts the next block
        block = enc.encode(headers)
        for _ in range(repeat + 1):
            t.send(block, end_stream)
            if t.srv.closed:
                return
