"""HTTP/3 through five SIGHUP hot restarts, with long requests in flight at each: no request
fails. Real processes: ``lameduck run`` (SIGHUP starts its successor, which takes the TCP and
UDP sockets over), the demo origin, and aioquic's HTTP/3 client in a thread of its own.

Each new process reads the UDP socket alone; a packet for a connection of an older process
(its connection id names that process's generation) is forwarded to it, so a connection in
flight at a restart goes on in its own process until that process has drained it. The
restarts overlap: the next SIGHUP comes once the new process serves, while the older ones
still drain, so the newest forwards to several generations at once.

A client here does what a real one does with the drain's signals (RFC 9114 §5.2): after a
GOAWAY it opens no new stream on that connection, and a request reset with
H3_REQUEST_REJECTED (not processed, §4.1.1) is sent again on a new connection."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from lameduck.http3 import H3_REQUEST_REJECTED
from tests.h3client import H3Client, counted_active, h3_connect
from tests.integration.test_http3 import h3_listener
from tests.procs import (
    Lameduck,
    base_config,
    children_of,
    exited_cleanly,
    sighup_restart,
    wait_until,
)

RESTARTS = 5
SHORT, LONG = 4, 3  # client tasks: short requests; requests that take LONG_MS at the origin
LONG_MS = 2000
HARD_CAP = 150.0  # seconds of load at most, whatever happens
LIMIT = 20_000  # requests at most


class Load:
    """HTTP/3 clients on an event loop in a thread of their own, until ``finish()``."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.ok = 0
        self.long_ok = 0
        self.long_in_flight = 0
        self.rejected = 0  # reset with H3_REQUEST_REJECTED: sent again, not a failure
        self.connections = 0
        self.failed: list[str] = []
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        async with asyncio.timeout(HARD_CAP):
            await asyncio.gather(*(self._client(i >= SHORT) for i in range(SHORT + LONG)))

    def _more(self) -> bool:
        return not self.stop.is_set() and self.sent < LIMIT

    async def _client(self, long: bool) -> None:
        path = f"/sleep?ms={LONG_MS}" if long else "/"
        while self._more():
            try:
                async with asyncio.timeout(30):
                    cm = h3_connect(self.addr)
                    c: H3Client = await cm.__aenter__()
            except (TimeoutError, ConnectionError, OSError) as e:
                self.failed.append(f"connect: {e!r}")
                return
            self.connections += 1
            try:
                # one request at a time on this connection, until the server says go away
                while self._more() and not c.goaways() and c.terminated is None:
                    self.sent += 1
                    if long:
                        self.long_in_flight += 1
                    try:
                        async with asyncio.timeout(30):
                            reply = await c.request("GET", path)
                    except TimeoutError:
                        self.failed.append(f"{path}: no answer in 30 s")
                        return
                    finally:
                        if long:
                            self.long_in_flight -= 1
                    if reply.status == 200:
                        self.ok += 1
                        self.long_ok += long
                    elif reply.reset == H3_REQUEST_REJECTED and not reply.closed:
                        self.rejected += 1
                        break  # not processed: sent again on a new connection
                    else:
                        self.failed.append(f"{path}: status {reply.status} reset "
                                           f"{reply.reset} closed {reply.closed}")
            finally:
                with contextlib.suppress(Exception):
                    await cm.__aexit__(None, None, None)

    def more(self, n: int, timeout: float = 60.0) -> bool:
        goal = self.ok + n
        return wait_until(lambda: self.ok >= goal or bool(self.failed), timeout, 0.01)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(HARD_CAP)
        assert not self.thread.is_alive()

    def report(self) -> str:
        return (f"ok={self.ok} long_ok={self.long_ok} rejected={self.rejected} "
                f"connections={self.connections} failed={len(self.failed)} "
                f"{self.failed[:5]}")


def _config(origin_port: int, tmp_path: Path, tls_files: tuple[Path, Path, Path],
            workers: int = 1) -> dict[str, Any]:
    """One process (it owns the UDP socket), or a main process and its workers (a UDP
    socket each); a connection grace long enough for a request in flight at the first
    GOAWAY to end below the final one; the deadline far beyond a long request."""
    cfg: dict[str, Any] = base_config(origin_port, listener=h3_listener(tls_files))
    cfg["workers"] = workers
    cfg["drain"] = {"time": "3s", "strategy": "gradual", "connection_grace": "3s"}
    cfg["shutdown"] = {"deadline": "30s", "min_drain": "0s"}
    cfg["hot_restart"] = {"socket": str(tmp_path / "restart.sock"),
                          "parent_shutdown_time": "30s"}
    return cfg


@pytest.mark.timeout(HARD_CAP + 120)
@pytest.mark.parametrize("workers", [(1, 1), (2, 2), (2, 1)],
                         ids=["one-process", "workers2", "workers2-then-1-then-2"])
