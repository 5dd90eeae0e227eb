"""Load balancing, persistence, endpoint admin states and safe retries on the HTTP/2 paths:

- HTTP/2 clients downstream (h2c prior knowledge: httpx with ``http2=True, http1=False``, and
  the raw-frame client tests/h2raw.py for several streams in flight on one connection) in front
  of HTTP/1.1 demo origins (``x-origin`` tells which one answered, ``--log`` what each saw);
- ``protocol: h2`` clusters of several real h2c origins (tests/h2origin.py: its ``request``
  lines tell which origin processed, or was refused, each stream).

Timing bounds are loose (a noisy 2-core machine); lower bounds ("no earlier than drain_stop")
are exact, since lameduck's loop.time() and time.monotonic() here are the same clock.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from typing import Any

import httpx
import pytest
from hyperframe.frame import RstStreamFrame

from tests import procs
from tests.h2raw import RawH2
from tests.procs import (
    PERSISTENCE_COOKIE,
    H2Origin,
    Lameduck,
    Origin,
    Reply,
    base_config,
    until_moved_off,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("workers")

INTERNAL_ERROR, CANCEL = 2, 8


# -- helpers ----------------------------------------------------------------------------------


def _cfg(origin_port: int, **cluster: Any) -> dict[str, Any]:
    """base_config with its one cluster ``app`` made of ``cluster`` (endpoints and options)."""
    cfg = base_config(origin_port)
    cfg["clusters"] = [{"name": "app", **cluster}]
    return cfg


def _port(ld: Lameduck) -> int:
    return int(ld.addr.rsplit(":", 1)[1])


def h2client(local_address: str | None = None) -> httpx.Client:
    """An h2c prior-knowledge client (every request an HTTP/2 stream); no cookie jar in
    effect: ``get2`` clears it, the tests carry the cookie themselves."""
    transport = httpx.HTTPTransport(http1=False, http2=True, local_address=local_address)
    return httpx.Client(transport=transport, timeout=15)


def get2(c: httpx.Client, ld: Lameduck, path: str = "/", cookie: str | None = None) -> Reply:
    c.cookies.clear()
    headers = {"cookie": f"lameduck={cookie}"} if cookie else {}
    r = Reply(c.get(ld.url(path), headers=headers), "HTTP/2")
    c.cookies.clear()
    return r


def hosts(ld: Lameduck, cluster: str = "app") -> dict[str, dict[str, Any]]:
    """/clusters?format=json for one cluster: address → host status."""
    body = ld.admin("GET", "/clusters?format=json").json()
    (cl,) = [x for x in body["cluster_statuses"] if x["name"] == cluster]
    return {h["address"]: h for h in cl["host_statuses"]}


def set_state(ld: Lameduck, addr: str, state: str, cluster: str = "app") -> float:
    """POST an endpoint's admin state; time.monotonic() from just before the POST."""
    t0 = time.monotonic()
    r = ld.admin("POST", f"/clusters/{cluster}/endpoints/{addr}?state={state}")
    assert r.status_code == 200, r.text
    return t0


def cstat(ld: Lameduck, name: str, cluster: str = "app") -> int:
    return ld.stats()[f"cluster.{cluster}.{name}"]


def header(raw: RawH2, sid: int, name: str) -> list[str]:
    """Values of response field ``name`` on stream ``sid`` of a raw HTTP/2 connection."""
    return [v for n, v in raw.streams[sid].headers if n == name]


def by_name(os_: list[Origin], name: str | None) -> Origin:
    (o,) = [o for o in os_ if o.name == name]
    return o


def paths(o: H2Origin, path: str) -> int:
    """How many streams with ``path`` the h2 origin processed (or refused: it logs them too)."""
    return sum(1 for r in o.records("request") if r["path"] == path)


def settled(ld: Lameduck, cluster: str = "app") -> None:
    """Nothing left counted in flight: no request, no upstream request on any endpoint."""
    def idle() -> bool:
        st = ld.stats()
        return (st["http.ingress.downstream_rq_active"] == 0
                and st[f"cluster.{cluster}.upstream_rq_active"] == 0
                and all(h["stats"]["rq_active"] == 0 for h in hosts(ld, cluster).values()))
    assert wait_until(idle, 5, 0.05), (ld.stats(), hosts(ld, cluster))


def seen(path: str, *os_: H2Origin, total: int) -> tuple[int, ...]:
    """How many ``path`` streams each origin logged, once ``total`` were logged in all (their
    stdout is read by a thread: a line printed before the answer may be read after it)."""
    wait_until(lambda: sum(paths(o, path) for o in os_) >= total, 5, 0.01)
    return tuple(paths(o, path) for o in os_)


