"""HTTP/1.1 CONNECT tunnels to an allow-list (HTTP/2 CONNECT is in test_http2.py)."""

from __future__ import annotations

import socket
import time

from tests.procs import wait_until


def _connect(port: int, target: str) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return sock, head


def _until_eof(sock: socket.socket) -> tuple[bytes, bool]:
    """Everything until the peer closes; True if it ended with a reset."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data, False
            data += chunk
    except ConnectionResetError:
        return data, True


def test_connect_relays_to_an_allowed_destination(lameduck, origin_port):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    sock, head = _connect(ld.port, f"127.0.0.1:{origin_port}")
    assert head == b"HTTP/1.1 200 Connection Established\r\n\r\n"  # no close, no framing
    sock.sendall(b"GET / HTTP/1.1\r\nHost: tunnel\r\n\r\n")  # spoken to the origin itself
    data = b""
    while b"hello from the lameduck demo origin" not in data:
        chunk = sock.recv(4096)
        assert chunk
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK")
    assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 1
    sock.shutdown(socket.SHUT_WR)  # our FIN goes through; the origin closes; so do we
    _, reset = _until_eof(sock)
    assert not reset
    sock.close()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert ld.stat("server.drain.cut") == 0


def test_connect_off_the_list_is_403(lameduck, origin_port):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    sock, head = _connect(ld.port, "127.0.0.1:1")
    assert head.startswith(b"HTTP/1.1 403")
    sock.close()
    sock, head = _connect(ld.port, f"localhost:{origin_port}")  # exact match only
    assert head.startswith(b"HTTP/1.1 403")
    sock.close()


def test_connect_destination_down_is_503(lameduck, origin_port):
    from tests.procs import refusing_port

    dead = refusing_port()
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{dead}"]}})
    sock, head = _connect(ld.port, f"127.0.0.1:{dead}")
    assert head.startswith(b"HTTP/1.1 503")
    assert b"connection: close" in head.lower()
    sock.close()


def test_connect_tunnel_ends_at_the_proactive_moment(lameduck, origin_port):
    """Envoy's draining docs: on HTTP/1 a tunnel drained proactively ends at once (reset,
    counted)."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}},
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    sock, head = _connect(ld.port, f"127.0.0.1:{origin_port}")
    assert head.startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    sock.settimeout(4)
    _, reset = _until_eof(sock)
    waited = time.monotonic() - t0
    assert reset
    assert 0.8 <= waited <= 1.6, waited  # the moment: in [1.0, 1.2) s
    sock.close()
    assert wait_until(lambda: ld.stat("server.drain.cut") == 1)
    assert ld.stat("server.drain.cut_reset") == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
