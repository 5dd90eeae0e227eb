"""``workers: 2`` over real processes: a main process and two data-plane workers on one
listening socket, draining as one.

- steady load over both workers, SIGTERM: nothing fails, one drain report with the sum, exit
  0, and the idle connections of both workers are drained at moments in [2T/3, T - G);
- SIGKILL of a worker under load: no connection refused, only its requests in flight fail,
  a replacement serves;
- an endpoint set to DRAIN on the admin API is obeyed by both workers; cookie and source-IP
  persistence keep a client on its endpoint whichever worker takes its next connection;
- the stats are the process's: summed counters, worker.<i>. spread, merged histograms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import selectors
import signal
import threading
import time
from pathlib import Path

import httpx

from tests import loadgen
from tests.procs import Lameduck, RawConn, wait_until

T, G = 3.0, 0.5  # the proactive window is [2T/3, T - G) = [2.0, 2.5)
REPORT = re.compile(r"drain report: requests completed=(\d+) refused=(\d+) cut=(\d+) .*"
                    r"proactively=(\d+)")


class Load:
    """tests/loadgen.py in a thread until stopped: keep-alive and fresh connections."""

    def __init__(self, port: int, keepalive: int = 16, fresh: int = 4, path: str = "/",
                 pause: float = 0.0) -> None:
        self.counts = loadgen.Counts()
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=lambda: asyncio.run(loadgen.run(port, 30, keepalive=keepalive, fresh=fresh,
                                                   stop=self.stop, counts=self.counts,
                                                   path=path, pause=pause)),
            daemon=True)
        self.thread.start()

    def end(self) -> loadgen.Counts:
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive()
        return self.counts


def worker_pids(ld: Lameduck) -> list[int]:
    return [w["pid"] for w in ld.server_info()["workers"]]


def owner(pids: list[int], server_port: int, client_port: int) -> int | None:
    """Which process holds the server side of the connection from ``client_port``:
    /proc/net/tcp gives the socket's inode, each process's fd table its sockets."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote = f[1].split(":"), f[2].split(":")
        if int(local[1], 16) == server_port and int(remote[1], 16) == client_port:
            inode = f[9]
            break
    if inode is None:
        return None
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def test_sigterm_under_load_both_workers_drain_as_one(lameduck, tmp_path: Path) -> None:
    where = tmp_path / "reports"
    ld: Lameduck = lameduck(workers=2, drain={"time": f"{T}s", "strategy": "gradual",
                                              "connection_grace": f"{G}s",
                                              "report_dir": str(where)},
                            shutdown={"deadline": "6s", "min_drain": "0s"})
    pids = worker_pids(ld)
    assert len(pids) == 2 and ld.pid not in pids

    def served() -> list[int]:
        return [ld.stat(f"worker.{i}.downstream_rq_total") for i in (0, 1)]

    # Both workers busy, each serving > 30 % of the requests. SO_REUSEPORT places a
    # connection by a hash of its addresses, so 20 clients' connections can land 4 to 16; a
    # lopsided draw is ended (failing nothing) and the clients connect anew.
    for _ in range(5):
        before = served()
        load = Load(ld.port)
        counts = load.counts
        try:
            assert wait_until(lambda: counts.ok >= 600, timeout=15), counts  # noqa: B023
            share = [b - a for a, b in zip(before, served(), strict=True)]
        except BaseException:
            load.end()
            raise
        print(f"\nrequests per worker before the drain: {share}")
        if min(share) > 0.3 * sum(share):
            break
        assert load.end().failed == 0
    else:
        raise AssertionError(f"five loads all lopsided: {share}")
    try:
        # Idle keep-alive connections, until one of each worker holds some: they are
        # closed at their proactive moments.
        idle: list[tuple[RawConn, int]] = []
        for _ in range(40):
            c = RawConn(ld.addr, timeout=15)
            c.request("/")
            who = owner([ld.pid, *pids], ld.port, c.sock.getsockname()[1])
            assert who in pids, (who, pids)
            idle.append((c, who))
            if len(idle) >= 12 and len({w for _, w in idle}) == 2:
                break
        assert {w for _, w in idle} == set(pids), "no idle connection in one of the workers"
        eof_at: dict[int, float] = {}
        watcher = threading.Thread(target=_watch_eof, args=([c for c, _ in idle], eof_at),
                                   daemon=True)
        watcher.start()
        t0 = time.monotonic()
        ld.signal(signal.SIGTERM)
        # The clients stop before T, as a load balancer that took the instance out would:
        # a single instance refuses what comes after T by design. T/2 before it: a
        # connection the load opened last has 1.5 s to send its request, where a loaded
        # machine once stalled the load's thread from T - 0.5 s past T, and the exit at T
        # closed the 20 connections that had sent nothing yet.
        while time.monotonic() < t0 + T / 2:
            time.sleep(0.05)
    finally:
        counts = load.end()
    watcher.join(15)
    closed: dict[int, list[float]] = {pid: [] for pid in pids}
    for c, who in idle:
        assert c.sock.fileno() in eof_at, "an idle connection was not closed"
        closed[who].append(eof_at[c.sock.fileno()] - t0)
    for c, _ in idle:
        c.close()
    code = ld.wait(15)
    print(f"load: {counts}; idle connections closed after SIGTERM (s): {closed}")
    assert code == 0, ld.log()
    assert counts.failed == 0, counts.samples
    for pid, times in closed.items():
        # An idle connection is drained at its moment in [2T/3, T - G) and closed G later
        # (docs/drain.md): the moments are the closes less G. Timers fire late, never early.
        moments = [t - G for t in times]
        assert moments and min(moments) >= 2 * T / 3 - 0.02, (pid, moments)
        assert max(moments) < T - G + 0.3, (pid, moments)
    reports = REPORT.findall(ld.log())
    assert len(reports) == 1, ld.log()  # one report, the main process's
    completed, refused, cut, proactive = map(int, reports[0])
    assert (refused, cut) == (0, 0) and completed > 0
    assert proactive >= len(idle)
    files = list(where.glob("drain-*.json"))
    assert len(files) == 1, files
    report = json.loads(files[0].read_text())
    assert report["pid"] == ld.pid
    assert report["counts"]["completed"] == completed
    assert report["counts"]["cx_drained_proactive"] == proactive
    # the workers exited with the main process
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid)


