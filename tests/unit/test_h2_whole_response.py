"""A whole plain HTTP/1.1 response to an HTTP/2 client (``H2Downstream.send_whole``): the
fields of its head as the HTTP/1.1 parser would have given them (read by the HTTP/1.1
upstream, ``http1.wire.response_fields``), then its body, as frames.
What the client reads must be what the parser's path gives it (the real H1Upstream, llhttp),
field for field and octet for octet of the body, whatever the head."""

from __future__ import annotations

import hpack
import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.http1.wire import response_fields, whole_response
from lameduck.http2.downstream import H2Downstream
from lameduck.proxy.fields import HOP_BY_HOP
from tests.drainplay import ScriptedRng
from tests.unit.test_downstream_playbook import H2_PREFACE, Listener, accept, frames, headers

# GET /x and HEAD /x on stream 1 (HPACK: :method by static index or a literal, RFC 7541)
GET_X = b"\x82\x86\x04\x02/x\x01\x03app"
HEAD_X = b"\x02\x04HEAD\x86\x04\x02/x\x01\x03app"


def parsed(raw: bytes) -> list[tuple[bytes, bytes]]:
    """The fields llhttp reports for a response head, less the hop-by-hop ones (what
    H1Upstream forwards)."""

    class Sink:
        def __init__(self) -> None:
            self.fields: list[tuple[bytes, bytes]] = []

        def on_header(self, name: bytes, value: bytes) -> None:
            self.fields.append((name, value))

    sink = Sink()
    httptools.HttpResponseParser(sink).feed_data(raw)
    return [(n, v) for n, v in sink.fields if n.lower() not in HOP_BY_HOP]


def cut(raw: bytes) -> tuple[bytes, int]:
    """What H1Upstream hands ``on_whole_response``: the response less its Connection and
    Keep-Alive lines, and where its head ends (0: not a whole response)."""
    end, a, a_to, b, b_to = whole_response(raw)
    if not end:
        return raw, 0
    out = raw[:a] + raw[a_to:b] + raw[b_to:] if b else (raw[:a] + raw[a_to:] if a else raw)
    return out, end - (a_to - a) - (b_to - b)


def client_view(raw: bytes, whole: bool, block: bytes = b"") -> tuple[list, bytes, list]:
    """An HTTP/2 client's GET answered with ``raw`` by the origin: through the real
    H1Upstream (the parser's path) or ``on_whole_response``. The decoded head, the body, and
    the frames' types in order."""
    ls = Listener(ScriptedRng())
    conn = H2Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(H2_PREFACE + headers(1, block or GET_X))
    t.take()
    h1, _wire = ls.connects[-1].succeed_h1(ls.loop)
    if not whole:
        h1.fresh = False  # as if a byte of the response had come already: the parser reads it
    h1.data_received(raw)
    assert (h1.whole_fields is not None) == whole
    got = [f for f in frames(t.take()) if f[1] == 1]
    dec = hpack.Decoder()
    head = dec.decode(b"".join(p for kind, _, p in got if kind == 1), raw=True)
    body = b"".join(p for kind, _, p in got if kind == 0)
    return head, body, [kind for kind, _, _ in got]


def nginx(body: bytes = b"hello\n", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 11 May 2026 02:00:00 GMT\r\n"
            b"Content-Type: text/plain\r\nContent-Length: %d\r\nConnection: keep-alive\r\n%s"
            b"\r\n%s" % (len(body), extra, body))


def test_response_fields_as_llhttp_reports_them() -> None:
    raw = nginx(extra=b"X-A:\t v \t\r\nX-Empty:\r\nX-Sp:   \r\nx-lower: \x80\xff\r\n")
    out, end = cut(raw)
    assert end
    assert response_fields(out[:end]) == parsed(raw)
    assert response_fields(b"HTTP/1.1 200 OK") == []


def test_the_client_reads_what_the_parser_path_gives_it() -> None:
    for raw in (nginx(), nginx(b""), nginx(b"x" * 70000),
                nginx(extra=b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-T: v  \r\n"),
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nno\n",
                b"HTTP/1.1 503 \r\ncontent-length: 0\r\nkeep-alive: timeout=5\r\n\r\n"):
        slow = client_view(raw, whole=False)
        fast = client_view(raw, whole=True)
        assert fast[0] == slow[0] and fast[1] == slow[1]
        assert fast[2][-1] == 0  # the body's last DATA frame ends the stream
        assert slow[0][0][0] == b":status"


def _upstream(ls: Listener):  # type: ignore[no-untyped-def]
    """The playbook upstream the newest exchange was started on (pooled, or connected now)."""
    for c in ls.connects:
        if c.conn is not None and c.conn.sink is not None:
            return c.conn
    return next(c for c in ls.connects if c.conn is None).succeed()


def test_bodiless_responses_take_the_parser_path() -> None:
    """HEAD, 204 and 304: send_whole declines (the exchange then parses the response)."""
    for block, status in ((HEAD_X, 200), (GET_X, 204), (GET_X, 304)):
        ls = Listener(ScriptedRng())
        conn = H2Downstream(ls)
        accept(ls, conn)
        conn.data_received(H2_PREFACE + headers(1, block))
        up = _upstream(ls)
        raw = b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status
        end = raw.index(b"\r\n\r\n")  # (whole_response passes no 204 or 304 anyway)
        fields = response_fields(raw[:end])
        assert not conn.send_whole(up.sink, status, raw, end, fields)
        assert not up.sink.on_whole_response(status, raw, end, fields)
        assert not up.sink.resp_started


token = st.text("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                min_size=1, max_size=12).map(str.encode)
value = st.binary(max_size=20).map(
    lambda v: bytes(c for c in v if c == 9 or 32 <= c <= 126 or c >= 128))
field = st.tuples(token, value).filter(
    lambda f: f[0].lower() not in HOP_BY_HOP | {b"content-length"})


@settings(max_examples=80, deadline=None)
@given(st.lists(field, max_size=8), st.binary(max_size=40),
       st.sampled_from([200, 201, 301, 404, 500]), st.booleans())
def test_any_whole_response_reads_the_same(fields: list[tuple[bytes, bytes]], body: bytes,
                                           status: int, keep_alive: bool) -> None:
    raw = (b"HTTP/1.1 %d R\r\n" % status
           + b"".join(b"%s: %s\r\n" % f for f in fields)
           + (b"Connection: keep-alive\r\n" if keep_alive else b"")
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    out, end = cut(raw)
    if not end:
        return  # not plain enough for the fast path: the parser's path takes it anyway
    assert response_fields(out[:end]) == parsed(raw)
    assert client_view(raw, whole=True)[:2] == client_view(raw, whole=False)[:2]


def test_no_field_value_reaches_the_client_with_whitespace_around_it() -> None:
    """llhttp keeps a value's trailing OWS; an HTTP/2 field value has none (RFC 9113 §8.2.1:
    nghttp2 resets such a stream as malformed). Whichever path the response took."""
    raw = nginx(extra=b"X-T: v  \r\nX-Tab:\tw\t\r\nX-Mid: a  b \r\n")
    for whole in (True, False):
        head = dict(client_view(raw, whole)[0])
        assert (head[b"x-t"], head[b"x-tab"], head[b"x-mid"]) == (b"v", b"w", b"a  b")
