"""A client that gives up over real sockets: an HTTP/1.1 client that half-closes (FIN) while
its request is in flight ends it as Envoy's connection manager does (which takes a downstream
FIN for the connection's end; nginx logs 499): logged code 0 with DC, and the upstream request
cut, so the origin stops working for nobody.

Bounded by conditions, not timers: the origin sleeps 30 s, and the line must come long before.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx

from tests.procs import Lameduck, wait_until


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x]


def test_a_client_fin_mid_request_is_logged_dc_and_cuts_the_upstream(
        lameduck: Any, origin_port: int, tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    ld: Lameduck = lameduck(listener={"access_log": {"path": str(log), "format": "json"}})
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /sleep?ms=30000 HTTP/1.1\r\nHost: app\r\n\r\n")
        # the request is at the origin (which answers in 30 s) before the client gives up
        assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 1, 20)
        sock.shutdown(socket.SHUT_WR)
        assert wait_until(lambda: _lines(log), 20), "no access-log line within 20 s"
        assert sock.recv(1024) == b""  # closed, nothing sent: there was nobody to answer
    (line,) = _lines(log)
    assert (line["path"], line["response_code"], line["response_flags"]) == (
        "/sleep?ms=30000", 0, "DC")
    assert line["duration"] < 25_000  # ended when the client left, not when the origin answered
    stats = ld.stats()
    assert stats["http.ingress.downstream_cx_destroy_remote_active_rq"] == 1
    assert stats["cluster.app.upstream_rq_active"] == 0
    # The origin saw its connection end: the only one it still has is the one asking.
    info = f"http://127.0.0.1:{origin_port}/info"
    assert wait_until(lambda: httpx.get(info).json()["connections"] == 1, 20)