def h2cluster_cfg(origin_port: int, *os_: H2Origin, **extra: Any) -> dict[str, Any]:
    return _cfg(origin_port, endpoints=[o.addr for o in os_], protocol="h2", **extra)


# -- 1. HTTP/2 client, cookie persistence -----------------------------------------------------


def test_h2_client_cookie_sticky_drain_stop_maint_and_503(lameduck, origins) -> None:
    os_ = origins(2)
    ld = lameduck(_cfg(os_[0].port, endpoints=[o.addr for o in os_], drain_stop="1500ms",
                       persistence={"type": "cookie", "timeout": "30m"}))
    with h2client() as c:
        first = get2(c, ld)
        assert first.status == 200 and first.cookie is not None, first.headers
        a, x = first.cookie, by_name(os_, first.origin)
        (y,) = [o for o in os_ if o is not x]
        for _ in range(5):  # round robin would alternate: the cookie keeps it on x
            r = get2(c, ld, cookie=a)
            assert (r.status, r.origin, r.cookie) == (200, x.name, None)

    # several streams in flight on one connection: each new client stream gets a cookie of
    # its own; a cookie split over several ``cookie`` fields (RFC 9113 §8.2.3) is found
    raw = RawH2(_port(ld))
    try:
        raw.request(1, "/sleep?ms=200")
        raw.request(3, "/sleep?ms=200")
        raw.request(5, "/sleep?ms=200", headers=[("cookie", "a=1"), ("cookie", f"lameduck={a}"),
                                                 ("cookie", "b=2")])
        assert raw.wait(lambda: all(raw.done(s) for s in (1, 3, 5)), 10)
        assert [raw.streams[s].status for s in (1, 3, 5)] == [200, 200, 200]
        keys = []
        for sid in (1, 3):
            (sc,) = header(raw, sid, "set-cookie")
            m = PERSISTENCE_COOKIE.match(sc)
            assert m, sc
            keys.append(m.group(1))
        assert len({a, *keys}) == 3
        assert header(raw, 5, "set-cookie") == [] and header(raw, 5, "x-origin") == [x.name]
    finally:
        raw.close()
    assert cstat(ld, "lb_persistence_records") == 3

    # DRAIN: the sticky client stays until drain_stop, new clients go elsewhere
    with h2client() as c:
        t0 = set_state(ld, x.addr, "drain")
        r = get2(c, ld, cookie=a)
        assert (r.origin, r.cookie) == (x.name, None)
        r = get2(c, ld)
        assert r.origin == y.name and r.cookie is not None and r.cookie not in (a, *keys)
        moved, after, sticky = until_moved_off(lambda: get2(c, ld, cookie=a), x.name, t0)
        assert after >= 1.5, f"moved {after:.2f} s after DRAIN, before drain_stop"
        assert after < 1.5 + 3, "kept long after drain_stop"
        assert sticky >= 2
        assert moved.status == 200 and moved.origin == y.name
        assert moved.cookie is not None and moved.cookie != a  # the cookie is rewritten
        b = moved.cookie
        assert [get2(c, ld, cookie=b).origin for _ in range(3)] == [y.name] * 3

        # MAINT moves a sticky client at once, with a new cookie
        set_state(ld, x.addr, "ready")
        set_state(ld, y.addr, "maint")
        r = get2(c, ld, cookie=b)
        assert r.status == 200 and r.origin == x.name
        assert r.cookie is not None and r.cookie != b
        k = r.cookie
        assert get2(c, ld, cookie=k).origin == x.name

        # every endpoint MAINT: 503 + retry-after, over HTTP/2, for old and new clients
        set_state(ld, x.addr, "maint")
        none_before = cstat(ld, "upstream_cx_none_healthy")
        for cookie in (k, None):
            r = get2(c, ld, cookie=cookie)
            assert r.status == 503 and r.text == "no healthy upstream\n"
            assert r.headers.get("retry-after") is not None and r.origin is None
            assert r.cookie is None
        assert cstat(ld, "upstream_cx_none_healthy") == none_before + 2
        set_state(ld, y.addr, "ready")
        assert get2(c, ld).origin == y.name
    settled(ld)


# -- 2. HTTP/2 client, source-IP persistence --------------------------------------------------


