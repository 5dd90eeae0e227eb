"""The access log of requests that turn into byte streams, over real sockets: CONNECT tunnels
(HTTP/1.1 and HTTP/2) and WebSockets (an HTTP/1.1 Upgrade and an HTTP/2 extended CONNECT, RFC
8441).

Each line is read as Envoy would write it (its access-log docs, "Command Operators" and
``%RESPONSE_FLAGS%``): a tunnel's line has the status the client saw (200 for a CONNECT, 101
for an HTTP/1.1 WebSocket, 200 for an HTTP/2 one: Envoy logs the downstream response code),
its tunnelled bytes each way, and no flag when it ended cleanly; a CONNECT whose destination
refuses is 503 with UF (upstream connection failure).

A TCP listener's connection is logged as Envoy's TCP proxy logs it: "- - -", response code 0,
the flags and the bytes each way.

Each lameduck drains at once (T = 0) on SIGTERM, so its lines are all written (at exit) when
the test reads them; every exchange has settled before (its stats say so).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
from pathlib import Path
from typing import Any

from websockets.sync.client import connect as ws_connect

from tests.h2raw import RawH2
from tests.peers import Destination, answer
from tests.procs import AdminPoller, Lameduck, base_config, refusing_port, wait_until

# Drained at once on SIGTERM: the process exits as soon as nothing is in flight.
QUICK_EXIT: dict[str, Any] = {
    "drain": {"time": "0s", "strategy": "immediate", "connection_grace": "100ms"},
    "shutdown": {"deadline": "5s", "min_drain": "0s", "stop_accepting": "at_drain_end"},
}
# What the client sends through a tunnel (the Destination answers with its size and sha256).
PAYLOAD = bytes(range(256)) * 12
WAIT = 15.0  # bounds for what should take milliseconds: generous on a loaded machine


def json_log(path: Path) -> dict[str, str]:
    return {"path": str(path), "format": "json"}


def lines_of(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line]


def flags(line: dict[str, Any]) -> set[str]:
    return set(line["response_flags"].split(","))


def the_line(lines: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    """The one line whose fields have the values in ``match``."""
    found = [ln for ln in lines if all(ln.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, lines)
    return found[0]


def settled(ld: Lameduck, listener: str = "ingress") -> None:
    """Every request of the HTTP listener is off the books (its line was formatted)."""
    admin = AdminPoller(ld.admin_addr)
    try:
        assert wait_until(
            lambda: admin.stat(f"http.{listener}.downstream_rq_active") == 0
            and admin.stat(f"http.{listener}.downstream_cx_upgrades_active") == 0, WAIT, 0.01)
    finally:
        admin.close()


def stop(ld: Lameduck) -> None:
    """SIGTERM (T = 0): the process exits, writing every buffered line."""
    ld.signal(signal.SIGTERM)
    assert ld.wait(30) == 0, ld.log()


def until_eof(sock: socket.socket) -> bytes:
    data = b""
    sock.settimeout(WAIT)
    while chunk := sock.recv(65536):
        data += chunk
    return data


def h1_connect(port: int, target: str) -> tuple[socket.socket, bytes, bytes]:
    """A CONNECT to ``target``: the socket, the response head, the bytes after it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        assert chunk, buf
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    return sock, head + b"\r\n\r\n", rest


def tunnel_fields(line: dict[str, Any]) -> dict[str, Any]:
    return {k: line[k] for k in ("response_code", "response_flags", "bytes_received",
                                 "bytes_sent")}


def connect_proxy(lameduck: Any, destination: Destination,
                  tmp_path: Path) -> tuple[Lameduck, Path, str, str]:
    """A lameduck whose listener allows CONNECT to ``destination`` and to a port that refuses,
    logging JSON: (it, the log, the target, the refusing one)."""
    log = tmp_path / "access.jsonl"
    target = f"127.0.0.1:{destination.port}"
    dead = f"127.0.0.1:{refusing_port()}"
    ld: Lameduck = lameduck(**QUICK_EXIT, listener={
        "connect": {"allow": [target, dead]}, "access_log": json_log(log)})
    return ld, log, target, dead


