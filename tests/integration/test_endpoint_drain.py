"""Upstream endpoint drain (after Kemp LoadMaster's drain stop and HAProxy's DRAIN server
state): admin states READY / DRAIN / MAINT set at run time, persistence by cookie and by source
IP, the drain-stop timer and what it does to sticky clients and to open connections, and TCP
(Layer-4) listeners, with real lameduck and several real demo origins (``x-origin`` tells which
one answered).

One lameduck serves most tests (a start costs ~1.5 s): each test has a cluster of its own,
reached over the HTTP listener by ``Host: <cluster>`` or over a TCP listener of its own, so no
test sees another's admin states, records or counters. The SIGTERM tests start their own.

The clocks compare: lameduck's loop.time() and time.monotonic() here are the same
CLOCK_MONOTONIC, so "moved no earlier than drain_stop after the POST" is exact; upper bounds
stay loose (two noisy cores).
"""

from __future__ import annotations

import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import procs
from tests.procs import (
    Lameduck,
    Origin,
    RawConn,
    Reply,
    base_config,
    start_named_origin,
    until_moved_off,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("workers")

STREAM = "/stream?chunks=50&size=100&interval_ms=100"  # 5000 bytes over ~4.9 s
STREAM_BYTES = 5000


# -- processes ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(workers: int) -> Iterator[list[Origin]]:
    """Four named demo origins, o1..o4, for the shared lameduck (o4 is only the ``tcpfail``
    cluster's, which kills it)."""
    made: list[Origin] = []
    try:
        for i in range(4):
            made.append(start_named_origin(f"o{i + 1}"))
        yield made
    finally:
        for o in made:
            o.kill()
        errors = {o.name: o.stderr() for o in made}
        for o in made:
            o.close()
    for name, err in errors.items():
        assert "Traceback" not in err, f"{name}: {err}"


@pytest.fixture(scope="module")
def shared(pool: list[Origin], tmp_path_factory: pytest.TempPathFactory,
           workers: int) -> Iterator[Lameduck]:
    """(``workers``: made again for each count, not shared across them.)"""
    o1, o2, o3, o4 = pool
    two = [o1.addr, o2.addr]
    http: dict[str, dict[str, Any]] = {
        "admin": {"endpoints": [o1.addr, {"address": o2.addr, "weight": 2}]},
        "plain": {"drain_stop": "2s"},
        "cookie": {"drain_stop": "2s", "persistence": {"type": "cookie", "timeout": "30m"}},
        "srcip": {"drain_stop": "1500ms",
                  "persistence": {"type": "source_ip", "timeout": "30m"}},
        "clear": {"drain_stop": "30s", "clear_persistence_on_drain": True,
                  "persistence": {"type": "cookie"}},
        "drop": {"drain_stop": "1500ms", "drop_at_drain_end": True},
        "keep": {"drain_stop": "1s"},
        "zero": {"drain_stop": "0s"},
        "maint": {"drain_stop": "30s", "persistence": {"type": "cookie"}},
        "expire": {"persistence": {"type": "cookie", "timeout": "1s"}},
        "initial": {"lb_policy": "least_request", "endpoints": [
            o1.addr, {"address": o2.addr, "state": "drain"},
            {"address": o3.addr, "state": "maint"}]},
    }
    tcp: dict[str, dict[str, Any]] = {
        "tcprr": {},
        "tcpsticky": {"drain_stop": "30s",
                      "persistence": {"type": "source_ip", "timeout": "30m"}},
        "tcpcookie": {"persistence": {"type": "cookie"}},
        "tcpnone": {"endpoints": [{"address": o1.addr, "state": "maint"},
                                  {"address": o2.addr, "state": "maint"}]},
        "tcpfail": {"endpoints": [o4.addr, o2.addr]},
        "tcpzero": {"drain_stop": "0s"},
        "tcpdrop": {"drain_stop": "1s", "drop_at_drain_end": True},
    }
    cfg = base_config(o1.port)
    cfg["listeners"][0]["routes"] = [
        {"host": name, "prefix": "/", "cluster": name, "timeout": "30s"} for name in http]
    cfg["clusters"] = [{"name": name, "endpoints": two, **extra}
                       for name, extra in {**http, **tcp}.items()]
    for name in tcp:
        cfg["listeners"].append({"name": name, "address": "127.0.0.1:0", "protocol": "tcp",
                                 "cluster": name, "quiet_period": "300ms"})
    ld = Lameduck(cfg, tmp_path_factory.mktemp("shared"))
    try:
        yield ld.start()
    finally:
        ld.kill()
    assert "Traceback" not in ld.log(), ld.log()


# -- helpers --------------------------------------------------------------------------------------


def get(ld: Lameduck, c: str, path: str = "/", cookie: str | None = None,
        source: str = "127.0.0.1") -> Reply:
    """One request to cluster ``c`` on a fresh connection (no cookie jar: the test carries the
    cookie), from the loopback address ``source`` (127.0.0.2 is another client IP)."""
    headers = {"host": c}
    if cookie:
        headers["cookie"] = f"lameduck={cookie}"
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=10) as client:
        return Reply(client.get(ld.url(path), headers=headers))


