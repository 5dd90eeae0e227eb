"""A SIGTERM while a client's TLS handshake is under way, over real sockets.

A TLS 1.3 client sends its first requests right behind its Finished (RFC 8446 §2), before the
server has read it; nothing can turn them away until the handshake ends (no response, no
GOAWAY). So an exit must wait for such a connection, and the deadline counts it as cut —
never an exit with ``cut=0`` while its client loses what it sent.

The client here is Python's ``ssl`` over memory buffers on a plain socket: it sends its
ClientHello, reads the server's flight and holds its Finished back, so the handshake is under
way for exactly as long as the test says. No sleeps: each step waits on what the process says.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import ssl
from pathlib import Path

import httpx
import pytest

from tests.procs import Lameduck, wait_until

pytestmark = pytest.mark.usefixtures("workers")

REPORT = re.compile(r"drain report: requests completed=(\d+) refused=(\d+) cut=(\d+) "
                    r"\(503=(\d+) reset=(\d+)\)")


class HeldHandshake:
    """A TLS client whose handshake waits, server side, for the Finished it holds back."""

    def __init__(self, addr: str, ca: Path) -> None:
        host, port = addr.rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # the server waits for our Finished
        ctx.set_alpn_protocols(["http/1.1"])
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname=host)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self._step()  # the ClientHello
        while not self._step():  # the server's flight, up to its Finished
            data = self.sock.recv(65536)
            assert data, "the server closed during its handshake"
            self.incoming.write(data)
        self.finished = self.outgoing.read()  # held back: the server's handshake waits
        assert self.finished

    def _step(self) -> bool:
        try:
            self.tls.do_handshake()
        except ssl.SSLWantReadError:
            self.sock.sendall(self.outgoing.read())
            return False
        return True

    def request(self, path: str) -> bytes:
        """Finish the handshake and send a request in the same write (as a client does),
        then read until the response is whole (its head and Content-Length bytes) or the
        connection ends."""
        self.tls.write(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        self.sock.sendall(self.finished + self.outgoing.read())
        got = b""
        while not _whole(got):
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            self.incoming.write(data)
            try:
                while chunk := self.tls.read(65536):
                    got += chunk
            except ssl.SSLWantReadError:
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
        return got

    def close(self) -> None:
        self.sock.close()


def _whole(response: bytes) -> bool:
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        return False
    m = re.search(rb"(?im)^content-length: *(\d+)", head)
    return m is not None and len(body) >= int(m.group(1))


def not_ready(ld: Lameduck) -> bool:
    """The shutdown began: /ready answers 503 (or the process is already gone)."""
    try:
        return ld.admin("GET", "/ready").status_code == 503
    except httpx.HTTPError:
        return True


def held(ld: Lameduck, ca: Path) -> HeldHandshake:
    try:
        return HeldHandshake(ld.addr, ca)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{ld.log()}") from None


def report_counts(ld: Lameduck) -> tuple[int, ...]:
    m = REPORT.search(ld.log())
    assert m is not None, ld.log()
    return tuple(map(int, m.groups()))


def test_an_idle_exit_waits_for_a_tls_handshake_under_way(lameduck, tls_files) -> None:
    """min_drain 0s (the exit as soon as idle) and no connection but one mid-handshake: the
    process serves that client's request, then exits."""
    ca, cert, key = tls_files
    ld: Lameduck = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}},
                            drain={"time": "60s"}, shutdown={"deadline": "65s", "min_drain": "0s"},
                            hot_restart={"parent_shutdown_time": "65s"})
    client = held(ld, ca)
    try:
        ld.signal(signal.SIGTERM)
        assert wait_until(lambda: not_ready(ld), timeout=10), ld.log()
        response = client.request("/")
    finally:
        client.close()
    assert response.startswith(b"HTTP/1.1 200 "), (response, ld.log())
    assert ld.wait(30) == 0, ld.log()
    completed, refused, cut, _, _ = report_counts(ld)
    assert (completed, refused, cut) == (1, 0, 0), ld.log()


def test_a_tls_handshake_still_under_way_at_the_deadline_is_cut(lameduck, tls_files) -> None:
    """Held past the deadline, the handshake is reset and counted: cut=1 (reset=1), exit 3."""
    ca, cert, key = tls_files
    ld: Lameduck = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}},
                            drain={"time": "1s", "connection_grace": "100ms"},
                            shutdown={"deadline": "2s", "min_drain": "0s"})
    client = held(ld, ca)
    try:
        ld.signal(signal.SIGTERM)
        code = ld.wait(30)
    finally:
        client.close()
    assert code == 3, ld.log()
    _, _, cut, _, reset = report_counts(ld)
    assert (cut, reset) == (1, 1), ld.log()


def client_hello(addr: str, ca: Path) -> bytes:
    """The first flight of a real TLS client: its ClientHello record."""
    host = addr.rsplit(":", 1)[0]
    ctx = ssl.create_default_context(cafile=str(ca))
    out = ssl.MemoryBIO()
    tls = ctx.wrap_bio(ssl.MemoryBIO(), out, server_hostname=host)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = out.read()
    assert len(hello) > 10, hello
    return hello


def connected(ld: Lameduck) -> bool:
    """The process holds a downstream connection (accepted: not in the accept queue)."""
    return ld.stat("server.total_connections") >= 1


def test_a_tls_connection_that_sent_nothing_does_not_hold_the_exit(lameduck, tls_files) -> None:
    """A TCP connect to the TLS listener that sends nothing (a balancer's TCP check, a port
    scan, a pre-connect pool) is an idle connection: the exit at T closes it, exit 0, cut=0
    — not a handshake under way held to the deadline and counted as cut."""
    _, cert, key = tls_files
    ld: Lameduck = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}},
                            drain={"time": "1s"}, shutdown={"deadline": "20s", "min_drain": "0s"},
                            hot_restart={"parent_shutdown_time": "20s"})
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert wait_until(lambda: connected(ld), timeout=10), ld.log()
        ld.signal(signal.SIGTERM)
        assert ld.wait(15) == 0, ld.log()
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(1) == b"", ld.log()  # closed by the exit
    assert report_counts(ld)[2] == 0, ld.log()


def test_a_tls_connection_with_part_of_a_client_hello_is_cut_at_the_deadline(
        lameduck, tls_files) -> None:
    """Part of a ClientHello sent: the handshake is under way, so it holds the exit past T
    and the deadline resets it and counts it: cut=1 (reset=1), exit 3."""
    ca, cert, key = tls_files
    ld: Lameduck = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}},
                            drain={"time": "4s", "connection_grace": "100ms"},
                            shutdown={"deadline": "5s", "min_drain": "0s"})
    host, port = ld.addr.rsplit(":", 1)
    hello = client_hello(ld.addr, ca)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(hello[:len(hello) // 2])
        assert wait_until(lambda: connected(ld), timeout=10), ld.log()
        ld.signal(signal.SIGTERM)
        code = ld.wait(30)
    assert code == 3, ld.log()
    _, _, cut, _, reset = report_counts(ld)
    assert (cut, reset) == (1, 1), ld.log()
