"""The shortest path through a real lameduck: a request proxied to the real origin."""

from __future__ import annotations

import httpx


def test_get_through_proxy(lameduck) -> None:
    ld = lameduck()
    r = httpx.get(ld.url("/"))
    assert r.status_code == 200
    assert r.text == "hello from the lameduck demo origin\n"
    assert ld.stat("http.ingress.downstream_rq_2xx") == 1
    assert ld.stat("cluster.app.upstream_rq_total") == 1