def hosts(ld: Lameduck, c: str) -> dict[str, dict[str, Any]]:
    """/clusters?format=json for cluster ``c``: address → host status."""
    body = ld.admin("GET", "/clusters?format=json").json()
    (cl,) = [x for x in body["cluster_statuses"] if x["name"] == c]
    return {h["address"]: h for h in cl["host_statuses"]}


def set_state(ld: Lameduck, c: str, o: Origin, state: str) -> float:
    """POST the endpoint's admin state; returns time.monotonic() from just before the POST (the
    endpoint's drain_since is no earlier)."""
    t0 = time.monotonic()
    r = ld.admin("POST", f"/clusters/{c}/endpoints/{o.addr}?state={state}")
    assert r.status_code == 200, r.text
    return t0


def stat(ld: Lameduck, name: str) -> int:
    return ld.stat(name)


def by_name(origins: list[Origin], name: str | None) -> Origin:
    (o,) = [o for o in origins if o.name == name]
    return o


def other(origins: list[Origin], name: str | None) -> Origin:
    """The one of the two that is not ``name``."""
    (o,) = [o for o in origins if o.name != name]
    return o


def tcp_port(ld: Lameduck, listener: str) -> int:
    return ld.port_of(listener)


def tcp_connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def tcp_ask(s: socket.socket, close: bool = False) -> str:
    """An HTTP/1.1 request over a raw socket relayed by a TCP listener (the origin answers with
    a sized body); the answering origin's name."""
    extra = b"Connection: close\r\n" if close else b""
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = s.recv(65536)
        if not data:
            raise ConnectionError(f"EOF before a response head: {buf!r}")
        buf += data
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    fields = {n.strip().lower(): v.strip() for n, _, v in (ln.partition(":") for ln in lines[1:])}
    n = int(fields["content-length"])
    while len(rest) < n:
        data = s.recv(65536)
        if not data:
            raise ConnectionError("EOF in a response body")
        rest += data
    return fields["x-origin"]


def tcp_once(port: int, source: str = "127.0.0.1") -> str:
    """A new TCP connection through an L4 listener, one request on it: who answered."""
    with tcp_connect(port, source) as s:
        return tcp_ask(s, close=True)


