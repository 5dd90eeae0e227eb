"""Load balancing, endpoint health and safe retries, end to end: real demo origins (``o1``...,
each answer carries ``x-origin``) behind a real lameduck, checked from the client side, the
origins' request logs and lameduck's admin API (``/clusters?format=json``, ``/stats``).

Timing bounds are generous (a noisy 2-core machine): a state change must be seen within what
the configuration promises plus slack; the measured times are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from tests.procs import Lameduck, Origin, base_config, refusing_port, wait_until

INTERVAL = 0.2  # health and agent check interval used below
HC = {"path": "/health", "interval": "200ms", "timeout": "500ms", "rise": 2, "fall": 3,
      "expected_statuses": [200]}
AGENT = {"interval": "200ms", "timeout": "500ms"}
SLACK = 1.5  # seconds allowed on top of what the configuration promises


# -- helpers ----------------------------------------------------------------------------------


def _multi(origin_port: int, clusters: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A config with one cluster per entry, each routed by Host (``Host: <cluster name>``);
    the first one also takes requests with another Host."""
    cfg = base_config(origin_port)
    cfg["clusters"] = [{"name": name, **c} for name, c in clusters.items()]
    routes = [{"prefix": "/", "cluster": name, "host": name, "timeout": "30s"}
              for name in clusters]
    routes.append({"prefix": "/", "cluster": next(iter(clusters)), "timeout": "30s"})
    cfg["listeners"][0]["routes"] = routes
    return cfg


class Admin:
    """A keep-alive client for lameduck's admin API (polled every 20 ms by the timing checks)."""

    def __init__(self, ld: Lameduck) -> None:
        self.c = httpx.Client(base_url=f"http://{ld.admin_addr}", timeout=5)

    def hosts(self, cluster: str = "app") -> dict[str, dict[str, Any]]:
        view = self.c.get("/clusters?format=json").json()["cluster_statuses"]
        for c in view:
            if c["name"] == cluster:
                return {h["address"]: h for h in c["host_statuses"]}
        raise KeyError(cluster)

    def host(self, addr: str, cluster: str = "app") -> dict[str, Any]:
        return self.hosts(cluster)[addr]

    def stats(self) -> dict[str, int]:
        return {s["name"]: s["value"]
                for s in self.c.get("/stats?format=json").json()["stats"] if "name" in s}

    def stat(self, name: str) -> int:
        return self.stats()[name]

    def set_state(self, cluster: str, addr: str, state: str) -> None:
        r = self.c.post(f"/clusters/{cluster}/endpoints/{addr}?state={state}")
        assert r.status_code == 200, r.text

    def close(self) -> None:
        self.c.close()


@contextlib.contextmanager
def _admin(ld: Lameduck) -> Iterator[Admin]:
    a = Admin(ld)
    try:
        yield a
    finally:
        a.close()


def _since(t0: float, pred: Callable[[], bool], timeout: float) -> float | None:
    """Seconds from ``t0`` until ``pred()`` held (polled every 20 ms), or None."""
    while True:
        if pred():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            return None
        time.sleep(0.02)


def _spread(ld: Lameduck, n: int, host: str | None = None, path: str = "/",
            fresh: bool = False) -> Counter[str]:
    """``n`` sequential GETs through lameduck (keep-alive, or a new connection each with
    ``fresh``): how many each origin answered. Every one must be a 200."""
    out: Counter[str] = Counter()
    headers = {"host": host} if host else {}
    with httpx.Client(timeout=10) as c:
        for _ in range(n):
            if fresh:
                r = httpx.get(ld.url(path), headers=headers, timeout=10)
            else:
                r = c.get(ld.url(path), headers=headers)
            assert r.status_code == 200, (r.status_code, r.text)
            out[r.headers["x-origin"]] += 1
    return out


class InFlight:
    """``n`` concurrent GETs through lameduck, started at once (so round robin gives one to
    each of n equal endpoints); ``join()`` → [(status, x-origin, monotonic end)]."""

    def __init__(self, ld: Lameduck, n: int, path: str) -> None:
        self.results: list[tuple[int, str, float]] = []

        def one() -> None:
            try:
                r = httpx.get(ld.url(path), timeout=15)
                self.results.append((r.status_code, r.headers.get("x-origin", ""),
                                     time.monotonic()))
            except httpx.HTTPError as e:
                self.results.append((0, repr(e), time.monotonic()))

        self.threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def join(self) -> list[tuple[int, str, float]]:
        for t in self.threads:
            t.join(20)
        return self.results


def _say(o: Origin, text: str) -> None:
    """What ``o``'s agent port answers from now on."""
    r = o.post("/agent?say=" + quote(text, safe=""))
    assert r.status_code == 200 and r.text.strip() == text, r.text


def _logged(*origins: Origin) -> dict[str, set[str]]:
    """x-request-id → the origins whose log has it (read from the logs, which survive
    SIGKILL)."""
    seen: dict[str, set[str]] = {}
    for o in origins:
        for line in o.log_lines():
            rid = line.rsplit(" ", 1)[-1]
            if rid != "-":
                seen.setdefault(rid, set()).add(o.name)
    return seen


# -- 1. load balancing ------------------------------------------------------------------------


