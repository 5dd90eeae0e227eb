"""``POST /drain_listeners`` over real sockets (Envoy's draining docs, and the usual Envoy
drain.sh preStop script): the gradual ramp of ``Connection: close`` on live keep-alive
connections, the proactive drain of idle ones inside [2T/3, T), and the listener that keeps
accepting with ``graceful&skip_exit``.
"""

from __future__ import annotations

import copy
import selectors
import subprocess
import threading
import time
from typing import Any

import httpx
import pytest

from tests.procs import AdminPoller, RawConn, base_config, refused, wait_until

pytestmark = pytest.mark.usefixtures("workers")


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-s", "--max-time", "5", *args], capture_output=True,
                          text=True, check=False)


# -- the drain.sh preStop script: graceful&skip_exit ------------------------------------------


def test_long_request_survives_graceful_skip_exit(lameduck) -> None:
    """A request longer than the drain completes with 200; downstream_rq_active reads 1 during
    and 0 after; the listener keeps accepting after T; the process stays LIVE and running."""
    ld = lameduck(drain={"time": "1s", "strategy": "gradual", "connection_grace": "200ms"})
    admin = f"http://{ld.admin_addr}"
    long = RawConn(ld.addr)
    long.send("/sleep?ms=2500")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)

    t0 = time.monotonic()
    out = curl("-X", "POST", f"{admin}/drain_listeners?graceful&skip_exit")
    assert out.stdout == "OK\n"
    # The poll of the usual Envoy drain.sh preStop script, verbatim.
    during = curl(f"{admin}/stats?filter=downstream_rq_active|upstream_rq_active").stdout
    assert during.splitlines() == ["cluster.app.upstream_rq_active: 1",
                                   "http.ingress.downstream_rq_active: 1"]
    info = ld.server_info()
    assert info["state"] == "LIVE"
    assert info["drain"]["active"] is True
    assert info["drain"]["cause"] == "drain_listeners"
    assert info["drain"]["strategy"] == "gradual"
    assert info["drain"]["time"] == 1.0
    assert 0 <= info["drain"]["elapsed"] < 1.0
    assert info["listeners"][0]["draining"] is True
    assert ld.stat("listener_manager.total_listeners_draining") == 1
    assert ld.stat("server.drain.active") == 1
    # drain_listeners is not health-check fail: /ready stays 200 LIVE.
    ready = ld.admin("GET", "/ready")
    assert (ready.status_code, ready.text) == (200, "LIVE\n")

    # After T the listener still accepts (skip_exit): a new connection gets a 200.
    time.sleep(max(0.0, t0 + 1.2 - time.monotonic()))
    late = httpx.get(ld.url("/"))
    assert late.status_code == 200
    assert late.headers["connection"] == "close"  # past T/2 every response drains
    assert ld.server_info()["listeners"][0]["accepting"] is True

    done = long.read_response()
    assert (done.status, done.body, done.complete) == (200, b"slept 2500 ms\n", True)
    assert time.monotonic() - t0 >= 2.0
    assert long.wait_eof(2)  # it carried Connection: close and the server closed after it
    long.close()
    after = curl(f"{admin}/stats?filter=downstream_rq_active|upstream_rq_active").stdout
    assert after.splitlines() == ["cluster.app.upstream_rq_active: 0",
                                  "http.ingress.downstream_rq_active: 0"]
    info = ld.server_info()
    assert info["drain"]["active"] is False  # T passed and nothing in flight
    assert info["state"] == "LIVE"
    assert ld.admin("GET", "/ready").status_code == 200
    assert ld.proc is not None and ld.proc.poll() is None  # skip_exit: still running
    assert httpx.get(ld.url("/")).status_code == 200
    assert ld.stat("server.drain.cut") == 0


def test_not_graceful_stops_accepting_at_once_and_drains_existing(lameduck) -> None:
    ld = lameduck(drain={"time": "2s", "strategy": "gradual", "connection_grace": "200ms"})
    busy = RawConn(ld.addr)
    busy.send("/sleep?ms=3000")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1)
    assert ld.admin("POST", "/drain_listeners").text == "OK\n"
    assert wait_until(lambda: refused(ld.addr), 10)
    assert ld.server_info()["listeners"][0]["accepting"] is False
    r = busy.read_response()
    assert r.status == 200 and r.complete
    busy.close()
    assert ld.proc is not None and ld.proc.poll() is None  # a drain, not an exit
    assert ld.admin("GET", "/ready").status_code == 200


