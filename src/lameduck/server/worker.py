"""A data-plane worker: listeners, codecs, pools and exchanges on sockets the main process
holds, doing what the main process says (nginx's worker processes, Envoy's worker threads).

The worker runs the same data plane as a single process does (``server.local.LocalPlane``),
without what belongs to the process as a whole: no admin API, no signals, no health or agent
checkers, no hot-restart socket, no drain decisions of its own. A drain comes from the main
process with its start time (the monotonic clock is system-wide), so every worker draws its
connections' moments from the same event; the deadline cut is each worker's own timer at that
same moment; the exit is the main process's decision, taken over every worker's requests in
flight (its lifecycle drives the workers through ``server.pool.WorkerPool``).

Started as ``python -m lameduck.server.worker --control-fd N`` with the log options; its
first message on the control channel is its config and its listening sockets' descriptors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import random
import signal
import socket
import sys
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from lameduck.config import Config, parse_duration
from lameduck.drain import Cause, Step
from lameduck.drain.endpoint import AdminState
from lameduck.drain.retry import RetryBudget
from lameduck.listeners import TcpListener
from lameduck.listeners.http import HttpListener
from lameduck.server.build import build
from lameduck.server.channel import Channel, Message, encode, open_channel, read_one
from lameduck.server.inflight import InFlight
from lameduck.server.lifecycle import EXIT_CUT, EXIT_OK, exit_now, flush_limit, run_loop
from lameduck.server.local import LocalPlane
from lameduck.server.logfile import (
    formatter,
    open_log_file,
    reopen_log_files,
    set_log_level,
)
from lameduck.stats import Stat
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.errlog import set_interval as set_errlog_interval

log = logging.getLogger("lameduck")

STATUS_INTERVAL = 0.1  # seconds between status messages (the main process's heartbeat too)
# The drain's counts a worker's status carries (``server.drain.*``; the main process sums
# them for the report; the listener-close resets are the main process's own).
DRAIN_COUNTS = ("completed", "refused", "cut", "cut_before_response", "cut_reset",
                "cx_drained_by_response", "cx_drained_proactive", "cx_closed_at_end")


@dataclass
class QuicFds:
    """An HTTP/3 listener's sockets in this worker (server.quicgroup)."""

    generation: int
    udp: list[socket.socket]
    inbox: socket.socket | None
    forward: dict[int, socket.socket]

    def close(self) -> None:
        for s in (*self.udp, *self.forward.values(), *([self.inbox] if self.inbox else [])):
            s.close()


