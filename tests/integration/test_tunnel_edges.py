"""Tunnel edge cases over real sockets: WebSocket closes from either side during a drain, a large
message caught mid-frame by the proactive moment, pings, HTTP/1 CONNECT with early data and
half-closes, memory with a client that does not read, and a tunnel cut at the shutdown deadline."""

from __future__ import annotations

import base64
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection, serve

from tests.peers import answer
from tests.procs import rss_kb, wait_until


class ByeServer:
    """A WebSocket server (in a thread) that closes first with 4000 "bye" when told "bye"."""

    def __init__(self) -> None:
        self.codes: list[int | None] = []

        def handler(ws: ServerConnection) -> None:
            try:
                for msg in ws:
                    if msg == "bye":
                        ws.close(4000, "bye")
                        break
                    ws.send(msg)
            except ConnectionClosed:
                pass
            rcvd = ws.protocol.close_rcvd
            self.codes.append(rcvd.code if rcvd is not None else None)

        self.server = serve(handler, "127.0.0.1", 0, ping_interval=None, close_timeout=2)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def byeserver() -> Iterator[ByeServer]:
    s = ByeServer()
    try:
        yield s
    finally:
        s.close()


# -- raw WebSocket helpers ---------------------------------------------------------------------


def _raw_upgrade(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise EOFError(f"EOF after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _read_frame(sock: socket.socket) -> tuple[int, bool, bytes]:
    b0, b1 = _exact(sock, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", _exact(sock, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", _exact(sock, 8))[0]
    assert not b1 & 0x80, "a server frame must not be masked"
    return b0 & 0x0F, bool(b0 & 0x80), _exact(sock, n)


def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A client frame, masked with the all-zero key (valid, and the payload stays as is)."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | opcode
    if n < 126:
        head = bytes((b0, 0x80 | n))
    elif n < 65536:
        head = bytes((b0, 0x80 | 126)) + struct.pack(">H", n)
    else:
        head = bytes((b0, 0x80 | 127)) + struct.pack(">Q", n)
    return head + b"\x00\x00\x00\x00" + payload


def _ws(port: int, **over):  # type: ignore[no-untyped-def]
    return {"cluster": {"endpoints": [f"127.0.0.1:{port}"]}, **over}


def _settled(ld) -> bool:  # type: ignore[no-untyped-def]
    s = ld.stats()
    return (s["http.ingress.downstream_cx_upgrades_active"] == 0
            and s["http.ingress.downstream_rq_active"] == 0
            and s["http.ingress.downstream_cx_active"] == 0
            and s["cluster.app.upstream_cx_active"] == 0)


# -- WebSocket ---------------------------------------------------------------------------------


def test_ws_client_closes_first_while_drain_runs(lameduck, wsecho):
    ld = lameduck(**_ws(wsecho.port),
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    with connect(f"ws://{ld.addr}/chat", ping_interval=None) as ws:
        ws.send("a")
        assert ws.recv(timeout=5) == "a"
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        time.sleep(0.2)  # the drain runs; the moment is still ahead
        ws.close(1000, "done")
        assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000
    assert wsecho.closes(1) == ["closed 1000 done"]
    assert wait_until(lambda: _settled(ld), 3), ld.stats()
    stats = ld.stats()
    assert stats["server.drain.cut"] == 0
    assert stats["http.ingress.downstream_rq_completed"] == 1


def test_ws_upstream_closes_first(lameduck, byeserver):
    ld = lameduck(**_ws(byeserver.port))
    with connect(f"ws://{ld.addr}/chat", ping_interval=None) as ws:
        ws.send("x")
        assert ws.recv(timeout=5) == "x"
        ws.send("bye")
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=5)
    assert info.value.rcvd is not None and info.value.rcvd.code == 4000
    assert wait_until(lambda: byeserver.codes == [4000], 3), byeserver.codes  # our echo of it
    assert wait_until(lambda: _settled(ld), 3), ld.stats()
    assert ld.stat("server.drain.cut") == 0


def test_ws_pings_are_relayed_both_ways(lameduck, wsecho):
    ld = lameduck(**_ws(wsecho.port))
    sock = _raw_upgrade(ld.port)
    sock.sendall(_frame(0x9, b"p1") + _frame(0x1, b"hello") + _frame(0x9, b"p2"))
    got = [_read_frame(sock) for _ in range(3)]
    assert (0xA, True, b"p1") in got
    assert (0xA, True, b"p2") in got
    assert (0x1, True, b"hello") in got
    # a ping between the fragments of a message (allowed: control frames may interleave)
    sock.sendall(_frame(0x1, b"frag-", fin=False) + _frame(0x9, b"p3") + _frame(0x0, b"ment"))
    got = [_read_frame(sock) for _ in range(2)]
    assert (0xA, True, b"p3") in got
    assert (0x1, True, b"frag-ment") in got
    sock.sendall(_frame(0x8, struct.pack(">H", 1000)))
    op, _, payload = _read_frame(sock)
    assert op == 0x8 and struct.unpack(">H", payload[:2])[0] == 1000
    sock.close()
    assert wsecho.closes(1) == ["closed 1000"]
    assert wait_until(lambda: _settled(ld), 3), ld.stats()


def test_ws_large_message_then_1001_at_the_frame_boundary(lameduck, wsecho):
    """The proactive moment comes while a 24 MiB message to the client is mid-frame (the client
    is not reading): the close must come after the whole frame, never inside it."""
    ld = lameduck(**_ws(wsecho.port),
                  drain={"time": "3s", "strategy": "gradual", "connection_grace": "900ms"},
                  shutdown={"deadline": "8s"})
    sock = _raw_upgrade(ld.port)
    sock.settimeout(8)
    big = os.urandom(24 * 1024 * 1024)
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    sock.sendall(_frame(0x2, big))  # echoed back; we do not read yet
    time.sleep(max(0.0, t0 + 2.15 - time.monotonic()))  # past the moment, in [2.0, 2.1) s
    op, fin, payload = _read_frame(sock)
    assert op == 0x2 and fin
    assert len(payload) == len(big)
    assert payload == big
    op, _, payload = _read_frame(sock)
    assert op == 0x8 and struct.unpack(">H", payload[:2])[0] == 1001
    sock.sendall(_frame(0x8, struct.pack(">H", 1001)))  # complete the handshake
    assert wsecho.closes(1) == ["closed 1001"]
    assert wait_until(lambda: _settled(ld), 3), ld.stats()
    sock.close()
    stats = ld.stats()
    assert stats["server.drain.cut"] == 0
    assert stats["server.drain.cx_drained_proactive"] == 1


def test_ws_sigterm_deadline_cuts_the_tunnel_exit_3(lameduck, wsecho):
    # G >= T/3: no proactive moment, so only the deadline can end the tunnel
    ld = lameduck(**_ws(wsecho.port),
                  drain={"time": "300ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "800ms"})
    sock = _raw_upgrade(ld.port)
    sock.sendall(_frame(0x1, b"hi"))
    assert _read_frame(sock) == (0x1, True, b"hi")
    ld.signal(signal.SIGTERM)
    sock.settimeout(4)
    t0 = time.monotonic()
    with pytest.raises((ConnectionResetError, EOFError)):
        while True:
            _read_frame(sock)
    assert time.monotonic() - t0 >= 0.5
    assert ld.wait(5) == 3
    sock.close()
    assert "cut=1 (503=0 reset=1)" in ld.log(), ld.log()


# -- HTTP/1.1 CONNECT ----------------------------------------------------------------------------


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _until_eof(sock: socket.socket, rest: bytes = b"") -> tuple[bytes, bool]:
    data = rest
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return data, True
    return data, False


def test_connect_early_data_in_the_same_packet_and_half_close(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}})
    target = f"127.0.0.1:{destination.port}"
    early = b"early bytes sent with the CONNECT itself\n" * 100
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + early)
    head, rest = _read_head(sock)
    assert head == b"HTTP/1.1 200 Connection Established\r\n\r\n"
    later = _frame(0x2, b"x" * 70000)  # just bytes here
    sock.sendall(later)
    sock.shutdown(socket.SHUT_WR)  # our FIN reaches the destination; its answer still comes
    data, reset = _until_eof(sock, rest)
    assert not reset
    assert data == answer(early + later)
    assert destination.received == [early + later]
    sock.close()
    assert wait_until(lambda: _settled_connect(ld), 3), ld.stats()
    assert ld.stat("server.drain.cut") == 0


def _settled_connect(ld) -> bool:  # type: ignore[no-untyped-def]
    s = ld.stats()
    return (s["http.ingress.downstream_cx_upgrades_active"] == 0
            and s["http.ingress.downstream_rq_active"] == 0
            and s["http.ingress.downstream_cx_active"] == 0)


def test_connect_large_upload_after_the_200(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}})
    target = f"127.0.0.1:{destination.port}"
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head, rest = _read_head(sock)
    assert head.startswith(b"HTTP/1.1 200") and rest == b""
    payload = os.urandom(8 * 1024 * 1024)
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    data, reset = _until_eof(sock)
    assert not reset and data == answer(payload)
    sock.close()
    assert wait_until(lambda: _settled_connect(ld), 3), ld.stats()