def tunnel_lines(ld: Lameduck, log: Path, key: str, target: str,
                 dead: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Once every exchange settled and the process is gone: the lines of the CONNECT to
    ``target`` and of the one to ``dead`` (found by ``key``: path or authority)."""
    settled(ld)
    stop(ld)
    lines = lines_of(log)
    return (the_line(lines, method="CONNECT", **{key: target}),
            the_line(lines, method="CONNECT", **{key: dead}))


def assert_tunnel_and_refusal(ok: dict[str, Any], refused: dict[str, Any],
                              reply: bytes) -> None:
    """The relayed tunnel's line: 200, no flag, the bytes each way; the refused one's: 503 UF."""
    observed = {"tunnel": tunnel_fields(ok),
                "refused": (refused["response_code"], "UF" in flags(refused))}
    expected = {"tunnel": {"response_code": 200, "response_flags": "-",
                           "bytes_received": len(PAYLOAD), "bytes_sent": len(reply)},
                "refused": (503, True)}
    assert observed == expected, (ok, refused)


# -- 1. HTTP/1.1 CONNECT ----------------------------------------------------------------------


def test_http1_connect_line_is_200_with_tunnel_bytes_and_503_uf_when_refused(
        lameduck: Any, destination: Destination, tmp_path: Path) -> None:
    ld, log, target, dead = connect_proxy(lameduck, destination, tmp_path)

    sock, head, early = h1_connect(ld.port, target)
    assert head == b"HTTP/1.1 200 Connection Established\r\n\r\n" and early == b""
    sock.sendall(PAYLOAD)
    sock.shutdown(socket.SHUT_WR)  # the destination answers once it has our FIN
    reply = until_eof(sock)
    sock.close()
    assert reply == answer(PAYLOAD)

    sock, head, _ = h1_connect(ld.port, dead)
    assert head.startswith(b"HTTP/1.1 503"), head
    until_eof(sock)  # the 503 closes the connection
    sock.close()

    ok, refused = tunnel_lines(ld, log, "path", target, dead)
    assert_tunnel_and_refusal(ok, refused, reply)


# -- 2. HTTP/2 CONNECT ------------------------------------------------------------------------


def test_http2_connect_line_is_200_with_tunnel_bytes_and_503_uf_when_refused(
        lameduck: Any, destination: Destination, tmp_path: Path) -> None:
    ld, log, target, dead = connect_proxy(lameduck, destination, tmp_path)

    c = RawH2(ld.port, timeout=WAIT)
    c.connect(1, target)
    assert c.wait(lambda: c.streams[1].status is not None, WAIT)
    assert c.streams[1].status == 200 and not c.streams[1].ended
    c.data(1, PAYLOAD, end=True)  # END_STREAM -> FIN: the destination answers, then closes
    assert c.wait(lambda: c.done(1), WAIT)
    reply = bytes(c.streams[1].body)
    assert reply == answer(PAYLOAD)
    assert c.streams[1].ended and c.streams[1].reset is None

    c.connect(3, dead)
    assert c.wait(lambda: c.done(3), WAIT)
    assert c.streams[3].status == 503
    c.close()

    ok, refused = tunnel_lines(ld, log, "authority", target, dead)
    assert ok["protocol"] == refused["protocol"] == "HTTP/2"
    assert_tunnel_and_refusal(ok, refused, reply)


# -- 3. WebSocket over HTTP/1.1 ---------------------------------------------------------------


def test_http1_websocket_line_is_101(lameduck: Any, wsecho: Any, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    ld: Lameduck = lameduck(**QUICK_EXIT, cluster={"endpoints": [f"127.0.0.1:{wsecho.port}"]},
                            listener={"access_log": json_log(log)})
    with ws_connect(f"ws://{ld.addr}/chat", ping_interval=None, open_timeout=WAIT,
                    close_timeout=WAIT) as ws:
        assert ws.response.status_code == 101
        ws.send("hello")
        assert ws.recv(timeout=WAIT) == "hello"
    assert wsecho.closes(1, WAIT) == ["closed 1000"]  # a clean close handshake

    settled(ld)
    stop(ld)
    line = the_line(lines_of(log), path="/chat")
    assert (line["method"], line["protocol"], line["upstream_cluster"]) == (
        "GET", "HTTP/1.1", "app")
    assert (line["response_code"], line["response_flags"]) == (101, "-"), line


# -- 4. WebSocket over HTTP/2 (RFC 8441) ------------------------------------------------------


def client_frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 §5.2), payload under 126 bytes."""
    assert len(payload) < 126
    key = os.urandom(4)
    return (bytes([0x80 | opcode, 0x80 | len(payload)]) + key
            + bytes(b ^ key[i % 4] for i, b in enumerate(payload)))


def server_frames(data: bytes) -> list[tuple[int, bytes]]:
    """The whole unmasked frames in ``data`` (payloads under 126 bytes)."""
    out = []
    i = 0
    while i + 2 <= len(data) and i + 2 + (data[i + 1] & 0x7F) <= len(data):
        n = data[i + 1] & 0x7F
        out.append((data[i] & 0x0F, data[i + 2:i + 2 + n]))
        i += 2 + n
    return out


def test_http2_websocket_line_is_200_the_status_the_client_saw(
        lameduck: Any, wsecho: Any, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    ld: Lameduck = lameduck(**QUICK_EXIT, cluster={"endpoints": [f"127.0.0.1:{wsecho.port}"]},
                            listener={"access_log": json_log(log)})
    c = RawH2(ld.port, timeout=WAIT)
    c.request(1, "/chat", method="CONNECT", end=False,
              headers=[(":protocol", "websocket"), ("sec-websocket-version", "13")])
    assert c.wait(lambda: c.streams[1].status is not None, WAIT)
    assert c.streams[1].status == 200 and not c.streams[1].ended
    c.data(1, client_frame(1, b"hello over h2"))
    assert c.wait(lambda: (1, b"hello over h2") in server_frames(bytes(c.streams[1].body)),
                  WAIT)
    c.data(1, client_frame(8, struct.pack(">H", 1000)))  # close 1000; the server answers it
    assert c.wait(lambda: any(op == 8 for op, _ in server_frames(bytes(c.streams[1].body))),
                  WAIT)
    c.data(1, b"", end=True)
    assert c.wait(lambda: c.done(1), WAIT)
    assert c.streams[1].ended and c.streams[1].reset is None
    c.close()
    assert wsecho.closes(1, WAIT) == ["closed 1000"]

    settled(ld)
    stop(ld)
    line = the_line(lines_of(log), path="/chat")
    assert (line["method"], line["protocol"], line["upstream_cluster"]) == (
        "CONNECT", "HTTP/2", "app")
    assert (line["response_code"], line["response_flags"]) == (200, "-"), line



# -- 5. A TCP listener's connections ----------------------------------------------------------


def test_tcp_line_is_envoys_tcp_proxy_line_and_uf_when_no_endpoint_answers(
        origin_port: int, lameduck: Any, destination: Destination, tmp_path: Path) -> None:
    """Envoy's TCP proxy writes "- - -", response code 0 and the bytes each way; an upstream
    that cannot be reached is UF (the client is reset)."""
    ok_log, dead_log = tmp_path / "tcp.jsonl", tmp_path / "dead.jsonl"
    cfg = base_config(origin_port, **QUICK_EXIT)
    cfg["clusters"] += [{"name": "dest", "endpoints": [f"127.0.0.1:{destination.port}"]},
                        {"name": "dead", "endpoints": [f"127.0.0.1:{refusing_port()}"]}]
    cfg["listeners"] += [
        {"name": "l4", "address": "127.0.0.1:0", "protocol": "tcp", "cluster": "dest",
         "access_log": json_log(ok_log)},
        {"name": "l4dead", "address": "127.0.0.1:0", "protocol": "tcp", "cluster": "dead",
         "access_log": json_log(dead_log)}]
    ld: Lameduck = lameduck(cfg)

    sock = socket.create_connection(("127.0.0.1", ld.port_of("l4")), timeout=WAIT)
    sock.sendall(PAYLOAD)
    sock.shutdown(socket.SHUT_WR)  # the destination answers once it has our FIN
    reply = until_eof(sock)
    sock.close()
    assert reply == answer(PAYLOAD)

    dead = socket.create_connection(("127.0.0.1", ld.port_of("l4dead")), timeout=WAIT)
    with contextlib.suppress(ConnectionResetError):  # reset: nothing could be relayed
        assert until_eof(dead) == b""
    dead.close()

    admin = AdminPoller(ld.admin_addr)
    try:
        assert wait_until(lambda: admin.stat("tcp.l4.downstream_cx_active") == 0
                          and admin.stat("tcp.l4dead.downstream_cx_active") == 0, WAIT, 0.01)
    finally:
        admin.close()
    stop(ld)
    (ok,) = lines_of(ok_log)
    (refused,) = lines_of(dead_log)
    assert (ok["method"], ok["protocol"], ok["upstream_cluster"]) == (None, "-", "dest")
    assert tunnel_fields(ok) == {"response_code": 0, "response_flags": "-",
                                 "bytes_received": len(PAYLOAD), "bytes_sent": len(reply)}
    assert (refused["response_code"], "UF" in flags(refused)) == (0, True), refused