class WorkerProcess:
    """One worker: the data plane ``build`` makes, in this process (``LocalPlane``), driven
    over ``channel`` by the main process's messages."""

    def __init__(self, cfg: Config, loop: asyncio.AbstractEventLoop, index: int, count: int,
                 sockets: dict[str, socket.socket]) -> None:
        self.cfg = cfg
        self.loop = loop
        self.index = index
        # listener name → its listening socket (a duplicate of the main process's)
        self.sockets = sockets
        self.quic: dict[str, QuicFds] = {}  # HTTP/3 listeners' UDP sockets, by name
        built = build(cfg, loop, random.random, self._changed)
        self.process = built.process
        self.registry = built.registry
        self.clusters = built.clusters
        self.plane = LocalPlane(loop, built)
        self.done: asyncio.Future[int] = loop.create_future()
        self.channel: Channel | None = None
        self._status_timer: asyncio.TimerHandle | None = None
        self._housekeeping: asyncio.TimerHandle | None = None
        self._check_timer: asyncio.TimerHandle | None = None
        self._status_soon = False
        self._applying = False  # endpoint facts from the main process are being applied
        self.parent_gone = False
        # the last drain message of the main process this worker has acted on (its status
        # says so: the main process decides on nothing older)
        self.ack = 0
        # told to exit while requests were in flight (its status was older than them): no
        # new work, and exit once they are done
        self._exit_when_idle = False
        self._arrival_timer: asyncio.TimerHandle | None = None  # _exit_if_idle's, at most one
        self._quit_why: str | None = None
        self._no_new_work = False
        self._finishing = False
        for c in self.clusters.values():
            # The retry budget is the process's: each worker holds its share of the minimum
            # (the percentage applies to its own requests, so the shares add up).
            b = c.budget
            c.budget = RetryBudget(b.budget_percent,
                                   math.ceil(b.min_retry_concurrency / count))
            c.on_change = self._cluster_changed(c)
            c.on_record = self._record_made(c)
        # made or refreshed here, not yet sent: cluster → key → endpoint address
        self._records: dict[str, dict[str, str]] = {}
        for _, tracker in self.plane.probe_trackers():
            tracker.journal = []  # reported with each status

    # -- start ------------------------------------------------------------------------------
    async def start(self, control: socket.socket) -> None:
        for listener in self.plane.listeners:
            sock = self.sockets.pop(listener.name, None)
            q = self.quic.pop(listener.name, None)
            if sock is None:
                # closed in the main process (its drain ended, or a successor has it) before
                # this worker replaced one that died: it takes no connection there
                if q is not None:
                    q.close()
                log.info("listener %s: closed before this worker started", listener.name)
                continue
            sock.setblocking(False)
            if q is not None and isinstance(listener, HttpListener) and q.udp:
                listener.generation, listener.quic_worker = q.generation, self.index
                listener.quic_socket, *listener.quic_extra = q.udp
                listener.quic_inbox, listener.quic_forward = q.inbox, q.forward
            elif q is not None:
                q.close()
            # The main process holds the socket too: closing ours resets nothing; the main
            # process counts what its own close resets.
            listener.socket_shared = listener.socket_shared_by_workers = True
            await listener.start(sock)
        self.process.initialized()
        self._housekeeping = self.loop.call_later(1.0, self._housekeep)
        self.channel = await open_channel(self.loop, control, self._on_message,
                                          self._on_lost)
        self.channel.send({"op": "ready", "pid": os.getpid()})
        self._status_tick()

    def install_signal_handlers(self) -> None:
        """A terminal's Ctrl-C and systemd's SIGTERM to the whole control group reach the
        workers too: they follow the main process, which has the same signals."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP,
                    signal.SIGUSR2):
            self.loop.add_signal_handler(sig, lambda: None)
        self.loop.add_signal_handler(signal.SIGUSR1, reopen_log_files)

    def _housekeep(self) -> None:
        self.plane.housekeep()
        self._housekeeping = self.loop.call_later(1.0, self._housekeep)

    # -- status -----------------------------------------------------------------------------
    def status(self) -> Message:
        """What the main process decides with: requests and connections in flight (the
        exit), the drain's counts (its report), which listeners accept (its own close)."""
        plane = self.plane
        r = plane.reading()
        ds = plane.sync_drain_counts()
        requests = 0
        for ls in plane.listeners:
            st = ls.stats  # type: ignore[attr-defined]
            requests += st.downstream_cx_total if isinstance(ls, TcpListener) \
                else st.downstream_rq_total
        return {
            "op": "status", "ack": self.ack, "active": self.process.ledger.active,
            "in_flight": plane.in_flight(),
            "connections": plane.connections(),
            # request heads and silent connections only matter to an exit: not looked for at
            # every status before it
            **self._unheard(),
            "requests": r.requests,
            "upgrades": r.upgrades,
            "accepting": [ls.name for ls in plane.listeners if ls.accepting],
            "listeners": {ls.name: len(ls.connections) for ls in plane.listeners},
            "rq_total": requests,
            "drain": {key: getattr(ds, key) for key in DRAIN_COUNTS},
            **self._probes(),
        }

    def _probes(self) -> dict[str, Any]:
        """What the health-check paths saw since the last status: the main process decides
        ``leave: confirm`` on every worker's probes and traffic together."""
        out = {}
        for name, tracker in self.plane.probe_trackers():
            batch = tracker.take_journal()
            if batch is not None:
                out[name] = batch
        return {"probes": out} if out else {}

    def _status_tick(self) -> None:
        self._status_timer = self.loop.call_later(STATUS_INTERVAL, self._status_tick)
        if self.process.shutdown is None:
            # a drain that does not exit is over here as in the main process: once no longer
            # active, a completion is no drain's (``ProcessDrain.tick``)
            self.process.tick(self.loop.time())
        self._send_status()

    def _send_status(self) -> None:
        self._status_soon = False
        if self.channel is not None:
            self.channel.send(self.status())

    def _changed(self) -> None:
        """During a drain a closed connection or an ended request may end it: the main
        process hears at once (coalesced), not at the next tick."""
        if self.process.shutdown is None or self._status_soon:
            return
        self._status_soon = True
        self.loop.call_soon(self._send_status)
        if self._exit_when_idle:
            self.loop.call_soon(self._exit_if_idle)

    def _unheard(self) -> dict[str, Any]:
        if self.process.shutdown is None:
            return {"unread": self.plane.unread(heads=False), "silent_since": 0.0}
        unread, since = self.plane.unheard()
        return {"unread": unread, "silent_since": since}

    def _exit_if_idle(self) -> None:
        """The exit the main process decided on counts older than this worker's own: once
        nothing is in flight, nothing unread, and no connection that has sent nothing yet
        is still waited for (``ProcessDrain.arriving_until``; one timer for that)."""
        if not self.process.ledger.idle:
            return
        unread, since = self.plane.unheard()
        if unread:
            return
        until = self.process.arriving_until(since)
        if until <= self.loop.time():
            self._finish(Step.EXIT)
        elif self._arrival_timer is None or self._arrival_timer.when() != until:
            if self._arrival_timer is not None:
                self._arrival_timer.cancel()
            self._arrival_timer = self.loop.call_at(until, self._arrival_due)

    def _arrival_due(self) -> None:
        self._arrival_timer = None
        self._exit_if_idle()

    # -- the main process's words -----------------------------------------------------------
    def _on_message(self, msg: Message) -> None:
        op = msg.get("op")
        try:
            handler = getattr(self, f"_do_{op}")
        except AttributeError:
            log.error("control: unknown message %r", op)
            return
        handler(msg)
        if "seq" in msg:
            self.ack = int(msg["seq"])
            self._send_status()

    def _on_lost(self) -> None:
        """The main process is gone (killed: a clean stop says so first). Drain as a hot
        restart's old process does — stop accepting, finish what is in flight by the
        deadline — since whoever restarts the main process accepts anew."""
        self.parent_gone = True
        self.channel = None
        if self.done.done():
            return
        log.warning("worker %d: the main process is gone: draining, then exiting",
                    self.index)
        self.plane.hand_over()
        if self.process.shutdown is None:
            self._shutdown(self.loop.time(), Cause.HOT_RESTART,
                           self.cfg.hot_restart.parent_shutdown_time, notify=True)
            log.debug("worker %d: drain started (%s)", self.index, Cause.HOT_RESTART.value)

    def _do_quic_handed_over(self, msg: Message) -> None:
        """The main process's successor reads the UDP sockets: its workers forward us our
        connections' packets."""
        self.plane.quic_handed_over([str(n) for n in msg["names"]])

    def _do_shutdown(self, msg: Message) -> None:
        if self.process.shutdown is not None:
            return
        self._shutdown(float(msg["start"]), Cause(msg["cause"]), msg.get("deadline"),
                       notify=bool(msg.get("broadcast", True)),
                       hand_over=bool(msg.get("hand_over")))

    def _do_drain_listeners(self, msg: Message) -> None:
        event, reached = self.process.drain_listeners(
            float(msg["start"]), bool(msg["graceful"]), bool(msg["skip_exit"]),
            bool(msg["inbound_only"]))
        self.plane.broadcast(event, reached)

    def _do_watch(self, msg: Message) -> None:
        """leave: confirm watches: every request is recorded per source address (or no
        longer)."""
        self.plane.watch_traffic(bool(msg["on"]))

    def _do_poll(self, msg: Message) -> None:
        """The main process wants a status sent now (the reply to any numbered message)."""

    def _do_healthcheck(self, msg: Message) -> None:
        if msg["failed"]:
            self.process.healthcheck_fail()
        else:
            self.process.healthcheck_ok()

    def _do_finish(self, msg: Message) -> None:
        if msg.get("quit"):
            self._quit_why = str(msg.get("why", "quit"))
        step = Step(msg["step"])
        if step is Step.EXIT and self._quit_why is None and (
                not self.process.ledger.idle or self._waits_for_unheard()):
            # what the main process saw is older than a request (or a TLS handshake, a head) that
            # came since: it is served to its end (the deadline still cuts), nothing new is
            # taken
            self._exit_when_idle = True
            self.process.ledger.accepting = False
            self.plane.stop_accepting()
            self.plane.no_new_work()
            self._exit_if_idle()
            return
        self._finish(step)

    def _waits_for_unheard(self) -> bool:
        unread, since = self.plane.unheard()
        return unread > 0 or self.process.arriving_until(since) > self.loop.time()

    def _do_endpoints(self, msg: Message) -> None:
        cluster = self.clusters.get(msg["cluster"])
        if cluster is None:
            return
        self._applying = True
        try:
            apply_endpoints(cluster, msg["hosts"], self.loop.time())
        finally:
            self._applying = False

    def _do_stats(self, msg: Message) -> None:
        if self.channel is None:
            return
        self.channel.send({"op": "stats",
                           "stats": [_stat_out(s) for s in self.plane.stats_snapshot()],
                           "clusters": self.plane.clusters_view(),
                           "status": self.status()})

    def _do_reset_counters(self, msg: Message) -> None:
        self.registry.reset_counters()

    def _do_log_level(self, msg: Message) -> None:
        set_log_level(msg.get("name"), msg["level"])

    def _do_reopen(self, msg: Message) -> None:
        reopen_log_files()

    def _cluster_changed(self, cluster: Cluster) -> Any:
        def changed() -> None:
            # an ejection found here (outlier detection) reaches every worker through the
            # main process; what the main process sent is not sent back
            if not self._applying and self.channel is not None:
                self.channel.send({"op": "endpoints", "cluster": cluster.name,
                                   "hosts": endpoint_facts(cluster)})
        return changed

    def _record_made(self, cluster: Cluster) -> Any:
        def made(key: str, ep: Any) -> None:
            if not self._records:
                self.loop.call_soon(self._send_records)
            self._records.setdefault(cluster.name, {})[key] = ep.address
        return made

    def _send_records(self) -> None:
        """The persistence records made in one turn of the loop, in one message: the main
        process passes them to every other worker."""
        records, self._records = self._records, {}
        if self.channel is not None:
            for name, rows in records.items():
                self.channel.send({"op": "persist", "cluster": name,
                                   "records": list(rows.items())})

    def _do_persist(self, msg: Message) -> None:
        cluster = self.clusters.get(msg["cluster"])
        table = cluster.persistence if cluster is not None else None
        if cluster is None or table is None:
            return
        now = self.loop.time()
        for key, address in msg["records"]:
            ep = cluster.find(address)
            if ep is not None:
                table.record(key, ep, now)
        cluster.stats.lb_persistence_records = len(table)

    # -- this worker's part of the drain ----------------------------------------------------
    def _shutdown(self, start: float, cause: Cause, deadline: float | None, notify: bool,
                  hand_over: bool = False) -> None:
        """The main process's shutdown (or, the main process gone, this worker's own): the
        same event, from the same start, as every other worker."""
        event, reached = self.process.start_shutdown(start, cause, deadline)
        if hand_over:
            self.plane.hand_over()
        self.plane.shutdown(event, reached, notify)
        self._schedule_check(self.loop.time())
        self._changed()

    def _schedule_check(self, now: float) -> None:
        nxt = self.process.next_deadline(now, self.plane.unheard()[1])
        if self._check_timer is not None:
            self._check_timer.cancel()
            self._check_timer = None
        if nxt is not None:
            self._check_timer = self.loop.call_at(nxt, self._check)

    def _check(self) -> None:
        """At the drain's marks (T, the deadline): from T no new work; at the deadline this
        worker cuts, at the same moment as every other (the same start, the same timer). An
        idle worker says so and waits for the main process, which exits when every worker is
        idle — unless the main process is gone."""
        self._check_timer = None
        if self._finishing or self.done.done():
            return
        now = self.loop.time()
        ev = self.process.shutdown
        if ev is not None and now >= ev.ends_at and not self._no_new_work:
            self._no_new_work = True
            log.debug("drain time reached: no new work; %d requests in flight, "
                      "%d connections", self.process.ledger.active, self.plane.connections())
            self.plane.no_new_work()
        plane = self.plane
        unread, since = plane.unheard()
        step = self.process.shutdown_step(now, plane.connections() + plane.queued(), unread,
                                          since)
        if step is Step.CUT or (step is Step.EXIT and self.parent_gone):
            self._finish(step)
            return
        self._send_status()
        self._schedule_check(now)

    def _finish(self, step: Step) -> None:
        if self._finishing or self.done.done():
            return
        self._finishing = True
        if self._check_timer is not None:
            self._check_timer.cancel()
        if self._arrival_timer is not None:
            self._arrival_timer.cancel()
        quitting = self._quit_why is not None
        if step is Step.CUT:
            log.warning("%s: cutting %d requests still in flight",
                        self._quit_why if quitting else "deadline",
                        self.process.ledger.active)
        elif quitting:
            log.debug("%s: no request in flight", self._quit_why)
        else:
            log.debug("drain complete: no request in flight")
        limit = flush_limit(step, self.loop.time(), self.process.deadline, quitting)
        self.loop.create_task(self._end(self.plane.finish(step, self._quit_why, limit)))

    async def _end(self, closed: Awaitable[None]) -> None:
        await closed
        ds = self.plane.sync_drain_counts()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        if not self.done.done():
            self.done.set_result(EXIT_CUT if ds.cut else EXIT_OK)

    def exited(self, code: int) -> None:
        """The last numbers: the main process keeps them."""
        if self._status_timer is not None:
            self._status_timer.cancel()
        if self.channel is not None:
            self.channel.send(self.status() | {
                "op": "exiting", "code": code,
                "stats": [_stat_out(s) for s in self.plane.stats_snapshot()]})


