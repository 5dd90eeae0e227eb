"""An origin that answers as nginx, Apache or Node do (``Connection: keep-alive``,
``Keep-Alive: timeout=5``), over real sockets: the client gets the response without those
hop-by-hop lines, byte for byte, and the upstream connection carries the next request."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capture import CaptureOrigin
from tests.procs import Lameduck, base_config


def _body(head: bytes) -> bytes:
    return head.split(b"\r\n", 1)[0] + b"\n"  # the request line: which request it answers


def _respond(head: bytes) -> bytes:
    body = _body(head)
    return (b"HTTP/1.1 200 OK\r\nServer: raw-origin\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n%s"
            % (len(body), body))


@pytest.fixture
def capture() -> Iterator[CaptureOrigin]:
    origin = CaptureOrigin(_respond)
    yield origin
    origin.close()


@pytest.fixture
def proxy(capture: CaptureOrigin, tmp_path: Path) -> Iterator[Lameduck]:
    # (no x-envoy-upstream-service-time: the response is compared byte for byte)
    ld = Lameduck(base_config(capture.port, listener={"suppress_envoy_headers": True}),
                  tmp_path).start()
    yield ld
    ld.kill()
    assert "Traceback" not in ld.log(), ld.log()


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out


def test_keep_alive_lines_are_dropped_and_the_upstream_connection_is_reused(
        proxy: Lameduck, capture: CaptureOrigin) -> None:
    host, port = proxy.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for path in (b"/one", b"/two"):
            s.sendall(b"GET %s HTTP/1.1\r\nHost: app\r\n\r\n" % path)
            body = b"GET %s HTTP/1.1\n" % path
            want = (b"HTTP/1.1 200 OK\r\nServer: raw-origin\r\nContent-Type: text/plain\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            assert _read(s, len(want)) == want
    # one connection accepted upstream, and both requests arrived on it
    assert len(capture.received) == 1
    assert [r.split(b"\r\n", 1)[0] for r in capture.requests] == [
        b"GET /one HTTP/1.1", b"GET /two HTTP/1.1"]
