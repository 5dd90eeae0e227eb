"""The HTTP/1 wire helpers: which responses may be forwarded as they came."""

from __future__ import annotations

from typing import Any

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.drain.endpoint import EndpointDrain
from lameduck.http1.downstream import H1Downstream
from lameduck.http1.upstream import H1Upstream
from lameduck.http1.wire import (
    _scan_whole_response,
    _split_whole_response,
    absolute_form,
    simple_response,
    whole_response,
)
from lameduck.proxy.fields import HOP_BY_HOP, drop_nominated_fields
from lameduck.proxy.message import HTTP2, HTTP11, RequestHead
from lameduck.upstream.connector import ExchangeSink
from lameduck.upstream.pool import Endpoint
from tests import playbook

PLAIN = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 5\r\n\r\nhello"


def test_plain_response_is_whole() -> None:
    end, *spans = whole_response(PLAIN)
    assert PLAIN[end:end + 4] == b"\r\n\r\n"
    assert PLAIN[end + 4:] == b"hello"
    assert spans == [0, 0, 0, 0]  # nothing to leave out: forwarded as it came


@pytest.mark.parametrize("data", [
    PLAIN[:-1],  # body not all here
    PLAIN + b"x",  # more than the body: not ours to judge
    PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),  # the proxy answers with its own version
    PLAIN.replace(b"Content-Length: 5", b"Transfer-Encoding: chunked"),
    PLAIN.replace(b"Server: x", b"Connection: close"),
    # Connection naming anything but keep-alive alone: close, a field, a list, nothing
    PLAIN.replace(b"Server: x", b"Connection: keep-alive, close"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive, x-foo\r\nX-Foo: 1"),
    PLAIN.replace(b"Server: x", b"Connection: x-foo\r\nX-Foo: 1"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive,"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive x"),
    PLAIN.replace(b"Server: x", b"Connection: keepalive"),
    PLAIN.replace(b"Server: x", b"Connection:"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive\r\nConnection: close"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive\r\nConnection: keep-alive"),
    PLAIN.replace(b"Server: x", b"Keep-Alive: timeout=5\r\nKeep-Alive: max=100"),
    PLAIN.replace(b"Server: x", b"Connection-Foo: keep-alive"),  # merely starts with it
    PLAIN.replace(b"Server: x", b"Keep-Alive-Foo: 1"),
    PLAIN.replace(b"Server: x", b"Connection : keep-alive"),
    PLAIN.replace(b"Server: x", b"Connection: keep-alive\r\nUpgrade: h2c"),
    PLAIN.replace(b"Server: x", b"Proxy-Connection: keep-alive"),
    PLAIN.replace(b"Server: x", b"Upgrade: h2c"),
    PLAIN.replace(b"Server: x", b"Trailer: x"),
    PLAIN.replace(b"Server: x", b"Content-Length: 5"),  # two Content-Length fields
    PLAIN.replace(b"Server: x", b"Server: a\nb"),  # a bare LF
    PLAIN.replace(b"Server: x", b"Server: a\rb"),  # a bare CR
    PLAIN.replace(b"Content-Length: 5", b"Content-Length: +5"),
    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n",  # close-delimited
    PLAIN.replace(b"Server: x", b"CONNECTION: close"),  # names in any case
    PLAIN.replace(b"Server: x", b"TE: trailers"),
    PLAIN.replace(b"Server: x", b"content-LENGTH: 5"),
    PLAIN.replace(b"200 OK", b"2000 OK"),  # not a three-digit status
    PLAIN.replace(b"200 OK", b"600 OK"),
    PLAIN.replace(b"200 OK", b"2x0 OK"),
    PLAIN.replace(b"Server: x", b"Server: x\r"),  # a bare CR before the blank line
    b"garbage",
    # What the parser refuses is never forwarded as it came (it answers 502 for these):
    PLAIN.replace(b"Server: x", b"Server: a\x00b"),  # NUL
    PLAIN.replace(b"Server: x", b"Server: a\x01b"),  # another control byte
    PLAIN.replace(b"Server: x", b"Server: a\x7fb"),  # DEL
    PLAIN.replace(b"Server: x", b"Server: a\r\n folded"),  # obs-fold (RFC 9112 §5.2)
    PLAIN.replace(b"Server: x", b"Server: a\r\n\tfolded"),
    PLAIN.replace(b"Server: x", b"Server : x"),  # space before the colon (RFC 9112 §5.1)
    PLAIN.replace(b"Server: x", b"Ser ver: x"),
    PLAIN.replace(b"Server: x", b"Server"),  # no colon
    PLAIN.replace(b"Server: x", b": x"),  # no name
    PLAIN.replace(b"200 OK", b"200 O\x00K"),  # a NUL in the reason phrase
])
def test_anything_else_takes_the_parser(data: bytes) -> None:
    assert whole_response(data) == (0, 0, 0, 0, 0)


