"""The header-field rules every codec shares: what a Connection header may remove, and which
authorities lameduck routes by."""

from __future__ import annotations

import random

import pytest

from lameduck.proxy.fields import (
    _AUTHORITY,
    _scan_authority,
    accepts_trailers,
    drop_nominated_fields,
    nominated,
    trailer_block,
    trailer_fields,
    valid_authority,
)


def test_connection_nominated_fields_are_dropped() -> None:
    fields = [(b"Foo", b"1"), (b"Bar", b"2"), (b"X-Keep", b"3")]
    assert drop_nominated_fields(fields, b",foo, close") == [(b"Bar", b"2"), (b"X-Keep", b"3")]
    assert drop_nominated_fields(fields, b",close") == fields


def test_nominated_answers_are_kept_per_value_and_bounded() -> None:
    """The same Connection value again gets the very set it got (not split again); a
    different one its own; endless distinct values do not grow the cache past its bound."""
    from lameduck.proxy import fields
    first = nominated(b",keep-alive, x-a")
    assert first == frozenset({b"x-a"}) and nominated(b",keep-alive, x-a") is first
    assert nominated(b",keep-alive, x-b") == frozenset({b"x-b"})
    for i in range(3 * fields._NOMINATED_MAX):
        assert nominated(b"x-%d" % i) == frozenset({b"x-%d" % i})
    assert len(fields._NOMINATED) <= fields._NOMINATED_MAX


@pytest.mark.parametrize("name", [
    b"content-length", b"Content-Length", b"transfer-encoding", b"host", b"HOST",
    b"idempotency-key", b"resume-seq", b"cookie", b"x-forwarded-for",
])
def test_framing_routing_and_retry_fields_are_never_nominated(name: bytes) -> None:
    """A Connection header cannot take away what lameduck framed, routed or retried by."""
    fields = [(b"Host", b"a"), (b"Content-Length", b"3"), (b"Transfer-Encoding", b"chunked"),
              (b"Idempotency-Key", b"k"), (b"Resume-Seq", b"2"), (b"Cookie", b"a=1"),
              (b"X-Forwarded-For", b"1.2.3.4")]
    assert drop_nominated_fields(fields, b"close, " + name) == fields
    assert nominated(b"keep-alive, " + name + b" , foo") == frozenset({b"foo"})


@pytest.mark.parametrize(("value", "ok"), [
    (b"example.com", True), (b"example.com:8080", True), (b"127.0.0.1:1", True),
    (b"[::1]:80", True), (b"[::1]", True), (b"", True), (b"xn--bcher-kva.example", True),
    (b"a%2Eb", True),
    (b"user@example.com", False), (b"a b", False), (b"a/b", False), (b"a:1:2", False),
    (b"[::1", False), (b"a\x00b", False), (b"example.com:x", False), (b"a?b", False),
    (b":80", False), (b":", False),  # a port without a host (RFC 9110 §4.2.1)
    # a list of host[:port] (a gRPC client's static address list), each element whole
    (b"127.0.0.1:50051,127.0.0.1:50052", True), (b"a,b", True), (b"[::1]:1,[::2]", True),
    (b"a:,b", True),
    (b"a,", False), (b",a", False), (b"a,,b", False), (b"a:1,", False), (b"a:1, b:2", False),
    (b"a:1,:2", False), (b"a:1,u@b:2", False), (b"a:1,b:2:3", False), (b"a:1,b/c", False),
])
def test_valid_authority(value: bytes, ok: bool) -> None:
    assert valid_authority(value) is ok


def test_the_authority_scan_and_the_regex_agree() -> None:
    """The compiled scan and the interpreted regex are one grammar: every short string over
    the bytes that matter (and random longer ones) gets the same answer from both."""
    alphabet = b"a0.:[]%F@ -_~!,"
    cases = [b""] + [bytes([c]) for c in range(256)]
    for a in alphabet:
        for b in alphabet:
            cases.append(bytes([a, b]))
            for c in alphabet:
                cases.append(bytes([a, b, c]))
    rng = random.Random(7)
    cases += [bytes(rng.choice(alphabet) for _ in range(rng.randint(4, 12)))
              for _ in range(20000)]
    cases += [b"[::1]:80", b"[::1]x", b"a%2", b"a%2g", b"%41%42:9", b"[]", b"[:]:", b"a:",
              b"[::1],[::2]:3", b"a:1,[::1]", b"a%41,b%4"]
    for v in cases:
        assert _scan_authority(v) is (_AUTHORITY.fullmatch(v) is not None), v


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