def closed_how(s: socket.socket, timeout: float) -> str:
    """Wait for the peer to end the connection: "fin", "reset", or "open" (timed out); bytes
    still arriving are dropped."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        s.settimeout(left)
        try:
            if not s.recv(65536):
                return "fin"
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        except TimeoutError:
            return "open"
    return "open"


def start_stream(ld: Lameduck, c: str, path: str = STREAM) -> tuple[RawConn, str]:
    """A long chunked response begun through cluster ``c``: the connection and the origin."""
    conn = RawConn(ld.addr)
    conn.host = c
    conn.send(path)
    resp = conn.read_response(head_only=True)
    assert resp.status == 200
    name = resp.header("x-origin")
    assert name is not None
    return conn, name


# -- 1. the admin API -----------------------------------------------------------------------------


def test_admin_states_clusters_view_errors_and_per_endpoint_stats(shared, pool) -> None:
    ld, c = shared, "admin"
    o1, o2 = pool[:2]
    view = hosts(ld, c)
    assert set(view) == {o1.addr, o2.addr}
    for h in view.values():
        assert h["admin_state"] == "ready" and h["healthy"] is True
        assert h["health_flags"] == "healthy"
        assert h["stats"]["rq_total"] == 0 and h["stats"]["cx_total"] == 0
    assert view[o1.addr]["weight"] == 1 and view[o2.addr]["weight"] == 2

    # traffic: every endpoint's rq_total / rq_success is what the clients saw from it
    seen = {o1.name: 0, o2.name: 0}
    for _ in range(9):
        r = get(ld, c)
        assert r.status == 200
        seen[r.origin] += 1  # type: ignore[index]
    assert seen[o1.name] >= 1 and seen[o2.name] > seen[o1.name]  # weight 2 takes more
    view = hosts(ld, c)
    for o in (o1, o2):
        st = view[o.addr]["stats"]
        assert st["rq_total"] == seen[o.name] and st["rq_success"] == seen[o.name], st
        assert st["rq_error"] == 0 and st["rq_active"] == 0
        assert 1 <= st["cx_total"] <= seen[o.name]

    # rq_active / cx_active while a request is in flight there
    box: dict[str, Reply] = {}
    t = threading.Thread(target=lambda: box.update(r=get(ld, c, "/sleep?ms=1000")))
    t.start()
    try:
        assert wait_until(
            lambda: sum(h["stats"]["rq_active"] for h in hosts(ld, c).values()) == 1, 5, 0.02)
        busy = [a for a, h in hosts(ld, c).items() if h["stats"]["rq_active"] == 1]
        assert len(busy) == 1 and hosts(ld, c)[busy[0]]["stats"]["cx_active"] >= 1
    finally:
        t.join(10)
    assert box["r"].status == 200
    assert by_name([o1, o2], box["r"].origin).addr == busy[0]
    seen[box["r"].origin] += 1  # type: ignore[index]

    # state changes, shown in text and JSON
    set_state(ld, c, o1, "drain")
    set_state(ld, c, o2, "MAINT")  # case-insensitive
    view = hosts(ld, c)
    assert view[o1.addr]["admin_state"] == "drain"
    assert view[o2.addr]["admin_state"] == "maint"
    text = ld.admin("GET", "/clusters").text.splitlines()
    assert "admin::lb_policy::round_robin" in text
    assert f"admin::{o1.addr}::admin_state::drain" in text
    assert f"admin::{o2.addr}::admin_state::maint" in text
    assert f"admin::{o2.addr}::weight::2" in text
    assert f"admin::{o1.addr}::health_flags::healthy" in text
    assert f"admin::{o1.addr}::rq_total::{seen[o1.name]}" in text
    assert f"admin::{o2.addr}::rq_success::{seen[o2.name]}" in text
    for key in ("cx_active", "cx_connect_fail", "cx_total", "rq_active", "rq_error",
                "rq_success", "rq_timeout", "maxconn", "agent"):
        assert any(ln.startswith(f"admin::{o1.addr}::{key}::") for ln in text), key
    assert f"plain::{o1.addr}::admin_state::ready" in text  # other clusters untouched
    assert stat(ld, "cluster.admin.membership_excluded") == 2
    set_state(ld, c, o1, "ready")
    set_state(ld, c, o2, "ready")
    assert {h["admin_state"] for h in hosts(ld, c).values()} == {"ready"}
    assert stat(ld, "cluster.admin.membership_excluded") == 0

    # errors
    a = o1.addr
    assert ld.admin("POST", f"/clusters/nope/endpoints/{a}?state=drain").status_code == 404
    assert ld.admin("POST", "/clusters/admin/endpoints/127.0.0.1:1?state=drain").status_code == 404
    assert ld.admin("POST", f"/clusters/admin/hosts/{a}?state=drain").status_code == 404
    assert ld.admin("POST", f"/clusters/admin/endpoints/{a}?state=sleepy").status_code == 400
    assert ld.admin("POST", f"/clusters/admin/endpoints/{a}").status_code == 400
    assert ld.admin("POST", f"/clusters/admin/endpoints/{a}?state=").status_code == 400
    r = ld.admin("GET", f"/clusters/admin/endpoints/{a}?state=drain")
    assert r.status_code == 405 and r.headers.get("allow") == "POST"
    assert {h["admin_state"] for h in hosts(ld, c).values()} == {"ready"}  # nothing changed


# -- 2. DRAIN without persistence -----------------------------------------------------------------


def test_drain_without_persistence_no_new_requests_in_flight_finishes(shared, pool) -> None:
    ld, c, os_ = shared, "plain", pool[:2]
    for _ in range(4):  # both in use, pooled connections to both
        assert get(ld, c).status == 200

    # a keep-alive client with a request in flight (seconds: still in flight through the
    # steps below on a loaded machine); its endpoint found from one look at /clusters
    conn = RawConn(ld.addr, 30)
    conn.host = c
    conn.send("/sleep?ms=4000")
    found: list[str] = []

    def in_flight() -> bool:
        found[:] = [a for a, h in hosts(ld, c).items() if h["stats"]["rq_active"] == 1]
        return len(found) == 1

    assert wait_until(in_flight, 15, 0.01)
    x = next(o for o in os_ if o.addr == found[0])
    y = other(os_, x.name)
    set_state(ld, c, x, "drain")
    before = hosts(ld, c)[x.addr]["stats"]["rq_total"]

    assert [get(ld, c).origin for _ in range(10)] == [y.name] * 10

    resp = conn.read_response()
    assert resp.status == 200 and resp.complete
    assert resp.body == b"slept 4000 ms\n" and resp.header("x-origin") == x.name
    # the same keep-alive client connection: its next request is balanced anew, elsewhere
    resp = conn.request("/")
    assert resp.status == 200 and resp.header("x-origin") == y.name
    conn.close()
    assert hosts(ld, c)[x.addr]["stats"]["rq_total"] == before
    assert stat(ld, "cluster.plain.membership_excluded") == 1
    assert stat(ld, "cluster.plain.upstream_cx_drain_stop_drop") == 0


# -- 3. cookie persistence ------------------------------------------------------------------------


def test_cookie_sticky_client_kept_until_drain_stop_then_moved(shared, pool) -> None:
    ld, c, os_ = shared, "cookie", pool[:2]
    first = get(ld, c)
    assert first.status == 200 and first.cookie is not None
    a, x = first.cookie, by_name(os_, first.origin)
    y = other(os_, x.name)
    for _ in range(5):  # sticks, and the record is only refreshed: no new cookie
        r = get(ld, c, cookie=a)
        assert (r.origin, r.cookie) == (x.name, None)
    assert stat(ld, "cluster.cookie.lb_persistence_records") == 1

    t0 = set_state(ld, c, x, "drain")
    r = get(ld, c, cookie=a)
    assert (r.origin, r.cookie) == (x.name, None)  # still there, refreshed
    cookies = {a}
    for _ in range(4):  # new clients: elsewhere, each with a record of its own
        r = get(ld, c)
        assert r.origin == y.name and r.cookie is not None and r.cookie not in cookies
        cookies.add(r.cookie)
    assert stat(ld, "cluster.cookie.lb_persistence_records") == 5

    moved, after, sticky = until_moved_off(lambda: get(ld, c, cookie=a), x.name, t0)
    assert after >= 2.0, "moved before drain_stop"
    assert after < 2.0 + 2.5, "kept long after drain_stop"
    assert sticky >= 2
    assert moved.origin == y.name and moved.cookie is not None and moved.cookie not in cookies
    b = moved.cookie
    for _ in range(3):  # the new record sticks
        r = get(ld, c, cookie=b)
        assert (r.origin, r.cookie) == (y.name, None)
    # the old cookie's record was discarded: bringing it again makes a new record
    r = get(ld, c, cookie=a)
    assert r.origin == y.name and r.cookie is not None and r.cookie not in (a, b)
    assert stat(ld, "cluster.cookie.lb_persistence_records") == 6
    assert hosts(ld, c)[x.addr]["stats"]["rq_total"] == 1 + 5 + sticky


# -- 4. source-IP persistence on the HTTP listener ------------------------------------------------


def test_source_ip_sticky_on_http_listener(shared, pool) -> None:
    ld, c, os_ = shared, "srcip", pool[:2]
    # every connection from 127.0.0.1 is one client: one record, one endpoint, no cookie
    replies = [get(ld, c) for _ in range(6)]
    assert {r.status for r in replies} == {200}
    assert len({r.origin for r in replies}) == 1, [r.origin for r in replies]
    assert {r.cookie for r in replies} == {None}
    x = by_name(os_, replies[0].origin)
    y = other(os_, x.name)
    assert stat(ld, "cluster.srcip.lb_persistence_records") == 1

    t0 = set_state(ld, c, x, "drain")
    assert get(ld, c).origin == x.name  # 127.0.0.1's record still honoured
    r2 = get(ld, c, source="127.0.0.2")  # a new client IP: only READY endpoints
    assert r2.origin == y.name and r2.cookie is None
    assert stat(ld, "cluster.srcip.lb_persistence_records") == 2

    sticky = 1
    moved: Reply | None = None
    moved_at = 0.0
    while time.monotonic() < t0 + 8:
        r = get(ld, c)
        if r.origin != x.name:
            moved, moved_at = r, time.monotonic()
            break
        sticky += 1
        time.sleep(0.1)
    assert moved is not None, "127.0.0.1 never moved off the DRAIN endpoint"
    assert moved_at - t0 >= 1.5 and sticky >= 2
    assert moved.origin == y.name and moved.cookie is None
    assert [get(ld, c).origin for _ in range(3)] == [y.name] * 3  # the new record sticks
    assert stat(ld, "cluster.srcip.lb_persistence_records") == 2


# -- 5. clear_persistence_on_drain ----------------------------------------------------------------


def test_clear_persistence_on_drain_rebalances_at_once(shared, pool) -> None:
    ld, c, os_ = shared, "clear", pool[:2]
    first = get(ld, c)
    a, x = first.cookie, by_name(os_, first.origin)
    assert a is not None
    r = get(ld, c, cookie=a)
    assert (r.origin, r.cookie) == (x.name, None)
    set_state(ld, c, x, "drain")
    r = get(ld, c, cookie=a)  # the very next request: re-balanced, cookie rewritten
    assert r.origin == other(os_, x.name).name
    assert r.cookie is not None and r.cookie != a
    r2 = get(ld, c, cookie=r.cookie)
    assert (r2.origin, r2.cookie) == (r.origin, None)


def test_cookie_record_refreshed_by_use_expires_after_timeout(shared, pool) -> None:
    ld, c = shared, "expire"  # persistence timeout 1 s
    first = get(ld, c)
    a = first.cookie
    assert a is not None
    end = time.monotonic() + 1.6
    while time.monotonic() < end:  # used every 0.4 s: refreshed, never expires
        time.sleep(0.4)
        r = get(ld, c, cookie=a)
        assert (r.origin, r.cookie) == (first.origin, None)
    time.sleep(1.3)  # unused for longer than the timeout
    r = get(ld, c, cookie=a)
    assert r.status == 200 and r.cookie is not None and r.cookie != a


# -- 6, 7. drain stop and open connections --------------------------------------------------------


def test_drop_at_drain_end_cuts_stream_when_drain_stop_expires(shared, pool) -> None:
    ld, c = shared, "drop"
    conn, name = start_stream(ld, c)
    t0 = set_state(ld, c, by_name(pool, name), "drain")
    body, complete = conn.read_chunked()
    cut_at = time.monotonic()
    conn.close()
    assert not complete and len(body) < STREAM_BYTES
    assert cut_at - t0 >= 1.5 - 0.05, f"cut {cut_at - t0:.2f} s after DRAIN, before drain_stop"
    assert len(body) >= 1000  # it kept flowing until then
    assert stat(ld, "cluster.drop.upstream_cx_drain_stop_drop") >= 1
    assert get(ld, c).origin == other(pool[:2], name).name


def test_without_drop_at_drain_end_stream_completes(shared, pool) -> None:
    ld, c = shared, "keep"
    path = "/stream?chunks=25&size=100&interval_ms=100"  # ~2.4 s, well past drain_stop (1 s)
    conn, name = start_stream(ld, c, path)
    t0 = set_state(ld, c, by_name(pool, name), "drain")
    body, complete = conn.read_chunked()
    done = time.monotonic()
    conn.close()
    assert complete and body == b"x" * 2500
    assert done - t0 > 1.0  # it did outlive drain_stop
    assert stat(ld, "cluster.keep.upstream_cx_drain_stop_drop") == 0


def test_drain_stop_zero_cuts_in_flight_at_once(shared, pool) -> None:
    ld, c = shared, "zero"
    conn, name = start_stream(ld, c)
    t0 = set_state(ld, c, by_name(pool, name), "drain")
    body, complete = conn.read_chunked()
    cut_at = time.monotonic()
    conn.close()
    assert not complete and len(body) < STREAM_BYTES
    assert cut_at - t0 < 1.5, f"cut {cut_at - t0:.2f} s after DRAIN (drain_stop 0s)"
    assert stat(ld, "cluster.zero.upstream_cx_drain_stop_drop") >= 1
    assert [get(ld, c).origin for _ in range(3)] == [other(pool[:2], name).name] * 3


# -- 8. MAINT -------------------------------------------------------------------------------------


def test_maint_gets_nothing_not_even_sticky_all_maint_503(shared, pool) -> None:
    ld, c, os_ = shared, "maint", pool[:2]
    first = get(ld, c)
    a, x = first.cookie, by_name(os_, first.origin)
    y = other(os_, x.name)
    assert a is not None and get(ld, c, cookie=a).origin == x.name
    set_state(ld, c, x, "maint")
    before = hosts(ld, c)[x.addr]["stats"]["rq_total"]
    r = get(ld, c, cookie=a)  # the sticky client is moved, with a new cookie
    assert r.origin == y.name and r.cookie is not None and r.cookie != a
    assert [get(ld, c).origin for _ in range(5)] == [y.name] * 5
    assert hosts(ld, c)[x.addr]["stats"]["rq_total"] == before
    assert stat(ld, "cluster.maint.membership_excluded") == 1

    set_state(ld, c, y, "maint")
    none_before = stat(ld, "cluster.maint.upstream_cx_none_healthy")
    for cookie in (None, a, r.cookie):
        r503 = get(ld, c, cookie=cookie)
        assert r503.status == 503 and r503.text == "no healthy upstream\n"
        assert r503.headers.get("retry-after") is not None
        assert r503.origin is None
    assert stat(ld, "cluster.maint.upstream_cx_none_healthy") == none_before + 3
    assert stat(ld, "cluster.maint.membership_excluded") == 2
    set_state(ld, c, x, "ready")
    assert get(ld, c).origin == x.name


# -- 9. initial states from the config ------------------------------------------------------------


def test_initial_states_from_config(shared, pool) -> None:
    ld, c = shared, "initial"
    o1, o2, o3 = pool[:3]
    assert [get(ld, c).origin for _ in range(8)] == [o1.name] * 8
    view = hosts(ld, c)
    assert [view[o.addr]["admin_state"] for o in (o1, o2, o3)] == ["ready", "drain", "maint"]
    assert view[o2.addr]["stats"]["rq_total"] == 0 and view[o3.addr]["stats"]["rq_total"] == 0
    assert stat(ld, "cluster.initial.membership_excluded") == 2
    body = ld.admin("GET", "/clusters?format=json").json()
    (cl,) = [x for x in body["cluster_statuses"] if x["name"] == c]
    assert cl["lb_policy"] == "least_request"
    set_state(ld, c, o2, "ready")
    # Picked at random among the two (least_request, both idle); with workers the new state
    # reaches each worker a moment after the admin call answers: bounded by time, not by 10
    # requests that can all come before it on a loaded machine.
    assert wait_until(lambda: get(ld, c).origin == o2.name, 10, 0.0)


# -- 10. TCP (Layer-4) listeners ------------------------------------------------------------------


def test_tcp_relays_and_round_robin_spreads(shared, pool) -> None:
    ld, c = shared, "tcprr"
    port = tcp_port(ld, c)
    names = [tcp_once(port) for _ in range(6)]
    if procs.DEFAULT_WORKERS == 1:
        assert sorted(names) == sorted([pool[0].name, pool[1].name] * 3), names
    else:  # each worker balances on its own, as each of Envoy's worker threads does
        assert set(names) == {pool[0].name, pool[1].name}, names
    with tcp_connect(port) as s:  # keep-alive HTTP over one relayed connection
        assert tcp_ask(s) == tcp_ask(s) == tcp_ask(s)
    assert wait_until(lambda: stat(ld, "tcp.tcprr.downstream_cx_active") == 0, 5, 0.02)
    st = ld.stats()
    assert st["tcp.tcprr.downstream_cx_total"] == 7
    assert st["tcp.tcprr.downstream_cx_cut"] == 0
    view = hosts(ld, c)
    assert sum(h["stats"]["cx_total"] for h in view.values()) == 7
    assert sum(h["stats"]["rq_success"] for h in view.values()) == 7


def test_tcp_source_ip_sticky_drain_discards_at_once(shared, pool) -> None:
    ld, c, os_ = shared, "tcpsticky", pool[:2]
    port = tcp_port(ld, c)
    names = [tcp_once(port) for _ in range(4)]
    assert len(set(names)) == 1, names
    x = by_name(os_, names[0])
    y = other(os_, x.name)
    held = tcp_connect(port)  # open to x before the drain
    try:
        assert tcp_ask(held) == x.name
        set_state(ld, c, x, "drain")
        # L4: the record is discarded at once although drain_stop is 30 s
        assert [tcp_once(port) for _ in range(3)] == [y.name] * 3
        assert tcp_once(port, source="127.0.0.2") == y.name
        # the open connection is not touched (no drop): still relayed to x
        assert tcp_ask(held) == x.name
    finally:
        held.close()
    assert stat(ld, "cluster.tcpsticky.upstream_cx_drain_stop_drop") == 0
    set_state(ld, c, x, "ready")
    assert tcp_once(port) == y.name  # the new record holds


def test_tcp_drain_stop_zero_and_drop_at_drain_end_sever_relays(shared, pool) -> None:
    """Existing relays are left alone by DRAIN (see tcpsticky) unless drain_stop is 0 (severed
    at once) or drop_at_drain_end (severed when drain_stop expires)."""
    ld = shared
    zero = tcp_connect(tcp_port(ld, "tcpzero"))
    drop = tcp_connect(tcp_port(ld, "tcpdrop"))
    try:
        xz = by_name(pool, tcp_ask(zero))
        xd = by_name(pool, tcp_ask(drop))
        set_state(ld, "tcpzero", xz, "drain")
        assert closed_how(zero, 5) in ("fin", "reset")  # at once: relays are left alone
        # otherwise, so the drain stop's drop (counted) is what closed it
        assert stat(ld, "cluster.tcpzero.upstream_cx_drain_stop_drop") == 1

        t0 = set_state(ld, "tcpdrop", xd, "drain")
        assert tcp_ask(drop) == xd.name  # still relayed before drain_stop
        assert closed_how(drop, 5) in ("fin", "reset")
        assert time.monotonic() - t0 >= 1.0 - 0.05
        assert stat(ld, "cluster.tcpdrop.upstream_cx_drain_stop_drop") == 1
    finally:
        zero.close()
        drop.close()
    assert tcp_once(tcp_port(ld, "tcpzero")) == other(pool[:2], xz.name).name
    assert wait_until(lambda: stat(ld, "tcp.tcpdrop.downstream_cx_active") == 0, 5, 0.02)
    assert stat(ld, "tcp.tcpzero.downstream_cx_active") == 0


def test_tcp_cookie_persistence_falls_back_to_source_ip(shared) -> None:
    """config/schema.py PersistenceConfig: "cookie: a cookie the proxy inserts (HTTP listeners
    only; a TCP listener falls back to the source IP)"."""
    ld, c = shared, "tcpcookie"
    port = tcp_port(ld, c)
    names = [tcp_once(port) for _ in range(4)]
    assert len(set(names)) == 1, f"not sticky by source IP: {names}"
    assert stat(ld, "cluster.tcpcookie.lb_persistence_records") == 1


