"""WebSocket over an HTTP/1.1 Upgrade, through lameduck to a real WebSocket server (the
`websockets` library on both ends), and drained the polite way: close 1001 to both peers at a
frame boundary, the close handshake given G, then the sockets closed (or reset if it stalls)."""

from __future__ import annotations

import base64
import os
import socket
import struct
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.procs import wait_until


def _ws_config(port: int, **over):  # type: ignore[no-untyped-def]
    return {"cluster": {"endpoints": [f"127.0.0.1:{port}"]}, **over}


def test_websocket_echo_through_the_proxy(lameduck, wsecho):
    ld = lameduck(**_ws_config(wsecho.port))
    big = os.urandom(1 << 20)
    with connect(f"ws://{ld.addr}/chat", max_size=None, ping_interval=None) as ws:
        assert ws.response.status_code == 101
        assert "close" not in (ws.response.headers.get("connection") or "").lower()
        ws.send("hello")
        assert ws.recv(timeout=5) == "hello"
        ws.send(big)
        assert ws.recv(timeout=10) == big
        assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 1
        assert ld.stat("http.ingress.downstream_rq_active") == 1
    assert wsecho.closes(1) == ["closed 1000"]
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert ld.stat("http.ingress.downstream_cx_upgrades_total") == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert wait_until(lambda: ld.stat("cluster.app.upstream_cx_active") == 0)


def test_websocket_drained_proactively_gets_1001_and_handshake(lameduck, wsecho):
    ld = lameduck(**_ws_config(wsecho.port),
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    with connect(f"ws://{ld.addr}/chat", ping_interval=None) as ws:
        ws.send("before")
        assert ws.recv(timeout=5) == "before"
        t0 = time.monotonic()
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        with pytest.raises(ConnectionClosed) as info:
            while True:
                ws.recv(timeout=5)
        waited = time.monotonic() - t0
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    assert 0.8 <= waited <= 1.7, waited  # the proactive moment: in [1.0, 1.2) s
    assert wsecho.closes(1) == ["closed 1001"]  # the upstream got our (masked) close
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert ld.stat("server.drain.cut") == 0  # a completed handshake is not a cut


def _raw_upgrade(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    assert head.split(b"\r\n\r\n", 1)[1] == b""
    return sock


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return out

    b0, b1 = exact(2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", exact(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", exact(8))[0]
    return b0 & 0x0F, exact(n)


def test_stalled_close_handshake_is_reset_after_g(lameduck, wsecho):
    """A client that never answers the close: the tunnel is reset G later and counted."""
    ld = lameduck(**_ws_config(wsecho.port),
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "400ms"},
                  shutdown={"deadline": "5s"})
    sock = _raw_upgrade(ld.port)
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    sock.settimeout(4)
    opcode, payload = _read_frame(sock)
    t_close = time.monotonic()
    assert opcode == 8 and struct.unpack(">H", payload[:2])[0] == 1001
    with pytest.raises((ConnectionResetError, EOFError)):
        while True:
            _read_frame(sock)  # nothing more, then the reset
    assert time.monotonic() - t_close >= 0.3
    sock.close()
    assert wait_until(lambda: ld.stat("server.drain.cut") == 1)
    assert ld.stat("server.drain.cut_reset") == 1


def test_invalid_frame_from_client_gets_1002(lameduck, wsecho):
    ld = lameduck(**_ws_config(wsecho.port))
    sock = _raw_upgrade(ld.port)
    sock.sendall(b"\x81\x02hi")  # an unmasked text frame from a client: RFC 6455 §5.1
    opcode, payload = _read_frame(sock)
    assert opcode == 8 and struct.unpack(">H", payload[:2])[0] == 1002
    sock.close()
    assert wsecho.closes(1) == ["closed 1001"]  # the upstream did nothing wrong: 1001
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    # the tunnel is gone; the process serves on
    with connect(f"ws://{ld.addr}/chat", ping_interval=None) as ws:
        ws.send("still here")
        assert ws.recv(timeout=5) == "still here"


def test_upgrade_refused_by_upstream_is_a_plain_response(lameduck, origin_port):
    """The demo origin does not speak WebSocket: its answer goes back as a normal response,
    and the connection closes after it (it cannot be reused as HTTP/1 after an Upgrade)."""
    ld = lameduck()
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(b"GET /status/404 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                 b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                 b"Sec-WebSocket-Version: 13\r\n\r\n")
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 404")
    assert b"connection: close" in data.lower()
    sock.close()
    del origin_port


# -- WebSocket over HTTP/2 (RFC 8441) ----------------------------------------------------------


def _frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 §5.2; RFC 8441 keeps the framing as it is)."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    """Unmasked server frames in ``data`` (whole frames only)."""
    out = []
    i = 0
    while i + 2 <= len(data):
        op, n = data[i] & 0x0F, data[i + 1] & 0x7F
        j = i + 2
        if n == 126:
            n, j = struct.unpack(">H", data[j : j + 2])[0], j + 2
        elif n == 127:
            n, j = struct.unpack(">Q", data[j : j + 8])[0], j + 8
        if j + n > len(data):
            break
        out.append((op, data[j : j + n]))
        i = j + n
    return out


def _h2_websocket(ld, sid: int):  # type: ignore[no-untyped-def]
    from tests.h2raw import RawH2

    c = RawH2(ld.port)
    c.request(sid, "/chat", method="CONNECT", end=False,
              headers=[(":protocol", "websocket"), ("sec-websocket-version", "13")])
    assert c.wait(lambda: c.streams[sid].status is not None)
    return c


def test_websocket_over_http2_echo_and_drain_close(lameduck, wsecho):
    ld = lameduck(**_ws_config(wsecho.port),
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    c = _h2_websocket(ld, 1)
    assert c.streams[1].status == 200 and not c.streams[1].ended
    c.data(1, _frame(1, b"hello over h2"))
    assert c.wait(lambda: (1, b"hello over h2") in _frames(bytes(c.streams[1].body)))
    assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 1
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    assert c.wait(lambda: any(op == 8 for op, _ in _frames(bytes(c.streams[1].body))), 4)
    waited = time.monotonic() - t0
    close = next(p for op, p in _frames(bytes(c.streams[1].body)) if op == 8)
    assert struct.unpack(">H", close[:2])[0] == 1001
    assert 0.8 <= waited <= 1.7, waited  # the proactive moment: in [1.0, 1.2) s
    c.data(1, _frame(8, struct.pack(">H", 1001)))  # the client completes the handshake
    assert c.wait(lambda: c.done(1), 3)
    assert c.streams[1].ended and c.streams[1].reset is None  # END_STREAM, not a reset
    c.close()
    assert wsecho.closes(1) == ["closed 1001"]
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert ld.stat("server.drain.cut") == 0


def test_websocket_over_http2_stalled_close_is_reset_after_g(lameduck, wsecho):
    ld = lameduck(**_ws_config(wsecho.port),
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    c = _h2_websocket(ld, 1)
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    assert c.wait(lambda: any(op == 8 for op, _ in _frames(bytes(c.streams[1].body))), 4)
    t_close = time.monotonic()
    assert c.wait(lambda: c.done(1), 3)  # no answer from us: reset G later
    assert c.streams[1].reset == 8
    assert time.monotonic() - t_close >= 0.2
    c.close()
    assert wait_until(lambda: ld.stat("server.drain.cut") == 1)
    assert ld.stat("server.drain.cut_reset") == 1