def test_skip_exit_without_graceful_is_rejected(lameduck) -> None:
    ld = lameduck()
    r = ld.admin("POST", "/drain_listeners?skip_exit")
    assert r.status_code == 400
    assert "graceful" in r.text
    assert ld.server_info()["drain"]["active"] is False


def test_graceful_without_skip_exit_stops_accepting_at_t(lameduck) -> None:
    """... and exits then, as Envoy does (test_admin.py has the exit's details)."""
    ld = lameduck(drain={"time": "800ms", "strategy": "gradual", "connection_grace": "200ms"})
    t0 = time.monotonic()
    ld.admin("POST", "/drain_listeners?graceful")
    assert not refused(ld.addr)
    assert wait_until(lambda: refused(ld.addr), 2)
    assert time.monotonic() - t0 >= 0.75
    assert ld.wait(5) == 0


def test_inboundonly_drains_only_inbound_listeners(origin_port: int, lameduck) -> None:
    cfg = base_config(origin_port)
    out = dict(copy.deepcopy(cfg["listeners"][0]), name="egress", direction="outbound",
               health_check_path=None)
    cfg["listeners"].append(out)
    cfg["drain"] = {"time": "1s", "strategy": "immediate", "connection_grace": "200ms"}
    ld = lameduck(cfg)
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit&inboundonly").text == "OK\n"
    listeners = {ls["name"]: ls for ls in ld.server_info()["listeners"]}
    assert listeners["ingress"]["draining"] is True
    assert listeners["egress"]["draining"] is False
    assert ld.stat("listener_manager.total_listeners_draining") == 1
    # immediate: every response on the inbound listener drains; the outbound one is untouched.
    assert httpx.get(ld.url("/")).headers.get("connection") == "close"
    with httpx.Client() as c:
        r = c.get(f"http://{ld.addr_of('egress')}/")
        assert r.status_code == 200 and "connection" not in r.headers




# -- the gradual ramp -------------------------------------------------------------------------


