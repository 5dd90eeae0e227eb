"""Upstream response corpus: a scripted origin (CaptureOrigin, answering by path) sends a
broken or hostile response, and lameduck must answer 502 before any byte of it reaches the
client, or cut the client connection once bytes went out — never relay something the client
would frame differently from lameduck (a response desync). After each case the same client
connection, when lameduck kept it, and a fresh one get the answers that name their own
requests. RFC 9112 §4 (status line), §5.2 (obs-fold), §6.3 (framing; two Content-Lengths is an
unrecoverable error: 502 and close the upstream connection), RFC 9110 §5.5 (field values),
§15.2 (1xx).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.adversarial.conftest import run_proxy, serve
from tests.capture import CaptureOrigin, echo_request_line
from tests.procs import Lameduck, RawConn, RawResponse, base_config

OK = b"HTTP/1.1 200 OK\r\n"

SCRIPTS: dict[bytes, bytes] = {
    # status lines (RFC 9112 §4)
    b"/status-4-digits": b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/status-2-digits": b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/status-alpha": b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/status-version-lower": b"http/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/status-garbage": b"SSH-2.0-OpenSSH\r\n\r\n",
    b"/status-no-space": b"HTTP/1.1200 OK\r\nContent-Length: 2\r\n\r\nhi",
    # not HTTP/1.x on an HTTP/1.1 connection (RFC 9112 §2.3: the major version must be 1)
    b"/status-version-2": b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    b"/status-bare-lf": b"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\nhi",
    b"/reason-nul": b"HTTP/1.1 200 O\x00K\r\nContent-Length: 2\r\n\r\nhi",
    # framing (RFC 9112 §6.3)
    b"/two-lengths": OK + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi!",
    b"/length-list": OK + b"Content-Length: 2, 3\r\n\r\nhi!",
    b"/length-signed": OK + b"Content-Length: +2\r\n\r\nhi",
    b"/length-negative": OK + b"Content-Length: -1\r\n\r\nhi",
    b"/cl-and-te": OK + b"Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"2\r\nhi\r\n0\r\n\r\n",
    b"/te-vtab": OK + b"Transfer-Encoding:\x0bchunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
    # fields (RFC 9110 §5.5, RFC 9112 §5.1, §5.2)
    b"/nul-value": OK + b"X-Bad: a\x00b\r\nContent-Length: 2\r\n\r\nhi",
    b"/ctl-value": OK + b"X-Bad: a\x01b\r\nContent-Length: 2\r\n\r\nhi",
    b"/nul-name": OK + b"X\x00Bad: a\r\nContent-Length: 2\r\n\r\nhi",
    b"/obs-fold": OK + b"X-Bad: a\r\n folded\r\nContent-Length: 2\r\n\r\nhi",
    b"/space-before-colon": OK + b"Content-Length : 2\r\n\r\nhi",
    b"/no-colon": OK + b"X-Bad\r\nContent-Length: 2\r\n\r\nhi",
    b"/bare-cr": OK + b"X-Bad: a\rb\r\nContent-Length: 2\r\n\r\nhi",
    # more body than the length says: the rest is not the next response
    b"/extra-bytes": OK + b"Content-Length: 2\r\n\r\nhi" + OK + b"Content-Length: 5\r\n\r\nEVIL!",
    # 1xx (RFC 9110 §15.2): a flood of interim responses before the final one
    b"/1xx-flood": b"HTTP/1.1 100 Continue\r\n\r\n" * 2000 + OK + b"Content-Length: 2\r\n\r\nhi",
    b"/1xx-103-flood": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * 2000
                       + OK + b"Content-Length: 2\r\n\r\nhi",
    b"/101-unasked": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\n\r\nRAW BYTES",
    # a stall: no head at all (route timeout: 300 ms)
    b"/stall-head": b"",
    # a stall mid-body: the route timeout spans the whole response (Envoy's)
    b"/stall-body": OK + b"Content-Length: 10\r\n\r\nabc",
    # close-delimited (no framing) to a keep-alive client (RFC 9112 §6.3 item 8)
    b"/close-delimited": OK + b"\r\nuntil close",
}


_serving = threading.local()


def respond(head: bytes) -> bytes:
    path = head.split(b" ", 2)[1]
    if path == b"/close-delimited":  # the body ends where the connection does
        conn: socket.socket = _serving.conn
        conn.sendall(SCRIPTS[path])
        conn.shutdown(socket.SHUT_WR)
        return b""
    return SCRIPTS[path] if path in SCRIPTS else echo_request_line(head)


class ClosingCapture(CaptureOrigin):
    """CaptureOrigin whose responder can end the connection it answers on (one thread per
    connection: the thread knows its socket)."""

    def _serve(self, conn: socket.socket, record: bytearray) -> None:
        _serving.conn = conn
        super()._serve(conn, record)


@pytest.fixture(scope="module")
def capture() -> Iterator[CaptureOrigin]:
    yield from serve(ClosingCapture(respond))


@pytest.fixture(scope="module")
def proxy(capture: CaptureOrigin, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Lameduck]:
    cfg = base_config(capture.port)
    cfg["listeners"][0]["routes"] = [
        {"prefix": "/stall", "cluster": "app", "timeout": "300ms"},
        {"prefix": "/", "cluster": "app", "timeout": "5s"},
    ]
    yield from run_proxy(cfg, tmp_path_factory, "adv-upstream")


def named(resp: RawResponse, path: str) -> bool:
    return resp.status == 200 and resp.body == f"GET {path} HTTP/1.1\n".encode()


def after_case(proxy: Lameduck, conn: RawConn, kept: bool, tag: str) -> None:
    """No desync: the kept client connection and a fresh one each get their own answer."""
    if kept:
        assert named(conn.request(f"/next-{tag}"), f"/next-{tag}")
    conn.close()
    fresh = RawConn(proxy.addr)
    assert named(fresh.request(f"/fresh-{tag}"), f"/fresh-{tag}")
    fresh.close()


BAD_502 = [p.decode() for p in SCRIPTS if p.startswith((b"/status", b"/two-", b"/length",
                                                          b"/nul", b"/ctl", b"/obs", b"/space",
                                                          b"/no-colon", b"/bare-cr",
                                                          b"/te-vtab"))]


@pytest.mark.parametrize("path", BAD_502)
def test_invalid_head_is_502_before_any_byte(proxy: Lameduck, path: str) -> None:
    conn = RawConn(proxy.addr)
    conn.send(path)
    resp = conn.read_response()
    assert resp.status == 502, (resp.status, resp.body)
    assert all(n != "x-bad" for n, _ in resp.headers)
    assert b"hi" not in resp.body and b"\x00" not in conn.buf
    after_case(proxy, conn, not resp.closes, path.strip("/"))


def test_nul_in_the_reason_phrase_never_reaches_the_client(proxy: Lameduck) -> None:
    """RFC 9112 §4: a reason phrase carries no meaning; refused (502) or replaced, its NUL
    must not be relayed."""
    conn = RawConn(proxy.addr)
    conn.send("/reason-nul", headers={"Connection": "close"})
    assert conn.wait_eof(5)
    assert conn.buf.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 502 ")), conn.buf
    assert b"\x00" not in conn.buf
    after_case(proxy, conn, False, "reason-nul")


def test_cl_and_te_is_502_or_dechunked_without_the_length(proxy: Lameduck) -> None:
    """RFC 9112 §6.3 item 3: Transfer-Encoding wins and the Content-Length must not be
    forwarded with it (a proxy that keeps both hands the client the ambiguity)."""
    conn = RawConn(proxy.addr)
    conn.send("/cl-and-te")
    resp = conn.read_response()
    if resp.status != 502:
        assert resp.status == 200 and resp.body == b"hi" and resp.complete
        assert resp.header("content-length") is None
    after_case(proxy, conn, not resp.closes, "cl-and-te")


def test_extra_bytes_after_the_body_never_answer_another_request(proxy: Lameduck) -> None:
    conn = RawConn(proxy.addr)
    first = conn.request("/extra-bytes")
    assert first.status == 200 and first.body == b"hi"
    for i in range(3):  # the upstream connection with the leftover bytes is not reused
        assert named(conn.request(f"/x{i}"), f"/x{i}")
    assert b"EVIL" not in conn.buf
    after_case(proxy, conn, not first.closes, "extra")


@pytest.mark.parametrize("path", ["/1xx-flood", "/1xx-103-flood"])
def test_1xx_flood_ends_in_one_final_answer(proxy: Lameduck, path: str) -> None:
    """Interim responses may be relayed or dropped, but the exchange ends in the final 200 (or
    a 502 if lameduck caps them), in bounded time, and the connection stays in step."""
    conn = RawConn(proxy.addr)
    conn.send(path)
    while True:
        resp = conn.read_response()
        if resp.status >= 200:
            break
        assert resp.status in (100, 103)
    assert resp.status == 502 or (resp.status, resp.body) == (200, b"hi")
    after_case(proxy, conn, not resp.closes, path.strip("/"))


def test_unrequested_101_is_not_a_tunnel(proxy: Lameduck) -> None:
    """RFC 9110 §15.2.2: a 101 answers only a request that asked to upgrade; relayed, the
    raw bytes after it would reach a client that still speaks HTTP/1.1."""
    conn = RawConn(proxy.addr)
    conn.send("/101-unasked")
    resp = conn.read_response(head_only=True)
    assert resp.status == 502
    after_case(proxy, conn, False, "101")


def test_stall_before_the_head_is_504(proxy: Lameduck) -> None:
    conn = RawConn(proxy.addr)
    resp = conn.request("/stall-head")
    assert resp.status == 504
    after_case(proxy, conn, not resp.closes, "stall-head")


def test_stall_mid_body_is_cut_at_the_route_timeout(proxy: Lameduck) -> None:
    """The head and 3 of 10 bytes, then nothing: the client's body is cut (a reset or a close
    short of its length, never a body that looks whole) once the route timeout ends."""
    conn = RawConn(proxy.addr)
    resp = conn.request("/stall-body")
    assert resp.status == 200 and resp.body == b"abc" and not resp.complete
    after_case(proxy, conn, False, "stall-body")


def test_close_delimited_to_a_keep_alive_client(proxy: Lameduck) -> None:
    """No framing upstream: lameduck frames it for the client (chunked) or closes after."""
    conn = RawConn(proxy.addr)
    resp = conn.request("/close-delimited")
    assert resp.status == 200 and resp.body == b"until close" and resp.complete
    after_case(proxy, conn, not resp.closes, "close-delimited")