def _watch_eof(conns: list[RawConn], eof_at: dict[int, float]) -> None:
    """The moment each idle connection reads EOF (by its descriptor), all watched at once: a
    close is timed when it happens, not when a test gets round to reading it. A reset or a
    response instead of EOF is not recorded (the test then fails)."""
    with selectors.DefaultSelector() as sel:
        for c in conns:
            c.sock.setblocking(False)
            sel.register(c.sock, selectors.EVENT_READ)
        end = time.monotonic() + 12
        while len(sel.get_map()) and time.monotonic() < end:
            for key, _ in sel.select(timeout=0.5):
                sock = key.fileobj
                try:
                    data = sock.recv(1)  # type: ignore[union-attr]
                except OSError:
                    data = b"reset"
                if data == b"":
                    eof_at[sock.fileno()] = time.monotonic()  # type: ignore[union-attr]
                sel.unregister(sock)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return "zombie"


def test_sigkill_of_a_worker_refuses_nothing_and_it_is_replaced(lameduck) -> None:
    ld: Lameduck = lameduck(workers=2)
    pids = worker_pids(ld)
    # a spare worker, started ahead and loaded, takes the dead one's place
    assert wait_until(lambda: (ld.server_info()["spare_worker"] or {}).get("loaded"), 15)
    spare = ld.server_info()["spare_worker"]["pid"]
    # Each of 16 keep-alive clients always has a request in flight (500 ms each), so every
    # one of them on the dead worker loses exactly one (it holds none of them once in 65,536
    # runs); new-connection clients land on its socket too (and must not be refused), a few
    # times a second each.
    load = Load(ld.port, keepalive=16, fresh=4, path="/sleep?ms=500", pause=0.05)
    try:
        assert wait_until(lambda: load.counts.ok >= 60, timeout=15), load.counts
        assert ld.server_info()["workers"][0]["connections"] > 0
        before = load.counts.failed + load.counts.stale_retries
        served_before = ld.stat("http.ingress.downstream_rq_total")
        t0 = time.monotonic()
        os.kill(pids[0], signal.SIGKILL)

        def replaced() -> bool:
            ws = ld.server_info()["workers"]
            return ws[0]["pid"] not in (0, pids[0]) and ws[0]["ready"]
        assert wait_until(replaced, timeout=10), ld.server_info()["workers"]
        took = time.monotonic() - t0
        done = load.counts.ok
        assert wait_until(lambda: load.counts.ok >= done + 60, timeout=15), load.counts
    finally:
        counts = load.end()
    print(f"\nreplacement serving after {took:.2f}s; {counts}")
    assert took < 1.0
    assert counts.refused == 0, counts.samples
    assert counts.bad_status == 0, counts.samples
    # What the clients lost is what the main process counts: the requests the dead worker
    # had begun, and the connections it had accepted and not yet read a request from (read
    # from the page it shared, not from its last status, up to 100 ms old).
    lost_client = counts.errors + counts.stale_retries - before
    lost_main = ld.stat("server.worker_lost_requests")
    print(f"lost: main process {lost_main}; client: {counts.errors} errors (a request sent "
          f"and no answer), {counts.stale_retries} on a reused connection that ended before "
          f"any byte (retried once)")
    assert lost_main == lost_client > 0, (lost_main, lost_client, counts.samples)
    assert re.search(rf"worker 0 \(pid {pids[0]}\) exited with signal 9 while serving; "
                     rf"{lost_main} request\(s\) in flight lost", ld.log()), ld.log()
    assert ld.stat("server.workers_replaced") == 1
    new = ld.server_info()["workers"][0]["pid"]
    assert new == spare
    assert wait_until(lambda: (ld.server_info()["spare_worker"] or {}).get("pid")
                      not in (None, spare), 10)  # and a new spare is started
    assert ld.stat("worker.0.downstream_rq_total") > 0
    # counters do not go back: the dead worker's requests are still counted (as of its last
    # report, which /stats asked for before the kill)
    assert ld.stat("http.ingress.downstream_rq_total") >= served_before + 60