def test_error_statuses_can_be_whole() -> None:
    assert whole_response(b"HTTP/1.1 503 Unavailable\r\ncontent-length:2\r\n\r\nno")[0] > 0


def test_whole_response_spacing_and_case() -> None:
    assert whole_response(PLAIN.replace(b"Content-Length: 5", b"CONTENT-LENGTH:  5 "))[0] > 0
    assert whole_response(b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n")[0] > 0  # no reason


@pytest.mark.parametrize(("line", "also"), [
    (b"Connection: keep-alive", b""),
    (b"connection: Keep-Alive", b""),
    (b"CONNECTION:keep-alive", b""),
    (b"Connection: \t keep-alive \t", b""),
    (b"Connection: keep-alive", b"Keep-Alive: timeout=5"),
    (b"Keep-Alive: timeout=5, max=100", b"Connection: Keep-Alive"),  # Apache's order
    (b"Keep-Alive: timeout=5", b""),  # with no Connection field at all
    (b"keep-alive:", b""),
])
def test_keep_alive_lines_are_whole_and_left_out(line: bytes, also: bytes) -> None:
    """What keep-alive origins send takes the fast path; the lines are the spans to drop."""
    lines = line + b"\r\n" + (also + b"\r\n" if also else b"")
    data = PLAIN.replace(b"Server: x\r\n", b"Server: x\r\n" + lines)
    end, a, a_to, b, b_to = whole_response(data)
    assert end == len(data) - len(b"\r\n\r\nhello")
    assert data[a:a_to] == line + b"\r\n"
    assert data[b:b_to] == (also + b"\r\n" if also else b"")
    assert (b, b_to) == ((a_to, a_to + len(also) + 2) if also else (0, 0))


def test_the_parser_refuses_what_the_fast_path_refuses() -> None:
    """The NUL and obs-fold heads above are the parser's to refuse: one validation."""
    for bad in (b"Server: a\x00b", b"Server: a\r\n folded", b"Server : x"):
        with pytest.raises(httptools.HttpParserError):
            httptools.HttpResponseParser(object()).feed_data(PLAIN.replace(b"Server: x", bad))


@pytest.mark.parametrize(("target", "want"), [
    (b"http://other.example/x", (b"other.example", b"/x")),
    (b"http://other.example:8080/x?q=1", (b"other.example:8080", b"/x?q=1")),
    (b"http://other.example", (b"other.example", b"/")),  # RFC 9112 §3.2.1: empty path is /
    (b"http://other.example?q", (b"other.example", b"/?q")),
    (b"HTTPS://o.example/y", (b"o.example", b"/y")),  # the scheme in any case
    (b"http://[::1]:9/z", (b"[::1]:9", b"/z")),
    (b"http://user@o.example/z", None),  # userinfo: RFC 9110 §4.2.4
    (b"http:///x", None),  # no host
    (b"http://a b/x", None),
    (b"ftp://o.example/x", None),
    (b"o.example/x", None),
    (b"http://o.example:80:81/x", None),
])
def test_absolute_form(target: bytes, want: tuple[bytes, bytes] | None) -> None:
    assert absolute_form(target) == want


def test_simple_response_framing() -> None:
    r = simple_response(503, b"going away\n", close=True, extra=((b"retry-after", b"1"),))
    head, _, body = r.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"content-length: 11" in head and b"connection: close" in head
    assert b"retry-after: 1" in head and body == b"going away\n"
    assert simple_response(200, b"ok", close=False, head_only=True).endswith(b"\r\n\r\n")


class _Sink:
    def on_headers_complete(self) -> None:
        raise _HeadParsed


class _HeadParsed(Exception):
    pass


def _parser_takes_head(data: bytes) -> bool:
    """llhttp reads the head up to its blank line without an error."""
    try:
        httptools.HttpResponseParser(_Sink()).feed_data(data)
    except httptools.HttpParserCallbackError:
        return True  # _HeadParsed, raised from the callback
    except httptools.HttpParserError:
        return False
    return False


def _reference_whole_response(data: bytes) -> tuple[int, int, int, int, int]:
    """The first (split and lower) version of ``whole_response``, kept here as the oracle,
    with the parser's own word on the head: both implementations must give its answer for
    every input. Lines are found by offset here (the implementations find them otherwise)."""
    no = (0, 0, 0, 0, 0)
    if data[:9] != b"HTTP/1.1 ":
        return no
    end = data.find(b"\r\n\r\n")
    if end < 13 or data[12] != 32:
        return no
    if not data[9:12].isdigit():
        return no
    code = int(data[9:12])
    if code < 200 or code > 599 or code == 204 or code == 304:
        return no
    length = -1
    spans: list[tuple[int, int]] = []  # Connection: keep-alive and Keep-Alive lines
    connection = keep_alive = False
    at = 0
    for line in data[:end].split(b"\r\n"):
        start, at = at, at + len(line) + 2
        if 13 in line or 10 in line:
            return no
        name, _, value = line.partition(b":")
        c = line[0] | 32 if line else 0
        if c == 99:
            if line[:15].lower() == b"content-length:":
                value = line[15:].strip()
                if length >= 0 or not value.isdigit():
                    return no
                length = int(value)
            elif line[:10].lower() == b"connection":
                if (connection or name.lower() != b"connection"
                        or value.strip(b" \t").lower() != b"keep-alive"):
                    return no
                connection = True
                spans.append((start, at))
        elif c == 116:
            return no
        elif c == 107:
            if line[:10].lower() == b"keep-alive":
                if keep_alive or name.lower() != b"keep-alive":
                    return no
                keep_alive = True
                spans.append((start, at))
        elif c == 112:
            if line[:16].lower() == b"proxy-connection":
                return no
        elif c == 117 and line[:7].lower() == b"upgrade":
            return no
    if length != len(data) - end - 4:
        return no
    if not _parser_takes_head(data[:end + 4]):
        return no
    (a, a_to), (b, b_to) = [*spans, (0, 0), (0, 0)][:2]
    return end, a, a_to, b, b_to


class _Collect:
    """What the parser reads of a response: its fields as they came, its body."""

    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


Parsed = tuple[int, list[tuple[bytes, bytes]], bytes]


def _parsed(data: bytes) -> Parsed:
    """Status, fields and body of the response in ``data``, as the parser reads them."""
    got = _Collect()
    parser = httptools.HttpResponseParser(got)
    parser.feed_data(data)
    assert got.complete
    return parser.get_status_code(), got.fields, got.body


def _as_the_parser_forwards(data: bytes) -> Parsed:
    """The same, as the parser's path forwards them (http1.upstream: every hop-by-hop field
    left out, and the names Connection lists)."""
    status, fields, body = _parsed(data)
    nominated = b"".join(b"," + v.lower() for n, v in fields if n.lower() == b"connection")
    kept = [(n, v) for n, v in fields if n.lower() not in HOP_BY_HOP]
    return status, drop_nominated_fields(kept, nominated), body


def _forwarded(data: bytes, whole: tuple[int, int, int, int, int]) -> bytes:
    """``data`` less the spans ``whole_response`` named."""
    _, a, a_to, b, b_to = whole
    if not a:
        return data
    return data[:a] + data[a_to:b] + data[b_to:] if b else data[:a] + data[a_to:]


def _check(data: bytes) -> None:
    """Both implementations answer as the reference; what the fast path forwards is what the
    parser's path forwards, field for field, and nothing hop-by-hop."""
    want = _reference_whole_response(data)
    assert _scan_whole_response(data) == want
    assert _split_whole_response(data) == want
    assert whole_response(data) == want
    if want[0]:
        out = _forwarded(data, want)
        assert _parsed(out) == _as_the_parser_forwards(data)
        assert out.index(b"\r\n\r\n") == want[0] - (want[2] - want[1]) - (want[4] - want[3])


_PIECES = [
    b"HTTP/1.1 ", b"200", b" OK", b"\r\n", b"\r", b"\n", b" ", b"\t", b"\x0b", b"\x0c", b":",
    b"Content-Length:", b"content-length: ", b"CONTENT-LENGTH:", b"Content-Type: x",
    b"Connection", b"connection: close", b"Keep-Alive", b"keep-alive: 1", b"Proxy-Connection",
    b"Upgrade", b"upgrade: h2c", b"TE", b"Trailer", b"Transfer-Encoding", b"Server: y",
    b"5", b"0", b"12", b"+", b"x", b"hello", b"\r\n\r\n", b"204", b"304", b"199", b"600", b"2x0",
    b"C", b"K", b"P", b"U", b"T", b"ContentLength:", b"\x00", b"\x7f", b"\x80", b"\r\n ",
    b"Connection: keep-alive", b"connection:", b"Keep-Alive", b"keep-alive", b"KEEP-ALIVE ",
    b"Keep-Alive: timeout=5", b"close", b",", b", x-foo", b"X-Foo: 1", b"-Foo",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=24))
