"""HTTP/1.1 request smuggling corpus: each row is raw client bytes, followed on the same
connection by a clean pipelined ``GET /after``, checked on both sides of the proxy.

A refused row must get exactly one error answer with ``Connection: close`` and the connection
closed (RFC 9112 §6.3 and §11.2: a message whose length cannot be determined reliably is
answered 400 and the connection closed), the pipelined request unanswered, and the capture
origin must have parsed no request from it. An accepted row must reach the origin as exactly
the expected bytes, and the pipelined request after it as a request of its own: a body read as
a request, or a request read as a body, shows up as a wrong answer or wrong upstream bytes.

The first rows are the framing fields nominated by ``Connection`` and the absolute-form target,
which once made lameduck forward a body as a request. HAProxy's HTX parser is the guide where
the RFC leaves a choice (it rejects what it cannot frame; see its "option accept-invalid-http-
request" documentation for the list of what it refuses by default).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import pytest

from tests.capture import CaptureOrigin
from tests.procs import Lameduck, WireResponse, raw_connect, read_wire_response, wait_until

FWD = b"x-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\n\r\n"
AFTER = b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n"
AFTER_UP = b"GET /after HTTP/1.1\r\nhost: h\r\n" + FWD
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: h\r\n\r\n"
TE = b"Transfer-Encoding: chunked\r\n"


@dataclass(frozen=True)
class Refused:
    """Answered ``status`` and closed; no request reaches the origin. ``mid_body``: the error
    is in the body, so the head may already have gone upstream (lameduck streams bodies);
    then that upstream connection must be dropped, never reused."""

    status: int = 400
    mid_body: bool = False


@dataclass(frozen=True)
class Accepted:
    """Forwarded as exactly ``upstream`` (the origin answers with its request line,
    ``answer``); ``closes``: the connection ends after it (an HTTP/1.0 request)."""

    upstream: bytes
    answer: bytes
    closes: bool = False


def post(fields: bytes, body: bytes, target: bytes = b"/a") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: h\r\n%s\r\n%s" % (target, fields, body)


def chunked(body: bytes) -> bytes:
    """A body as lameduck re-chunks it towards the origin: one chunk, no extensions."""
    return (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"


def up(head: bytes, body: bytes = b"") -> bytes:
    """What the origin should get: ``head`` (request line and fields, host first) + FWD."""
    return head + FWD + body


BAD_CHUNKS = [
    (b"ffffffffffffffff1\r\n", "chunk-size-overflow"),
    (b"10000000000000000\r\n", "chunk-size-2^64"),
    (b"-1\r\n", "chunk-size-negative"),
    (b"0x3\r\nabc\r\n", "chunk-size-0x"),
    (b" 3\r\nabc\r\n", "chunk-size-leading-space"),
    (b"3\r\nabcd\r\n", "chunk-data-overrun"),
    (b"3\nabc\r\n", "chunk-size-bare-lf"),
    (b"3\r\nabc\n", "chunk-data-bare-lf"),
    (b"3\rabc\r\n", "chunk-size-bare-cr"),
    (b"3;e\x00x\r\nabc\r\n", "chunk-ext-nul"),
    (b"3;e\x01\r\nabc\r\n", "chunk-ext-ctl"),
    (b"3;a=\"b\r\nabc\r\n", "chunk-ext-open-quote"),
    (b"3;\x7f\r\nabc\r\n", "chunk-ext-del"),
]

CASES = [
    # -- framing nominated by Connection and absolute-form targets: once critical defects --
    pytest.param(post(b"Connection: content-length\r\nContent-Length: %d\r\n" % len(SMUGGLED),
                      SMUGGLED),
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\nContent-Length: %d\r\n"
                             % len(SMUGGLED), SMUGGLED), b"POST /a HTTP/1.1\n"),
                 id="connection-nominates-content-length"),
    pytest.param(post(b"Connection: transfer-encoding\r\n" + TE, chunked(SMUGGLED)),
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n",
                             chunked(SMUGGLED)), b"POST /a HTTP/1.1\n"),
                 id="connection-nominates-transfer-encoding"),
    pytest.param(b"GET http://other/x HTTP/1.1\r\nHost: client\r\n\r\n",
                 Accepted(up(b"GET /x HTTP/1.1\r\nhost: other\r\n"), b"GET /x HTTP/1.1\n"),
                 id="absolute-form-other-host"),
    # -- CL.TE and TE.CL (RFC 9112 §6.3 item 3, §11.2) --
    pytest.param(post(b"Content-Length: 6\r\n" + TE, b"0\r\n\r\nX"), Refused(), id="CL.TE"),
    pytest.param(post(TE + b"Content-Length: 3\r\n", b"1\r\nZ\r\n0\r\n\r\n"), Refused(),
                 id="TE.CL"),
    pytest.param(post(b"Content-Length: 0\r\n" + TE, b"0\r\n\r\n"), Refused(), id="CL0.TE"),
    pytest.param(post(b"Content-Length: %d\r\nTransfer-Encoding: xchunked\r\n" % len(SMUGGLED),
                      SMUGGLED), Refused(), id="CL.TE-xchunked"),
    # -- TE.TE obfuscations --
    pytest.param(post(b"Transfer-Encoding: xchunked\r\n", b"0\r\n\r\n"), Refused(501),
                 id="TE-xchunked"),
    pytest.param(post(b"Transfer-Encoding : chunked\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-space-before-colon"),
    pytest.param(b"POST /a HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: h\r\n\r\n0\r\n\r\n",
                 Refused(), id="TE-leading-space-first-line"),
    pytest.param(post(b"Transfer-Encoding: chunked, identity\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-chunked-identity"),
    pytest.param(post(b"Transfer-Encoding: chunked, chunked\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-chunked-twice"),
    pytest.param(post(TE + TE, b"0\r\n\r\n"), Refused(), id="TE-duplicate-headers"),
    pytest.param(post(TE + b"Transfer-Encoding: identity\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-chunked-then-identity-header"),
    pytest.param(post(b"Transfer-Encoding:\x0bchunked\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-vtab"),
    pytest.param(post(b"Transfer-Encoding:\x0cchunked\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-formfeed"),
    pytest.param(post(b"Transfer-Encoding: chunked\x00\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-nul"),
    pytest.param(post(b"Transfer-Encoding: \r\n chunked\r\n", b"0\r\n\r\n"), Refused(),
                 id="TE-obs-fold"),
    pytest.param(post(b"Transfer-Encoding:\tchunked\r\n", b"3\r\nabc\r\n0\r\n\r\n"),
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n",
                             chunked(b"abc")), b"POST /a HTTP/1.1\n"),
                 id="TE-tab-is-ows"),
    # -- Content-Length (RFC 9110 §8.6: 1*DIGIT) --
    pytest.param(post(b"Content-Length: +5\r\n", b"abcde"), Refused(), id="CL-plus"),
    pytest.param(post(b"Content-Length: -1\r\n", b"abcde"), Refused(), id="CL-negative"),
    pytest.param(post(b"Content-Length: 5, 6\r\n", b"abcdef"), Refused(), id="CL-list-differs"),
    pytest.param(post(b"Content-Length: 5\r\nContent-Length: 6\r\n", b"abcdef"), Refused(),
                 id="CL-duplicate-differs"),
    pytest.param(post(b"Content-Length: 0x5\r\n", b"abcde"), Refused(), id="CL-hex"),
    pytest.param(post(b"Content-Length: 5a\r\n", b"abcde"), Refused(), id="CL-trailing-alpha"),
    pytest.param(post(b"Content-Length: 5 5\r\n", b"abcde"), Refused(), id="CL-inner-space"),
    pytest.param(post(b"Content-Length: 99999999999999999999999\r\n", b"abcde"), Refused(),
                 id="CL-huge"),
    pytest.param(post(b"Content-Length:\x0b5\r\n", b"abcde"), Refused(), id="CL-vtab"),
    pytest.param(post(b"Content-Length: 05\r\n", b"abcde"),
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\nContent-Length: 05\r\n", b"abcde"),
                          b"POST /a HTTP/1.1\n"), id="CL-leading-zero-is-digits"),
    # -- chunked bodies (RFC 9112 §7.1) --
    *[pytest.param(post(TE, bad + b"0\r\n\r\n"), Refused(mid_body=True), id=name)
      for bad, name in BAD_CHUNKS],
    pytest.param(post(TE, b"3;a=b;c=\"d e\"\r\nabc\r\n0\r\n\r\n"),
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n",
                             chunked(b"abc")), b"POST /a HTTP/1.1\n"),
                 id="chunk-ext-valid"),
    pytest.param(post(TE, b"0\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"),
                 Refused(mid_body=True), id="framing-fields-in-trailer"),
    # -- an h2c upgrade is not passed on (RFC 9113 §3.1 retired it; an origin that took it
    # would speak HTTP/2 on a pooled HTTP/1.1 connection) --
    pytest.param(b"GET /u HTTP/1.1\r\nHost: h\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__"
                 b"\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n",
                 Accepted(up(b"GET /u HTTP/1.1\r\nhost: h\r\n"), b"GET /u HTTP/1.1\n"),
                 id="h2c-upgrade-not-forwarded"),
    # -- line endings, obs-fold, controls (RFC 9112 §2.2, §5.2; RFC 9110 §5.5) --
    pytest.param(b"\r\nGET /l HTTP/1.1\r\nHost: h\r\n\r\n",
                 Accepted(up(b"GET /l HTTP/1.1\r\nhost: h\r\n"), b"GET /l HTTP/1.1\n"),
                 id="leading-empty-line-ignored"),
    pytest.param(b"GET / HTTP/1.1\nHost: h\r\n\r\n", Refused(), id="bare-lf-request-line"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\nX: y\r\n\r\n", Refused(), id="bare-lf-field"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n", Refused(), id="bare-cr-field"),
    pytest.param(b"GET / HTTP/1.1\rHost: h\r\n\r\n", Refused(), id="bare-cr-request-line"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", Refused(), id="obs-fold"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n", Refused(),
                 id="obs-fold-tab"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX\x00Y: a\r\n\r\n", Refused(), id="nul-name"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x00b\r\n\r\n", Refused(), id="nul-value"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n", Refused(), id="ctl-value"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fb\r\n\r\n", Refused(), id="del-value"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX\x01: a\r\n\r\n", Refused(), id="ctl-name"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\nX Y: a\r\n\r\n", Refused(), id="space-in-name"),
    pytest.param(b"GET / HTTP/1.1\r\nHost: h\r\n: a\r\n\r\n", Refused(), id="empty-name"),
    # -- methods, targets and versions (RFC 9112 §3, §2.3) --
    pytest.param(b"G(T / HTTP/1.1\r\nHost: h\r\n\r\n", Refused(), id="method-bad-char"),
    pytest.param(b"GET\x00 / HTTP/1.1\r\nHost: h\r\n\r\n", Refused(), id="method-nul"),
    pytest.param(b" / HTTP/1.1\r\nHost: h\r\n\r\n", Refused(), id="method-empty"),
    # an extension method is any token (RFC 9110 §9.1): forwarded as it came, as by HAProxy
    pytest.param(b"FOO /e HTTP/1.1\r\nHost: h\r\n\r\n",
                 Accepted(up(b"FOO /e HTTP/1.1\r\nhost: h\r\n"), b"FOO /e HTTP/1.1\n"),
                 id="method-extension"),
    pytest.param(b"\r\nBREW-2 /e HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
                 Accepted(up(b"BREW-2 /e HTTP/1.1\r\nhost: h\r\nContent-Length: 3\r\n", b"abc"),
                          b"BREW-2 /e HTTP/1.1\n"),
                 id="method-extension-with-body"),
    pytest.param(b"get /e HTTP/1.1\r\nHost: h\r\n\r\n",  # methods are case-sensitive
                 Accepted(up(b"get /e HTTP/1.1\r\nhost: h\r\n"), b"get /e HTTP/1.1\n"),
                 id="method-lower-case-is-an-extension"),
    pytest.param(b"FOO / HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nTransfer-Encoding: "
                 b"chunked\r\n\r\n0\r\n\r\n", Refused(), id="method-extension-cl-te"),
    # RFC 9112 §3 lets a recipient split the request-line on whitespace runs: normalised
    pytest.param(b"GET  /w HTTP/1.1\r\nHost: h\r\n\r\n",
                 Accepted(up(b"GET /w HTTP/1.1\r\nhost: h\r\n"), b"GET /w HTTP/1.1\n"),
                 id="request-line-two-spaces"),
    pytest.param(b"GET /\x00 HTTP/1.1\r\nHost: h\r\n\r\n", Refused(), id="target-nul"),
    pytest.param(b"GET / HTTP/01.1\r\nHost: h\r\n\r\n", Refused(), id="version-leading-zero"),
    pytest.param(b"GET / HTTP/1.10\r\nHost: h\r\n\r\n", Refused(), id="version-two-digits"),
    pytest.param(b"GET / http/1.1\r\nHost: h\r\n\r\n", Refused(), id="version-lowercase"),
    pytest.param(b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", Refused(505), id="version-2.0-on-h1"),
    pytest.param(b"GET / HTTP/1.1 \r\nHost: h\r\n\r\n", Refused(), id="version-trailing-space"),
    # -- HTTP/1.0 with Transfer-Encoding: faulty framing, closed after (RFC 9112 §6.1) --
    pytest.param(b"POST /a HTTP/1.0\r\nHost: h\r\n" + TE + b"\r\n0\r\n\r\n",
                 Accepted(up(b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n",
                             chunked(b"")), b"POST /a HTTP/1.1\n", closes=True),
                 id="http10-transfer-encoding-closes"),
]


def read_all(sock: socket.socket, most: int = 3) -> tuple[list[WireResponse], bool]:
    """Responses until the server closes or ``most`` came; ``closed`` False if it kept the
    connection open past the socket timeout or ``most`` came first."""
    out: list[WireResponse] = []
    with sock.makefile("rb") as f:
        while len(out) < most:
            try:
                out.append(read_wire_response(f))
            except (EOFError, ConnectionResetError):
                return out, True
            except TimeoutError:
                return out, False
    return out, False


def clean_request(proxy: Lameduck, capture: CaptureOrigin, path: bytes) -> None:
    """A fresh connection still gets a clean answer, and the origin saw exactly that request:
    an upstream connection left mid-request and reused would turn it into body bytes."""
    n0 = len(capture.requests)
    with raw_connect(proxy.port, timeout=5) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % path)
        r = read_wire_response(f)
    assert r.status == 200 and r.body == b"GET %s HTTP/1.1\n" % path
    assert wait_until(lambda: len(capture.requests) > n0, 5)
    assert capture.requests[n0:] == [b"GET %s HTTP/1.1\r\nhost: h\r\n%s" % (path, FWD)]


@pytest.mark.parametrize(("data", "expect"), CASES)
def test_request_framing(proxy: Lameduck, capture: CaptureOrigin, data: bytes,
                         expect: Refused | Accepted) -> None:
    capture.quiet()  # the previous case's upstream bytes have all arrived
    n_req, mark = len(capture.requests), capture.mark()
    keeps = isinstance(expect, Accepted) and not expect.closes
    with raw_connect(proxy.port, timeout=3) as sock:
        sock.sendall(data + AFTER)
        responses, closed = read_all(sock, 2 if keeps else 3)
    statuses = [r.status for r in responses]
    if isinstance(expect, Refused):
        assert statuses == [expect.status], responses[0].body if responses else statuses
        assert responses[0].header("connection") == "close"
        assert closed
        assert capture.requests[n_req:] == []
        sent = capture.since(mark)
        if expect.mid_body:  # at most the head and the chunks before the bad one
            assert sent == b"" or sent.startswith(
                b"POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n" + FWD), sent
            assert b"smuggled" not in sent and b"/after" not in sent
        else:
            assert sent == b"", sent
        clean_request(proxy, capture, b"/clean")
        return
    want = [expect.answer] if expect.closes else [expect.answer, b"GET /after HTTP/1.1\n"]
    assert [r.body for r in responses] == want and statuses == [200] * len(want)
    assert closed == expect.closes
    ups = [expect.upstream] if expect.closes else [expect.upstream, AFTER_UP]
    assert wait_until(lambda: len(capture.requests) >= n_req + len(ups), 5)
    assert capture.requests[n_req:] == ups
    assert len(capture.since(mark)) == sum(map(len, ups))  # nothing unparsed


PIPELINES = [
    pytest.param(post(b"Content-Length: -1\r\n", b"x"), id="negative-length"),
    pytest.param(post(b"Content-Length: 6\r\n" + TE, b"0\r\n\r\nX"), id="CL.TE"),
    pytest.param(post(TE, b"ffffffffffffffff1\r\n" + SMUGGLED), id="chunk-overflow"),
    pytest.param(post(b"Content-Length: 5, 6\r\n", b"abcdef"), id="two-lengths"),
]


@pytest.mark.parametrize("bad", PIPELINES)
def test_good_request_then_bad_body(proxy: Lameduck, capture: CaptureOrigin,
                                    bad: bytes) -> None:
    """The good request is answered, the bad one refused and the connection closed; the
    origin got the good request and nothing after it that it could parse as a request."""
    n_req = len(capture.requests)
    with raw_connect(proxy.port, timeout=3) as sock:
        sock.sendall(b"GET /good HTTP/1.1\r\nHost: h\r\n\r\n" + bad + SMUGGLED + AFTER)
        responses, closed = read_all(sock)
    assert [r.status for r in responses] == [200, 400]
    assert responses[0].body == b"GET /good HTTP/1.1\n"
    assert responses[1].header("connection") == "close" and closed
    assert wait_until(lambda: len(capture.requests) > n_req, 5)
    assert capture.requests[n_req:] == [b"GET /good HTTP/1.1\r\nhost: h\r\n" + FWD]
    clean_request(proxy, capture, b"/clean-after-pipeline")