def test_h2_client_source_ip_sticky_across_streams_and_connections(lameduck, origins) -> None:
    os_ = origins(2)
    ld = lameduck(_cfg(os_[0].port, endpoints=[o.addr for o in os_],
                       persistence={"type": "source_ip", "timeout": "30m"}))
    names: list[str | None] = []
    for _ in range(3):  # three connections from 127.0.0.1, three streams on each
        with h2client() as c:
            for _ in range(3):
                r = get2(c, ld)
                assert r.status == 200 and r.cookie is None
                names.append(r.origin)
    raw = RawH2(_port(ld))  # and concurrent streams on a fourth
    try:
        for sid in (1, 3, 5, 7):
            raw.request(sid, "/sleep?ms=100")
        assert raw.wait(lambda: all(raw.done(s) for s in (1, 3, 5, 7)), 10)
        for sid in (1, 3, 5, 7):
            assert raw.streams[sid].status == 200
            names.extend(header(raw, sid, "x-origin"))
    finally:
        raw.close()
    assert len(names) == 13 and len(set(names)) == 1, names  # round robin alone would alternate
    x = names[0]
    with h2client(local_address="127.0.0.2") as c:  # another client IP: balanced, then sticks
        other = [get2(c, ld).origin for _ in range(4)]
    assert len(set(other)) == 1, (x, other)
    if procs.DEFAULT_WORKERS == 1:  # one balancer: round robin moved on; with workers, each
        assert other[0] != x, (x, other)  # balances on its own (as Envoy's worker threads)
    assert cstat(ld, "lb_persistence_records") == 2
    settled(ld)


# -- 3. HTTP/2 client, an origin SIGKILLed with requests in flight on it ------------------------


def test_h2_client_origin_killed_in_flight_safe_requests_retried_post_not(lameduck,
                                                                         origins) -> None:
    victim, o2 = origins(2, log=True)
    # weights: the first requests all go to the victim (smooth weighted round robin)
    ld = lameduck(_cfg(victim.port, endpoints=[{"address": victim.addr, "weight": 100},
                                               {"address": o2.addr, "weight": 1}]))
    body = b"p" * 1000
    cl = [("content-length", str(len(body)))]
    raw = RawH2(_port(ld))
    try:
        raw.request(1, "/sleep?ms=1500", headers=[("x-request-id", "rid-get")])
        raw.request(3, "/sleep?ms=1500", "POST", body, [("x-request-id", "rid-post"), *cl])
        raw.request(5, "/sleep?ms=1500", "POST", body,
                    [("x-request-id", "rid-idem"), ("idempotency-key", "k-1"), *cl])
        raw.request(7, "/sleep?ms=1500", "POST", body,  # lameduck.resume commits it once
                    [("x-request-id", "rid-resume"), ("resume-token", "t"),
                     ("resume-seq", "4"), *cl])
        assert wait_until(lambda: len(victim.log_lines()) == 4, 5, 0.01), victim.log_lines()
        assert wait_until(lambda: hosts(ld)[victim.addr]["stats"]["rq_active"] == 4, 5, 0.02)
        assert o2.log_lines() == []
        victim.kill()
        assert raw.wait(lambda: all(raw.done(s) for s in (1, 3, 5, 7)), 10)
        got = {sid: (raw.streams[sid].status, header(raw, sid, "x-origin"))
               for sid in (1, 3, 5, 7)}
        assert got[1] == (200, [o2.name]), got
        assert got[3] == (502, []), got  # sent, not idempotent: never sent twice
        assert got[5] == (200, [o2.name]), got
        assert got[7] == (200, [o2.name]), got
        assert bytes(raw.streams[1].body) == b"slept 1500 ms\n"
        assert raw.streams[3].reset is None and raw.streams[3].ended
    finally:
        raw.close()
    ids = [ln.split()[-1] for ln in o2.log_lines()]
    assert sorted(ids) == ["rid-get", "rid-idem", "rid-resume"], o2.log_lines()
    s = ld.stats()
    assert s["cluster.app.upstream_rq_retry"] == 3
    assert s["cluster.app.upstream_rq_retry_success"] == 3
    assert s["http.ingress.downstream_rq_5xx"] == 1
    settled(ld)


# -- 4. HTTP/2 client, connect failure to a dead endpoint ---------------------------------------