@settings(max_examples=3000, deadline=None)
def test_whole_response_matches_the_reference(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    _check(data)
    _check(b"HTTP/1.1 200 OK\r\n" + data)


# Whole lines as origins send them (and near misses): random pieces above seldom make a head
# whose Content-Length matches, so these do, with the lines in any order and number.
_LINES = [
    b"Server: nginx/1.22.1", b"Date: Mon, 01 Jan 2024 00:00:00 GMT", b"Content-Type: text/plain",
    b"Set-Cookie: a=1; Path=/; HttpOnly", b"Vary: Accept-Encoding", b"X-Foo: 1",
    b"Connection: keep-alive", b"connection: Keep-Alive", b"CONNECTION:\tkeep-alive ",
    b"Connection: close", b"Connection: keep-alive, x-foo", b"Connection: x-foo",
    b"Connection: Keep-Alive, Keep-Alive", b"Connection:", b"Connection : keep-alive",
    b"Connection-Foo: keep-alive", b"Keep-Alive: timeout=5", b"keep-alive: timeout=5, max=100",
    b"Keep-Alive:", b"Keep-AliveX: 1", b"Proxy-Connection: keep-alive", b"Upgrade: h2c",
    b"Transfer-Encoding: chunked", b"TE: trailers", b"X: a\x00b", b"Connection: keep-alive\x7f",
    b" folded", b"Keep-Alive: a\rb",
]


@given(st.lists(st.sampled_from(_LINES), max_size=12), st.integers(0, 12),
       st.sampled_from([b"", b"abc"]))
@settings(max_examples=3000, deadline=None)
def test_origin_heads_match_the_reference(lines: list[bytes], at: int, body: bytes) -> None:
    lines.insert(at, b"Content-Length: %d" % len(body))
    _check(b"HTTP/1.1 200 OK\r\n" + b"".join(line + b"\r\n" for line in lines) + b"\r\n"
           + body)


@pytest.mark.parametrize("body", [b"", b"hello", b"x" * 300])
@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nServer: lameduck-demo\r\nContent-Type: text/plain\r\nContent-Length: %d",
    b"HTTP/1.1 200 OK\r\ncontent-length:%d\r\nX: \x0b\x0c",
    b"HTTP/1.1 404 \r\nContent-Length: \t%d \x0b",
    b"HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: %d\r\nConnectionX: 1",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nupgradeable: no",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: %d\r\nKeep-Alive: a",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nconnection:\tKEEP-ALIVE ",
])
def test_whole_response_examples_match_the_reference(head: bytes, body: bytes) -> None:
    data = head % len(body) + b"\r\n\r\n" + body
    for cut in range(len(data) + 1):
        _check(data[:cut])


