"""Acceptance of ``lameduck prestop`` (the job of the usual Envoy drain.sh preStop script, on
shortened timers) over real processes: HAProxy (the Debian package) as the external load
balancer health-checking two lameduck instances in front of the demo origin.

- hold-health keeps a backend in the LB while a request longer than the drain is in flight,
  fails its health check once nothing is in flight, and ends only after the LB took it out;
- a rolling prestop + SIGTERM + restart of both instances under steady load through HAProxy
  fails no request;
- the edges: exit codes 4 / 2 / 3, the deregister-first order, ``server.prestop_state``,
  ``/server_info``'s ``prestop`` and a second ``POST /prestop``.

HAProxy has no ``retry-on`` / ``redispatch`` (tests/haproxy.py): a request sent to a backend
that is gone would fail, so zero failures means the prestop took it out before it went.
"""

from __future__ import annotations

import asyncio
import copy
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import loadgen
from tests.procs import (
    AdminPoller,
    Lameduck,
    _env,
    listening_socket,
    refusing_port,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("workers")

HEALTH = "/health_check.html"
UPSTREAM_ACTIVE = "cluster.app.upstream_rq_active"  # proxied requests only (not health checks)


def prestop_cmd(admin: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "lameduck", "prestop", "--admin", admin, *args]


def run_prestop(admin: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(prestop_cmd(admin, *args), capture_output=True, text=True,
                          timeout=timeout, env=_env(), check=False)


def start_prestop(admin: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(prestop_cmd(admin, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())


def transitions(summary: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["from"], t["to"]) for t in summary["transitions"]]


class Fetch(threading.Thread):
    """One GET in a thread: ``status`` (or ``error``) and ``done_at`` (monotonic) when over."""

    def __init__(self, url: str, timeout: float = 15) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.timeout = timeout
        self.status: int | None = None
        self.error: str | None = None
        self.done_at: float | None = None
        self.started = time.monotonic()
        self.start()

    def run(self) -> None:
        try:
            self.status = httpx.get(self.url, timeout=self.timeout).status_code
        except httpx.HTTPError as e:
            self.error = repr(e)
        self.done_at = time.monotonic()


class Held(Fetch):
    """A ``POST /echo`` whose body ends when the test says (``release()``): a request in flight
    for as long as the test needs, however long the steps around it take on a loaded machine
    (a /sleep of fixed length ended before a loaded ``lameduck prestop`` had even started).
    A byte every half second keeps idle timers (HAProxy's, lameduck's request_body_timeout)
    from ending it; the origin echoes each."""

    def __init__(self, url: str, timeout: float = 60) -> None:
        self.gate = threading.Event()
        super().__init__(url, timeout)

    def _body(self) -> Iterator[bytes]:
        yield b"x"
        while not self.gate.wait(0.5):
            yield b"x"

    def run(self) -> None:
        try:
            self.status = httpx.post(self.url, content=self._body(),
                                     timeout=self.timeout).status_code
        except httpx.HTTPError as e:
            self.error = repr(e)
        self.done_at = time.monotonic()

    def release(self) -> None:
        self.gate.set()


def health(ld: Lameduck) -> int:
    return httpx.get(ld.url(HEALTH), timeout=2).status_code


def both_up(h: Any) -> None:
    for s in h.servers:
        assert h.wait_state(s, "UP", timeout=5) is not None, (h.server_states(), h.log())


# -- 1. hold-health protects a long request ----------------------------------------------------


def test_hold_health_protects_a_long_request(lameduck, haproxy) -> None:
    """The long request is held open by the test: it ends only once the FSM has been seen
    running and the test has sampled it in flight (HAProxy's state and the health check, at
    least 10 times and over at least 5 of HAProxy's check intervals), so every sample is
    surely "in flight under hold-health", whatever the CLI's start-up costs under load (a
    3 s /sleep once ended before a loaded CLI had started)."""
    a, b = lameduck(), lameduck()
    h = haproxy([a.port, b.port], interval=0.2, fall=2, rise=2)  # a is s1
    both_up(h)

    # The long request goes THROUGH HAProxy; round robin: if it landed on b, the next one
    # lands on a (b's is held too, and released at the end).
    fetches: list[Held] = []
    long_req: Held | None = None
    for _ in range(4):
        f = Held(h.url("/echo"))
        fetches.append(f)
        assert wait_until(lambda: a.stat(UPSTREAM_ACTIVE) + b.stat(UPSTREAM_ACTIVE)
                          >= len(fetches), 30, 0.01), "the long request reached no lameduck"
        if a.stat(UPSTREAM_ACTIVE) == 1:
            long_req = f
            break
    assert long_req is not None, "no long request landed on lameduck A"
    sent = long_req.started
    assert a.stat("http.ingress.downstream_rq_active") >= 1

    t0 = time.monotonic()
    proc = start_prestop(a.admin_addr, "--strategy", "hold-health", "--drain-timeout", "60s",
                         "--lb-buffer", "3s")
    poller = AdminPoller(a.admin_addr)
    # one keep-alive client for the checks: a sample costs a request, not a client's set-up
    # (the loop must sample often on a loaded machine)
    checker = httpx.Client(timeout=10)
    states_in_flight: list[str] = []
    health_in_flight: list[int] = []
    down_at: float | None = None
    fsm_seen: float | None = None  # when the FSM was first seen started (the CLI's start-up)
    released_at: float | None = None  # when the test let the long request end
    end = t0 + 90  # an upper bound: the loop ends with the prestop
    try:
        while proc.poll() is None and time.monotonic() < end:
            if fsm_seen is None and poller.stat("server.prestop_state") > 0:
                fsm_seen = time.monotonic()
            state = h.server_states()["s1"]
            now = time.monotonic()
            if released_at is None and fsm_seen is not None:
                # the FSM runs and the request is in flight: the test has not released it
                states_in_flight.append(state)
                health_in_flight.append(checker.get(a.url(HEALTH)).status_code)
                if (len(states_in_flight) >= 10
                        and time.monotonic() - fsm_seen >= 5 * h.interval):
                    released_at = time.monotonic()
                    long_req.release()
            if down_at is None and state == "DOWN":
                down_at = now
            time.sleep(0.05)
        ended_at = time.monotonic()
    finally:
        for f in fetches:
            f.release()
        poller.close()
        checker.close()
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate(timeout=30)
    for f in fetches:
        f.join(30)

    assert fsm_seen is not None, err
    assert released_at is not None, ("the prestop ended with the request in flight", out, err)
    assert long_req.status == 200, (long_req.error, h.log())
    assert long_req.done_at is not None and down_at is not None, (h.server_states(), err)
    rel = {"FSM seen started": fsm_seen - t0, "request released": released_at - t0,
           "long request done": long_req.done_at - t0, "s1 DOWN (sampled)": down_at - t0,
           "prestop exited": ended_at - t0}
    summary = json.loads(out)
    after = {f"{t['from']}->{t['to']}": t["after"] for t in summary["transitions"]}
    print(f"\nhold-health: long request sent {sent - t0:+.3f}s; times from the prestop start: "
          + ", ".join(f"{k} {v:.3f}s" for k, v in rel.items())
          + f"; FSM: {after}; samples in flight: {len(states_in_flight)}")
    print(err)

    # While the long request was in flight HAProxy kept s1 UP and its health check said 200.
    assert set(states_in_flight) == {"UP"}, states_in_flight
    assert set(health_in_flight) == {200}, health_in_flight
    # s1 went DOWN only after the request could end; the prestop ended only after that.
    assert down_at > released_at, rel
    assert ended_at >= down_at, rel
    assert proc.returncode == 0, (out, err)
    assert transitions(summary) == [("SERVING", "DRAINING"), ("DRAINING", "CLOSING"),
                                    ("CLOSING", "CLOSED")], summary
    closing = summary["transitions"][1]
    assert closing["reason"] == "no request in flight", summary
    # FSM time counts from POST /prestop, no later than fsm_seen: CLOSING came no sooner than
    # the release (the request ended after it); the times are rounded to the millisecond.
    assert closing["after"] >= released_at - fsm_seen - 0.001, (rel, summary)
    # (2.816 - 1.816 is 0.99999... in floats)
    assert summary["transitions"][2]["after"] - closing["after"] >= 3.0 - 0.0015, summary
    assert summary["state"] == "CLOSED" and summary["timed_out"] is False, summary
    assert a.stat("server.prestop_state") == 3
    assert h.server_states()["s2"] == "UP"


# -- 2. a rolling prestop + restart under load -------------------------------------------------


# The suite's 120 s per test guards against hangs; this roll (two prestops, two SIGTERMs, two
# start-ups, under its own load) took 81 s with two workers at load 16, and every step of it
# has a bound of its own.
@pytest.mark.timeout(300)
def test_rolling_prestop_and_restart_under_load_fails_nothing(lameduck, haproxy) -> None:
    # Each instance's port is held here and passed in (systemd socket activation), so its
    # replacement serves on the same port, the one HAProxy's server points at.
    socks = [listening_socket(), listening_socket()]
    a, b = (lameduck(activate=s) for s in socks)
    h = haproxy([a.port, b.port], interval=0.2, fall=2, rise=2)
    both_up(h)

    stop = threading.Event()
    result: dict[str, Any] = {}
    counts = loadgen.Counts()  # read as the load goes: requests answered during each step

    def load() -> None:
        t = time.monotonic()
        # closed-loop workers until stopped; bounded (180 s, 200 000 requests per worker) only
        # in case the test dies: a bound the roll outlives (25 s did, at load 12) would leave
        # its end without load
        asyncio.run(loadgen.run(h.port, 180, keepalive=8, fresh=2, limit=200_000, stop=stop,
                                counts=counts))
        result["seconds"] = time.monotonic() - t

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    time.sleep(1.0)  # steady state before the roll

    log: list[str] = []
    t0 = time.monotonic()
    replacements: list[Lameduck] = []
    answered_while_out: dict[str, int] = {}
    try:
        for server, old, sock in (("s1", a, socks[0]), ("s2", b, socks[1])):
            t = time.monotonic()
            # upper bounds, returned from early: the drain ends once nothing is in flight;
            # lb_buffer is only the LB's time to take it out (2 checks of 0.2 s), long enough
            # for a loaded HAProxy and lameduck
            r = run_prestop(old.admin_addr, "--strategy", "hold-health", "--drain-timeout",
                            "15s", "--lb-buffer", "3s", timeout=60)
            assert r.returncode == 0, (r.stdout, r.stderr)
            assert h.server_states()[server] == "DOWN", (h.server_states(), r.stderr)
            summary = json.loads(r.stdout)
            log.append(f"{server}: prestop {time.monotonic() - t:.2f}s "
                       f"(CLOSING after {summary['transitions'][1]['after']}s: "
                       f"{summary['transitions'][1]['reason']})")
            t = time.monotonic()
            old.signal(signal.SIGTERM)
            assert old.wait(30) == 0, old.log()
            ok_before = counts.ok  # from here until the replacement is UP: the other one's
            log.append(f"{server}: SIGTERM -> exit 0 in {time.monotonic() - t:.2f}s")
            cfg = copy.deepcopy(old.cfg)
            cfg["hot_restart"].pop("socket", None)  # its own rendezvous, not the dead one's
            t = time.monotonic()
            new = lameduck(cfg, activate=sock)
            replacements.append(new)
            assert new.port == old.port
            up = h.wait_state(server, "UP", timeout=30)
            assert up is not None, (h.server_states(), h.log())
            log.append(f"{server}: restarted, UP in HAProxy {time.monotonic() - t:.2f}s")
            answered_while_out[server] = counts.ok - ok_before
        roll = time.monotonic() - t0
        # traffic over both replacements
        assert wait_until(lambda: all(ld.stat("cluster.app.upstream_rq_total") > 0
                                      for ld in replacements), 30, 0.05)
        load_throughout = loader.is_alive()  # the load ran for the whole roll
    finally:
        stop.set()
        loader.join(30)
        for s in socks:
            s.close()  # the lameducks hold their own copies
    assert not loader.is_alive()
    total = counts.ok + counts.failed
    rate = total / result["seconds"]
    served = [ld.stat("cluster.app.upstream_rq_total") for ld in replacements]
    print(f"\nroll {roll:.2f}s; " + "; ".join(log))
    print(f"load {result['seconds']:.2f}s: {total} requests, {counts.ok} ok, "
          f"{counts.failed} failed, {counts.stale_retries} stale retries, "
          f"{counts.connections} connections, {rate:.0f} req/s; "
          f"replacements forwarded {served}; answered while each was out "
          f"{answered_while_out}; failures {counts.samples}")

    assert counts.failed == 0, (counts.samples, h.log())
    assert counts.stale_retries == 0, counts  # HAProxy keeps its client connections open
    # Not a speed floor (that is bench/'s): the load went on through the whole roll, and the
    # instance left in service answered requests while the other was gone (exited, its
    # replacement not UP yet).
    assert load_throughout, result
    assert all(n > 0 for n in answered_while_out.values()), answered_while_out
    assert all(n > 0 for n in served), served
    assert set(h.server_states().values()) == {"UP"}


# -- 3. the edges ------------------------------------------------------------------------------


def test_unreachable_admin_exits_4() -> None:
    r = run_prestop(f"127.0.0.1:{refusing_port()}", "--drain-timeout", "1s", "--lb-buffer", "0s")
    assert r.returncode == 4, (r.stdout, r.stderr)
    assert "unreachable" in r.stderr
    assert json.loads(r.stdout)["error"] == "admin unreachable"


def test_prestop_exits_without_the_interpreters_teardown(lameduck, tmp_path) -> None:
    """The hook's exit is the kubelet's cue for SIGTERM: it comes once its output is out, not
    after Python frees every module (seconds on a loaded node). Shown by an atexit handler,
    which runs in that teardown and not at os._exit: it must never run, and the summary and
    exit code must be whole all the same."""
    ld = lameduck()
    marker = tmp_path / "teardown"
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
            "from lameduck.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "prestop", "--admin", ld.admin_addr,
                        "--drain-timeout", "1s", "--lb-buffer", "0s"], capture_output=True,
                       text=True, timeout=30, env=_env(), check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert transitions(json.loads(r.stdout))[-1] == ("CLOSING", "CLOSED")
    assert not marker.exists(), "the interpreter's teardown ran"


def test_bad_strategy_exits_2_and_admin_refuses_400(lameduck) -> None:
    ld = lameduck()
    r = run_prestop(ld.admin_addr, "--strategy", "nope")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "invalid choice" in r.stderr
    r = run_prestop(ld.admin_addr, "--drain-timeout", "soon")
    assert r.returncode == 2, (r.stdout, r.stderr)
    resp = ld.admin("POST", "/prestop?strategy=nope")
    assert resp.status_code == 400, resp.text
    assert "nope" in resp.text
    assert ld.admin("POST", "/prestop?drain_timeout=soon").status_code == 400
    # Refused: nothing started.
    assert ld.server_info()["prestop"] == {"state": "SERVING"}
    assert ld.stat("server.prestop_state") == 0
    assert health(ld) == 200


def test_drain_timeout_with_a_request_in_flight_exits_3(lameduck) -> None:
    """The request is held open until the CLI has exited (a 2.5 s /sleep ended before a loaded
    CLI had started, and the drain saw nothing in flight): the FSM can only end by its
    drain_timeout, and a CLI waiting for the request would never return."""
    ld = lameduck()
    long_req = Held(ld.url("/echo"))
    try:
        assert wait_until(lambda: ld.stat(UPSTREAM_ACTIVE) == 1, 30, 0.01)
        r = run_prestop(ld.admin_addr, "--drain-timeout", "500ms", "--lb-buffer", "200ms")
    finally:
        long_req.release()
    summary = json.loads(r.stdout)
    print(f"\n{r.stderr}{summary}")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert summary["state"] == "CLOSED"
    assert summary["timed_out"] is True
    assert summary["in_flight_at_timeout"] == 1, summary
    closing = summary["transitions"][1]
    assert (closing["from"], closing["to"]) == ("DRAINING", "CLOSING")
    assert closing["reason"].startswith("drain_timeout with"), closing
    # at the drain_timeout, not before; the bound only catches a timer gone astray (waiting
    # for the request would not close at all while it is held)
    assert 0.5 <= closing["after"] < 5.0, closing
    # The FSM does not cut it (skip_exit): the request still completes.
    long_req.join(30)
    assert long_req.status == 200, long_req.error
    assert health(ld) == 503


def test_in_flight_counts_one_proxied_request_once(lameduck) -> None:
    ld = lameduck()
    long_req = Fetch(ld.url("/sleep?ms=1000"))
    assert wait_until(lambda: ld.stat(UPSTREAM_ACTIVE) == 1, 3, 0.01)
    view = ld.admin("POST", "/prestop?drain_timeout=100ms&lb_buffer=0s").json()
    long_req.join(5)
    assert long_req.status == 200
    assert view["in_flight"] == 1, view
    assert wait_until(lambda: ld.server_info()["prestop"]["state"] == "CLOSED", 3)
    summary = ld.server_info()["prestop"]
    assert summary["in_flight_at_timeout"] == 1, summary
    assert summary["transitions"][1]["reason"] == "drain_timeout with 1 in flight", summary


def test_deregister_first_order(lameduck, haproxy) -> None:
    a = lameduck()
    h = haproxy([a.port], interval=0.2, fall=2, rise=2)
    both_up(h)
    assert a.server_info()["prestop"] == {"state": "SERVING"}
    assert a.stat("server.prestop_state") == 0

    poller = AdminPoller(a.admin_addr)
    t0 = time.monotonic()
    proc = start_prestop(a.admin_addr, "--strategy", "deregister-first", "--drain-timeout",
                         "5s", "--lb-buffer", "1s")
    states: list[int] = []
    first: dict[str, float] = {}
    health_first: int | None = None
    second: dict[str, Any] | None = None
    long_req: Fetch | None = None
    with httpx.Client(timeout=2) as client:
        end = t0 + 15
        while proc.poll() is None and time.monotonic() < end:
            st = poller.stat("server.prestop_state")
            now = time.monotonic() - t0
            if st > 0 and (not states or states[-1] != st):
                states.append(st)
                first.setdefault(f"state {st}", now)
                if st == 2:
                    # A request (straight to a) in flight past lb_buffer: DRAINING observable.
                    long_req = Fetch(a.url("/sleep?ms=2000"))
                    health_first = client.get(a.url(HEALTH)).status_code
                    view = a.server_info()["prestop"]
                    assert view["state"] in ("CLOSING", "DRAINING", "CLOSED"), view
                    # A second POST: the other strategy is a conflict; the same one
                    # reports the running FSM, unchanged.
                    conflict = a.admin("POST", "/prestop?strategy=hold-health")
                    assert conflict.status_code == 409, conflict.text
                    second = a.admin("POST", "/prestop?strategy=deregister-first"
                                              "&drain_timeout=1s&lb_buffer=0s").json()
            if "DOWN" not in first and h.server_states()["s1"] == "DOWN":
                first["DOWN"] = now
            time.sleep(0.02)
    # the prestop client leaves as soon as it reads CLOSED, which a loaded machine may show
    # after this loop's last look: one more look, after it has gone
    st = poller.stat("server.prestop_state")
    if st > 0 and (not states or states[-1] != st):
        states.append(st)
        first.setdefault(f"state {st}", time.monotonic() - t0)
    poller.close()
    out, err = proc.communicate(timeout=5)
    assert long_req is not None, (states, out, err)
    long_req.join(10)
    summary = json.loads(out)
    print(f"\nderegister-first: states {states}, first seen {first}\n{err}")

    assert proc.returncode == 0, (out, err)
    assert long_req.status == 200, long_req.error
    assert states == [2, 1, 3], states
    assert health_first == 503
    assert "DOWN" in first, h.log()
    assert first["state 2"] <= first["DOWN"] < first["state 1"] < first["state 3"], first
    assert first["state 1"] >= 1.0  # lb_buffer
    assert transitions(summary) == [("SERVING", "CLOSING"), ("CLOSING", "DRAINING"),
                                    ("DRAINING", "CLOSED")], summary
    assert summary["transitions"][1]["after"] >= 1.0
    assert summary["transitions"][2]["reason"] == "no request in flight"
    assert summary["transitions"][2]["after"] >= 1.5
    assert summary["timed_out"] is False
    assert second is not None
    assert second["strategy"] == "deregister-first", second
    assert (second["drain_timeout"], second["lb_buffer"]) == (5.0, 1.0), second
    assert second["transitions"] == summary["transitions"][:len(second["transitions"])]
    view = a.server_info()["prestop"]
    assert view["state"] == "CLOSED" and view["transitions"] == summary["transitions"], view
    assert a.stat("server.prestop_state") == 3