def test_connect_client_not_reading_bounded_memory(lameduck, origin_port):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    target = f"127.0.0.1:{origin_port}"
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head, _ = _read_head(sock)
    assert head.startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /bytes?n=1073741824 HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.2)
    base = rss_kb(ld.pid)
    time.sleep(1.0)
    grown = rss_kb(ld.pid) - base
    sock.close()
    assert grown < 16 * 1024, f"lameduck grew by {grown} KiB while the client read nothing"
    assert wait_until(lambda: _settled_connect(ld), 3), ld.stats()


def test_connect_destination_resets_mid_tunnel(lameduck):
    """The destination resets: the client's side ends too (no hang), the books settle."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    lsock.settimeout(5)
    port = lsock.getsockname()[1]
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{port}"]}})
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    conn, _ = lsock.accept()
    head, _ = _read_head(sock)
    assert head.startswith(b"HTTP/1.1 200")
    sock.sendall(b"ping")
    assert conn.recv(4) == b"ping"
    conn.sendall(b"pong")
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()  # RST
    data, _ = _until_eof(sock)
    assert data == b"pong"
    sock.close()
    lsock.close()
    assert wait_until(lambda: _settled_connect(ld), 3), ld.stats()
    assert ld.stat("server.drain.cut") == 0


def test_connect_sigterm_tunnel_cut_at_deadline(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}},
                  drain={"time": "300ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "800ms"})
    target = f"127.0.0.1:{destination.port}"
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head, _ = _read_head(sock)
    assert head.startswith(b"HTTP/1.1 200")
    ld.signal(signal.SIGTERM)
    _, reset = _until_eof(sock)
    assert reset
    assert ld.wait(5) == 3
    sock.close()
    assert "cut=1 (503=0 reset=1)" in ld.log(), ld.log()


def test_ws_frame_sent_with_the_upgrade_request(lameduck, wsecho):
    """A client frame in the same packet as the Upgrade request reaches the upstream after
    its 101 (not parsed as HTTP, not lost)."""
    ld = lameduck(**_ws(wsecho.port))
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode() + _frame(0x1, b"early"))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101")
    assert _read_frame(sock) == (0x1, True, b"early")
    sock.sendall(_frame(0x8, struct.pack(">H", 1000)))
    op, _, _ = _read_frame(sock)
    assert op == 0x8
    sock.close()
    assert wsecho.closes(1) == ["closed 1000"]
    assert wait_until(lambda: _settled(ld), 3), ld.stats()


def test_ws_client_mid_frame_at_the_moment_close_waits_for_the_frame(lameduck, wsecho):
    """The client is in the middle of a frame when the proactive moment comes: the close to the
    upstream goes after that frame's last byte (else the upstream sees a broken frame).

    The 1001 comes to us at once, not after the frame: we send its rest only once we have the
    1001. That it came at the proactive moment, not at the drain's end, is the stats' word
    (drained proactively), not a clock's: a loaded machine made it late by a clock. G (the
    close handshake's time after the moment, reset and cut past it) is 1.5 s, not 0.4 s: our
    half a frame and close must get through in it."""
    t, grace = 6.0, 1.5  # the moment in [2T/3, T - G) = [4.0, 4.5) s
    ld = lameduck(**_ws(wsecho.port),
                  drain={"time": f"{t * 1000:.0f}ms", "strategy": "gradual",
                         "connection_grace": f"{grace * 1000:.0f}ms"},
                  shutdown={"deadline": "15s"})
    sock = _raw_upgrade(ld.port)
    sock.settimeout(30)
    msg = _frame(0x2, os.urandom(200_000))
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    sock.sendall(msg[:100_000])  # half a frame
    op, _, payload = _read_frame(sock)  # the moment: 1001 to us at once
    assert op == 0x8 and struct.unpack(">H", payload[:2])[0] == 1001
    assert time.monotonic() - t0 >= 2 * t / 3  # not before the window
    assert ld.stat("server.drain.cx_drained_proactive") == 1, ld.stats()
    sock.sendall(msg[100_000:])  # the rest of the frame, then our close
    sock.sendall(_frame(0x8, struct.pack(">H", 1001)))
    assert wsecho.closes(1) == ["closed 1001"]  # a whole frame, then our close: no 1002
    data, _ = _until_eof(sock)
    assert data == b""  # the echo of the message is not forwarded after our close
    sock.close()
    assert wait_until(lambda: _settled(ld), 30), ld.stats()
    assert ld.stat("server.drain.cut") == 0
    assert ld.stat("server.drain.cx_closed_at_end") == 0
