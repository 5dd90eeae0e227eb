"""The route timeout and the per-try idle timeout against real processes: a real lameduck in
front of the demo origin (Envoy's route ``timeout`` and ``per_try_idle_timeout``). The exact
timing is in tests/unit/test_exchange_playbook.py; here the bounds are loose."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tests.procs import H2Origin, Lameduck, base_config, raw_connect


def _slow_body(pieces: int, size: int, every: float) -> Iterator[bytes]:
    """An upload paced by the client: ``pieces`` of ``size`` bytes, ``every`` seconds apart."""
    for i in range(pieces):
        if i:
            time.sleep(every)  # the pace of the upload, not a wait for the proxy
        yield b"u" * size


def test_an_upload_longer_than_the_route_timeout_is_answered(
        lameduck: Callable[..., Lameduck]) -> None:
    """The route timeout starts at the request's end (Envoy): a 3 s upload under a 2 s route
    timeout gets its answer, not a 504."""
    ld = lameduck(route={"timeout": "2s"})
    # 7 pieces 0.5 s apart: the client's own pacing makes the upload last 3 s
    r = httpx.post(ld.url("/continue"), content=_slow_body(7, 1000, 0.5), timeout=10)
    assert (r.status_code, r.text) == (200, "received 7000 bytes\n")
    assert ld.stat("cluster.app.upstream_rq_timeout") == 0


def _read_until_cut(sock: socket.socket) -> tuple[bytes, str]:
    """Everything the proxy sends until it ends the connection, and how: "rst" or "fin"."""
    got = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return got, "rst"
        if not data:
            return got, "fin"
        got += data


def test_a_response_stalled_mid_body_is_cut_at_the_per_try_idle_timeout(
        lameduck: Callable[..., Any]) -> None:
    """The origin sends the head and the first of two chunks, then nothing for 10 s: the
    per-try idle timeout (1 s) cuts it, and the client sees a reset, not a whole body."""
    ld = lameduck(route={"timeout": "30s", "per_try_idle_timeout": "1s"})
    with raw_connect(ld.port, timeout=10) as sock:
        sock.sendall(b"GET /stream?chunks=2&size=10&interval_ms=10000 HTTP/1.1\r\n"
                     b"Host: x\r\n\r\n")
        started = time.monotonic()
        got, how = _read_until_cut(sock)
        took = time.monotonic() - started
    assert got.startswith(b"HTTP/1.1 200 ") and b"x" * 10 in got
    assert not got.endswith(b"0\r\n\r\n")  # the body is not made to look whole
    assert how == "rst"
    assert 0.9 <= took < 5.0, took
    assert ld.stat("cluster.app.upstream_rq_per_try_idle_timeout") == 1
    assert ld.stat("cluster.app.upstream_rq_timeout") == 0


def test_an_h2_upstream_silent_past_the_per_try_idle_timeout_is_answered_504(
        lameduck: Callable[..., Any], h2origin: Callable[..., H2Origin]) -> None:
    """The same timer on an HTTP/2 stream: no head within 1 s of the request's end (the
    origin would answer after 10 s), so the stream is cancelled and the client gets 504."""
    o = h2origin()
    cfg = base_config(o.port, route={"timeout": "30s", "per_try_idle_timeout": "1s"})
    cfg["clusters"] = [{"name": "app", "endpoints": [o.addr], "protocol": "h2"}]
    ld = lameduck(cfg)
    started = time.monotonic()
    r = httpx.get(ld.url("/slow/10000"), timeout=10)
    took = time.monotonic() - started
    assert r.status_code == 504
    assert 0.9 <= took < 5.0, took
    assert ld.stat("cluster.app.upstream_rq_per_try_idle_timeout") == 1
    assert ld.stat("cluster.app.upstream_rq_tx_reset") == 1  # RST_STREAM CANCEL upstream