def test_round_robin_weights_and_least_request(lameduck, origins, origin_port) -> None:
    """Round robin is per request (keep-alive or not): 30 requests over 3 origins are 10/10/10.
    Weights 3:1 give 30:10 of 40 (smooth weighted round robin is exact over whole cycles).
    Least request: with o1 frozen (SIGSTOP), its requests pile up, and power-of-two-choices
    stops sending it more once it has more in flight than the others; round robin would send
    it every third request until all 8 clients hang on it."""
    o1, o2, o3 = origins(3)
    ld = lameduck(_multi(origin_port, {
        "rr": {"endpoints": [o1.addr, o2.addr, o3.addr]},
        "weighted": {"endpoints": [{"address": o1.addr, "weight": 3}, o2.addr]},
        "lr": {"endpoints": [o1.addr, o2.addr, o3.addr], "lb_policy": "least_request"},
    }))
    keep = _spread(ld, 30, "rr")
    fresh = _spread(ld, 30, "rr", fresh=True)
    weighted = _spread(ld, 40, "weighted")
    print(f"\nround robin keep-alive {dict(keep)}, new connections {dict(fresh)}, "
          f"weights 3:1 {dict(weighted)}")
    assert keep == {"o1": 10, "o2": 10, "o3": 10}
    assert fresh == {"o1": 10, "o2": 10, "o3": 10}
    assert weighted == {"o1": 30, "o2": 10}

    clients = 8
    stop = threading.Event()
    lock = threading.Lock()
    done: Counter[str] = Counter()
    errors: list[str] = []

    def client() -> None:
        with httpx.Client(timeout=20) as c:
            while not stop.is_set():
                try:
                    r = c.get(ld.url("/sleep?ms=20"), headers={"host": "lr"})
                except httpx.HTTPError as e:
                    errors.append(repr(e))
                    return
                with lock:
                    if r.status_code != 200:
                        errors.append(str(r.status_code))
                    done[r.headers.get("x-origin", "?")] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    with _admin(ld) as adm:
        o1.signal(signal.SIGSTOP)
        try:
            for t in threads:
                t.start()
            time.sleep(1.5)
            stuck = adm.host(o1.addr, "lr")["stats"]["rq_active"]
            stop.set()
            with lock:
                served_while_stopped = dict(done)
        finally:
            o1.signal(signal.SIGCONT)
        for t in threads:
            t.join(20)
    others = served_while_stopped.get("o2", 0) + served_while_stopped.get("o3", 0)
    print(f"least request, o1 frozen 1.5 s under {clients} clients: {stuck} hang on o1, "
          f"o2+o3 served {others}; after SIGCONT {dict(done)}")
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    # P2C over 3 hosts with 8 clients: o1 gets another only while it has no more in flight
    # than the host it is compared with, so it saturates around 3-4 (round robin: 8).
    assert 1 <= stuck <= 5, stuck
    assert others >= 40, served_while_stopped
    assert done["o1"] >= stuck  # the frozen ones were answered after SIGCONT


# -- 2. active health checks ------------------------------------------------------------------


def test_active_health_check_out_and_back(lameduck, origins, origin_port) -> None:
    """/health failing takes an endpoint out after ``fall`` checks (not before ``fall - 1``
    intervals, within interval x fall + slack) and back after ``rise``; a 503 with the
    immediate-fail header takes it out after one check; a killed origin (network failure)
    goes out too. Out means: no traffic, membership_healthy and health_check.healthy drop,
    /clusters shows /failed_active_hc."""
    o1, o2, o3 = origins(3)
    ld = lameduck(base_config(origin_port, cluster={
        "endpoints": [o1.addr, o2.addr, o3.addr], "health_check": HC}))
    with _admin(ld) as adm:
        assert wait_until(lambda: adm.stat("cluster.app.health_check.success") >= 3, 5)
        flags = lambda o: adm.host(o.addr)["health_flags"]  # noqa: E731
        before = adm.stats()

        t0 = time.monotonic()
        assert o1.post("/health/fail").status_code == 200
        out = _since(t0, lambda: flags(o1) == "/failed_active_hc", 10)
        st = adm.stats()
        assert out is not None, adm.hosts()
        assert adm.host(o1.addr)["healthy"] is False
        assert st["cluster.app.membership_healthy"] == 2
        assert st["cluster.app.health_check.healthy"] == 2
        assert st["cluster.app.health_check.failure"] - before[
            "cluster.app.health_check.failure"] >= 3
        assert _spread(ld, 12) == {"o2": 6, "o3": 6}

        t0 = time.monotonic()
        assert o1.post("/health/ok").status_code == 200
        back = _since(t0, lambda: flags(o1) == "healthy", 10)
        assert back is not None, adm.hosts()
        assert adm.stat("cluster.app.membership_healthy") == 3
        assert _spread(ld, 12) == {"o1": 4, "o2": 4, "o3": 4}

        # one request in flight on each origin (round robin) while o1 goes out
        flight = InFlight(ld, 3, "/sleep?ms=1500")
        assert wait_until(lambda: adm.host(o1.addr)["stats"]["rq_active"] == 1, 5)
        f0 = adm.stat("cluster.app.health_check.failure")
        t0 = time.monotonic()
        assert o1.post("/health/fail?immediate=1").status_code == 200
        immediate = _since(t0, lambda: flags(o1) == "/failed_active_hc", 10)
        failed_checks = adm.stat("cluster.app.health_check.failure") - f0
        t_out = time.monotonic()
        assert immediate is not None, adm.hosts()
        assert "o1" not in _spread(ld, 6)
        # passive drain: what o1 had in flight finishes there, after it went out
        answers = flight.join()
        assert sorted(a[:2] for a in answers) == [(200, "o1"), (200, "o2"), (200, "o3")]
        assert all(a[2] > t_out for a in answers)

        n0 = adm.stat("cluster.app.health_check.network_failure")
        t0 = time.monotonic()
        o2.kill()
        killed = _since(t0, lambda: flags(o2) == "/failed_active_hc", 10)
        assert killed is not None, adm.hosts()
        st = adm.stats()
        assert st["cluster.app.health_check.network_failure"] - n0 >= 3
        assert st["cluster.app.membership_healthy"] == 1
        assert st["cluster.app.health_check.healthy"] == 1
        assert _spread(ld, 6) == {"o3": 6}
        assert st["cluster.app.health_check.attempt"] > st["cluster.app.health_check.success"]

        # a frozen origin: every check times out (timeout 500 ms, then the interval)
        f0 = adm.stat("cluster.app.health_check.failure")
        t0 = time.monotonic()
        o3.signal(signal.SIGSTOP)
        try:
            frozen = _since(t0, lambda: flags(o3) == "/failed_active_hc", 10)
            assert frozen is not None, adm.hosts()
            assert adm.stat("cluster.app.health_check.failure") - f0 >= 3
            r = httpx.get(ld.url("/"), timeout=10)
            assert (r.status_code, r.text) == (503, "no healthy upstream\n")
            assert r.headers["retry-after"] == "1"
        finally:
            o3.signal(signal.SIGCONT)
        t0 = time.monotonic()
        thawed = _since(t0, lambda: flags(o3) == "healthy", 10)
        assert thawed is not None, adm.hosts()
        assert _spread(ld, 3) == {"o3": 3}

    print(f"\nhealth check interval {INTERVAL}s rise 2 fall 3: out after {out:.2f}s, back "
          f"after {back:.2f}s, immediate fail out after {immediate:.2f}s "
          f"({failed_checks} failed check), killed origin out after {killed:.2f}s, frozen "
          f"origin (timeout 0.5s) out after {frozen:.2f}s, back {thawed:.2f}s after SIGCONT")
    # fall: three failing checks, the last at least two intervals after the first
    assert 2 * INTERVAL - 0.05 <= out <= 3 * INTERVAL + SLACK
    assert INTERVAL - 0.05 <= back <= 2 * INTERVAL + SLACK
    assert immediate <= INTERVAL + SLACK
    assert failed_checks < 3  # out before `fall` failures: the immediate header did it
    assert 2 * INTERVAL - 0.05 <= killed <= 3 * INTERVAL + SLACK
    # a timed-out check takes `timeout` before the interval starts
    assert 2 * (INTERVAL + 0.5) <= frozen <= 3 * (INTERVAL + 0.5) + SLACK
    assert thawed <= 2 * (INTERVAL + 0.5) + SLACK