# -- the same bytes to the client, whichever path carries a real origin's response ------------
# The real HTTP/1.1 codecs on a socket with no socket (tests/playbook.py): a response that
# arrives in one read can take the fast path; the same response split over two reads always
# takes the parser's. The client must get the same bytes from both, and the upstream connection
# must go back to the pool exactly when the parser's path would put it back.

DATE = b"Date: Sat, 01 Jun 2024 12:00:00 GMT"
BODY = b"hello from the lameduck demo origin\n"
MANY = [b"X-Field-%d: value %d" % (i, i) for i in range(20)]


def _response(lines: list[bytes], body: bytes = BODY, status: bytes = b"200 OK") -> bytes:
    return (b"HTTP/1.1 %s\r\n" % status + b"".join(line + b"\r\n" for line in lines)
            + b"\r\n" + body)


# (response, whether it may take the fast path, whether the upstream connection is reused)
ORIGIN_RESPONSES = {
    "nginx": (_response([b"Server: nginx/1.22.1", DATE, b"Content-Type: text/plain",
                         b"Content-Length: 36", b"Connection: keep-alive"]), True, True),
    "nginx-keep-alive-timeout": (_response([
        b"Server: nginx/1.22.1", DATE, b"Content-Type: text/plain", b"Content-Length: 36",
        b"Connection: keep-alive", b"Keep-Alive: timeout=5"]), True, True),
    "mixed-case": (_response([b"Server: nginx/1.22.1", DATE, b"Content-Length: 36",
                              b"connection: Keep-Alive"]), True, True),
    "node": (_response([b"Content-Type: text/plain", DATE, b"Connection: keep-alive",
                        b"Keep-Alive: timeout=5", b"Content-Length: 36"]), True, True),
    "apache": (_response([DATE, b"Server: Apache/2.4.57 (Debian)", b"Vary: Accept-Encoding",
                          b"Content-Length: 36", b"Keep-Alive: timeout=5, max=100",
                          b"Connection: Keep-Alive", b"Content-Type: text/plain"]), True, True),
    "gunicorn-404": (_response([b"Server: gunicorn", DATE, b"Connection: keep-alive",
                                b"Content-Type: text/html", b"Content-Length: 9"],
                               b"not found", b"404 Not Found"), True, True),
    "redirect-empty-body": (_response([b"Server: nginx/1.22.1", DATE, b"Location: /y",
                                       b"Content-Length: 0", b"Connection: keep-alive"],
                                      b"", b"301 Moved Permanently"), True, True),
    "twenty-plus-fields": (_response([
        b"Server: nginx/1.22.1", DATE, b"Content-Type: text/plain", b"Content-Length: 36",
        b"Set-Cookie: session=abc; Path=/; HttpOnly", b"Set-Cookie: theme=dark; Path=/",
        b"Vary: Accept-Encoding", b"Vary: Origin", *MANY[:10], b"Connection: keep-alive",
        *MANY[10:], b"Keep-Alive: timeout=5"]), True, True),
    # the parser's path, as before
    "close": (_response([b"Server: nginx/1.22.1", DATE, b"Content-Length: 36",
                         b"Connection: close"]), False, False),
    "keep-alive-and-a-field": (_response([b"Server: x", b"Content-Length: 36",
                                          b"Connection: keep-alive, x-foo", b"X-Foo: 1"]),
                               False, True),
    "two-connection-fields": (_response([b"Server: x", b"Content-Length: 36",
                                         b"Connection: keep-alive", b"Connection: close"]),
                              False, False),
    "two-keep-alive-connection-fields": (_response([
        b"Server: x", b"Content-Length: 36", b"Connection: keep-alive",
        b"Connection: keep-alive"]), False, True),
    "connection-foo": (_response([b"Server: x", b"Content-Length: 36",
                                  b"Connection-Foo: keep-alive", b"Connection: keep-alive"]),
                       False, True),
}


