"""The HTTP/1 wire helpers: which responses may be forwarded as they came."""

from __future__ import annotations

import pytest

from lameduck.http1.wire import drop_nominated, simple_response, whole_response

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
])
def test_anything_else_takes_the_parser(data: bytes) -> None:
    assert whole_response(data) == 0


def test_error_statuses_can_be_whole() -> None:
    assert whole_response(b"HTTP/1.1 503 Unavailable\r\ncontent-length:2\r\n\r\nno") > 0


def test_whole_response_spacing_and_case() -> None:
    assert whole_response(PLAIN.replace(b"Content-Length: 5", b"CONTENT-LENGTH:  5 ")) > 0
    assert whole_response(b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n") > 0  # no reason


def test_connection_nominated_fields_are_dropped() -> None:
    lines = [b"Foo: 1\r\n", b"Bar: 2\r\n", b"X-Keep: 3\r\n"]
    assert drop_nominated(lines, b",foo, close") == [b"Bar: 2\r\n", b"X-Keep: 3\r\n"]
    assert drop_nominated(lines, b",close") == lines


def test_simple_response_framing() -> None:
    r = simple_response(503, b"going away\n", close=True, extra=((b"retry-after", b"1"),))
    head, _, body = r.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"content-length: 11" in head and b"connection: close" in head
    assert b"retry-after: 1" in head and body == b"going away\n"
    assert simple_response(200, b"ok", close=False, head_only=True).endswith(b"\r\n\r\n")
