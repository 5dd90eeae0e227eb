"""Hot restart over real processes: a new `lameduck run --hot-restart` with the same config
path takes the running one's sockets over the rendezvous Unix socket, becomes ready, then the
old one drains and exits. Load runs from a client that counts every failure
(tests/loadgen.py): keep-alive and new connections mixed."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests import loadgen, procs
from tests.procs import Lameduck, base_config, wait_until

pytestmark = pytest.mark.usefixtures("workers")


def _config(origin_port: int, tmp_path: Path, **over: Any) -> dict[str, Any]:
    """T is seconds, not a fraction of one: a connection the old process accepted just before
    the handover is closed at T if its request has not come by then (idle, as HTTP/1.1 allows),
    and on a loaded 2-core machine the load's client thread has gone 600 ms between its
    connect and its write. The old process still exits as soon as its connections are gone
    (``min_drain: 0s``), so a longer T costs these tests nothing."""
    cfg = base_config(origin_port, **over)
    cfg["drain"] = {"time": "3s", "strategy": "gradual", "connection_grace": "200ms"}
    cfg["shutdown"] = {"deadline": "8s", "min_drain": "0s", "stop_accepting": "at_drain_end"}
    cfg["hot_restart"] = {"socket": str(tmp_path / "restart.sock"),
                          "parent_shutdown_time": "8s"}
    return cfg


class Load:
    """loadgen in a thread of its own, so the test can restart processes meanwhile; its
    counts fill in as it goes (``more``)."""

    def __init__(self, port: int, seconds: float = 60.0) -> None:
        self.counts: loadgen.Counts | None = loadgen.Counts()
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.elapsed = 0.0
        self.thread = threading.Thread(target=self._run, args=(port, seconds), daemon=True)
        self.thread.start()

    def _run(self, port: int, seconds: float) -> None:
        asyncio.run(loadgen.run(port, seconds, stop=self.stop, counts=self.counts))
        self.elapsed = time.monotonic() - self.started

    def more(self, n: int, timeout: float = 60.0) -> bool:
        """Wait for ``n`` more answered requests than now."""
        c = self.counts
        assert c is not None
        goal = c.ok + n
        return wait_until(lambda: c.ok >= goal, timeout, 0.01)

    def finish(self) -> loadgen.Counts:
        self.stop.set()
        self.thread.join(30)
        assert self.counts is not None
        return self.counts

    def report(self) -> str:
        c = self.counts
        assert c is not None
        elapsed = self.elapsed or time.monotonic() - self.started
        return (f"ok={c.ok} ({c.ok / elapsed:.0f}/s) refused={c.refused} "
                f"errors={c.errors} bad_status={c.bad_status} stale_retries={c.stale_retries} "
                f"connections={c.connections} {c.samples}")


def _epoch(ld: Lameduck) -> int:
    try:
        return ld.stat("server.hot_restart_epoch")
    except (httpx.HTTPError, KeyError, ValueError):
        return -1


def _successor(cfg: dict[str, Any], tmp_path: Path, old: Lameduck) -> Lameduck:
    """The next process, not started: ``cfg`` written over ``old``'s config file, since a hot
    restart replaces the same service (the same config path). Start it with
    ``start(args=HOT)``."""
    new = Lameduck(cfg, tmp_path)
    new.path.unlink()
    new.path = old.path
    old.path.write_text(yaml.safe_dump(new.cfg))
    return new


HOT = ("--hot-restart",)


def _hello(ld: Lameduck) -> bytes:
    """A successor's first message, by hand (restart/hot.py), for ``ld``'s config."""
    msg = json.dumps({"op": "hello", "pid": 1, "config": str(ld.path)}).encode()
    return struct.pack(">I", len(msg)) + msg


def _restart(cfg: dict[str, Any], tmp_path: Path, old: Lameduck, epoch: int) -> Lameduck:
    """Start the next process; wait until it serves as ``epoch`` and the old one has exited.
    Its listeners configured on port 0 keep the ports the old one had: it inherits the bound
    sockets, and so does its admin API. (Upper bounds, returned from as soon as it is done:
    a main process and two workers take seconds to start at load 10.)"""
    new = _successor(cfg, tmp_path, old)
    new.start(args=HOT)  # its admin address is written once the old one has handed over
    assert wait_until(lambda: _epoch(new) == epoch, 30), new.log()
    assert new.admin_addr == old.admin_addr
    before = {lc["name"]: lc["address"] for lc in old.cfg["listeners"]}
    kept = [lc["name"] for lc in cfg["listeners"] if before.get(lc["name"]) == lc["address"]]
    assert {n: new.addrs[n] for n in kept} == {n: old.addrs[n] for n in kept}, (old.addrs,
                                                                                 new.addrs)
    assert old.wait(30) == 0, old.log()
    return new


def _start_failing(new: Lameduck) -> int:
    """Start a successor that must fail; its exit code. (Its start may look ready: the old
    process answers the admin's /ready until a successor takes the admin port.)"""
    try:
        new.start(args=HOT)
    except RuntimeError as e:
        assert "exited early" in str(e)
    return new.wait(10)


# The suite's 120 s per test guards against hangs; ten restarts of a main process and two
# workers took longer at load 10, and every wait in the test is bounded on its own.
@pytest.mark.timeout(400)
def test_ten_hot_restarts_under_load_fail_no_request(origin_port: int, tmp_path: Path) -> None:
    """Each restart comes with the load running, and the load makes progress on each new
    process (answers counted, not a rate: a loaded machine serves fewer per second)."""
    cfg = _config(origin_port, tmp_path)
    ld = Lameduck(cfg, tmp_path).start()
    assert _epoch(ld) == 0
    load = Load(ld.port, seconds=360)
    procs = [ld]
    try:
        assert load.more(200), load.report()
        for epoch in range(1, 11):
            ld = _restart(cfg, tmp_path, ld, epoch)
            procs.append(ld)
            assert load.more(200), load.report()
    finally:
        counts = load.finish()
    msg = load.report()
    print(msg)
    assert counts.failed == 0, msg
    assert counts.connections > 100, msg
    # stats carried across the processes: the last one counts (nearly) every request
    served = ld.stat("http.ingress.downstream_rq_total")
    assert served >= counts.ok, (served, counts.ok)
    assert ld.stat("server.hot_restart_epoch") == 10
    assert all(p.proc is not None and p.proc.poll() == 0 for p in procs[:-1])
    ld.kill()


def test_a_successor_with_a_bad_config_leaves_the_old_one_serving(
        origin_port: int, tmp_path: Path) -> None:
    cfg = _config(origin_port, tmp_path)
    ld = Lameduck(cfg, tmp_path).start()
    load = Load(ld.port)
    try:
        bad = dict(cfg, drain={"time": "banana"})
        new = _successor(bad, tmp_path, ld)
        assert _start_failing(new) == 2
        assert "drain.time" in new.log()
        time.sleep(0.5)
    finally:
        counts = load.finish()
    assert counts.failed == 0 and counts.ok > 0, load.report()
    assert _epoch(ld) == 0 and ld.proc is not None and ld.proc.poll() is None
    ld.kill()


def test_a_successor_that_fails_after_taking_the_sockets_changes_nothing(
        origin_port: int, tmp_path: Path) -> None:
    """It got the sockets, then could not bind a listener of its own (a crash before ready):
    exit 1; the old one never stopped accepting."""
    cfg = _config(origin_port, tmp_path)
    ld = Lameduck(cfg, tmp_path).start()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    load = Load(ld.port)
    try:
        second = dict(cfg["listeners"][0], name="second",
                      address=f"127.0.0.1:{busy.getsockname()[1]}")
        new = _successor(dict(cfg, listeners=[cfg["listeners"][0], second]), tmp_path, ld)
        assert _start_failing(new) == 1
        assert wait_until(lambda: "went away before it was ready" in ld.log(), 5), ld.log()
        time.sleep(0.5)
    finally:
        counts = load.finish()
        busy.close()
    assert counts.failed == 0 and counts.ok > 0, load.report()
    assert ld.proc is not None and ld.proc.poll() is None
    assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    # and a good successor still can take over afterwards
    ld = _restart(cfg, tmp_path, ld, 1)
    ld.kill()


def test_a_successor_that_vanishes_mid_handshake(origin_port: int, tmp_path: Path) -> None:
    """Speaking the protocol by hand: hello, take the descriptors, go away without "drain"
    (a process killed before it was ready). The rendezvous is owner-only."""
    cfg = _config(origin_port, tmp_path)
    ld = Lameduck(cfg, tmp_path).start()
    path = cfg["hot_restart"]["socket"]
    assert os.stat(path).st_mode & 0o777 == 0o600
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    s.sendall(_hello(ld))
    data, fds, _, _ = socket.recv_fds(s, 65536, 16)
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        data += s.recv(65536)
    assert b'"op":"sockets"' in data
    # the listener's (one per worker with workers: N, an SO_REUSEPORT group) and the admin's
    assert len(fds) == procs.DEFAULT_WORKERS + 1
    got = socket.socket(fileno=fds[0])
    assert got.getsockname()[1] == ld.port
    s.close()
    got.close()
    os.close(fds[1])
    assert wait_until(lambda: "went away before it was ready" in ld.log(), 5), ld.log()
    for _ in range(20):
        assert httpx.get(ld.url("/"), timeout=5).status_code == 200
    assert _epoch(ld) == 0
    ld.kill()


def test_reload_by_hot_restart_adds_moves_and_removes_listeners(
        origin_port: int, tmp_path: Path) -> None:
    """The new process's config decides: a listener kept at its address keeps its socket (no
    refused connection), one that moved binds anew, one that is gone drains in the old one.
    Every address has port 0; "moved" goes from 127.0.0.1 to 127.0.0.2."""
    cfg = _config(origin_port, tmp_path)
    keep = cfg["listeners"][0]
    gone = dict(keep, name="gone")
    moved_old = dict(keep, name="moved")
    cfg["listeners"] = [keep, gone, moved_old]
    ld = Lameduck(cfg, tmp_path).start()
    moved_new = dict(moved_old, address="127.0.0.2:0")
    added = dict(keep, name="added")
    new_cfg = dict(cfg, listeners=[keep, moved_new, added])
    old_addrs = dict(ld.addrs)
    load = Load(ld.port)
    try:
        new = _restart(new_cfg, tmp_path, ld, 1)
    finally:
        counts = load.finish()
    assert counts.failed == 0 and counts.ok > 0, load.report()
    assert new.addr_of("moved").startswith("127.0.0.2:")
    for lc in (keep, moved_new, added):
        assert httpx.get(f"http://{new.addr_of(lc['name'])}/", timeout=5).status_code == 200
    for lc in (gone, moved_old):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{old_addrs[lc['name']]}/", timeout=5)
    lm = {k.removeprefix("listener_manager."): v for k, v in new.stats().items()
          if k.startswith("listener_manager.")}
    # Envoy's LDS words against the process before (its own 3 additions carried over)
    assert lm == {"listener_added": 3 + 1, "listener_modified": 1, "listener_removed": 1,
                  "total_listeners_active": 3, "total_listeners_draining": 0}, lm
    new.kill()


def test_modify_only_ignores_healthcheck_fail_but_drains_on_hot_restart(
        origin_port: int, tmp_path: Path) -> None:
    """Envoy's drain_type modify_only, as its draining docs describe it: /healthcheck/fail leaves
    it alone (its responses keep the connection), a hot restart drains it like any listener."""
    from tests.procs import RawConn

    cfg = _config(origin_port, tmp_path)
    cfg["drain"]["time"] = "600ms"  # T/2 below
    side = dict(cfg["listeners"][0], name="sidecar", drain_type="modify_only")
    cfg["listeners"].append(side)
    ld = Lameduck(cfg, tmp_path).start()
    default = RawConn(ld.addr)
    sidecar = RawConn(ld.addr_of("sidecar"))
    assert ld.admin("POST", "/healthcheck/fail").status_code == 200
    default.send("/")
    assert default.read_response().closes  # default: every response drains
    for _ in range(3):
        sidecar.send("/")
        r = sidecar.read_response()
        assert r.status == 200 and not r.closes
    new = _successor(cfg, tmp_path, ld)
    new.start(args=HOT)
    assert wait_until(lambda: _epoch(new) == 1, 10), new.log()
    time.sleep(0.4)  # past T/2 (300 ms): in the old process every response drains
    # Drained either way: its response says close, or (idle, its proactive moment came
    # first) the old process has closed it already.
    try:
        sidecar.send("/")
        r = sidecar.read_response()
    except (ConnectionError, OSError):
        pass
    else:
        assert r.status == 200 and r.closes
    assert ld.wait(10) == 0
    new.kill()


def test_the_old_process_exits_by_parent_shutdown_time(origin_port: int, tmp_path: Path) -> None:
    """A request longer than the old process may live is cut at parent_shutdown_time (counted,
    exit code 3), while the new process serves.

    The request outlives everything but a cut (90 s; the successor's start-up under load took
    longer than the 8 s it had been), and shutdown.deadline (30 s) is far from
    parent_shutdown_time (2 s): an exit within 10 s of the handover is the latter's."""
    cfg = _config(origin_port, tmp_path, route={"timeout": "120s"})
    cfg["drain"]["time"] = "600ms"  # below parent_shutdown_time
    cfg["shutdown"]["deadline"] = "30s"
    cfg["hot_restart"]["parent_shutdown_time"] = "2s"
    ld = Lameduck(cfg, tmp_path).start()
    result: list[int | str] = []

    def slow() -> None:
        try:
            result.append(httpx.get(ld.url("/sleep?ms=90000"), timeout=120).status_code)
        except httpx.HTTPError as e:
            result.append(type(e).__name__)

    t = threading.Thread(target=slow)
    t.start()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 1, 30), ld.log()
    new = _successor(cfg, tmp_path, ld)
    new.start(args=HOT)
    assert wait_until(lambda: _epoch(new) == 1, 30), new.log()
    t0 = time.monotonic()
    assert ld.wait(30) == 3, ld.log()  # cut at parent_shutdown_time
    assert time.monotonic() - t0 < 10.0, ld.log()  # not at the 30 s deadline
    t.join(15)
    assert result and result[0] != 200, result  # cut: a 503 or a reset, never a hang
    assert "cutting 1 requests" in ld.log()
    assert httpx.get(new.url("/"), timeout=5).status_code == 200
    new.kill()


def test_one_successor_at_a_time(origin_port: int, tmp_path: Path) -> None:
    """While one new process holds the sockets and is not ready yet, a second is refused
    (exit 1, a clear message): two would both serve and one would never be drained."""
    cfg = _config(origin_port, tmp_path)
    ld = Lameduck(cfg, tmp_path).start()
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.settimeout(5)
    first.connect(cfg["hot_restart"]["socket"])
    first.sendall(_hello(ld))
    _, fds, _, _ = socket.recv_fds(first, 65536, 16)
    for fd in fds:
        os.close(fd)
    second = _successor(cfg, tmp_path, ld)
    assert _start_failing(second) == 1
    assert "refused: another new process is taking over" in second.log()
    first.close()  # the first one gives up (dies before it was ready)
    assert wait_until(lambda: "went away before it was ready" in ld.log(), 5), ld.log()
    third = _restart(cfg, tmp_path, ld, 1)  # now a successor is welcome again
    assert httpx.get(third.url("/"), timeout=5).status_code == 200
    third.kill()
