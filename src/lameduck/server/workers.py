"""The main process's workers: started with the listening sockets, watched, replaced.

Each worker gets a Unix socket pair for control and a duplicate of every listening socket
(the main process keeps its own: a worker that dies leaves the socket open in the others and
here, so no connection is refused, and its replacement gets the same socket). A worker sends
its status every 100 ms; one silent for ``HEARTBEAT_TIMEOUT`` is killed and replaced, as is
one that exits while the process serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lameduck.server.channel import Channel, Message, encode, open_channel
from lameduck.server.inflight import InFlight

if TYPE_CHECKING:
    from lameduck.server.quicgroup import QuicGroup

log = logging.getLogger("lameduck")

HEARTBEAT_TIMEOUT = 3.0  # seconds without a status before a worker is killed
READY_TIMEOUT = 30.0  # seconds a new worker may take to serve
STATS_TIMEOUT = 1.0  # seconds /stats waits for a worker's numbers (else: its last ones)


def worker_count(setting: int | str) -> int:
    """``workers``: a number, or ``auto`` (the CPUs this process may run on, as nginx's
    ``worker_processes auto``)."""
    if setting == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            return max(1, os.cpu_count() or 1)
    return int(setting)


class Worker:
    """One worker process as the main process sees it."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        self.channel: Channel | None = None
        self.status: dict[str, Any] = {}
        self.ready = False
        self.last_seen = 0.0
        self.exiting = False  # told to finish: its exit is expected
        self.stats: list[Any] = []  # its last stats reply
        self.clusters: list[dict[str, Any]] = []
        self.waiting: asyncio.Future[None] | None = None
        # Stats requests sent and not yet answered, in order (the channel keeps it): each
        # reply answers the oldest, so a caller waits for the reply to its own request, one
        # that reflects every message sent to the worker before it.
        self.stats_asked: deque[asyncio.Future[None]] = deque()
        self.loaded = False  # a spare: its modules loaded, its config built
        self.inflight: InFlight | None = None  # its requests in flight, shared with it

    def lost(self) -> int:
        """What it had in flight when it died (the shared page is let go of)."""
        page, self.inflight = self.inflight, None
        if page is None:
            return 0
        n = page.lost()
        page.close()
        return n

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0


