"""Retries stay safe and bounded at the edges: a retry whose client goes away gives its budget
slot back; a request reset by an HTTP/2 upstream is sent again only if it is safe."""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import httpx

from tests.procs import base_config, refusing_port, wait_until


def _dead_addr() -> str:
    return f"127.0.0.1:{refusing_port()}"  # connect refused


def test_a_retry_abandoned_by_its_client_gives_its_budget_slot_back(lameduck: Any,
                                                                   origins: Any) -> None:
    """Budget 0% with one retry in flight at most: if an abandoned retry kept its slot, the
    next connect failure would be answered 503 instead of retried."""
    (live,) = origins(1)
    dead = _dead_addr()
    ld = lameduck(base_config(live.port, cluster={
        "endpoints": [dead, live.addr],  # round robin: about every other request to dead
        "retry_policy": {"num_retries": 1,
                         "retry_budget": {"budget_percent": 0, "min_retry_concurrency": 1}}}))
    for _ in range(3):
        # to dead (refused) -> retried on live, where /hang never answers; then the client
        # goes away
        s = socket.create_connection(("127.0.0.1", ld.port))
        s.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 1, 5, 0.01)
        # a reset (a FIN alone is a half-close: the response would still be awaited)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 0, 5, 0.01)
    # Round robin sends every other new request to dead: each is retried on live, which needs
    # the one slot the abandoned retries above held while they ran.
    for _ in range(4):
        r = httpx.get(ld.url("/"), timeout=5)
        assert r.status_code == 200 and r.headers["x-origin"] == live.name
    st = ld.stats()
    assert st["cluster.app.upstream_rq_retry"] >= 4
    assert st["cluster.app.upstream_rq_retry_overflow"] == 0
    assert st["cluster.app.upstream_rq_retry_success"] >= 1


def test_a_reset_from_an_h2_upstream_resends_only_safe_requests(lameduck: Any,
                                                                h2origin: Any) -> None:
    """HTTP/1.1 client, protocol: h2 cluster: RST_STREAM(INTERNAL_ERROR) before any response
    byte. A GET or a POST with Idempotency-Key or Resume-Seq goes to the other endpoint; a POST
    without either reached an upstream and is never sent again (it proves nothing
    unprocessed)."""
    a, b = h2origin(), h2origin()
    ld = lameduck(base_config(a.port, cluster={"endpoints": [a.addr, b.addr], "protocol": "h2",
                                               "retry_policy": {"num_retries": 1}}))

    def seen(path: str) -> int:
        return sum(1 for o in (a, b) for rec in o.records("request") if rec.get("path") == path)

    with httpx.Client(timeout=5) as c:
        r = c.post(ld.url("/reset?plain"), content=b"x" * 100)
        assert r.status_code == 502
        assert seen("/reset?plain") == 1 or seen("/reset") == 1
        before = ld.stat("cluster.app.upstream_rq_retry")
        r = c.post(ld.url("/reset?keyed"), content=b"y" * 100,
                   headers={"idempotency-key": "k1"})
        assert r.status_code == 502  # every endpoint resets it: retried once, then answered
        assert ld.stat("cluster.app.upstream_rq_retry") == before + 1
        r = c.get(ld.url("/reset?get"))
        assert r.status_code == 502
        assert ld.stat("cluster.app.upstream_rq_retry") == before + 2
        r = c.post(ld.url("/reset?resumed"), content=b"z" * 100,  # committed once by the app
                   headers={"resume-token": "t", "resume-seq": "1"})
        assert r.status_code == 502
        assert ld.stat("cluster.app.upstream_rq_retry") == before + 3
    # what each origin saw: the plain POST once in all, the others twice (both endpoints)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        reqs = [rec.get("path", "") for o in (a, b) for rec in o.records("request")]
        if sum(p.startswith("/reset") for p in reqs) >= 7:
            break
        time.sleep(0.02)
    reqs = [rec.get("path", "") for o in (a, b) for rec in o.records("request")]
    assert sum(p.startswith("/reset") for p in reqs) == 7, reqs