def _through_the_codecs(reads: list[bytes], last_request: bool = False) -> tuple[bytes, Any]:
    """What a client that sent GET /x gets when the origin answers in ``reads``;
    ``last_request``: the connection's last (max_requests_per_connection), so lameduck adds
    its own ``connection: close``."""
    ls = playbook.Listener()
    if last_request:
        ls.max_requests_per_connection = 1
    conn = H1Downstream(ls)
    client = playbook.Transport(ls.loop)
    conn.connection_made(client)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    up, wire = ls.connects[0].succeed_h1(ls.loop)
    assert wire.take().startswith(b"GET /x HTTP/1.1\r\n")
    for data in reads:
        up.data_received(data)
    return client.take(), up


@pytest.mark.parametrize("last_request", [False, True], ids=["kept", "last-request"])
@pytest.mark.parametrize("name", ORIGIN_RESPONSES)
def test_real_origin_responses_reach_the_client_as_the_parser_path_sends_them(
        name: str, last_request: bool) -> None:
    data, fast, reused = ORIGIN_RESPONSES[name]
    assert bool(whole_response(data)[0]) == fast
    one, up1 = _through_the_codecs([data], last_request)  # the fast path when it may
    two, up2 = _through_the_codecs([data[:-1], data[-1:]], last_request)  # the parser's
    assert one == two
    assert (up1.whole_size == len(data)) == fast and up2.whole_size == -1
    head, _, body = one.partition(b"\r\n\r\n")
    assert body == data.partition(b"\r\n\r\n")[2]
    names = [line.partition(b":")[0].lower() for line in head.split(b"\r\n")[1:]]
    assert b"keep-alive" not in names
    # the origin's Connection is this hop's alone: the client's says only lameduck's close
    assert names.count(b"connection") == last_request
    if fast:  # the origin's head less its Connection and Keep-Alive lines, byte for byte
        kept = [line for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n")
                if line.partition(b":")[0].lower() not in (b"connection", b"keep-alive")]
        close = [b"connection: close"] if last_request else []
        assert head == b"\r\n".join(kept + close)
    for up in (up1, up2):  # back in its endpoint's pool for the next request, or closed
        assert (up.reusable, up in up.endpoint.idle) == (reused, reused)