# -- 3. agent checks --------------------------------------------------------------------------


def test_agent_words_move_endpoint_states(lameduck, origins, origin_port) -> None:
    """HAProxy agent words from the origin's agent port: drain / maint / ready move the admin
    state, down / up the health (/failed_agent_check), N% scales the configured weight (the
    traffic ratio follows), maxconn:N caps requests in flight; an admin-API change stands
    until the agent says something new; an unreachable agent changes nothing."""
    o1, o2, o3 = origins(3, agent=True)
    ld = lameduck(base_config(origin_port, cluster={
        "endpoints": [{"address": o1.addr, "agent_port": o1.agent_port, "weight": 4},
                      {"address": o2.addr, "agent_port": o2.agent_port, "weight": 2},
                      # nothing listens there
                      {"address": o3.addr, "agent_port": refusing_port(), "weight": 2}],
        "agent_check": AGENT}))
    times: dict[str, float] = {}
    with _admin(ld) as adm:
        def on(o: Origin, key: str, value: Any, label: str) -> None:
            t0 = time.monotonic()
            took = _since(t0, lambda: adm.host(o.addr)[key] == value, 3 * INTERVAL + SLACK)
            assert took is not None, (label, adm.host(o.addr))
            times[label] = took

        on(o1, "agent", "ready up 100%", "first word")
        on(o2, "agent", "ready up 100%", "first word o2")
        base = _spread(ld, 40)
        assert base == {"o1": 20, "o2": 10, "o3": 10}, base

        _say(o1, "drain")
        on(o1, "admin_state", "drain", "drain")
        assert adm.stat("cluster.app.membership_excluded") == 1
        assert "o1" not in _spread(ld, 12)

        _say(o1, "ready")
        on(o1, "admin_state", "ready", "ready after drain")
        flight = InFlight(ld, 4, "/sleep?ms=1500")  # o1 has half the weight: 2 of 4
        assert wait_until(lambda: adm.host(o1.addr)["stats"]["rq_active"] >= 1, 5)
        _say(o1, "maint")
        on(o1, "admin_state", "maint", "maint")
        t_maint = time.monotonic()
        assert "o1" not in _spread(ld, 12)
        answers = flight.join()  # in flight on o1 when it went to maint: finished there
        assert [a[0] for a in answers] == [200] * 4, answers
        assert any(a[1] == "o1" and a[2] > t_maint for a in answers), answers

        _say(o1, "ready")
        on(o1, "admin_state", "ready", "ready")
        assert _spread(ld, 16)["o1"] >= 6

        _say(o1, "down #disk full")  # HAProxy: '#' starts the description only as a word
        on(o1, "health_flags", "/failed_agent_check", "down")
        h = adm.host(o1.addr)
        assert h["healthy"] is False and h["admin_state"] == "ready", h
        assert adm.stat("cluster.app.membership_healthy") == 2
        assert "o1" not in _spread(ld, 12)

        _say(o1, "up")
        on(o1, "health_flags", "healthy", "up")
        assert adm.stat("cluster.app.membership_healthy") == 3

        _say(o1, "50%")
        on(o1, "weight", 2, "50%")
        halved = _spread(ld, 30)
        assert halved == {"o1": 10, "o2": 10, "o3": 10}, halved  # 2:2:2 now, was 4:2:2

        _say(o1, "maxconn:1")
        on(o1, "maxconn", 1, "maxconn:1")
        with httpx.Client(timeout=10) as warm:  # idle connections to each, so no connect race
            for _ in range(9):
                warm.get(ld.url("/"))
        got: list[str] = []

        def slow() -> None:
            r = httpx.get(ld.url("/sleep?ms=500"), timeout=10)
            got.append(f"{r.status_code} {r.headers.get('x-origin')}")

        threads = [threading.Thread(target=slow) for _ in range(9)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join(10)
        concurrent = Counter(got)
        # round robin alone gives o1 3 of 9; maxconn:1 lets it have one at a time
        assert concurrent["200 o1"] == 1 and sum(concurrent.values()) == 9, concurrent

        # The operator drains o2 while its agent keeps saying "ready up 100%": it stands.
        adm.set_state("app", o2.addr, "drain")
        time.sleep(5 * INTERVAL)
        assert adm.host(o2.addr)["admin_state"] == "drain"
        _say(o2, "maint")  # until the agent says something new
        on(o2, "admin_state", "maint", "o2 maint after operator drain")
        _say(o2, "ready up")
        on(o2, "admin_state", "ready", "o2 ready")

        h3 = adm.host(o3.addr)
        assert (h3["admin_state"], h3["healthy"], h3["weight"], h3["agent"]) == (
            "ready", True, 2, ""), h3
        assert "o3" in _spread(ld, 6)
    print("\nagent word seen by /clusters after (s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))


# -- 4. outlier ejection ----------------------------------------------------------------------


def test_outlier_ejection(lameduck, origins, origin_port) -> None:
    """Passive ejection. ``gw``: a killed origin's connect failures are gateway failures;
    the third in a row ejects it (the requests themselves are retried and succeed), it gets
    no traffic until base_ejection_time has passed, then is tried again and re-ejected.
    ``err``: /status/500 from every origin; consecutive_5xx ejects the first to reach 3 and
    max_ejection_percent 50 refuses the others (ejections_overflow). ``both``: two dead
    endpoints at 50%: only one is ejected."""
    o1, o2, o3, o4 = origins(4)
    od = {"consecutive_5xx": 3, "consecutive_gateway_failure": 3, "base_ejection_time": "1s",
          "max_ejection_time": "5s", "max_ejection_percent": 50}
    dead = f"127.0.0.1:{refusing_port()}"
    ld = lameduck(_multi(origin_port, {
        "gw": {"endpoints": [o1.addr, o2.addr, o3.addr], "outlier_detection": od},
        "err": {"endpoints": [o2.addr, o3.addr, o4.addr], "outlier_detection": od},
        "both": {"endpoints": [o1.addr, dead], "outlier_detection": od},
    }))
    o1.kill()
    ejected_flag = "/failed_outlier_check"
    with _admin(ld) as adm, httpx.Client(timeout=10, headers={"host": "gw"}) as c:
        def get() -> None:
            r = c.get(ld.url("/"))
            assert r.status_code == 200, r.text

        sent = 0
        while adm.stat("cluster.gw.outlier_detection.ejections_active") == 0:
            assert sent < 20, adm.hosts("gw")
            get()
            sent += 1
        t_eject = time.monotonic()
        h1 = adm.host(o1.addr, "gw")
        assert h1["health_flags"] == ejected_flag and h1["stats"]["cx_connect_fail"] == 3, h1
        st = adm.stats()
        assert st["cluster.gw.outlier_detection.ejections_enforced_total"] == 1
        assert st["cluster.gw.outlier_detection.ejections_enforced_consecutive_gateway_failure"] \
            == 1
        assert st["cluster.gw.membership_healthy"] == 2
        retries = st["cluster.gw.upstream_rq_retry"]
        assert retries == 3 == st["cluster.gw.upstream_rq_retry_success"]
        for _ in range(6):
            get()
        assert adm.host(o1.addr, "gw")["stats"]["cx_connect_fail"] == 3  # not tried: ejected
        unejected = _since(t_eject, lambda: adm.host(o1.addr, "gw")["health_flags"] == "healthy",
                           1 + SLACK)
        assert unejected is not None, adm.hosts("gw")
        assert adm.stat("cluster.gw.outlier_detection.ejections_active") == 0
        again = 0
        while adm.stat("cluster.gw.outlier_detection.ejections_active") == 0:
            assert again < 20, adm.hosts("gw")
            get()
            again += 1
        assert adm.stat("cluster.gw.outlier_detection.ejections_enforced_total") == 2

        with httpx.Client(timeout=10, headers={"host": "err"}) as e:
            statuses = Counter(e.get(ld.url("/status/500")).status_code for _ in range(12))
        assert statuses == {500: 12}
        st = adm.stats()
        err_hosts = adm.hosts("err")
        assert st["cluster.err.outlier_detection.ejections_active"] == 1
        assert st["cluster.err.outlier_detection.ejections_enforced_consecutive_5xx"] == 1
        assert st["cluster.err.outlier_detection.ejections_overflow"] >= 1
        assert [h["health_flags"] for h in err_hosts.values()].count(ejected_flag) == 1
        assert st["cluster.err.upstream_rq_retry"] == 0  # a 500 is an answer, not retried

        with httpx.Client(timeout=10, headers={"host": "both"}) as b:
            statuses = Counter(b.get(ld.url("/")).status_code for _ in range(6))
        assert statuses == {503: 6}
        st = adm.stats()
        assert st["cluster.both.outlier_detection.ejections_active"] == 1
        assert st["cluster.both.outlier_detection.ejections_overflow"] >= 1
        assert [h["health_flags"] for h in adm.hosts("both").values()].count(ejected_flag) == 1
    print(f"\noutlier: ejected after {sent} requests (3 connect failures, {retries} retries, "
          f"all 200), unejected {unejected:.2f}s after (base 1s), re-ejected after {again} "
          f"more; 5xx: {st['cluster.err.outlier_detection.ejections_overflow']} overflows")
    assert unejected >= 0.8


# -- 5. the acceptance run --------------------------------------------------------------------


@dataclass
class Res:
    kind: str  # get | stream | post | post_slow | post_key | catch | held
    rid: str
    status: int = 0  # 0: no response head
    origin: str = ""
    complete: bool = False
    error: str = ""
    started: float = 0.0


STREAM = "/stream?chunks=20&size=1000&interval_ms=50"
STREAM_LEN = 20 * 1000
CATCH = "/stream?chunks=50&size=1000&interval_ms=50"
CATCH_LEN = 50 * 1000
POST_BODY = b"p" * 64


def _request(kind: str, rid: str) -> tuple[bytes, str]:
    """(request bytes, path) of one load request."""
    host = kind if kind in ("catch", "held") else "app"  # see test_origin_killed_under_load
    head = f"Host: {host}\r\nx-request-id: {rid}\r\n"
    if kind in ("get", "stream", "catch", "held"):
        path = {"get": "/sleep?ms=50", "stream": STREAM, "catch": CATCH,
                "held": "/sleep?ms=1000"}[kind]
        return f"GET {path} HTTP/1.1\r\n{head}\r\n".encode(), path
    if kind == "post_key":
        head += f"Idempotency-Key: {rid}\r\n"
    head += f"Content-Length: {len(POST_BODY)}\r\n"
    path = "/sleep?ms=50" if kind == "post_slow" else "/echo"
    return f"POST {path} HTTP/1.1\r\n{head}\r\n".encode() + POST_BODY, path


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(first.split(" ", 2)[1]), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> tuple[bytes, bool]:
    """The body, and whether it arrived whole (a cut one: EOF or reset before its end)."""
    body = b""
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    return body, True
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        return await reader.readexactly(int(headers.get("content-length", "0"))), True
    except (asyncio.IncompleteReadError, ConnectionError):
        return body, False


async def _worker(kind: str, wid: int, port: int, until: float, out: list[Res]) -> None:
    """Keep-alive requests of one kind until ``until``; never retries anything itself."""
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    n = 0
    while time.monotonic() < until:
        n += 1
        res = Res(kind, f"{kind}-{wid}-{n}", started=time.monotonic())
        out.append(res)
        data, _ = _request(kind, res.rid)
        try:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
            reader, writer = conn
            writer.write(data)
            res.status, headers = await asyncio.wait_for(_read_head(reader), 15)
            res.origin = headers.get("x-origin", "")
            body, whole = await asyncio.wait_for(_read_body(reader, headers), 15)
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
            res.error = repr(e)
            if conn is not None:
                conn[1].close()
            conn = None
            continue
        want = {"stream": STREAM_LEN, "get": None, "post_slow": None}.get(kind, len(POST_BODY))
        res.complete = whole and (want is None or res.status != 200 or len(body) == want)
        if kind in ("post", "post_key") and res.status == 200 and body != POST_BODY:
            res.error = f"echo mismatch {body[:20]!r}"
        if not whole or headers.get("connection", "").lower() == "close":
            writer.close()
            conn = None
    if conn is not None:
        conn[1].close()


async def _catch_o2_stream(port: int, out: list[Res]) -> tuple[
        Res, asyncio.StreamReader, asyncio.StreamWriter, dict[str, str]]:
    """A long stream from o2 (the first pick of cluster ``catch``), its head read: it is
    surely streaming at the kill."""
    res = Res("catch", "catch-0", started=time.monotonic())
    out.append(res)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request("catch", res.rid)[0])
    res.status, headers = await asyncio.wait_for(_read_head(reader), 10)
    res.origin = headers.get("x-origin", "")
    return res, reader, writer, headers


async def _hold_get_on_o2(port: int, o2: Origin, out: list[Res]) -> tuple[
        Res, asyncio.StreamReader, asyncio.StreamWriter]:
    """GET /sleep?ms=1000 to o2 (the first pick of cluster ``held``), once o2's log shows it:
    surely in flight there, not answered, at the kill."""
    res = Res("held", "held-0", started=time.monotonic())
    out.append(res)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request("held", res.rid)[0])
    for _ in range(100):
        if any(line.endswith(" held-0") for line in o2.log_lines()):
            break
        await asyncio.sleep(0.01)
    return res, reader, writer


