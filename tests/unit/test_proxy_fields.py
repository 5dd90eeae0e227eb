"""The header-field rules every codec shares: what a Connection header may remove, and which
authorities lameduck routes by."""

from __future__ import annotations

import pytest

from lameduck.proxy.fields import (
    accepts_trailers,
    drop_nominated,
    nominated,
    trailer_block,
    trailer_fields,
    valid_authority,
)


def test_connection_nominated_fields_are_dropped() -> None:
    lines = [b"Foo: 1\r\n", b"Bar: 2\r\n", b"X-Keep: 3\r\n"]
    assert drop_nominated(lines, b",foo, close") == [b"Bar: 2\r\n", b"X-Keep: 3\r\n"]
    assert drop_nominated(lines, b",close") == lines


@pytest.mark.parametrize("name", [
    b"content-length", b"Content-Length", b"transfer-encoding", b"host", b"HOST",
    b"idempotency-key", b"resume-seq", b"cookie", b"x-forwarded-for",
])
def test_framing_routing_and_retry_fields_are_never_nominated(name: bytes) -> None:
    """A Connection header cannot take away what lameduck framed, routed or retried by."""
    lines = [b"Host: a\r\n", b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n",
             b"Idempotency-Key: k\r\n", b"Resume-Seq: 2\r\n", b"Cookie: a=1\r\n",
             b"X-Forwarded-For: 1.2.3.4\r\n"]
    assert drop_nominated(lines, b"close, " + name) == lines
    assert nominated(b"keep-alive, " + name + b" , foo") == frozenset({b"foo"})


@pytest.mark.parametrize(("value", "ok"), [
    (b"example.com", True), (b"example.com:8080", True), (b"127.0.0.1:1", True),
    (b"[::1]:80", True), (b"[::1]", True), (b"", True), (b"xn--bcher-kva.example", True),
    (b"a%2Eb", True),
    (b"user@example.com", False), (b"a b", False), (b"a/b", False), (b"a:1:2", False),
    (b"[::1", False), (b"a\x00b", False), (b"example.com:x", False), (b"a?b", False),
    (b":80", False), (b":", False),  # a port without a host (RFC 9110 §4.2.1)
])
def test_valid_authority(value: bytes, ok: bool) -> None:
    assert valid_authority(value) is ok


def test_trailer_fields_drop_what_a_trailer_may_not_carry() -> None:
    """RFC 9110 §6.5.1: framing, routing and connection fields are never merged from trailers;
    names go out lower-cased (HTTP/2 requires it)."""
    got = trailer_fields([(b"X-Checksum", b"abc"), (b"Content-Length", b"9"), (b"host", b"h"),
                          (b"grpc-status", b"0"), (b"transfer-encoding", b"chunked"),
                          (b":status", b"200"), (b"Trailer", b"x")])
    assert got == [(b"x-checksum", b"abc"), (b"grpc-status", b"0")]


@pytest.mark.parametrize(("te", "ok"), [
    (b"trailers", True), (b"gzip, trailers", True), (b"Trailers;q=1", True),
    (b"gzip", False), (b"", False), (b"trailersx", False),
])
def test_accepts_trailers(te: bytes, ok: bool) -> None:
    assert accepts_trailers(te) is ok


def test_trailer_block() -> None:
    assert trailer_block([(b"x-a", b"1")]) == b"0\r\nx-a: 1\r\n\r\n"