def endpoint_facts(cluster: Cluster) -> list[dict[str, Any]]:
    """What every process must agree on about each endpoint: admin state, health sources,
    and what an agent set."""
    return [{"address": ep.address, "state": ep.drain.state.value, "hc_ok": ep.hc_ok,
             "agent_up": ep.agent_up, "ejected": ep.ejected, "weight": ep.weight,
             "maxconn": ep.maxconn}
            for ep in cluster.endpoints]


def apply_endpoints(cluster: Cluster, hosts: list[dict[str, Any]], now: float) -> None:
    """Endpoint facts from another process, applied as if found here."""
    for h in hosts:
        ep = cluster.find(h["address"])
        if ep is None:
            continue
        state = AdminState(h["state"])
        if state is not ep.drain.state:
            cluster.set_state(ep, state, now)
        changed = (ep.hc_ok, ep.agent_up, ep.ejected) != (h["hc_ok"], h["agent_up"],
                                                          h["ejected"])
        ep.hc_ok, ep.agent_up, ep.ejected = h["hc_ok"], h["agent_up"], h["ejected"]
        if changed:
            cluster.health_changed(ep)
        if ep.weight != h["weight"] or ep.maxconn != h["maxconn"]:
            ep.weight, ep.maxconn = h["weight"], h["maxconn"]
            cluster.refresh()