def test_five_sighup_hot_restarts_under_http3_load_fail_no_request(
        tmp_path: Path, origin_port: int, tls_files: tuple[Path, Path, Path],
        subreaper: list[int], workers: tuple[int, int]) -> None:
    """Generation g runs ``workers[g % 2]`` workers. ``workers: 2``: each new main process
    takes the group of UDP sockets over, and its worker i forwards to the older processes'
    workers the packets whose ids name them. From 2 to 1 and back: one process reads every
    socket of the group; the next main process binds a second socket beside the first."""
    cfg = _config(origin_port, tmp_path, tls_files, workers[0])
    ld = Lameduck(cfg, tmp_path).start()
    pid = ld.pid
    olds: list[int] = []
    codes: dict[int, int] = {}
    t0 = time.monotonic()
    load = Load(ld.addr)
    try:
        assert load.more(100), load.report()
        for epoch in range(1, RESTARTS + 1):
            # a long request in flight on a connection of the process about to be replaced
            assert wait_until(lambda: load.long_in_flight > 0 or bool(load.failed), 30,
                              0.01), load.report()
            olds.append(pid)
            subreaper.extend(children_of(pid))  # its workers, adopted here once it exits
            if workers[epoch % 2] != cfg["workers"]:
                cfg["workers"] = workers[epoch % 2]
                ld.path.write_text(yaml.safe_dump(cfg))
            pid = sighup_restart(ld, pid, epoch, subreaper, codes, wait_exit=False)
            assert load.more(50), load.report()  # the new process serves the load
        for old in olds:  # each drained its connections, the long requests too, and left
            exited_cleanly(ld, old, codes, timeout=60)
        assert load.more(50), load.report()  # a tail on the last one
    finally:
        load.finish()
    elapsed = time.monotonic() - t0
    stats = ld.stats()  # the last process's, with every earlier one's carried over
    forwarded = stats["http.ingress.http3.packets_forwarded"]
    report = (f"workers {workers}, {RESTARTS} restarts: {load.report()} in {elapsed:.1f} s; "
              f"packets forwarded "
              f"{forwarded}, dropped {stats['http.ingress.http3.packets_forward_dropped']}")
    print(report)
    log = ld.log()
    subreaper.extend(children_of(pid))
    assert "Traceback" not in log, log
    assert not load.failed, report
    assert load.long_ok >= RESTARTS, report
    assert forwarded > 0, report  # the connections in flight were served across restarts
    assert stats["http.ingress.downstream_rq_5xx"] == 0, report


def test_a_supervise_reload_carries_an_http3_request_in_flight(
        tmp_path: Path, origin_port: int, tls_files: tuple[Path, Path, Path]) -> None:
    """`lameduck supervise` (the container entry point) on SIGHUP starts a new child that
    hot-restarts from the running one: the same handover, so a 3 s HTTP/3 request in flight
    at the SIGHUP ends with its 200 from the old child (its packets forwarded by the new
    one), and a new connection is the new child's."""
    from tests.integration.test_hot_restart import _epoch
    from tests.integration.test_http3 import run
    from tests.procs import children_of

    sup = Lameduck(_config(origin_port, tmp_path, tls_files), tmp_path).start(
        command="supervise")
    try:
        async def go() -> Any:
            async with h3_connect(sup.addr) as c:
                long = c.send("GET", "/sleep?ms=3000")
                assert await counted_active(sup, 15)
                sup.signal(signal.SIGHUP)
                assert await asyncio.to_thread(wait_until, lambda: _epoch(sup) == 1, 30)
                async with asyncio.timeout(30):
                    reply = await long
                async with h3_connect(sup.addr) as c2:
                    fresh = await c2.request("GET", "/")
            return reply, fresh

        reply, fresh = run(go())
        assert reply.status == 200 and reply.body == b"slept 3000 ms\n", sup.log()
        assert fresh.status == 200, sup.log()
        assert wait_until(lambda: len(children_of(sup.pid)) == 1, 30), sup.log()
        assert sup.stat("http.ingress.http3.packets_forwarded") > 0, sup.log()
        sup.signal(signal.SIGTERM)
        assert sup.wait(30) == 0, sup.log()
    finally:
        sup.kill()
    assert "Traceback" not in sup.log(), sup.log()


def test_an_http3_listener_renamed_over_a_hot_restart_takes_its_sockets_over(
        tmp_path: Path, origin_port: int, tls_files: tuple[Path, Path, Path],
        subreaper: list[int]) -> None:
    """With workers, the port's UDP sockets are one SO_REUSEPORT group steered by connection
    id: a renamed listener that bound sockets of its own beside the old ones would have its
    packets steered to the old process's. It takes the old listener's sockets over instead:
    a request in flight at the SIGHUP ends in the old process, new connections are the new
    one's."""
    from tests.integration.test_http3 import run

    cfg = _config(origin_port, tmp_path, tls_files, workers=2)
    ld = Lameduck(cfg, tmp_path).start()
    codes: dict[int, int] = {}
    subreaper.extend(children_of(ld.pid))

    addr = ld.addr  # the same port under its new name

    async def go() -> tuple[Any, list[int]]:
        async with h3_connect(addr) as c:
            long = c.send("GET", "/sleep?ms=3000")
            assert await counted_active(ld, 15)
            cfg["listeners"][0]["name"] = "edge"
            ld.path.write_text(yaml.safe_dump(cfg))
            await asyncio.to_thread(sighup_restart, ld, ld.pid, 1, subreaper, codes, False)
            fresh = []
            for _ in range(8):
                async with asyncio.timeout(15), h3_connect(addr) as c2:
                    fresh.append((await c2.request("GET", "/")).status)
            async with asyncio.timeout(30):
                return await long, fresh

    reply, fresh = run(go())
    assert reply.status == 200 and reply.body == b"slept 3000 ms\n", ld.log()
    assert fresh == [200] * 8, ld.log()
    assert ld.stat("http.edge.http3.packets_forwarded") > 0, ld.log()
    exited_cleanly(ld, ld.pid, codes, timeout=60)
    assert "Traceback" not in ld.log(), ld.log()