def _served_by(resp: httpx.Response) -> str:
    assert resp.status_code == 200, resp.text
    return resp.headers["x-origin"]


def test_endpoint_drain_and_persistence_hold_in_both_workers(lameduck, origins) -> None:
    o1, o2 = origins(2)
    ld: Lameduck = lameduck(workers=2, cluster={
        "endpoints": [f"127.0.0.1:{o1.port}", f"127.0.0.1:{o2.port}"],
        "persistence": {"type": "source_ip", "timeout": "60s"}})
    # source-IP persistence: the first request makes the record; once every worker has it
    # (the gauge is the least over the workers) every new connection, whichever worker
    # takes it, goes to the same endpoint
    first = _served_by(httpx.get(ld.url("/")))
    assert wait_until(lambda: ld.stat("cluster.app.lb_persistence_records") == 1, 5)
    seen = set()
    before = [ld.stat(f"worker.{i}.downstream_rq_total") for i in (0, 1)]
    for _ in range(40):
        seen.add(_served_by(httpx.get(ld.url("/"))))  # a new connection each
    after = [ld.stat(f"worker.{i}.downstream_rq_total") for i in (0, 1)]
    assert seen == {first}, seen
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_endpoint_set_to_drain_is_obeyed_by_both_workers(lameduck, origins) -> None:
    o1, o2 = origins(2)
    ld: Lameduck = lameduck(workers=2, cluster={
        "endpoints": [f"127.0.0.1:{o1.port}", f"127.0.0.1:{o2.port}"]})
    seen = {_served_by(httpx.get(ld.url("/"))) for _ in range(10)}
    assert len(seen) == 2, seen
    r = ld.admin("POST", f"/clusters/app/endpoints/127.0.0.1:{o1.port}?state=drain")
    assert r.status_code == 200, r.text
    before = [ld.stat(f"worker.{i}.downstream_rq_total") for i in (0, 1)]
    seen = {_served_by(httpx.get(ld.url("/"))) for _ in range(40)}
    after = [ld.stat(f"worker.{i}.downstream_rq_total") for i in (0, 1)]
    assert len(seen) == 1 and o1.name not in seen, seen
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)


def test_cookie_persistence_holds_in_both_workers(lameduck, origins) -> None:
    o1, o2 = origins(2)
    ld: Lameduck = lameduck(workers=2, cluster={
        "endpoints": [f"127.0.0.1:{o1.port}", f"127.0.0.1:{o2.port}"],
        "persistence": {"type": "cookie", "timeout": "60s"}})
    r = httpx.get(ld.url("/"))
    first = _served_by(r)
    cookies = dict(r.cookies)
    assert cookies, r.headers
    assert wait_until(lambda: ld.stat("cluster.app.lb_persistence_records") == 1, 5)
    seen = {_served_by(httpx.get(ld.url("/"), cookies=cookies)) for _ in range(40)}
    assert seen == {first}, seen
    assert all(ld.stat(f"worker.{i}.downstream_rq_total") > 0 for i in (0, 1))


