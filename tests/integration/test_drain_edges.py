"""Edges of the drain found in review: local error answers drain like any response, a cut
HEAD gets no body, and an upstream that closes every connection at once never leaks a
request."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx

from tests.procs import base_config, wait_until

CLOSER = """
import socket, sys
import pytest

pytestmark = pytest.mark.usefixtures("workers")
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0)); ls.listen(128)
print("listening on 127.0.0.1:%d" % ls.getsockname()[1], flush=True)
while True:
    c, _ = ls.accept()
    c.close()
"""


def _recv_all(sock: socket.socket) -> bytes:
    got = bytearray()
    while True:
        b = sock.recv(65536)
        if not b:
            return bytes(got)
        got += b


def test_local_error_answers_drain_their_connection(lameduck) -> None:
    """A 503 for a failed upstream connect carries Connection: close during a drain."""
    cfg_port = 1  # nothing listens on port 1: connect refused
    ld = lameduck(cluster={"endpoints": [f"127.0.0.1:{cfg_port}"]}, shutdown={"deadline": "15s"},
                  drain={"time": "10s", "strategy": "immediate", "connection_grace": "1s"})
    with httpx.Client() as c:
        assert c.get(ld.url("/")).status_code == 503
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        r = c.get(ld.url("/"))
        assert r.status_code == 503
        assert r.headers.get("connection") == "close"
    assert ld.stat("server.drain.cx_drained_by_response") >= 1


def test_cut_head_request_gets_no_body(lameduck) -> None:
    ld = lameduck(drain={"time": "0s", "strategy": "immediate", "connection_grace": "0s"},
                  shutdown={"deadline": "300ms"})
    s = socket.create_connection(("127.0.0.1", ld.port))
    s.settimeout(5)
    s.sendall(b"HEAD /sleep?ms=3000 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 5)
    ld.signal(signal.SIGTERM)
    got = _recv_all(s)
    s.close()
    head, sep, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert sep and body == b""
    assert ld.wait(5) == 3


def test_upstream_closing_every_connection_at_once_leaks_nothing(lameduck, tmp_path) -> None:
    closer = subprocess.Popen([sys.executable, "-c", CLOSER], stdout=subprocess.PIPE)
    try:
        assert closer.stdout is not None
        port = int(closer.stdout.readline().split(b":")[-1])
        cfg = base_config(port, shutdown={"deadline": "3s"})
        cfg["listeners"][0]["routes"][0]["timeout"] = "0s"  # no timeout to hide a hang
        ld = lameduck(cfg)
        for _ in range(20):
            r = httpx.get(ld.url("/"), timeout=5)
            assert r.status_code in (502, 503)  # reset at connect or before the response
        assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)
        stats = ld.stats()
        assert stats["cluster.app.upstream_rq_active"] == 0
        assert wait_until(lambda: ld.stat("cluster.app.upstream_cx_active") == 0, 2)
        ld.signal(signal.SIGTERM)
        assert ld.wait(5) == 0  # nothing left in flight to cut
    finally:
        closer.kill()
        closer.wait()