def _quic_fds(q: dict[str, Any], index: int, count: int) -> QuicFds:
    """Of an HTTP/3 listener's group (server.quicgroup): this worker's UDP sockets (its own,
    and those of a group made for more workers: ``j % count == index``), its inbox, and every
    older route; the other descriptors closed."""
    udp: list[socket.socket] = []
    for j, fd in enumerate(q["udp"]):
        if j % count == index:
            udp.append(socket.socket(fileno=fd))
        else:
            os.close(fd)
    inbox = None
    for j, fd in enumerate(q["inbox"]):
        if j == index:
            inbox = socket.socket(fileno=fd)
        else:
            os.close(fd)
    forward = {int(r): socket.socket(fileno=fd) for r, fd in q["forward"].items()}
    return QuicFds(int(q["generation"]), udp, inbox, forward)


def _stat_out(s: Stat) -> list[Any]:
    if s.hist is None:
        return [s.name, s.value, s.kind]
    return [s.name, s.value, s.kind, list(s.hist.counts), s.hist.sum]


async def serve(control: socket.socket) -> int:
    first = read_one(control)
    cfg = Config.model_validate(first["config"])
    count = int(first["count"])
    loop = asyncio.get_running_loop()
    server = WorkerProcess(cfg, loop, -1, count, {})
    if first["index"] is None:
        # a spare: loaded and built; it says so, then waits (nothing runs on its loop yet)
        # to be told which worker it replaces
        try:
            control.sendall(encode({"op": "loaded"}))
            index = int(read_one(control)["index"])
        except OSError:  # the main process has gone (or no longer wants a spare)
            return 0
        _PREFIX.prefix = f"worker {index}: "
    else:
        index = int(first["index"])
    server.index = index
    if first.get("inflight_fd") is not None:
        page = InFlight(int(first["inflight_fd"]))
        server.process.ledger.share(page.slots)
    for name, fds in first["fds"].items():
        keep = fds[index % len(fds)]
        for fd in fds:
            if fd != keep:
                os.close(fd)  # the other workers' sockets of the group
        server.sockets[name] = socket.socket(fileno=keep)
    for name, q in first.get("quic", {}).items():
        server.quic[name] = _quic_fds(q, index, count)
    server.install_signal_handlers()
    await server.start(control)
    log.info("worker %d (pid %d) serving", index, os.getpid())
    code = await server.done
    server.exited(code)
    # The last status must reach the main process before this one ends. Not a close: a Unix
    # socket closed with unread data in it (the main process's "finish", sent as this worker
    # cut at its own deadline) resets the peer, which then drops what it had not read yet —
    # this last status. Half-close instead, read on, and end when the main process closes.
    ch = server.channel
    t = ch.transport if ch is not None else None
    if ch is not None and t is not None:
        closed: asyncio.Future[None] = loop.create_future()
        ch.on_lost = lambda: None if closed.done() else closed.set_result(None)
        ch.on_message = lambda msg: None
        ch.end()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closed, 1.0)
    return code


class _Prefix(logging.Filter):
    """Each line says which worker wrote it."""

    prefix = "worker: "

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and not record.msg.startswith("worker "):
            record.msg = self.prefix + record.msg
        return True


_PREFIX = _Prefix()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lameduck-worker")
    p.add_argument("--control-fd", type=int, required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-format", default="text")
    p.add_argument("--log-file")
    p.add_argument("--upstream-error-log-every", type=parse_duration, default=None)
    args = p.parse_args(argv)
    if args.upstream_error_log_every is not None:
        set_errlog_interval(args.upstream_error_log_every)
    handler: logging.Handler = (open_log_file(args.log_file) if args.log_file
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(formatter(args.log_format))
    _PREFIX.prefix = f"worker {args.index}: "
    handler.addFilter(_PREFIX)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), handlers=[handler])
    control = socket.socket(fileno=args.control_fd)
    return run_loop(lambda: serve(control))


if __name__ == "__main__":
    # the main process waits for its workers before it exits itself: a worker's teardown
    # would be the main process's too
    exit_now(main())
