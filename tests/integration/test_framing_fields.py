"""Framing and routing fields survive every hop-by-hop rule, checked on both sides of the proxy:
what the client got, and what a raw-socket origin received, byte for byte.

A ``Connection`` header nominating ``Content-Length`` once made lameduck forward a body as the
start of another request (request smuggling: the next client on that pooled upstream
connection got the smuggled response); ``Connection: host`` forwarded a request without Host;
absolute-form targets were forwarded with the client's Host; an upstream response nominating
its own Content-Length reached a keep-alive client unframed; a NUL or obs-fold in an upstream
head was relayed on the fast path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.capture import CaptureOrigin, echo_request_line
from tests.h2raw import RawH2
from tests.procs import Lameduck, RawConn, base_config, wait_until
from tests.procs import until_closed as exchange

SMUGGLED = b"GET /sleep?ms=1000 HTTP/1.1\r\nHost: x\r\n\r\n"
FORWARDED = b"x-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\n\r\n"


def _respond(head: bytes) -> bytes:
    """Scripted upstream answers by path; anything else names its request line."""
    path = head.split(b" ", 2)[1]
    if path == b"/nominates-length":
        return b"HTTP/1.1 200 OK\r\nConnection: content-length\r\nContent-Length: 6\r\n\r\nabcdef"
    if path == b"/nul":
        return b"HTTP/1.1 200 OK\r\nX-Bad: a\x00b\r\nContent-Length: 2\r\n\r\nhi"
    if path == b"/fold":
        return b"HTTP/1.1 200 OK\r\nX-Bad: a\r\n folded\r\nContent-Length: 2\r\n\r\nhi"
    return echo_request_line(head)


@pytest.fixture
def capture() -> Iterator[CaptureOrigin]:
    origin = CaptureOrigin(_respond)
    yield origin
    origin.close()


@pytest.fixture
def proxy(capture: CaptureOrigin, tmp_path: Path) -> Iterator[Lameduck]:
    # generate_request_id off: the heads below are compared byte for byte
    ld = Lameduck(base_config(capture.port, listener={"generate_request_id": False}),
                  tmp_path).start()
    yield ld
    ld.kill()
    assert "Traceback" not in ld.log(), ld.log()


def received(capture: CaptureOrigin, n: int) -> list[bytes]:
    assert wait_until(lambda: len(capture.requests) >= n, 5), capture.requests
    return capture.requests


@pytest.mark.parametrize("connection", [b"content-length", b"close, content-length",
                                        b"Content-Length, keep-alive"])
def test_connection_cannot_remove_content_length(
    proxy: Lameduck, capture: CaptureOrigin, connection: bytes
) -> None:
    """The body stays a body: forwarded with its Content-Length, one request upstream."""
    req = (b"POST /a HTTP/1.1\r\nHost: h\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n%s"
           % (connection, len(SMUGGLED), SMUGGLED))
    conn = RawConn(proxy.addr)
    conn.sock.sendall(req)
    resp = conn.read_response()
    assert resp.status == 200 and resp.body == b"POST /a HTTP/1.1\n"
    conn.close()
    [got] = received(capture, 1)
    assert got == (b"POST /a HTTP/1.1\r\nhost: h\r\nContent-Length: %d\r\n%s%s"
                   % (len(SMUGGLED), FORWARDED, SMUGGLED))
    # Nothing after it was read as a request: the upstream connection saw these bytes only.
    assert capture.all_bytes() == got


def test_no_response_poisoning_through_the_pool(
    lameduck: Callable[..., Lameduck],
) -> None:
    """The attack end to end against a real origin: the smuggled request's response must not
    reach the next client on the pooled upstream connection."""
    ld = lameduck()
    body = SMUGGLED
    a = RawConn(ld.addr)
    a.sock.sendall(b"POST /echo HTTP/1.1\r\nHost: h\r\nConnection: content-length\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    ra = a.read_response()
    assert ra.status == 200 and ra.body == body  # echoed: the origin read it as a body
    a.close()
    b = RawConn(ld.addr)
    rb = b.request("/bytes?n=7")
    assert rb.status == 200 and rb.body == bytes(range(7))
    b.close()


def test_connection_cannot_remove_host(proxy: Lameduck, capture: CaptureOrigin) -> None:
    out = exchange(proxy.addr, b"GET /b HTTP/1.1\r\nHost: h\r\nConnection: host, close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ")
    [got] = received(capture, 1)
    assert got == b"GET /b HTTP/1.1\r\nhost: h\r\n" + FORWARDED


def test_other_nominated_fields_are_still_removed(
    proxy: Lameduck, capture: CaptureOrigin
) -> None:
    """RFC 9110 §7.6.1 still holds for fields lameduck does not frame or route by."""
    exchange(proxy.addr, b"GET /c HTTP/1.1\r\nHost: h\r\nX-Hop: 1\r\nX-Stay: 2\r\n"
                         b"Connection: x-hop, close\r\n\r\n")
    [got] = received(capture, 1)
    assert got == b"GET /c HTTP/1.1\r\nhost: h\r\nX-Stay: 2\r\n" + FORWARDED


@pytest.mark.parametrize(("target", "host_field", "host", "path"), [
    (b"http://other.example/x", b"Host: client.example\r\n", b"other.example", b"/x"),
    (b"http://other.example/x", b"", b"other.example", b"/x"),
    (b"http://other.example:8080/x?q=1", b"Host: client.example\r\n", b"other.example:8080",
     b"/x?q=1"),
    (b"http://other.example", b"Host: client.example\r\n", b"other.example", b"/"),
    (b"HTTPS://o.example/y", b"", b"o.example", b"/y"),
    (b"http://[::1]:9/z", b"Host: h\r\n", b"[::1]:9", b"/z"),
])
def test_absolute_form_authority_replaces_host(
    proxy: Lameduck, capture: CaptureOrigin, target: bytes, host_field: bytes, host: bytes,
    path: bytes,
) -> None:
    """RFC 9112 §3.2.2: the target's authority is the Host; the upstream gets origin-form."""
    out = exchange(proxy.addr, b"GET %s HTTP/1.1\r\n%sConnection: close\r\n\r\n"
                   % (target, host_field))
    assert out.startswith(b"HTTP/1.1 200 "), out
    assert out.endswith(b"GET %s HTTP/1.1\n" % path)
    [got] = received(capture, 1)
    assert got == b"GET %s HTTP/1.1\r\nhost: %s\r\n%s" % (path, host, FORWARDED)