def test_tcp_no_endpoint_closes_and_counts_no_route(shared) -> None:
    ld, c = shared, "tcpnone"  # both endpoints start in MAINT
    port = tcp_port(ld, c)
    try:
        s = tcp_connect(port)
    except ConnectionResetError:
        how = "reset"  # reset before connect() even returned
    else:
        with s:
            try:
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            except (ConnectionResetError, BrokenPipeError):
                how = "reset"
            else:
                how = closed_how(s, 5)
    assert how in ("fin", "reset")
    st = ld.stats()
    assert st["tcp.tcpnone.downstream_cx_no_route"] == 1
    assert st["cluster.tcpnone.upstream_cx_none_healthy"] == 1
    assert st["tcp.tcpnone.downstream_cx_total"] == 1
    assert st["tcp.tcpnone.downstream_cx_active"] == 0


def test_tcp_connect_failure_retried_on_other_endpoint(shared, pool) -> None:
    ld, c = shared, "tcpfail"
    o2, dead = pool[1], pool[3]
    port = tcp_port(ld, c)
    dead.kill()
    assert [tcp_once(port) for _ in range(4)] == [o2.name] * 4
    st = ld.stats()
    assert st["tcp.tcpfail.upstream_connect_fail"] >= 1
    assert st["cluster.tcpfail.upstream_cx_connect_fail"] == st["tcp.tcpfail.upstream_connect_fail"]
    view = hosts(ld, c)
    assert view[dead.addr]["stats"]["cx_connect_fail"] >= 1
    assert view[dead.addr]["stats"]["cx_total"] == 0
    assert view[o2.addr]["stats"]["rq_success"] == 4
    # Retried through the cluster's retry policy and budget, as an HTTP request is: each retry
    # that reached an endpoint gave its budget slot back as a success.
    retries = st["cluster.tcpfail.upstream_rq_retry"]
    assert retries >= 1 and st["cluster.tcpfail.upstream_rq_retry_success"] == retries


