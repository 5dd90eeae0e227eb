"""A TLS listener's records, end to end with Python's ssl client on a raw socket: what a
client sees of lameduck's TLS layer (lameduck.proxy.tlsstream): close_notify both ways, a
request split across records and reads, requests pipelined in one record, a response larger
than the socket buffers, a connection that speaks no TLS, a failed handshake's alert, and a
TLS 1.2 renegotiation."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_http2_edges import _pattern
from tests.procs import wait_until

WAIT = 30.0  # an upper bound on a loaded machine, never a margin


def _client(ca: Path, alpn: str = "http/1.1") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols([alpn])
    return ctx


def _connect(addr: str, ca: Path) -> ssl.SSLSocket:
    host, port = addr.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=WAIT)
    # suppress_ragged_eofs=False: a FIN without close_notify raises SSLEOFError
    return _client(ca).wrap_socket(raw, server_hostname=host, suppress_ragged_eofs=False)


def _read_response(s: ssl.SSLSocket, buf: bytearray) -> bytes:
    """One response with a Content-Length body, from ``buf`` and then the socket."""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        assert data, bytes(buf)
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    size = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            size = int(line.split(b":", 1)[1])
    while len(buf) < end + size:
        data = s.recv(65536)
        assert data
        buf += data
    whole = bytes(buf[:end + size])
    del buf[:end + size]
    return whole


def _tls_listener(lameduck, tls_files):  # type: ignore[no-untyped-def]
    ca, cert, key = tls_files
    return ca, lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}})


def test_pipelined_and_split_requests_are_answered_in_order(lameduck, tls_files) -> None:
    ca, ld = _tls_listener(lameduck, tls_files)
    s = _connect(ld.addr, ca)
    assert s.selected_alpn_protocol() == "http/1.1"
    req = b"GET /bytes?n=%d HTTP/1.1\r\nHost: t\r\n\r\n"
    buf = bytearray()
    # two requests in one record
    s.sendall(req % 10 + req % 11)
    for n in (10, 11):
        resp = _read_response(s, buf)
        assert resp.startswith(b"HTTP/1.1 200") and resp.endswith(_pattern(n)), resp
    # one request in three records, each its own write
    one = req % 12
    for part in (one[:5], one[5:20], one[20:]):
        s.sendall(part)
    resp = _read_response(s, buf)
    assert resp.endswith(_pattern(12))
    # a response larger than the socket buffers: written as the client reads it
    s.sendall(req % 3_000_000)
    assert _read_response(s, buf).endswith(_pattern(3_000_000))
    s.close()
    assert ld.stat("http.ingress.downstream_rq_total") == 4


def test_a_client_close_notify_ends_the_connection(lameduck, tls_files) -> None:
    ca, ld = _tls_listener(lameduck, tls_files)
    s = _connect(ld.addr, ca)
    s.sendall(b"GET /bytes?n=5 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert _read_response(s, bytearray()).endswith(_pattern(5))
    raw = s.unwrap()  # close_notify; lameduck answers with its own, then closes the socket
    assert raw.recv(1) == b""  # a FIN after it, no reset
    raw.close()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0, WAIT)


def test_connection_close_sends_close_notify_before_the_fin(lameduck, tls_files) -> None:
    ca, ld = _tls_listener(lameduck, tls_files)
    s = _connect(ld.addr, ca)
    s.sendall(b"GET /bytes?n=7 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    buf = bytearray()
    assert _read_response(s, buf).endswith(_pattern(7))
    # the end is a close_notify (a bare FIN would raise SSLEOFError here)
    assert s.recv(100) == b""
    s.close()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0, WAIT)


def test_a_client_that_speaks_no_tls_is_not_served_and_the_next_one_is(lameduck,
                                                                        tls_files) -> None:
    ca, ld = _tls_listener(lameduck, tls_files)
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT) as plain:
        plain.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        got = b""
        try:
            while True:
                data = plain.recv(4096)
                if not data:
                    break
                got += data
        except ConnectionResetError:
            pass
        assert b"HTTP/1.1" not in got  # at most a TLS alert, no HTTP answer
    s = _connect(ld.addr, ca)
    s.sendall(b"GET /bytes?n=3 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert _read_response(s, bytearray()).endswith(_pattern(3))
    s.close()
    stats = ld.stats()
    assert stats["http.ingress.downstream_cx_ssl_total"] == 1
    assert stats["http.ingress.downstream_rq_total"] == 1


def test_a_tls12_client_renegotiation_is_refused(lameduck, tls_files) -> None:
    """openssl s_client's ``R`` command renegotiates a TLS 1.2 connection: lameduck answers
    with a no_renegotiation alert (RFC 9113 §9.2.1 forbids renegotiation on HTTP/2; HAProxy
    and nginx refuse it), which s_client takes as the end of the connection. Its stdin stays
    open: had the renegotiation gone through, it would wait for more input and never exit."""
    ca, ld = _tls_listener(lameduck, tls_files)
    stdin_r, stdin_w = os.pipe()
    p = subprocess.Popen(["openssl", "s_client", "-tls1_2", "-connect", ld.addr,
                          "-CAfile", str(ca), "-alpn", "http/1.1", "-verify_return_error"],
                         stdin=stdin_r, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(stdin_r)
    try:
        assert p.stdout is not None
        seen = b""
        while b"Verify return code:" not in seen:  # the handshake is done
            line = p.stdout.readline()
            assert line, seen
            seen += line
        os.write(stdin_w, b"R\n")
        out, _ = p.communicate(timeout=WAIT)
    finally:
        os.close(stdin_w)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert b"RENEGOTIATING" in out and b"no renegotiation" in out, out


def test_a_failed_handshake_sends_its_alert(lameduck, tls_files) -> None:
    """A ClientHello the listener cannot serve (TLS 1.2, only an RSA suite, for its ECDSA
    certificate) is answered with a handshake_failure alert (RFC 5246 §7.2.2), then the socket
    closes; the next client is served."""
    ca, ld = _tls_listener(lameduck, tls_files)
    host, port = ld.addr.rsplit(":", 1)
    ctx = _client(ca)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers("ECDHE-RSA-AES128-GCM-SHA256")
    raw = socket.create_connection((host, int(port)), timeout=WAIT)
    with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
        ctx.wrap_socket(raw, server_hostname=host)
    raw.close()
    s = _connect(ld.addr, ca)
    s.sendall(b"GET /bytes?n=3 HTTP/1.1\r\nHost: t\r\n\r\n")
    assert _read_response(s, bytearray()).endswith(_pattern(3))
    s.close()