def test_h2_client_connect_failure_retried_on_other_endpoint(lameduck, origins) -> None:
    dead, o2 = origins(2, log=True)
    dead.kill()
    ld = lameduck(_cfg(o2.port, endpoints=[dead.addr, o2.addr]))
    with h2client() as c:
        for _ in range(2):
            r = Reply(c.get(ld.url("/")), "HTTP/2")
            assert (r.status, r.origin) == (200, o2.name)
            # never sent: even a POST without Idempotency-Key may go elsewhere
            r = Reply(c.post(ld.url("/echo"), content=b"hello",
                             headers={"x-request-id": "rid-post"}), "HTTP/2")
            assert (r.status, r.origin, r.text) == (200, o2.name, "hello")
    s = ld.stats()
    fails = s["cluster.app.upstream_cx_connect_fail"]
    assert fails >= 1  # round robin lands on the dead one first
    assert s["cluster.app.upstream_rq_retry"] == fails
    assert s["cluster.app.upstream_rq_retry_success"] == fails
    assert hosts(ld)[dead.addr]["stats"]["cx_connect_fail"] == fails
    assert [ln.split()[-1] for ln in o2.log_lines()].count("rid-post") == 2
    settled(ld)


def test_h2_client_retry_ended_by_client_gives_back_its_retry_budget(lameduck,
                                                                     origins) -> None:
    """A retry holds a slot of the retry budget while it is in flight; a retrying stream that
    the client ends (RST_STREAM, or its connection closed) must give the slot back, or the
    budget leaks until no retry is ever allowed. Budget: one retry in flight at a time."""
    dead, o2 = origins(2)
    dead.kill()
    ld = lameduck(_cfg(o2.port, endpoints=[dead.addr, o2.addr], retry_policy={
        "retry_budget": {"budget_percent": 0, "min_retry_concurrency": 1}}))

    def retrying_stream_ended_by_client(how: str) -> None:
        raw = RawH2(_port(ld))
        try:
            raw.request(1, "/sleep?ms=3000")  # dead first (connect refused), then o2
            assert wait_until(lambda: hosts(ld)[o2.addr]["stats"]["rq_active"] == 1, 5, 0.02)
            if how == "rst":
                raw.send(RstStreamFrame(1, error_code=CANCEL).serialize())
        finally:
            raw.close()
        settled(ld)

    for how in ("rst", "close"):
        retrying_stream_ended_by_client(how)
        with h2client() as c:
            # one of them lands on dead
            got = [Reply(c.get(ld.url("/")), "HTTP/2") for _ in range(2)]
        assert [(r.status, r.origin) for r in got] == [(200, o2.name)] * 2, (
            how, [r.text for r in got], ld.stats()["cluster.app.upstream_rq_retry_overflow"])
    assert cstat(ld, "upstream_rq_retry_overflow") == 0


# -- 5. protocol: h2 cluster of two h2 origins ------------------------------------------------


def test_h2_cluster_round_robin_and_drain_keeps_in_flight(lameduck, h2origin) -> None:
    a, b = h2origin(), h2origin()
    ld = lameduck(h2cluster_cfg(a.port, a, b))
    with h2client() as c:
        for _ in range(6):
            r = c.get(ld.url("/"))
            assert r.status_code == 200 and r.text == "hello from h2 origin\n"
    assert seen("/", a, b, total=6) == (3, 3)  # round robin over both

    box: dict[str, httpx.Response] = {}

    def slow() -> None:
        with h2client() as c2:
            box["r"] = c2.get(ld.url("/slow/1500"))

    t = threading.Thread(target=slow)
    t.start()
    try:
        assert wait_until(lambda: paths(a, "/slow/1500") + paths(b, "/slow/1500") == 1, 5, 0.01)
        x, y = (a, b) if paths(a, "/slow/1500") else (b, a)
        set_state(ld, x.addr, "drain")
        with h2client() as c:
            for _ in range(6):
                assert c.get(ld.url("/")).status_code == 200
        assert seen("/", x, y, total=12) == (3, 9)  # new streams: all on the other
        assert box.get("r") is None, "the slow request ended before DRAIN was checked"
    finally:
        t.join(10)
    r = box["r"]
    assert r.status_code == 200 and r.text == "slow\n"  # in flight on the drained one: finished
    assert (paths(x, "/slow/1500"), paths(y, "/slow/1500")) == (1, 0)
    view = hosts(ld)
    assert view[x.addr]["admin_state"] == "drain" and view[y.addr]["admin_state"] == "ready"
    assert cstat(ld, "upstream_rq_retry") == 0
    assert cstat(ld, "upstream_cx_drain_stop_drop") == 0
    settled(ld)


def _refuse_next_time_not(o: H2Origin, key: str) -> None:
    """Make ``o`` answer ``/refuse-once/<key>`` (its first request with a key is refused):
    one refused request straight to it."""
    with httpx.Client(http1=False, http2=True, timeout=5) as c, \
            contextlib.suppress(httpx.HTTPError):
        c.get(o.url(f"/refuse-once/{key}"))
    assert seen(f"/refuse-once/{key}", o, total=1) == (1,)