async def _finish_held(held: tuple[Res, asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    res, reader, writer = held
    try:
        res.status, headers = await asyncio.wait_for(_read_head(reader), 15)
        res.origin = headers.get("x-origin", "")
        _, res.complete = await asyncio.wait_for(_read_body(reader, headers), 15)
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        res.error = repr(e)
    writer.close()


async def _finish_catch(held: tuple[Res, asyncio.StreamReader, asyncio.StreamWriter,
                                    dict[str, str]]) -> None:
    res, reader, writer, headers = held
    body, whole = await asyncio.wait_for(_read_body(reader, headers), 15)
    res.complete = whole and len(body) == CATCH_LEN
    writer.close()


async def _acceptance_load(port: int, origins: list[Origin], seconds: float,
                           kill_after: float) -> tuple[list[Res], float, float]:
    """(results, start, kill time), monotonic."""
    out: list[Res] = []
    t0 = time.monotonic()
    until = t0 + seconds
    plan = [("get", 4), ("stream", 1), ("post", 1), ("post_slow", 1), ("post_key", 1)]
    tasks = [asyncio.ensure_future(_worker(kind, w, port, until, out))
             for kind, count in plan for w in range(count)]
    await asyncio.sleep(kill_after - 0.3)
    held = await _catch_o2_stream(port, out)
    assert held[0].origin == "o2", held[0]
    gets = await _hold_get_on_o2(port, origins[1], out)
    assert "held-0" in _logged(origins[1]), origins[1].log_lines()[-5:]
    await asyncio.sleep(max(0.0, t0 + kill_after - time.monotonic()))
    origins[1].kill()
    t_kill = time.monotonic()
    await asyncio.gather(*tasks, _finish_held(gets))
    await _finish_catch(held)
    return out, t0, t_kill


def test_origin_killed_under_load(lameduck, origins, origin_port) -> None:
    """THE acceptance run: 8 keep-alive clients (4 GET /sleep?ms=50, 1 streaming GETs, 1 POST
    /echo and 1 POST /sleep?ms=50 without Idempotency-Key, 1 POST /echo with one; each with a
    unique x-request-id) for 3 s, plus long streams and GET /sleep?ms=1000 opened until one of
    each is on o2; o2 SIGKILLed after 1 s. Every plain GET succeeds (what o2 had not answered
    is retried elsewhere); the streams o2 was sending are cut (the client sees a short body)
    and counted; no POST without Idempotency-Key reaches two origins, and one that failed
    reached none but o2; every POST with a key succeeds."""
    o1, o2, o3 = origins(3, log=True)
    # Two more clusters over the same origins, o2 first, each used by one request: their
    # first pick is o2, so the long stream and the long GET held across the kill are on o2.
    ld = lameduck(_multi(origin_port, {"app": {
        "endpoints": [o1.addr, o2.addr, o3.addr],
        "health_check": {**HC, "fall": 2},
        "outlier_detection": {"consecutive_5xx": 5, "consecutive_gateway_failure": 3,
                              "base_ejection_time": "10s", "max_ejection_time": "10s",
                              "max_ejection_percent": 34},
        # retry_policy: the defaults (2 retries, budget 20% but at least 10 in flight: the burst
        # of retries an origin's death causes fits); test_retry_limit_budget_and_safety checks
        # the budget itself.
    }, "catch": {"endpoints": [o2.addr, o1.addr, o3.addr]},
        "held": {"endpoints": [o2.addr, o1.addr, o3.addr]}}))
    results, t0, t_kill = asyncio.run(_acceptance_load(ld.port, [o1, o2, o3], 3.0, 1.0))
    with _admin(ld) as adm:
        st = adm.stats()
        hosts = adm.hosts()
    o2_flags = hosts[o2.addr]["health_flags"]
    per_ep = {o.name: {k: v for k, v in hosts[o.addr]["stats"].items() if v}
              for o in (o1, o2, o3)}
    logs = _logged(o1, o2, o3)

    by = {k: [r for r in results if r.kind == k]
          for k in ("get", "stream", "post", "post_slow", "post_key", "catch", "held")}
    gets = by["get"] + by["held"]
    bad_gets = [r for r in gets if r.status != 200 or not r.complete or r.error]
    gets_resent = [r for r in gets if len(logs.get(r.rid, ())) > 1]
    streams = by["stream"] + by["catch"]
    cut = [r for r in streams if r.status == 200 and not r.complete]
    wrong_cuts = [r for r in streams if not r.complete and r.origin != "o2"]
    stream_errors = [r for r in streams if r.status != 200]
    posts = by["post"] + by["post_slow"]
    post_twice = [r for r in posts if len(logs.get(r.rid, ())) > 1]
    post_failed = [r for r in posts if r.status != 200]
    failed_at_o2 = [r for r in post_failed if logs.get(r.rid) == {"o2"}]
    failed_unseen = [r for r in post_failed if not logs.get(r.rid)]
    # 502: sent, lost with o2 (or on a pooled connection o2's death had closed); 503: never
    # sent and not retried (budget, limit); anything else, or seen by another origin: wrong.
    post_failed_bad = [r for r in post_failed
                       if not ((r.status == 502 and r in failed_at_o2 + failed_unseen)
                               or (r.status == 503 and r in failed_unseen))]
    # /echo answers its head before the body has arrived: o2 killed between the two leaves a
    # response that started on o2 and can only be cut (no retry once a response byte went
    # out, RFC 9110 §9.2.2); counted with the other cuts below.
    echo_cut = [r for r in by["post"] + by["post_key"]
                if r.status == 200 and r.origin == "o2" and not r.complete]
    post_ok_bad = [r for r in posts if r.status == 200 and r not in echo_cut
                   and (logs.get(r.rid) != {r.origin} or r.error or not r.complete)]
    post_key_bad = [r for r in by["post_key"] if r not in echo_cut
                    and (r.status != 200 or r.error or not r.complete)]
    post_key_resent = [r for r in by["post_key"] if len(logs.get(r.rid, ())) > 1]
    o2_answered = sum(1 for r in results if r.origin == "o2")
    after_kill = sum(1 for r in results if r.started > t_kill + 0.5 and r.status == 200)
    cluster = {k.removeprefix("cluster.app."): v for k, v in st.items()
               if k.startswith("cluster.app.") and ("retry" in k or "reset" in k
                                                    or "connect_fail" in k or "none" in k)}
    print(f"\nacceptance: o2 killed at {t_kill - t0:.2f}s; {len(results)} requests: "
          f"{len(gets)} GET /sleep (not 200: {len(bad_gets)}; reached o2 and re-sent: "
          f"{len(gets_resent)}), {len(streams)} streams ({len(cut)} cut, all from o2), "
          f"{len(posts)} POST w/o key ({len(by['post_slow'])} to /sleep; failed "
          f"{dict(Counter(r.status for r in post_failed))}: {len(failed_at_o2)} seen by o2 "
          f"only, {len(failed_unseen)} by no origin; in two logs: {len(post_twice)}), "
          f"{len(by['post_key'])} POST with key (not 200: {len(post_key_bad)}, re-sent: "
          f"{len(post_key_resent)}); o2 answered {o2_answered}, {after_kill} answered from "
          f"0.5s after the kill; o2 health_flags {o2_flags}")
    print(f"stats: {cluster}; cluster.held retry "
          f"{st['cluster.held.upstream_rq_retry']} retry_success "
          f"{st['cluster.held.upstream_rq_retry_success']}; "
          f"http.ingress.downstream_cx_destroy_local_active_rq "
          f"{st['http.ingress.downstream_cx_destroy_local_active_rq']}; per endpoint {per_ep}")

    assert o2_answered > 10 and after_kill > 20, "o2 was not killed under load"
    assert not bad_gets, bad_gets[:5]
    # the GET held on o2 across the kill was sent there, then retried elsewhere
    assert len(logs["held-0"]) == 2 and by["held"][0].origin != "o2"
    assert st["cluster.held.upstream_rq_retry"] == st["cluster.held.upstream_rq_retry_success"]
    assert st["cluster.held.upstream_rq_retry_success"] >= 1
    assert not stream_errors, stream_errors[:5]
    assert not wrong_cuts, wrong_cuts[:5]
    assert by["catch"][0] in cut  # the o2 stream held across the kill was cut
    assert st["http.ingress.downstream_cx_destroy_local_active_rq"] >= len(cut) + len(echo_cut)
    assert st["cluster.app.upstream_rq_rx_reset"] + st["cluster.catch.upstream_rq_rx_reset"] \
        >= len(cut)
    assert not post_twice, post_twice[:5]
    assert not post_failed_bad, post_failed_bad[:5]
    assert not post_ok_bad, post_ok_bad[:5]
    assert not post_key_bad, post_key_bad[:5]
    assert o2_flags != "healthy"
    # per-endpoint stats (cluster app): o2's failures are its own
    assert per_ep["o2"].get("rq_error", 0) >= len(cut) - 1
    assert per_ep["o1"].get("rq_error", 0) == per_ep["o3"].get("rq_error", 0) == 0
    assert sum(per_ep[n]["rq_success"] for n in per_ep) >= sum(
        1 for r in results if r.status == 200 and r.kind not in ("catch", "held"))


# -- 6. nothing to send to ----------------------------------------------------------------------


def test_no_eligible_endpoint(lameduck, origins, origin_port) -> None:
    """All origins killed: while the health checks still count them healthy a request fails
    to connect everywhere (503 upstream connect error); once they are out, 503 no healthy
    upstream with Retry-After. With num_retries 0 a connect failure is not retried."""
    o1, o2, o3 = origins(3)
    dead = f"127.0.0.1:{refusing_port()}"
    ld = lameduck(_multi(origin_port, {
        "app": {"endpoints": [o1.addr, o2.addr],
                "health_check": {**HC, "interval": "300ms", "fall": 3}},
        "noretry": {"endpoints": [dead, o3.addr], "retry_policy": {"num_retries": 0}},
    }))
    with _admin(ld) as adm:
        assert wait_until(lambda: adm.stat("cluster.app.health_check.success") >= 2, 5)
        o1.kill()
        o2.kill()
        before = adm.stat("cluster.app.membership_healthy")
        r = httpx.get(ld.url("/"), timeout=10)
        members = adm.stat("cluster.app.membership_healthy")
        print(f"\nright after the kill: {r.status_code} {r.text.strip()!r} "
              f"(membership_healthy {before} -> {members})")
        assert r.status_code == 503
        if members == 2:  # still counted healthy when it was answered
            assert r.text == "upstream connect error\n"
            assert adm.stat("cluster.app.upstream_rq_retry_limit_exceeded") == 1
        elif before == 0:  # out before it was sent
            assert r.text == "no healthy upstream\n"
        else:  # the health checks took them out while it was answered: either, by when
            assert r.text in ("upstream connect error\n", "no healthy upstream\n"), r.text
        assert wait_until(lambda: adm.stat("cluster.app.membership_healthy") == 0,
                          3 * 0.3 + SLACK)
        n0 = adm.stat("cluster.app.upstream_cx_none_healthy")
        for method in ("GET", "POST"):
            r = httpx.request(method, ld.url("/"), timeout=10)
            assert r.status_code == 503 and r.text == "no healthy upstream\n", r.text
            assert r.headers.get("retry-after") == "1"
        assert adm.stat("cluster.app.upstream_cx_none_healthy") == n0 + 2

        with httpx.Client(timeout=10, headers={"host": "noretry"}) as c:
            first, second = c.get(ld.url("/")), c.get(ld.url("/"))
        assert (first.status_code, first.text) == (503, "upstream connect error\n")
        assert "retry-after" not in first.headers
        assert second.status_code == 200 and second.headers["x-origin"] == "o3"
        st = adm.stats()
        assert st["cluster.noretry.upstream_rq_retry"] == 0
        assert st["cluster.noretry.upstream_cx_connect_fail"] == 1


# -- 7. retry limit, budget, and what may be retried --------------------------------------------


def test_retry_limit_budget_and_safety(lameduck, origins, origin_port) -> None:
    """``limit``: two dead endpoints and a live one, num_retries 1: a request that meets both
    dead ones is answered 503 (upstream_rq_retry_limit_exceeded), the next goes to the live
    one. ``budget``: budget 0% with min_retry_concurrency 1: of concurrent requests meeting
    the dead endpoint only one may be retried at a time (upstream_rq_retry_overflow).
    ``post``: a POST whose connect failed was never sent: retried. ``sent``: requests in
    flight on an origin that is killed: a GET and a POST with Idempotency-Key are retried on
    the other endpoint, a POST without one is not (502, and only the dead origin saw it)."""
    o1, o2, o3, o4 = origins(4, log=True)
    dead1, dead2 = f"127.0.0.1:{refusing_port()}", f"127.0.0.1:{refusing_port()}"
    ld = lameduck(_multi(origin_port, {
        "limit": {"endpoints": [dead1, dead2, o1.addr], "retry_policy": {"num_retries": 1}},
        "budget": {"endpoints": [dead1, o1.addr], "retry_policy": {
            "num_retries": 2, "retry_budget": {"budget_percent": 0, "min_retry_concurrency": 1}}},
        "post": {"endpoints": [dead1, o2.addr]},
        "sent": {"endpoints": [o3.addr, o4.addr]},
    }))
    with _admin(ld) as adm:
        with httpx.Client(timeout=10, headers={"host": "limit"}) as c:
            statuses = [c.get(ld.url("/")).status_code for _ in range(6)]
        st = adm.stats()
        assert statuses == [503, 200] * 3, statuses
        assert st["cluster.limit.upstream_rq_retry"] == 3
        assert st["cluster.limit.upstream_rq_retry_limit_exceeded"] == 3
        assert st["cluster.limit.upstream_rq_retry_success"] == 0

        got: list[int] = []

        def slow() -> None:
            got.append(httpx.get(ld.url("/sleep?ms=800"), headers={"host": "budget"},
                                 timeout=10).status_code)

        threads = [threading.Thread(target=slow) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        st = adm.stats()
        print(f"\nlimit: {statuses}; budget: {sorted(got)}, overflow "
              f"{st['cluster.budget.upstream_rq_retry_overflow']}, retries "
              f"{st['cluster.budget.upstream_rq_retry']}")
        assert st["cluster.budget.upstream_rq_retry_overflow"] >= 1
        assert got.count(503) == st["cluster.budget.upstream_rq_retry_overflow"]
        assert st["cluster.budget.upstream_rq_retry_success"] >= 1
        assert got.count(200) + got.count(503) == 4

        r = httpx.post(ld.url("/echo"), content=b"never sent",
                       headers={"host": "post", "x-request-id": "post-never-sent"}, timeout=10)
        assert r.status_code == 200 and r.text == "never sent" and r.headers["x-origin"] == "o2"
        assert _logged(o2)["post-never-sent"] == {"o2"}
        assert adm.stat("cluster.post.upstream_rq_retry") == 1

        adm.set_state("sent", o4.addr, "drain")  # all three go to o3
        results: dict[str, httpx.Response] = {}

        def send(rid: str, method: str, extra: dict[str, str]) -> None:
            results[rid] = httpx.request(
                method, ld.url("/sleep?ms=1000"), timeout=10,
                content=b"body" if method == "POST" else None,
                headers={"host": "sent", "x-request-id": rid, **extra})

        reqs = [("sent-get", "GET", {}), ("sent-post", "POST", {}),
                ("sent-post-key", "POST", {"idempotency-key": "k1"})]
        threads = [threading.Thread(target=send, args=r) for r in reqs]
        for t in threads:
            t.start()
        assert wait_until(lambda: len(_logged(o3)) == 3, 5), o3.log_lines()
        adm.set_state("sent", o4.addr, "ready")
        o3.kill()
        for t in threads:
            t.join(10)
        logs = _logged(o3, o4)
        print("in flight on a killed origin: " + ", ".join(
            f"{rid} {results[rid].status_code} seen by {sorted(logs[rid])}" for rid, _, _ in reqs))
        assert results["sent-get"].status_code == 200
        assert results["sent-get"].headers["x-origin"] == "o4"
        assert logs["sent-get"] == {"o3", "o4"}
        assert results["sent-post-key"].status_code == 200
        assert logs["sent-post-key"] == {"o3", "o4"}
        assert results["sent-post"].status_code == 502
        assert logs["sent-post"] == {"o3"}
        assert adm.stat("cluster.sent.upstream_rq_retry") >= 2


# -- src bugs -----------------------------------------------------------------------------------


def test_agent_zero_weight_alone_takes_no_traffic(lameduck, origins, origin_port) -> None:
    """An agent's ``0%`` takes the endpoint out of the balancing (drain/health.py
    ``agent_weight``: "0 takes the endpoint out of the balancing like DRAIN"). With two such
    endpoints lameduck answers 503 no healthy upstream; it must do the same when the
    weight-0 endpoint is the only one left (here: the other is in maint)."""
    o1, o2 = origins(2, agent=True)
    ld = lameduck(base_config(origin_port, cluster={
        "endpoints": [{"address": o1.addr, "agent_port": o1.agent_port},
                      {"address": o2.addr, "agent_port": o2.agent_port}],
        "agent_check": AGENT}))
    with _admin(ld) as adm:
        _say(o1, "0%")
        _say(o2, "maint")
        assert wait_until(lambda: adm.host(o1.addr)["weight"] == 0
                          and adm.host(o2.addr)["admin_state"] == "maint", 3 * INTERVAL + SLACK)
        r = httpx.get(ld.url("/"), timeout=10)
        assert (r.status_code, r.headers.get("x-origin")) == (503, None), (
            f"weight-0 o1 got the request: {r.status_code} from {r.headers.get('x-origin')}")
        assert r.text == "no healthy upstream\n"


def test_retry_budget_does_not_count_the_retry_it_replaces(lameduck, origins,
                                                            origin_port) -> None:
    """The retry budget bounds retries *in flight*. A request whose first retry failed has no
    retry in flight any more: its second retry must not be refused because of its own first
    one (Envoy releases it first: ``RetryStateImpl::shouldRetry`` calls ``resetRetry``).
    Two dead endpoints, one live, num_retries 2, budget 0% with min_retry_concurrency 1, one
    request at a time: dead1, dead2, then the live one answers."""
    (o1,) = origins(1)
    dead1, dead2 = f"127.0.0.1:{refusing_port()}", f"127.0.0.1:{refusing_port()}"
    ld = lameduck(base_config(origin_port, cluster={
        "endpoints": [dead1, dead2, o1.addr],
        "retry_policy": {"num_retries": 2, "retry_budget": {"budget_percent": 0,
                                                            "min_retry_concurrency": 1}}}))
    r = httpx.get(ld.url("/"), timeout=10)
    with _admin(ld) as adm:
        st = adm.stats()
    assert st["cluster.app.upstream_cx_connect_fail"] == 2
    assert (r.status_code, st["cluster.app.upstream_rq_retry_overflow"]) == (200, 0), (
        f"{r.status_code} {r.text!r}: the second retry was refused by the budget "
        f"(overflow {st['cluster.app.upstream_rq_retry_overflow']}, "
        f"retries {st['cluster.app.upstream_rq_retry']})")
    assert st["cluster.app.upstream_rq_retry"] == 2