class _WholeSink(ExchangeSink):
    """An exchange that takes every whole response (and lets go of the connection, as the
    real one does); anything else fails the test."""

    def __init__(self, up: H1Upstream) -> None:
        super().__init__()
        self.up = up
        self.got: list[tuple[int, bytes, int]] = []
        self.fields: list[list[tuple[bytes, bytes]] | None] = []

    def on_whole_response(self, status: int, data: bytes, end: int,
                          fields: list[tuple[bytes, bytes]] | None) -> bool:
        self.got.append((status, data, end))
        self.fields.append(fields)
        self.up.sink = None
        return True

    def cork(self) -> None:
        raise AssertionError("the parser's path")


def test_responses_in_a_row_on_one_connection_each_leave_their_keep_alive_lines_out() -> None:
    """The scan's verdict is kept for a head that repeats (the connection's cache): a repeated
    head, a new Date, and a plain head between them each forward exactly their own bytes;
    a plain one the very object that came (nothing copied)."""
    loop = playbook.Loop()
    up = H1Upstream(Endpoint("127.0.0.1", 9000, 4, 1, EndpointDrain()), loop)
    up.connection_made(playbook.Transport(loop))
    sink = _WholeSink(up)
    nginx = ORIGIN_RESPONSES["nginx-keep-alive-timeout"][0]
    plain = _response([b"Server: nginx/1.22.1", DATE, b"Content-Length: 36"])
    later = nginx.replace(b"12:00:00", b"12:00:01")
    apache = ORIGIN_RESPONSES["apache"][0]
    for data in (nginx, nginx, later, plain, nginx, apache, apache, plain):
        up.start(sink, RequestHead(b"GET", b"app", b"/", [], HTTP11))
        up.data_received(data)
        assert up.reusable
        status, out, end = sink.got.pop()
        want = b"\r\n".join(
            line for line in data.split(b"\r\n")
            if line.partition(b":")[0].lower() not in (b"connection", b"keep-alive"))
        assert (status, out, end) == (200, want, want.index(b"\r\n\r\n"))
        if data is plain:
            assert out is data


