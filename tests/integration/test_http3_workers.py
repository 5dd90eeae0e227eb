"""HTTP/3 with ``workers: 2``: a main process holds one UDP socket per worker in the port's
SO_REUSEPORT group, and the kernel steers each datagram to the worker its connection id
names (``listeners.quic.steering_program``). Real processes: ``lameduck run`` and its two
workers, the demo origin, aioquic's HTTP/3 client.

The kernel's own choice, a hash of the addresses, keeps a client on one socket only while
its address stays the same: after a NAT rebinding (RFC 9000 §9.3) its packets would reach
either worker, and the one that knows no such connection id drops them. Steered by the id,
they reach the worker that owns the connection wherever they come from."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.h3client import h3_connect
from tests.integration.test_http3 import h3_listener, run
from tests.procs import Lameduck, base_config

CONNECTIONS, REQUESTS = 24, 5
REBOUND = 12  # connections whose client address changes: each one a coin toss by hash


@pytest.fixture
def ld(tmp_path: Path, origin_port: int, tls_files: tuple[Path, Path, Path],
       ) -> Iterator[Lameduck]:
    """``lameduck run`` with two workers and HTTP/3; its log has no traceback at the end."""
    cfg = base_config(origin_port, listener=h3_listener(tls_files), workers=2)
    ld = Lameduck(cfg, tmp_path).start()
    try:
        yield ld
        assert "Traceback" not in ld.log(), ld.log()
    finally:
        ld.kill()


def test_http3_connections_are_served_by_both_workers(ld: Lameduck) -> None:
    async def one() -> tuple[int, list[int]]:
        """A connection of its own: the worker its server id names, and its statuses."""
        async with h3_connect(ld.addr) as c:
            statuses = [(await c.request("GET", "/")).status for _ in range(REQUESTS)]
            return c._quic._peer_cid.cid[1], statuses

    async def go() -> list[tuple[int, list[int]]]:
        out: list[Any] = []
        for _ in range(CONNECTIONS // 8):  # eight at once
            out += await asyncio.gather(*(one() for _ in range(8)))
        return out

    got = run(go())
    workers = sorted({w for w, _ in got})
    assert workers == [0, 1], got  # ids that name each worker: both served
    assert all(s == [200] * REQUESTS for _, s in got), got
    stats = ld.stats()
    assert stats["http.ingress.downstream_cx_http3_total"] == CONNECTIONS, stats
    assert stats["http.ingress.downstream_rq_http3_total"] == CONNECTIONS * REQUESTS


def test_an_http3_connection_keeps_its_worker_when_its_client_address_changes(
        ld: Lameduck) -> None:
    async def one() -> tuple[int, list[Any]]:
        async with h3_connect(ld.addr) as c:
            first = (await c.request("GET", "/")).status
            await c.rebind()
            after: list[Any] = [first]
            for _ in range(3):
                try:
                    async with asyncio.timeout(10):
                        after.append((await c.request("GET", "/")).status)
                except TimeoutError:
                    after.append("no answer in 10 s")
                    break
            return c._quic._peer_cid.cid[1], after

    async def go() -> list[tuple[int, list[Any]]]:
        return list(await asyncio.gather(*(one() for _ in range(REBOUND))))

    got = run(go())
    assert all(s == [200] * 4 for _, s in got), got
    assert sorted({w for w, _ in got}) == [0, 1], got
