"""The HTTP/1.1 request head lameduck builds, as the HTTP/2 fields an h2 upstream gets."""

from __future__ import annotations

import pytest

from lameduck.http2.upstream import request_fields


def test_pseudo_fields_first_and_host_becomes_authority() -> None:
    head = (b"GET /a?b=1 HTTP/1.1\r\nhost: example.com:8080\r\nAccept: */*\r\n"
            b"x-forwarded-for: 127.0.0.1\r\n\r\n")
    fields, body = request_fields(head)
    assert fields == [
        (b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"example.com:8080"),
        (b":path", b"/a?b=1"), (b"accept", b"*/*"), (b"x-forwarded-for", b"127.0.0.1"),
    ]
    assert body is False


@pytest.mark.parametrize("line", [
    b"connection: keep-alive", b"keep-alive: timeout=5", b"proxy-connection: close",
    b"upgrade: websocket", b"te: gzip",
])
def test_connection_specific_fields_are_dropped(line: bytes) -> None:
    fields, _ = request_fields(b"GET / HTTP/1.1\r\nhost: h\r\n" + line + b"\r\n\r\n")
    assert [n for n, _ in fields] == [b":method", b":scheme", b":authority", b":path"]


def test_te_is_kept_only_as_trailers() -> None:
    """RFC 9113 §8.2.2: "trailers" is the one TE value HTTP/2 allows, and gRPC servers
    require it; trailers are carried back to the client."""
    fields, _ = request_fields(b"POST / HTTP/1.1\r\nhost: h\r\nTE: trailers\r\n"
                               b"connection: te\r\n\r\n")
    assert (b"te", b"trailers") in fields and all(n != b"connection" for n, _ in fields)
    fields, _ = request_fields(b"POST / HTTP/1.1\r\nhost: h\r\nTE: gzip\r\n\r\n")
    assert all(n != b"te" for n, _ in fields)


@pytest.mark.parametrize(("extra", "body"), [
    (b"content-length: 10\r\n", True),
    (b"content-length: 0\r\n", False),
    (b"transfer-encoding: chunked\r\n", True),
    (b"", False),
])
def test_body_follows(extra: bytes, body: bool) -> None:
    fields, has_body = request_fields(b"POST /x HTTP/1.1\r\nhost: h\r\n" + extra + b"\r\n")
    assert has_body is body
    assert all(n != b"transfer-encoding" for n, _ in fields)


def test_asterisk_target_and_values_with_colons() -> None:
    fields, _ = request_fields(
        b"OPTIONS * HTTP/1.1\r\nhost: [::1]:80\r\nx-time: 12:30:00\r\n\r\n")
    assert (b":path", b"*") in fields
    assert (b":authority", b"[::1]:80") in fields
    assert (b"x-time", b"12:30:00") in fields
