"""A request that was never sent is tried again on the only endpoint after a back-off
(HAProxy's ``retries``, Envoy's ``retry_back_off``), and a cold pool opens at most
``max_connecting`` connections to an endpoint at once: real lameduck, real demo origin."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.procs import base_config, start_origin_on, stop, wait_until

SYN_SENT = "02"  # the state column of /proc/net/tcp (include/net/tcp_states.h)


def _syn_sent_to(port: int) -> int:
    """Connects to ``port`` still waiting for the handshake (the kernel's own table: an
    origin cannot see a connect before its handshake completes)."""
    n = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == SYN_SENT and int(f[2].rsplit(":", 1)[1], 16) == port:
            n += 1
    return n


def _get_all(url: str, n: int) -> tuple[list[threading.Thread], list[int]]:
    """``n`` concurrent GETs in threads (each bounded by its timeout); their statuses."""
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            status = httpx.get(url, timeout=30).status_code
        except httpx.HTTPError:
            status = 0
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, statuses


def test_the_only_endpoint_refusing_the_first_connect_is_retried_and_answers_200(
        lameduck: Any) -> None:
    """Bound but not listening, the port refuses (RST) at once; it listens once the first
    refusal is counted, and the retry after the back-off reaches the origin."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    origin = None
    # Back-offs long enough that the test listens before the retries are spent (several
    # seconds of them), short enough that the answer comes in about a second.
    ld = lameduck(base_config(port, cluster={"retry_policy": {
        "num_retries": 5, "retry_back_off": {"base_interval": "200ms", "max_interval": "1s"}}}))
    try:
        threads, statuses = _get_all(ld.url("/"), 1)
        assert wait_until(lambda: ld.stat("cluster.app.upstream_cx_connect_fail") >= 1, 10)
        sock.listen(64)
        origin = start_origin_on(sock)
        threads[0].join(30)
        assert statuses == [200]
        stats = ld.stats()
        assert stats["cluster.app.upstream_rq_retry"] >= 1
        assert stats["cluster.app.upstream_rq_retry_success"] == 1
        assert stats["http.ingress.downstream_rq_5xx"] == 0
    finally:
        if origin is not None:
            stop(origin)
        sock.close()


def test_a_burst_on_a_cold_pool_opens_at_most_max_connecting_at_once(lameduck: Any) -> None:
    """An origin that does not accept yet, with the shortest accept queue (backlog 0: one
    connection): the kernel drops the other SYNs, so every connect lameduck starts stays
    SYN_SENT, and the kernel's table shows how many it opened at once. Then the origin starts
    and every request is answered (a dropped connect that timed out meanwhile is retried)."""
    n, cap = 8, 2
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    port = sock.getsockname()[1]
    origin = None
    ld = lameduck(base_config(port, cluster={"max_connecting": cap, "retry_policy": {
        "num_retries": 5}}))
    threads: list[threading.Thread] = []
    try:
        threads, statuses = _get_all(ld.url("/"), n)
        assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_pending_active") >= 1, 10)
        assert wait_until(lambda: _syn_sent_to(port) >= 1, 10)
        most, end = 0, time.monotonic() + 0.3
        while time.monotonic() < end:  # samples for 0.3 s (the connect timeout is 1 s)
            most = max(most, _syn_sent_to(port))
        assert 1 <= most <= cap
        assert ld.stat("cluster.app.upstream_rq_pending_total") >= n - cap - 1
        origin = start_origin_on(sock)  # listens with a long queue, and accepts
        for t in threads:
            t.join(30)
        assert statuses == [200] * n
        stats = ld.stats()
        # Connects the kernel dropped while the queue was full may time out (connect_timeout
        # 1s): they were retried after a back-off, and no client saw it.
        assert stats["cluster.app.upstream_rq_pending_active"] == 0
    finally:
        if origin is not None:
            stop(origin)
        sock.close()


def test_an_http2_pool_opens_at_most_max_connecting_connections_at_once() -> None:
    """HTTP/2 multiplexes, so the pool caps connections, not requests: with one stream per
    connection and max_connecting 1, a burst of three opens one connection; the others wait
    in line and are placed as each open ends (here refused: loopback answers at once)."""
    from lameduck.drain.endpoint import EndpointDrain
    from lameduck.http2.connection import H2Limits
    from lameduck.http2.upstream import H2Pool
    from lameduck.upstream.cluster import Cluster
    from lameduck.upstream.pool import Endpoint
    from tests.procs import refusing_port

    async def burst() -> None:
        loop = asyncio.get_running_loop()
        ep = Endpoint("127.0.0.1", refusing_port(), 4, 1, EndpointDrain(), max_connecting=1)
        pool = H2Pool(Cluster("app", [ep], 1.0, 30.0), H2Limits(), 1, loop)
        futs = [pool.connect(ep) for _ in range(3)]
        assert len(pool.opening[ep]) == 1 and len(ep.waiting) == 2  # the endpoint's line
        opened_at_once = 1
        for fut in futs:
            with contextlib.suppress(OSError):
                await asyncio.wait_for(fut, 5)
            opened_at_once = max(opened_at_once, len(pool.opening.get(ep, [])))
        assert opened_at_once == 1
        assert all(isinstance(f.exception(), OSError) for f in futs)
        assert ep.cx_connect_fail == 3 and not ep.waiting

    asyncio.run(burst())