@pytest.mark.parametrize("wanted", [False, True])
def test_a_whole_responses_fields_are_read_once_per_head_and_only_when_wanted(
        wanted: bool) -> None:
    """An HTTP/2 client's HEADERS and the access log's %RESP()% need the fields of a response
    that goes through whole: the upstream reads them once for each new head (an origin sends
    the same one again and again), as llhttp reports them less the hop-by-hop lines; a plain
    HTTP/1.1 exchange without the log gets none (nothing read)."""
    loop = playbook.Loop()
    up = H1Upstream(Endpoint("127.0.0.1", 9000, 4, 1, EndpointDrain()), loop)
    up.connection_made(playbook.Transport(loop))
    sink = _WholeSink(up)
    sink.wants_fields = wanted
    nginx = ORIGIN_RESPONSES["nginx-keep-alive-timeout"][0]
    later = nginx.replace(b"12:00:00", b"12:00:01")
    for data in (nginx, nginx, later, later):
        up.start(sink, RequestHead(b"GET", b"app", b"/", [], HTTP11))
        up.data_received(data)
    if not wanted:
        assert sink.fields == [None] * 4
        return
    a, b, c, d = sink.fields
    assert a is b and c is d and a is not c  # read once per distinct head
    assert a == _parsed_fields(nginx) and c == _parsed_fields(later)
    up.start(sink, RequestHead(b"GET", b"app", b"/", [], HTTP2))  # an HTTP/2 client's
    sink.wants_fields = False
    up.data_received(nginx)
    assert sink.fields[-1] == a


def _parsed_fields(raw: bytes) -> list[tuple[bytes, bytes]]:
    """llhttp's fields of a response head, less the hop-by-hop ones."""
    got: list[tuple[bytes, bytes]] = []

    class Sink:
        def on_header(self, name: bytes, value: bytes) -> None:
            got.append((name, value))

    httptools.HttpResponseParser(Sink()).feed_data(raw)
    return [(n, v) for n, v in got if n.lower() not in HOP_BY_HOP]


def test_extension_method_stands_in_for_a_token_llhttp_does_not_know() -> None:
    from lameduck.http1.wire import STAND_IN, extension_method

    # any token is a method (RFC 9110 §9.1): parsed as POST, forwarded as it came
    assert extension_method(b"FROB /x HTTP/1.1\r\nHost: a\r\n\r\n") == (
        b"FROB", STAND_IN + b" /x HTTP/1.1\r\nHost: a\r\n\r\n")
    # after the empty lines a server may skip (RFC 9112 §2.2)
    assert extension_method(b"\r\n\r\nFROB / HTTP/1.1\r\n\r\n") == (
        b"FROB", STAND_IN + b" / HTTP/1.1\r\n\r\n")
    assert extension_method(b"GET / HTTP/1.1\r\n\r\n") is None  # llhttp knows it
    assert extension_method(b"FR(B / HTTP/1.1\r\n\r\n") is None  # not a token
    assert extension_method(b" / HTTP/1.1\r\n\r\n") is None  # no method at all
    assert extension_method(b"FROB") is None  # no request line yet
