"""The connection's memory of the last head it sent (``H2Connection._octets``): a field sent
again where it was last time goes out as the octets it had then, when those octets do not
depend on the dynamic table or the table has not changed since. Whatever the heads, the
table size changes and the trailers in between, every block must be the very bytes a fresh
encoder fed the same fields gives, and decode (with the ``hpack`` package, and in the ``h2``
client) to the fields sent: lower-cased names, no connection-specific ones (RFC 9113 §8.2.2)."""

from __future__ import annotations

from typing import Any

import h2.events as ce
import hpack
from h2.settings import SettingCodes
from hyperframe.frame import ContinuationFrame, HeadersFrame, SettingsFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.http2 import connection
from lameduck.http2.codec import Encoder
from lameduck.http2.connection import H2Server
from lameduck.proxy import sections
from tests.unit.test_h2_connection import GET, Pair, Raw, frames_of

EHS = ["END_HEADERS", "END_STREAM"]
DROPPED = {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"proxy-connection"}


def fresh(b: bytes) -> bytes:
    """A new bytes object, as the HTTP/1 parser hands each response's fields."""
    return bytes(bytearray(b))


def as_sent(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Names lower-cased, connection-specific fields dropped, values without the OWS around
    them (RFC 9113 §8.2.1)."""
    return [(n.lower(), v.strip(b" \t")) for n, v in headers if n.lower() not in DROPPED]


class Server:
    """An H2Server driven by hand, each head on a new stream, with a plain ``Encoder`` fed
    the same fields alongside: the reference for the octets."""

    def __init__(self) -> None:
        self.raw = Raw()
        self.ref = Encoder()
        self.dec = hpack.Decoder()
        self.sid = 1

    def table_size(self, size: int) -> None:
        self.raw.send(SettingsFrame(0, settings={SettingCodes.HEADER_TABLE_SIZE: size}))
        self.ref.set_max_table_size(size)

    def head(self, status: int, headers: list[tuple[bytes, bytes]],
             trailers: list[tuple[bytes, bytes]] | None = None) -> bytes:
        """Send one response head (and trailers); its block, checked."""
        sid = self.sid
        self.sid += 2
        self.raw.send(HeadersFrame(sid, self.raw.block(GET), flags=EHS))
        srv: H2Server = self.raw.server
        srv.send_headers(sid, status, [(fresh(n), fresh(v)) for n, v in headers],
                         end_stream=trailers is None)
        if trailers is not None:
            srv.send_trailers(sid, trailers)
        blocks = self.blocks(srv.data_to_send())
        want = [(b":status", b"%d" % status), *as_sent(headers)]
        assert blocks[0] == self.ref.encode(want)
        assert self.dec.decode(blocks[0], raw=True) == want
        if trailers is not None:
            assert blocks[1] == self.ref.encode(as_sent(trailers))
            assert self.dec.decode(blocks[1], raw=True) == as_sent(trailers)
        return blocks[0]

    @staticmethod
    def blocks(data: bytes) -> list[bytes]:
        out: list[bytes] = []
        for f in frames_of(data):
            if isinstance(f, HeadersFrame):
                out.append(f.data)
            elif isinstance(f, ContinuationFrame):
                out[-1] += f.data
        return out


def date(i: int) -> bytes:
    return b"Mon, 11 May 2026 02:%02d:%02d GMT" % (i // 60 % 60, i % 60)


def nginx(i: int, length: int = 36) -> list[tuple[bytes, bytes]]:
    return [(b"Server", b"nginx/1.22.1"), (b"Date", date(i)),
            (b"Content-Type", b"text/plain"), (b"Content-Length", b"%d" % length),
            (b"Connection", b"keep-alive")]


def test_a_repeated_head_is_sent_as_the_same_octets() -> None:
    s = Server()
    first = s.head(200, nginx(0))
    second = s.head(200, nginx(0))  # now indexed: server, date, content-type are in the table
    assert len(second) < len(first)
    assert s.raw.server._head_missed  # the first time after the insertions: worked out
    assert s.head(200, nginx(0)) == second
    assert not s.raw.server._head_missed  # from the last head, octet for octet
    assert s.head(200, nginx(0)) == second


def test_date_changes_and_evictions_in_a_small_table() -> None:
    """A new Date each second is inserted, and in a 200-octet table it pushes the others out:
    octets kept from before that name an entry since moved or evicted must not be reused."""
    s = Server()
    s.table_size(200)
    for i in range(300):
        s.head(200 if i % 7 else 404, nginx(i // 3, 36 + i % 2))


def test_table_size_changes_between_heads() -> None:
    s = Server()
    for i, size in enumerate([4096, 0, 100, 4096, 64, 64, 300, 0, 0, 4096]):
        s.head(200, nginx(i))
        s.table_size(size)
        s.head(200, nginx(i))
        s.head(200, nginx(i))


def test_fields_in_another_order_number_or_case() -> None:
    s = Server()
    h = nginx(0)
    s.head(200, h)
    s.head(200, h)
    s.head(200, h[::-1])
    s.head(200, h[:2])
    s.head(200, h)
    s.head(200, [(n.upper(), v) for n, v in h])
    s.head(200, [(b"server", b"nginx/1.22.1 "), *h[1:]])  # one octet more
    s.head(200, [])
    s.head(302, [(b"Location", b"/x"), *h])
    s.head(302, [(b"Location", b"/y"), *h])
    s.head(200, h + [(b"X-%d" % i, b"v") for i in range(connection._SENT_MAX + 5)])
    s.head(200, h + [(b"X-%d" % i, b"v") for i in range(connection._SENT_MAX + 5)])
    big = (b"X-Big", b"b" * (sections.CACHE_ENTRY_MAX + 1))
    s.head(200, [big, *h])
    s.head(200, [big, *h])
    assert all(len(f.value) <= sections.CACHE_ENTRY_MAX for f in s.raw.server._sent)


def test_trailers_and_interim_heads_in_between() -> None:
    s = Server()
    for i in range(20):
        s.head(200, nginx(0), trailers=[(b"grpc-status", b"%d" % (i % 3)),
                                        (b"x-trailer-%d" % (i % 4), b"t")])
        s.head(200, nginx(0))


names = st.sampled_from([b"Server", b"server", b"Date", b"Content-Type", b"Content-Length",
                         b"Set-Cookie", b"Connection", b"ETag", b"X-A", b"x-b", b"Vary",
                         b"Cache-Control", b"Location"])
values = st.sampled_from([b"", b"a", b"nginx", b"text/plain", b"36", b"x" * 40, b"y" * 300,
                          b"Mon, 11 May 2026 02:00:00 GMT", b"Mon, 11 May 2026 02:00:01 GMT"])
heads = st.lists(st.tuples(names, values), max_size=10)
steps = st.lists(st.one_of(
    st.tuples(st.just("head"), st.sampled_from([200, 204, 301, 404, 503, 599]), heads),
    st.tuples(st.just("again"), st.just(0), st.just([])),
    st.tuples(st.just("table"), st.sampled_from([0, 64, 256, 4096]), st.just([])),
    st.tuples(st.just("trailers"), st.just(200), heads),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_any_sequence_gives_the_octets_of_a_fresh_encoder(plan: list[Any]) -> None:
    s = Server()
    last: tuple[int, list[tuple[bytes, bytes]]] = (200, [])
    for what, n, headers in plan:
        if what == "head":
            last = (n, headers)
            s.head(n, headers)
        elif what == "again":
            s.head(*last)
        elif what == "table":
            s.table_size(n)
        else:
            s.head(n, nginx(1), trailers=as_sent(headers))


def test_the_h2_client_reads_every_head() -> None:
    """The strict ``h2`` client state machine over real framing, the table shrunk midway."""
    p = Pair()
    for i in range(120):
        if i == 60:
            p.client.update_settings({SettingCodes.HEADER_TABLE_SIZE: 128})
            p.pump()
        sid = p.request()
        p.pump()
        p.server.send_headers(sid, 200, nginx(i // 10, i), end_stream=True)
        _, cli = p.pump()
        resp = [e for e in cli if isinstance(e, ce.ResponseReceived)]
        assert resp[0].headers == [(b":status", b"200"), *as_sent(nginx(i // 10, i))]


def test_frame_headers_of_a_response_by_length_and_stream_id() -> None:
    """Short frames take their first five octets from a table and the stream id's four from
    the stream; longer ones are packed: every length and id must come out as hyperframe
    reads it, up to the highest stream id (2^31-1)."""
    raw = Raw()
    srv: H2Server = raw.server
    dec = hpack.Decoder()
    for sid, n in [(1, 0), (3, 1), (5, 255), (7, 256), (9, 16384), (11, 16385),
                   (2**31 - 1, 255)]:
        raw.send(HeadersFrame(sid, raw.block(GET), flags=EHS))
        pad = (b"x-pad", b"p" * max(0, n - 8))
        srv.send_headers(sid, 200, [pad])
        body = b"b" * n
        srv.send_data(sid, body)
        if n % 2:
            srv.send_trailers(sid, [(b"x-t", b"1")])
        else:
            srv.send_data(sid, b"", end_stream=True)
        got = frames_of(srv.data_to_send())
        assert {f.stream_id for f in got} == {sid}
        assert b"".join(f.data for f in got if f.type == 0x0) == body
        assert "END_STREAM" in got[-1].flags
        blocks = Server.blocks(b"".join(f.serialize() for f in got))
        assert dec.decode(blocks[0], raw=True) == [(b":status", b"200"), pad]
        if n % 2:
            assert dec.decode(blocks[1], raw=True) == [(b"x-t", b"1")]


def test_stream_id_octets() -> None:
    from lameduck.http2.frames import stream_id_octets

    for sid in [*range(0, 1 << 17, 3), 0xFF, 0x100, 0xFFFF, 0x10000, 2**31 - 1]:
        assert stream_id_octets(sid) == sid.to_bytes(4, "big")


def test_a_head_of_the_kept_fields_after_a_longer_one_sends_only_its_own() -> None:
    """Only the first ``_SENT_MAX`` fields of a head are kept to compare: a head that is the
    last one's first fields, all sent as before, is not the last head's block (which holds the
    fields past them too: another response's headers, or another request's credentials)."""
    s = Server()
    longer = [(b"x-%d" % i, b"v") for i in range(connection._SENT_MAX + 5)]
    s.head(200, longer)
    s.head(200, longer)  # every field indexed now: the next head matches field for field
    s.head(200, longer[:connection._SENT_MAX - 1])  # with :status, _SENT_MAX fields
    s.head(200, longer[:connection._SENT_MAX - 1])