def test_h2_cluster_refused_stream_retried_on_other_endpoint(lameduck, h2origin) -> None:
    """REFUSED_STREAM proves a stream unprocessed: it goes to the OTHER endpoint, a POST too
    (with its body replayed). ``a`` is picked first (round robin starts at the first endpoint,
    and a retry moves the rotation on past ``b``); ``b`` has seen the keys already, so it answers
    where ``a`` refuses."""
    a, b = h2origin(), h2origin()
    ld = lameduck(h2cluster_cfg(a.port, a, b))
    for key in ("g1", "p1", "g2"):
        _refuse_next_time_not(b, key)
    body = bytes(range(256)) * 40
    with h2client() as c:  # an HTTP/2 client
        r = c.get(ld.url("/refuse-once/g1"))
        assert (r.status_code, r.text) == (200, f"0 {hashlib.sha256(b'').hexdigest()}\n")
        r = c.post(ld.url("/refuse-once/p1"), content=body)  # not idempotent: still safe
        assert (r.status_code, r.text) == (200, f"{len(body)} {hashlib.sha256(body).hexdigest()}\n")
    with httpx.Client(timeout=10) as c:  # and an HTTP/1.1 client
        r = c.get(ld.url("/refuse-once/g2"))
        assert r.status_code == 200
    for key in ("g1", "p1", "g2"):
        path = f"/refuse-once/{key}"
        assert seen(path, a, b, total=3) == (1, 2), (key, a.lines(), b.lines())
    assert cstat(ld, "upstream_rq_retry") == 3
    assert cstat(ld, "upstream_rq_retry_success") == 3

    # always unprocessed (GOAWAY below its stream id; REFUSED_STREAM): tried on each endpoint
    # in turn, a POST too, at most num_retries (2) times, then 503
    with h2client() as c:
        r = c.post(ld.url("/goaway"), content=b"body")
        assert r.status_code == 503
        r = c.get(ld.url("/refuse"))
        assert r.status_code == 503
    for path in ("/goaway", "/refuse"):
        assert sorted(seen(path, a, b, total=3)) == [1, 2], (a.lines(), b.lines())
    assert a.lines("goaway-sent") and b.lines("goaway-sent")
    assert cstat(ld, "upstream_rq_retry") == 3 + 2 + 2
    settled(ld)


# -- 6. protocol: h2 cluster, drain_stop 0s ------------------------------------------------------


def test_h2_cluster_drain_stop_zero_severs_connection(lameduck, h2origin) -> None:
    a, b = h2origin(), h2origin()
    ld = lameduck(h2cluster_cfg(a.port, a, b, drain_stop="0s"))
    raw = RawH2(_port(ld))
    try:
        # stream 1 -> a (round robin starts there): a POST still waiting for its answer
        raw.request(1, "/slow/5000", "POST", b"data", [("content-length", "4")])
        assert a.wait_line("request conn=1 ", 1), a.lines()
        raw.request(3, "/")  # -> b
        assert raw.wait(lambda: raw.done(3)) and raw.streams[3].status == 200
        # stream 5 -> a: its response under way (the head and a first echo went out)
        raw.request(5, "/echo", "POST", end=False)
        raw.data(5, b"ping")
        assert raw.wait(lambda: bytes(raw.streams[5].body) == b"ping")
        assert raw.streams[5].status == 200
        assert seen("/slow/5000", a, b, total=1) == (1, 0)
        assert seen("/echo", a, b, total=1) == (1, 0)
        assert seen("/", a, b, total=1) == (0, 1)

        t0 = set_state(ld, a.addr, "drain")
        assert raw.wait(lambda: raw.done(1) and raw.done(5), 5)
        cut = time.monotonic() - t0
        assert cut < 1.5, f"cut {cut:.2f} s after DRAIN (drain_stop 0s)"
        s1, s5 = raw.streams[1], raw.streams[5]
        assert s1.status == 502 and bytes(s1.body) == b"upstream reset before response\n"
        assert s5.reset == INTERNAL_ERROR and not s5.ended  # cut after its head: a reset
        # the client connection itself lives on, and new streams go to b
        raw.request(7, "/")
        assert raw.wait(lambda: raw.done(7)) and raw.streams[7].status == 200
    finally:
        raw.close()
    assert a.wait_line("closed conn=1 ", 1), a.lines()
    assert cstat(ld, "upstream_cx_drain_stop_drop") >= 1
    assert seen("/", a, b, total=2) == (0, 2)
    assert paths(b, "/slow/5000") == 0  # the POST was not sent again
    assert hosts(ld)[a.addr]["stats"]["cx_active"] == 0
    settled(ld)