# -- 11. TCP listener drain (processes of their own) ----------------------------------------------


def tcp_config(origins: list[Origin]) -> dict[str, Any]:
    cfg = base_config(origins[0].port, cluster={"endpoints": [o.addr for o in origins]})
    cfg["listeners"].append({"name": "l4", "address": "127.0.0.1:0", "protocol": "tcp",
                             "cluster": "app", "quiet_period": "300ms"})
    return cfg


def test_tcp_drain_idle_closed_at_moment_busy_cut_at_deadline(lameduck, origins) -> None:
    os_ = origins(2)
    ld = lameduck(tcp_config(os_))  # drain time 2 s, deadline 4 s
    port = tcp_port(ld, "l4")
    idle = tcp_connect(port)
    busy = tcp_connect(port)
    tcp_ask(idle)
    tcp_ask(busy)
    stop = threading.Event()
    answers: list[float] = []
    ended: dict[str, Any] = {}

    def chatter() -> None:
        """A request and its answer every 100 ms: never quiet for 300 ms."""
        try:
            while not stop.is_set():
                tcp_ask(busy)
                answers.append(time.monotonic())
                time.sleep(0.1)
        except (OSError, ConnectionError) as e:
            ended["at"], ended["exc"] = time.monotonic(), e

    t = threading.Thread(target=chatter)
    t.start()
    try:
        assert wait_until(lambda: len(answers) >= 2, 5, 0.01)
        t0 = time.monotonic()
        ld.signal(signal.SIGTERM)
        how = closed_how(idle, 6)
        idle_end = time.monotonic() - t0
        assert how == "fin", how  # closed gracefully, not reset at the deadline
        assert idle_end < 3.5, f"idle TCP connection closed {idle_end:.2f} s after SIGTERM"
        st = ld.stats()  # before the exit
        assert st["tcp.l4.downstream_cx_drain_close"] == 1
        assert st["tcp.l4.downstream_cx_active"] == 1 and st["tcp.l4.downstream_cx_cut"] == 0
        code = ld.wait(10)
        # The chatter sees the cut at its next ask (it sleeps 100 ms between them): wait for
        # that, not for a stop that could come first on a loaded machine.
        wait_until(lambda: "at" in ended, 5)
    finally:
        stop.set()
        t.join(10)
        idle.close()
        busy.close()
    assert code == 3, ld.log()
    assert "at" in ended, "the busy connection was never ended"
    busy_end = ended["at"] - t0
    assert busy_end >= 3.5, f"busy TCP connection ended {busy_end:.2f} s after SIGTERM"
    assert max(answers) - t0 > 2.5  # relayed past every proactive moment (drain time 2 s)
    assert re.search(r"proactively=1\b", ld.log()), ld.log()
    assert re.search(r"\bcut=1\b", ld.log()), ld.log()


def test_tcp_drain_idle_only_exits_zero(lameduck, origins) -> None:
    os_ = origins(1)
    ld = lameduck(tcp_config(os_))
    with tcp_connect(tcp_port(ld, "l4")) as idle:
        assert tcp_ask(idle) == os_[0].name
        t0 = time.monotonic()
        ld.signal(signal.SIGTERM)
        assert closed_how(idle, 6) == "fin"
        assert time.monotonic() - t0 < 3.5
        assert ld.wait(10) == 0, ld.log()
    assert re.search(r"\bcut=0\b", ld.log()), ld.log()