def test_gradual_ramp_on_live_keepalive_connections(lameduck) -> None:
    """20 keep-alive clients in a loop: no Connection: close before the drain, few in the first
    tenth of T, a rising share, and every response drains from T/2 on. Nothing fails."""
    T = 4.0
    ld = lameduck(drain={"time": "4s", "strategy": "gradual", "connection_grace": "200ms"})
    records: list[tuple[float, float, bool]] = []  # (sent, received, closes), monotonic
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        conn: RawConn | None = None
        try:
            while not stop.is_set():
                if conn is None:
                    conn = RawConn(ld.addr)
                sent = time.monotonic()
                r = conn.request("/")
                got = time.monotonic()
                if r.status != 200 or not r.complete:
                    raise AssertionError(f"status {r.status} complete={r.complete}")
                with lock:
                    records.append((sent, got, r.closes))
                if r.closes:
                    conn.close()
                    conn = None
                time.sleep(0.02)
        except BaseException as e:
            errors.append(e)
        finally:
            if conn is not None:
                conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    before = time.monotonic()
    ld.admin("POST", "/drain_listeners?graceful&skip_exit")
    after = time.monotonic()
    time.sleep(max(0.0, after + T / 2 + 0.6 - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(5)
    assert not errors, errors[:3]

    pre = [c for s, g, c in records if g < before]
    assert len(pre) > 50 and not any(pre)
    # A decision is made between send and receive, and the event started in [before, after]
    # (the admin call can take a while on a loaded machine): a window's bound on the ramp's
    # probability counts from ``before``, its lower bound from ``after``.
    first_tenth = [c for s, g, c in records if s >= before and g - before <= T / 10]
    q1 = [c for s, g, c in records if s >= before and g - before <= T / 4]
    q2 = [c for s, g, c in records if s - after >= T / 4 and g - before <= T / 2]
    late = [c for s, g, c in records if s - after >= T / 2]
    assert len(first_tenth) >= 20 and len(q1) >= 40 and len(q2) >= 40 and len(late) >= 20, (
        len(first_tenth), len(q1), len(q2), len(late))
    share = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert share(first_tenth) < 0.3, share(first_tenth)  # P <= 0.2 there, about 0.1 on average
    assert share(q2) > share(q1) + 0.15, (share(q1), share(q2))
    assert all(late), f"{late.count(False)} responses after T/2 kept their connection"
    stats = ld.stats()
    assert stats["http.ingress.downstream_rq_5xx"] == 0
    assert stats["http.ingress.downstream_cx_drain_close"] >= sum(c for _, _, c in records) - 20
    assert stats["server.drain.cx_drained_by_response"] >= 1


# -- the proactive drain ----------------------------------------------------------------------


def test_proactive_drain_closes_idle_keepalive_connections_spread_in_window(lameduck) -> None:
    """20 idle keep-alive connections: each is drained at a uniform moment in [2T/3, T-G) and
    closed G later, so every close lands in [2T/3+G, T), spread out, not all at once."""
    T, G = 3.0, 0.3
    ld = lameduck(drain={"time": "3s", "strategy": "gradual", "connection_grace": "300ms"})
    conns = [RawConn(ld.addr) for _ in range(20)]
    for c in conns:
        r = c.request("/")
        assert r.status == 200 and not r.closes
    admin = AdminPoller(ld.admin_addr)
    assert admin.stat("http.ingress.downstream_cx_active") == 20
    before = time.monotonic()
    assert admin.conn.request("/drain_listeners?graceful&skip_exit", "POST").status == 200
    after = time.monotonic()

    sel = selectors.DefaultSelector()
    for c in conns:
        c.sock.setblocking(False)
        sel.register(c.sock, selectors.EVENT_READ, c)
    closed: dict[Any, float] = {}
    data: list[bytes] = []
    end = before + T + 1.5
    while len(closed) < len(conns) and time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            c = key.data
            try:
                chunk = c.sock.recv(4096)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if chunk:
                data.append(chunk)
                continue
            closed[c] = time.monotonic()
            sel.unregister(c.sock)
    sel.close()
    assert not data, data[:3]  # nothing is sent to an idle connection: it is just closed
    assert len(closed) == 20, f"only {len(closed)} of 20 closed by T+1.5s"
    lo = min(closed.values())
    hi = max(closed.values())
    # close = start + moment + G with start in [before, after] and moment in [2T/3, T-G).
    assert lo - before >= 2 * T / 3 + G - 0.15, lo - before
    assert hi - after < T + 0.25, hi - after
    assert hi - lo > 0.25 * (T / 3 - G), f"closes not spread: span {hi - lo:.3f}s"
    stats = admin.stats()
    assert stats["server.drain.cx_drained_proactive"] == 20
    assert stats["http.ingress.downstream_cx_drain_close"] == 20
    # The staged close waits for the client's side (RFC 9112 §9.6); once it closes, all gone.
    for c in conns:
        c.close()
    assert wait_until(lambda: admin.stat("http.ingress.downstream_cx_active") == 0, 2)
    admin.close()


def test_no_proactive_drain_when_the_window_is_empty(lameduck) -> None:
    """G >= T/3: nothing is drained proactively; idle connections stay open past T."""
    ld = lameduck(drain={"time": "900ms", "strategy": "gradual", "connection_grace": "300ms"})
    conns = [RawConn(ld.addr) for _ in range(3)]
    for c in conns:
        assert c.request("/").status == 200
    ld.admin("POST", "/drain_listeners?graceful&skip_exit")
    assert not conns[0].wait_eof(1.3)
    assert ld.stat("server.drain.cx_drained_proactive") == 0
    # Their next response drains them (past T/2).
    for c in conns:
        r = c.request("/")
        assert r.status == 200 and r.closes
        c.close()


def test_local_answers_drain_their_connection_too(origin_port: int, lameduck) -> None:
    """Every response the policy drains carries Connection: close, the ones lameduck answers
    itself included (a load balancer's keep-alive health-check connection)."""
    ld = lameduck(route={"prefix": "/app"},
                  drain={"time": "1s", "strategy": "immediate", "connection_grace": "200ms"})
    hc, nf = RawConn(ld.addr), RawConn(ld.addr)
    assert hc.request("/health_check.html").status == 200
    assert nf.request("/nothing").status == 404
    ld.admin("POST", "/drain_listeners?graceful&skip_exit")
    r = nf.request("/nothing")
    assert r.status == 404
    h = hc.request("/health_check.html")
    assert h.status == 200  # drain_listeners is not health-check fail
    hc.close()
    nf.close()
    assert (r.closes, h.closes) == (True, True)