@pytest.mark.parametrize("head", [
    b"GET http://user@o.example/z HTTP/1.1\r\nHost: h\r\n\r\n",  # userinfo, RFC 9110 §4.2.4
    b"GET http:///z HTTP/1.1\r\nHost: h\r\n\r\n",  # no host
    b"GET ftp://o.example/z HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /z HTTP/1.1\r\nHost: a b\r\n\r\n",  # Host that is not host[:port]
    b"GET /z HTTP/1.1\r\nHost: user@h\r\n\r\n",
    b"GET /z HTTP/1.1\r\nHost: h\r\nHost: h\r\n\r\n",
    b"GET /z HTTP/1.1\r\n\r\n",
])
def test_bad_targets_and_hosts_get_400_and_close(
    proxy: Lameduck, capture: CaptureOrigin, head: bytes,
) -> None:
    out = exchange(proxy.addr, head + b"GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 "), out
    assert b"connection: close" in out.lower()
    assert out.count(b"HTTP/1.1 ") == 1  # closed: the pipelined request is not answered
    assert capture.requests == []


def test_http10_without_host_is_forwarded_with_an_empty_host(
    proxy: Lameduck, capture: CaptureOrigin,
) -> None:
    """RFC 9112 §3.2: a target without an authority gets an empty Host."""
    out = exchange(proxy.addr, b"GET /old HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ")
    [got] = received(capture, 1)
    assert got == b"GET /old HTTP/1.1\r\nhost: \r\n" + FORWARDED


def test_response_cannot_nominate_its_own_framing(proxy: Lameduck) -> None:
    """An upstream ``Connection: content-length`` keeps its Content-Length towards a
    keep-alive client, and the next response on that connection is a response of its own."""
    conn = RawConn(proxy.addr)
    first = conn.request("/nominates-length")
    assert first.status == 200 and first.header("content-length") == "6"
    assert first.body == b"abcdef" and not first.closes
    second = conn.request("/second")
    assert second.status == 200 and second.body == b"GET /second HTTP/1.1\n"
    conn.close()


@pytest.mark.parametrize("path", ["/nul", "/fold"])
@pytest.mark.parametrize("close", [False, True])
def test_invalid_upstream_heads_get_502_on_every_path(
    proxy: Lameduck, path: str, close: bool,
) -> None:
    """A NUL byte or obs-fold in an upstream head: 502 whether the client keeps its
    connection or not (one validation for the fast path and the parser's), never relayed."""
    conn = RawConn(proxy.addr)
    conn.send(path, headers={"Connection": "close"} if close else None)
    resp = conn.read_response()
    assert resp.status == 502
    assert b"\x00" not in conn.buf and b"folded" not in conn.buf
    assert all(n != "x-bad" for n, _ in resp.headers)
    if not close:
        # The client's connection is still good for a clean request.
        again = conn.request("/after")
        assert again.status == 200 and again.body == b"GET /after HTTP/1.1\n"
    conn.close()
    assert proxy.stat("http.ingress.downstream_rq_5xx") == 1  # the one 502, counted


# -- the same rules from an HTTP/2 client to an HTTP/1.1 upstream ------------------------------


def test_h2_authority_is_the_host_and_is_validated(
    proxy: Lameduck, capture: CaptureOrigin,
) -> None:
    c = RawH2(proxy.port)
    c.authority = "app.example:8443"
    c.request(1, "/h2")
    c.authority = "user@app.example"  # RFC 9113 §8.3.1: no userinfo in :authority
    c.request(3, "/h2-bad")
    assert c.wait(lambda: c.done(1) and c.done(3))
    assert c.streams[1].status == 200 and c.streams[3].status == 400
    c.close()
    [got] = received(capture, 1)
    assert got == b"GET /h2 HTTP/1.1\r\nhost: app.example:8443\r\n" + FORWARDED


def test_h2_client_gets_an_upstream_response_with_its_framing(proxy: Lameduck) -> None:
    c = RawH2(proxy.port)
    c.request(1, "/nominates-length")
    c.request(3, "/nul")
    assert c.wait(lambda: c.done(1) and c.done(3))
    first = c.streams[1]
    assert first.status == 200 and bytes(first.body) == b"abcdef"
    assert dict(first.headers).get("content-length") == "6"
    assert c.streams[3].status == 502  # the parser refuses the NUL: never relayed
    c.close()