class WorkerSet:
    """``count`` workers over the held ``sockets``; ``on_status(worker)`` after each status,
    ``on_lost(worker, its last status, its requests in flight)`` when one died while serving
    (it is replaced),
    ``on_endpoints(msg)`` for endpoint facts a worker found (outlier detection)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, config: dict[str, Any],
                 sockets: dict[str, list[socket.socket]], argv: list[str],
                 on_status: Callable[[Worker], None],
                 on_lost: Callable[[Worker, Message, int], None],
                 on_endpoints: Callable[[Message], None],
                 quic: dict[str, QuicGroup] | None = None) -> None:
        self.loop = loop
        self.config = config
        self.sockets = sockets
        self.quic = quic if quic is not None else {}  # HTTP/3 listeners' UDP sockets
        self.argv = argv
        self.on_status = on_status
        self.on_lost = on_lost
        self.on_endpoints = on_endpoints
        self.workers = [Worker(i) for i in range(count)]
        self.stopping = False
        self.replaced = 0
        self._heartbeat: asyncio.TimerHandle | None = None
        self._all_exited: asyncio.Future[None] = loop.create_future()
        # what the main process has broadcast that a replacement must replay, and the state
        # it must start with (endpoint facts)
        self.replay: list[Message] = []
        self.spare: Worker | None = None
        self.spares_wanted = True
        self.greeting: Callable[[], list[Message]] = list

    # -- start, replace ---------------------------------------------------------------------
    async def start(self) -> None:
        """Every worker serving (or OSError naming the one that did not); then a spare."""
        await asyncio.gather(*(self._spawn(w) for w in self.workers))
        self._heartbeat = self.loop.call_later(0.5, self._check_heartbeats)
        self.start_spare()

    # -- the spare: a worker started ahead, its modules loaded, waiting to be told its index;
    # it replaces one that dies in milliseconds instead of an interpreter's start-up.
    def start_spare(self) -> None:
        if self.spare is None and self.spares_wanted and not self.stopping:
            self.spare = Worker(-1)
            self.loop.create_task(self._spawn(self.spare, spare=True))

    def drop_spare(self) -> None:
        """No spare from now on (a drain: it would hold listening sockets open past their
        close)."""
        self.spares_wanted = False
        s, self.spare = self.spare, None
        if s is not None:
            s.exiting = True
            self._kill(s)

    async def _spawn(self, w: Worker, spare: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # worker i: the i-th socket of an SO_REUSEPORT group, else the one socket; a spare
        # has them all until it knows which worker it is
        fds = {name: [s.fileno() for s in socks] if spare
               else [socks[w.index % len(socks)].fileno()]
               for name, socks in self.sockets.items()}
        # HTTP/3: every worker is given the whole group and keeps its own (worker.serve)
        quic = {name: g.for_workers() for name, g in self.quic.items()}
        argv = [sys.executable, "-m", "lameduck.server.worker", "--control-fd",
                str(theirs.fileno()), "--index", str(w.index), *self.argv]
        w.lost()
        w.inflight = InFlight()
        try:
            w.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno(), w.inflight.fd,
                                                      *(fd for fl in fds.values() for fd in fl),
                                                      *(fd for g in self.quic.values()
                                                        for fd in g.fds())],
                                      stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        w.ready = w.exiting = False
        w.status = {}
        w.last_seen = self.loop.time()
        with contextlib.suppress(OSError):
            w.pidfd = os.pidfd_open(w.proc.pid)
            self.loop.add_reader(w.pidfd, self._exited, w)
        ours.sendall(encode({"config": self.config, "index": None if spare else w.index,
                             "count": len(self.workers), "fds": fds, "quic": quic,
                             "inflight_fd": w.inflight.fd}))
        w.waiting = self.loop.create_future()
        holder: list[Channel] = []

        def lost() -> None:  # read to the end: a worker's last status comes before its EOF
            if holder and w.channel is holder[0]:
                w.channel = None
                self._maybe_all_exited()
        w.channel = await open_channel(self.loop, ours, lambda m: self._message(w, m), lost)
        holder.append(w.channel)
        if not spare:
            await self._serving(w)

    async def _serving(self, w: Worker) -> None:
        """Until ``w`` serves; then it learns the state and the drains under way."""
        assert w.waiting is not None and w.channel is not None
        try:
            await asyncio.wait_for(asyncio.shield(w.waiting), READY_TIMEOUT)
        except TimeoutError:
            self._kill(w)
            raise OSError(f"worker {w.index} (pid {w.pid}) did not start serving within "
                          f"{READY_TIMEOUT:.0f}s") from None
        # its channel read to the end (the worker has gone, maybe not yet reaped): the same
        channel = w.channel
        if w.proc is None or w.proc.poll() is not None or channel is None:
            raise OSError(f"worker {w.index} exited while starting")
        for msg in [*self.greeting(), *self.replay]:
            channel.send(msg)

    def _message(self, w: Worker, msg: Message) -> None:
        op = msg.get("op")
        w.last_seen = self.loop.time()
        if op == "status" or op == "exiting":
            w.status = msg
            if "stats" in msg:
                w.stats = msg.pop("stats")
            self.on_status(w)
        elif op == "loaded":  # a spare, ready to take a worker's place
            w.loaded = True
        elif op == "ready":
            w.ready = True
            if w.waiting is not None and not w.waiting.done():
                w.waiting.set_result(None)
        elif op == "stats":
            w.stats = msg["stats"]
            w.clusters = msg["clusters"]
            w.status = msg["status"]  # as fresh as the numbers
            self.on_status(w)
            if w.stats_asked:
                answered = w.stats_asked.popleft()
                if not answered.done():
                    answered.set_result(None)
        elif op == "endpoints":
            self.on_endpoints(msg)
        elif op == "persist":  # to every other worker (the main process keeps no table)
            for other in self.workers:
                if other is not w and other.channel is not None and other.ready:
                    other.channel.send(msg)

    def _exited(self, w: Worker) -> None:
        if w.pidfd >= 0:
            self.loop.remove_reader(w.pidfd)
            with contextlib.suppress(OSError):
                os.close(w.pidfd)
            w.pidfd = -1
        proc = w.proc
        code = proc.wait() if proc is not None else 0
        if w.waiting is not None and not w.waiting.done():
            w.waiting.set_result(None)
        while w.stats_asked:  # no reply will come: its last numbers stand
            asked = w.stats_asked.popleft()
            if not asked.done():
                asked.set_result(None)
        pid = w.pid
        lost = w.lost()
        if w is self.spare or (w.index < 0 and w.exiting):
            w.proc = None
            if w is self.spare:  # it died waiting: another, a moment later
                log.warning("the spare worker (pid %d) exited with %s", pid, code)
                self.spare = None
                self.loop.call_later(1.0, self.start_spare)
            return
        if self.stopping or w.exiting:
            log.debug("worker %d (pid %d) exited with %s", w.index, w.pid, code)
            w.proc = None
            self._maybe_all_exited()
            return
        last, w.status = w.status, {}
        how = f"signal {-code}" if code < 0 else f"code {code}"
        log.error("worker %d (pid %d) exited with %s while serving; %d request(s) in flight "
                  "lost; starting a new one", w.index, pid, how, lost)
        w.proc = None
        self.replaced += 1
        self.on_lost(w, last, lost)
        s = self.spare
        if s is not None and s.channel is not None and s.proc is not None:
            self.spare = None  # the spare becomes worker w.index
            self.workers[self.workers.index(w)] = s
            s.index = w.index
            s.waiting = self.loop.create_future()
            s.channel.send({"index": w.index})
            self.loop.create_task(self._respawn(s, spawn=False))
        else:
            self.loop.create_task(self._respawn(w))

    async def _respawn(self, w: Worker, spawn: bool = True) -> None:
        try:
            await (self._spawn(w) if spawn else self._serving(w))
        except OSError as e:
            log.error("worker %d: %s", w.index, e)
            return
        log.info("worker %d replaced by pid %d%s", w.index, w.pid,
                 "" if spawn else " (the spare)")
        self.on_status(w)
        self.start_spare()

    def _check_heartbeats(self) -> None:
        now = self.loop.time()
        for w in self.workers:
            if (w.proc is not None and w.ready and not w.exiting
                    and now - w.last_seen > HEARTBEAT_TIMEOUT):
                log.error("worker %d (pid %d) has not answered for %.1fs: killing it",
                          w.index, w.pid, now - w.last_seen)
                self._kill(w)
        self._heartbeat = self.loop.call_later(0.5, self._check_heartbeats)

    def _kill(self, w: Worker) -> None:
        if w.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGKILL)

    # -- talking to them --------------------------------------------------------------------
    def broadcast(self, msg: Message, replay: bool = False) -> None:
        """To every worker; ``replay``: also to every worker started later."""
        if replay:
            self.replay.append(msg)
        for w in self.workers:
            if w.channel is not None and w.ready:
                w.channel.send(msg)

    async def gather_stats(self) -> None:
        """Each worker's stats and cluster view, fresh (or its last, past STATS_TIMEOUT):
        asked anew even while an earlier request is unanswered, whose reply may predate a
        message sent since (an endpoint's new state, say)."""
        asked = []
        for w in self.workers:
            if w.channel is not None and w.ready:
                fut: asyncio.Future[None] = self.loop.create_future()
                w.stats_asked.append(fut)
                w.channel.send({"op": "stats"})
                asked.append(fut)
        if asked:
            await asyncio.wait(asked, timeout=STATS_TIMEOUT)

    def finish(self, step: str, quit_why: str | None) -> None:
        """Every worker ends: ``exit`` (nothing in flight) or ``cut`` (the deadline)."""
        msg: Message = {"op": "finish", "step": step}
        if quit_why is not None:
            msg.update(quit=True, why=quit_why)
        self.stopping = True
        self.drop_spare()
        for w in self.workers:
            w.exiting = True
            if w.channel is not None:
                w.channel.send(msg)
        self._maybe_all_exited()

    def _maybe_all_exited(self) -> None:
        if (self.stopping and not self._all_exited.done()
                and all(w.proc is None and w.channel is None for w in self.workers)):
            self._all_exited.set_result(None)

    async def wait_exited(self, timeout: float) -> None:
        """Until every worker has exited; those still running after ``timeout`` are
        killed."""
        self.drop_spare()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._all_exited), max(0.0, timeout))
        for w in self.workers:
            if w.proc is not None:
                log.warning("worker %d (pid %d) still running at exit: killed", w.index,
                            w.pid)
                self._kill(w)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(1.0)
        self.close()

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        for w in self.workers:
            if w.pidfd >= 0:
                self.loop.remove_reader(w.pidfd)
                with contextlib.suppress(OSError):
                    os.close(w.pidfd)
                w.pidfd = -1
            if w.channel is not None:
                w.channel.close()