def test_stats_are_the_process_s(lameduck) -> None:
    ld: Lameduck = lameduck(workers=2)
    n = 60
    for _ in range(n):
        assert httpx.get(ld.url("/")).status_code == 200  # a new connection each
    stats = ld.stats()
    spread = [stats[f"worker.{i}.downstream_rq_total"] for i in (0, 1)]
    assert sum(spread) == stats["http.ingress.downstream_rq_total"] == n, stats
    assert stats["server.workers"] == 2
    assert stats["cluster.app.membership_total"] == 1  # the same in each: not summed
    assert stats["server.live"] == 1
    text = ld.admin("GET", "/stats").text
    m = re.search(r"http\.ingress\.downstream_rq_time: P0\(.*", text)
    assert m is not None, text
    prom = ld.admin("GET", "/stats/prometheus").text
    count = re.search(r'envoy_http_downstream_rq_time_count\{envoy_http_conn_manager_prefix='
                      r'"ingress"\} (\d+)', prom)
    assert count is not None and int(count.group(1)) == n, prom[:2000]



def test_a_worker_that_stops_answering_is_killed_and_replaced(lameduck) -> None:
    ld: Lameduck = lameduck(workers=2)
    pids = worker_pids(ld)
    t0 = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)  # alive, silent: no status reaches the main process
    try:
        def replaced() -> bool:
            ws = ld.server_info()["workers"]
            return ws[1]["pid"] not in (0, pids[1]) and ws[1]["ready"]
        assert wait_until(replaced, timeout=15), ld.log()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[1], signal.SIGCONT)
    took = time.monotonic() - t0
    print(f"\nsilent worker replaced after {took:.2f}s")
    assert took >= 3.0  # the heartbeat's timeout, not sooner
    assert "has not answered for" in ld.log()
    assert ld.stat("server.workers_replaced") == 1
    for _ in range(20):  # both workers serve again
        assert httpx.get(ld.url("/")).status_code == 200


def test_a_drain_that_keeps_the_listeners_keeps_the_spare(lameduck) -> None:
    """``drain_listeners?graceful&skip_exit`` closes no listening socket: the spare, which
    holds them all, stays (it is dropped only where a listener is to close)."""
    ld: Lameduck = lameduck(workers=2)
    # upper bounds, returned from when done: the spare's start-up (a worker's took 3.5 s at
    # load 12) and a 2 s drain
    assert wait_until(lambda: (ld.server_info()["spare_worker"] or {}).get("loaded"), 30)
    spare = ld.server_info()["spare_worker"]["pid"]
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    assert wait_until(lambda: not ld.server_info()["drain"]["active"], 30), ld.server_info()
    info = ld.server_info()
    assert all(ls["accepting"] for ls in info["listeners"]), info["listeners"]
    assert (info["spare_worker"] or {}).get("pid") == spare, info


def test_a_worker_replaced_after_its_listener_closed_starts_without_it(lameduck) -> None:
    """In a shutdown the listening sockets close at the drain's end while a request is still
    in flight; a worker that dies then is replaced by one that starts without them (before,
    the replacement died at start-up on the socket it was not given, and was replaced
    again, and again)."""
    ld: Lameduck = lameduck(workers=2,
                            drain={"time": "1s", "strategy": "immediate",
                                   "connection_grace": "200ms"},
                            shutdown={"deadline": "120s", "min_drain": "0s",
                                      "stop_accepting": "at_drain_end"})
    c = RawConn(ld.addr, timeout=120)
    try:
        # in flight until the test sends the rest of its body
        c.sock.sendall(f"POST / HTTP/1.1\r\nHost: {ld.addr}\r\nContent-Length: 10\r\n\r\n"
                       "12345".encode())
        assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 30)
        ld.signal(signal.SIGTERM)
        assert wait_until(lambda: "listener ingress stopped accepting" in ld.log(), 60), \
            ld.log()
        ws = ld.server_info()["workers"]
        idle = next(w for w in ws if w["connections"] == 0)
        os.kill(idle["pid"], signal.SIGKILL)
        assert wait_until(lambda: re.search(r"worker \d replaced by pid", ld.log()), 60), \
            ld.log()
        assert "listener ingress: closed before this worker started" in ld.log()
        c.sock.sendall(b"67890")
        assert c.read_response().status == 200
    finally:
        c.sock.close()
    assert ld.wait(60) == 0, ld.log()
    assert "Traceback" not in ld.log(), ld.log()
