"""The HTTP/1 wire helpers: which responses may be forwarded as they came."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lameduck.http1.wire import (
    _scan_whole_response,
    _split_whole_response,
    absolute_form,
    simple_response,
    whole_response,
)

PLAIN = b"HTTP/1.1 200 OK\r\nServer: x\r\nContent-Length: 5\r\n\r\nhello"


def test_plain_response_is_whole() -> None:
    end = whole_response(PLAIN)
    assert PLAIN[end:end + 4] == b"\r\n\r\n"
    assert PLAIN[end + 4:] == b"hello"


@pytest.mark.parametrize("data", [
    PLAIN[:-1],  # body not all here
    PLAIN + b"x",  # more than the body: not ours to judge
    PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),  # the proxy answers with its own version
    PLAIN.replace(b"Content-Length: 5", b"Transfer-Encoding: chunked"),
    PLAIN.replace(b"Server: x", b"Connection: close"),
    PLAIN.replace(b"Server: x", b"Keep-Alive: timeout=5"),
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
    assert whole_response(data) == 0


def test_error_statuses_can_be_whole() -> None:
    assert whole_response(b"HTTP/1.1 503 Unavailable\r\ncontent-length:2\r\n\r\nno") > 0


def test_whole_response_spacing_and_case() -> None:
    assert whole_response(PLAIN.replace(b"Content-Length: 5", b"CONTENT-LENGTH:  5 ")) > 0
    assert whole_response(b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n") > 0  # no reason


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


def _reference_whole_response(data: bytes) -> int:
    """The first (split and lower) version of ``whole_response``, kept here as the oracle,
    with the parser's own word on the head: both implementations must give its answer for
    every input."""
    if data[:9] != b"HTTP/1.1 ":
        return 0
    end = data.find(b"\r\n\r\n")
    if end < 13 or data[12] != 32:
        return 0
    if not data[9:12].isdigit():
        return 0
    code = int(data[9:12])
    if code < 200 or code > 599 or code == 204 or code == 304:
        return 0
    length = -1
    for line in data[:end].split(b"\r\n"):
        if 13 in line or 10 in line:
            return 0
        c = line[0] | 32 if line else 0
        if c == 99:
            if line[:15].lower() == b"content-length:":
                value = line[15:].strip()
                if length >= 0 or not value.isdigit():
                    return 0
                length = int(value)
            elif line[:10].lower() == b"connection":
                return 0
        elif c == 116:
            return 0
        elif c == 107:
            if line[:10].lower() == b"keep-alive":
                return 0
        elif c == 112:
            if line[:16].lower() == b"proxy-connection":
                return 0
        elif c == 117 and line[:7].lower() == b"upgrade":
            return 0
    if length != len(data) - end - 4:
        return 0
    return end if _parser_takes_head(data[:end + 4]) else 0


_PIECES = [
    b"HTTP/1.1 ", b"200", b" OK", b"\r\n", b"\r", b"\n", b" ", b"\t", b"\x0b", b"\x0c", b":",
    b"Content-Length:", b"content-length: ", b"CONTENT-LENGTH:", b"Content-Type: x",
    b"Connection", b"connection: close", b"Keep-Alive", b"keep-alive: 1", b"Proxy-Connection",
    b"Upgrade", b"upgrade: h2c", b"TE", b"Trailer", b"Transfer-Encoding", b"Server: y",
    b"5", b"0", b"12", b"+", b"x", b"hello", b"\r\n\r\n", b"204", b"304", b"199", b"600", b"2x0",
    b"C", b"K", b"P", b"U", b"T", b"ContentLength:", b"\x00", b"\x7f", b"\x80", b"\r\n ",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=24))
@settings(max_examples=3000, deadline=None)
def test_whole_response_matches_the_reference(pieces: list[bytes]) -> None:
    data = b"".join(pieces)
    framed = b"HTTP/1.1 200 OK\r\n" + data
    for d in (data, framed):
        want = _reference_whole_response(d)
        assert _scan_whole_response(d) == want
        assert _split_whole_response(d) == want
        assert whole_response(d) == want


@pytest.mark.parametrize("body", [b"", b"hello", b"x" * 300])
@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nServer: lameduck-demo\r\nContent-Type: text/plain\r\nContent-Length: %d",
    b"HTTP/1.1 200 OK\r\ncontent-length:%d\r\nX: \x0b\x0c",
    b"HTTP/1.1 404 \r\nContent-Length: \t%d \x0b",
    b"HTTP/1.1 301 Moved\r\nLocation: /x\r\nContent-Length: %d\r\nConnectionX: 1",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nupgradeable: no",
])
def test_whole_response_examples_match_the_reference(head: bytes, body: bytes) -> None:
    data = head % len(body) + b"\r\n\r\n" + body
    for cut in range(len(data) + 1):
        want = _reference_whole_response(data[:cut])
        assert _scan_whole_response(data[:cut]) == want
        assert _split_whole_response(data[:cut]) == want
