"""The data plane of ``workers: N`` (N > 1): N worker processes, driven over their control
channels; the main process runs no connection.

The main process keeps what belongs to the process as a whole — the listening sockets (bound
once, a duplicate handed to each worker), the admin API, signals, hot restart, health and agent
checks (one checker per cluster, not per worker), the preStop FSM, the drain decisions and the
drain report — and its lifecycle drives this pool as it would drive its own listeners. A drain
is sent to every worker with its start time, so each worker's connections draw their moments
from the same event; the counts the exit is decided on are the workers' statuses, summed, and
the exit code and the drain report cover every worker.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from lameduck.config import Config
from lameduck.drain import Cause, DrainEvent, ListenerDrain, Step
from lameduck.drain.probers import ProbeTracker
from lameduck.drain.timeline import Reading
from lameduck.listeners import Listener
from lameduck.listeners.base import accept_queue, probe_trackers
from lameduck.listeners.http import HttpListener
from lameduck.restart.hot import HasFileno, Inherited
from lameduck.server.build import Built
from lameduck.server.channel import Message
from lameduck.server.quicgroup import QuicGroup, quic_group
from lameduck.server.views import add_cluster_counts, clusters_view, fmt_addr
from lameduck.server.worker import DRAIN_COUNTS, apply_endpoints, endpoint_facts
from lameduck.server.workers import Worker, WorkerSet
from lameduck.stats import (
    COUNTER,
    DrainStats,
    Stat,
)
from lameduck.stats.histogram import HistogramValue
from lameduck.stats.registry import merge
from lameduck.upstream.cluster import Cluster

log = logging.getLogger("lameduck")

# Stats of the process as a whole: the main process's, not a sum over workers.
MAIN_PREFIXES = ("server.", "listener_manager.")
MAIN_DATA_PLANE = "server.drain."  # ... except the drain's counts, which the workers keep
# Gauges every worker holds the same value of (endpoint facts and persistence records are
# shared): not summed but the least of them — what every worker has (a record made in one
# worker counts once every other one has it too).
SHARED_GAUGES = ("membership_total", "membership_healthy", "membership_excluded",
                 "lb_persistence_records", "ejections_active")
# How long a listener's socket stays open here after the workers stopped accepting on it,
# at most, waiting for their word (then what is queued is reset, and counted).
CLOSE_WAIT = 1.0


class WorkerPool:
    """The listeners ``build`` made (here: their configs, drains and sockets, never a
    connection), served by ``count`` worker processes. ``on_change``: a worker's status came
    (maybe the drain is over)."""

    cut_where = " in the workers"
    idle_where = " in any worker"

    def __init__(self, loop: asyncio.AbstractEventLoop, cfg: Config, built: Built, count: int,
                 worker_argv: list[str], inherited: Inherited | None,
                 on_change: Callable[[], None]) -> None:
        self.loop = loop
        self.cfg = cfg
        self.count = count
        self.worker_argv = worker_argv
        self.inherited = inherited
        self.on_change = on_change
        self.process = built.process
        self.listeners = built.listeners
        self.clusters = built.clusters
        self.registry = built.registry
        self.drain_stats = built.drain_stats
        # listener name → its listening sockets: one every worker accepts on, or one per
        # worker in an SO_REUSEPORT group (worker i takes the i-th)
        self.held: dict[str, list[socket.socket]] = {}
        self.quic: dict[str, QuicGroup] = {}  # HTTP/3 listeners' UDP sockets, by name
        self.workers: WorkerSet | None = None
        self.lost_requests = 0  # in flight in a worker that died
        # the counters of workers that died, as last reported: counters do not go back
        self.gone_counters: dict[str, int] = {}
        self.gone_drain: dict[str, int] = {}  # and their drain counts
        self._close_timers: dict[str, asyncio.TimerHandle] = {}
        self._closing: set[str] = set()
        self.seq = 0  # drain messages sent; a worker's status acknowledges the last it saw
        for c in self.clusters.values():
            c.on_change = self._cluster_changed(c)
        self.registry.add_gauge_fn("server.workers", lambda: self.count)
        self.registry.add_counter_fn("server.workers_replaced", lambda: (
            self.workers.replaced if self.workers is not None else 0))
        self.registry.add_counter_fn("server.worker_lost_requests", lambda: self.lost_requests)

    # -- start ------------------------------------------------------------------------------
    def bind(self, listener: Listener) -> socket.socket:
        return listener.bind(reuse_port=listener.cfg.reuse_port)

    async def serve(self, listener: Listener, sock: socket.socket) -> None:
        """Held here; with ``reuse_port``, the rest of the group too (taken over from the
        previous process, else bound now, beside the first socket). HTTP/3: its UDP
        sockets, one per worker, always in a group (``quic_group``)."""
        socks = [sock]
        listener.sockname = sock.getsockname()
        self.held[listener.name] = socks
        if isinstance(listener, HttpListener) and listener.cfg.http3 is not None:
            try:
                self.quic[listener.name] = quic_group(listener, self.count)
            except OSError:
                sock.close()
                raise
        if not listener.cfg.reuse_port:
            return
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
            log.info("listener %s: its socket (passed in, or from a process that had one "
                     "socket) is not in an SO_REUSEPORT group: every worker accepts on it",
                     listener.name)
            return
        inh = self.inherited
        for i in range(1, self.count):
            got = inh.listeners.pop(f"{listener.name}@{i}", None) if inh is not None else None
            if got is not None and got[1].getsockname() == listener.sockname:
                extra = got[1]
                extra.setblocking(False)
            else:
                if got is not None:  # the listener moved: the old group drains in the old
                    got[1].close()   # process

                try:
                    extra = listener.bind(reuse_port=True, port=listener.sockname[1])
                except OSError:
                    for s in socks:
                        s.close()
                    raise
            socks.append(extra)

    async def serving(self) -> None:
        """The workers start, each with its sockets, and serve."""
        self.workers = WorkerSet(self.loop, self.count, self.cfg.model_dump(mode="json"),
                                 self.held, self.worker_argv, self._status, self._lost,
                                 self._endpoints_found, self.quic)
        self.workers.greeting = lambda: [
            {"op": "endpoints", "cluster": c.name, "hosts": endpoint_facts(c)}
            for c in self.clusters.values()]
        try:
            await self.workers.start()
        except OSError:
            self.workers.finish("exit", "start failed")
            await self.workers.wait_exited(1.0)
            raise
        log.info("%d workers serving (pids %s)", self.count,
                 " ".join(str(w.pid) for w in self.workers.workers))

    def handover_sockets(self) -> list[tuple[str, str, HasFileno]]:
        return [(ls.name if i == 0 else f"{ls.name}@{i}", str(ls.cfg.address), sock)
                for ls in self.listeners if ls.name in self.held
                for i, sock in enumerate(self.held[ls.name])]

    def handover_quic(self) -> list[tuple[str, str, HasFileno, dict[int, HasFileno]]]:
        """Each HTTP/3 listener's group of UDP sockets, in its order (``name``, ``name@1``,
        ...), the first with every route: this process's workers' and the older ones'."""
        out: list[tuple[str, str, HasFileno, dict[int, HasFileno]]] = []
        for name, g in self.quic.items():
            address = next(str(ls.cfg.address) for ls in self.listeners if ls.name == name)
            for i, udp in enumerate(g.udp):
                routes: dict[int, HasFileno] = dict(g.routes()) if i == 0 else {}
                out.append((name if i == 0 else f"{name}@{i}", address, udp, routes))
        return out

    def quic_handed_over(self, names: list[str]) -> None:
        """The workers read what the successor forwards, not the UDP sockets; the sending
        ends held here are the successor's now (our copies closed, so that a worker sees end
        of file once no newer process is left)."""
        if self.workers is not None:
            self.workers.broadcast({"op": "quic_handed_over", "names": names}, replay=True)
        for name in names:
            g = self.quic.get(name)
            if g is not None:
                g.handed_over()

    def _cluster_changed(self, cluster: Cluster) -> Any:
        def changed() -> None:
            if self.workers is not None:
                self.workers.broadcast({"op": "endpoints", "cluster": cluster.name,
                                        "hosts": endpoint_facts(cluster)})
        return changed

    def _endpoints_found(self, msg: Message) -> None:
        """A worker's outlier detection ejected (or let back) an endpoint: every worker."""
        cluster = self.clusters.get(msg["cluster"])
        if cluster is not None:
            # applying calls on_change at each step: muted, then one broadcast
            changed, cluster.on_change = cluster.on_change, None
            try:
                apply_endpoints(cluster, msg["hosts"], self.loop.time())
            finally:
                cluster.on_change = changed
            if changed is not None:
                changed()

    # -- the workers' numbers ---------------------------------------------------------------
    def _statuses(self) -> list[dict[str, Any]]:
        ws = self.workers
        return [] if ws is None else [w.status for w in ws.workers if w.status]

    def _sum(self, key: str) -> int:
        return sum(int(s.get(key, 0)) for s in self._statuses())

    def _status(self, w: Worker) -> None:
        """A worker's status: the ledger here is the sum of theirs (the exit decision); what
        its health-check paths saw goes into the main process's trackers (leave: confirm)."""
        probes = w.status.pop("probes", None)
        if probes:
            trackers = dict(self.probe_trackers())
            for name, batch in probes.items():
                tracker = trackers.get(name)
                if tracker is not None:
                    tracker.replay(batch)
        self.process.ledger.active = self._sum("active")
        self._check_closing()
        self.on_change()

    def _lost(self, w: Worker, last: Message, lost: int) -> None:
        """A worker died: its requests in flight are lost (read from the page it shared),
        and what it counted is kept — its counters, and the drain's counts for the report
        (as of its last status)."""
        self.lost_requests += lost
        for key, value in last.get("drain", {}).items():
            self.gone_drain[key] = self.gone_drain.get(key, 0) + int(value)
        gone = self.gone_counters
        for stat in _stats_of(w):
            if stat.kind == COUNTER:
                gone[stat.name] = gone.get(stat.name, 0) + stat.value
        w.stats = []
        self._status(w)

    def connections(self) -> int:
        return self._sum("connections")

    def unread(self) -> int:
        return self._sum("unread")

    def unheard(self) -> tuple[int, float]:
        return self.unread(), max((float(s.get("silent_since", 0.0))
                                   for s in self._statuses()), default=0.0)

    def queued(self) -> int:
        return sum(accept_queue(s) for name, socks in self.held.items()
                   if name not in self._closing for s in socks)

    def in_flight(self) -> int:
        return self._sum("in_flight")

    def draining_listeners(self) -> int:
        return len(self.listeners) if self.connections() else 0

    def accepting_listeners(self) -> int:
        return len(self.held)

    def current(self) -> bool:
        """Every serving worker's status acknowledges the last drain message."""
        ws = self.workers
        return ws is None or all(int(w.status.get("ack", 0)) >= self.seq
                                 for w in ws.workers if w.ready and not w.exiting)

    def poll(self) -> bool:
        """Numbered like a drain message (a worker started later answers it too, so only the
        newest poll is kept for replay); each worker answers with a status."""
        ws = self.workers
        if ws is None:
            return False
        self.seq += 1
        ws.replay = [m for m in ws.replay if m.get("op") != "poll"]
        ws.broadcast({"op": "poll", "seq": self.seq}, replay=True)
        return True

    def _drain_sum(self, key: str) -> int:
        return self.gone_drain.get(key, 0) + sum(int(s.get("drain", {}).get(key, 0))
                                                 for s in self._statuses())

    def sync_drain_counts(self) -> DrainStats:
        ds, ledger = self.drain_stats, self.process.ledger
        for key in DRAIN_COUNTS:
            setattr(ds, key, self._drain_sum(key))
        ledger.completed, ledger.refused, ledger.cut = ds.completed, ds.refused, ds.cut
        return ds

    def reading(self) -> Reading:
        ds = self.sync_drain_counts()
        return Reading(self._sum("requests"), self.connections(), self._sum("upgrades"),
                       ds.cx_drained_by_response, ds.cx_drained_proactive,
                       ds.cx_closed_at_end, ds.refused, ds.cut)

    # -- drains: decided here, carried out in every worker ----------------------------------
    def drain_listeners(self, event: DrainEvent, reached: list[ListenerDrain], graceful: bool,
                        skip_exit: bool, inbound_only: bool) -> None:
        self._drain_message({"op": "drain_listeners", "start": event.start,
                             "graceful": graceful, "skip_exit": skip_exit,
                             "inbound_only": inbound_only})
        self._schedule_closes()

    def shutdown(self, event: DrainEvent, reached: list[ListenerDrain], notify: bool) -> None:
        self._drain_message({"op": "shutdown", "start": event.start,
                             "cause": event.cause.value, "deadline": self.process.exit_after,
                             "broadcast": notify,
                             "hand_over": event.cause is Cause.HOT_RESTART})
        self._schedule_closes()

    def _drain_message(self, msg: Message) -> None:
        """To every worker, now and when started later; numbered, so that the exit is
        decided on statuses sent after it."""
        assert self.workers is not None
        self.seq += 1
        self.workers.broadcast(msg | {"seq": self.seq}, replay=True)

    def healthcheck(self, failed: bool) -> None:
        if self.workers is not None:
            self.workers.broadcast({"op": "healthcheck", "failed": failed}, replay=True)

    def no_new_work(self) -> None:
        """Nothing to do here: each worker's own timer reaches T at the same moment."""

    def hand_over(self) -> None:
        for name in list(self.held):
            self._close_held(name, handed_over=True)

    # -- the listening sockets held here ----------------------------------------------------
    def _schedule_closes(self) -> None:
        """A listener stops accepting at its drain's ``stop_at`` in every worker; this
        process's copy closes once they have (only the last close resets the queue)."""
        now = self.loop.time()
        for ls in self.listeners:
            at = ls.drain.stop_at
            if at is None or ls.name not in self.held or ls.name in self._close_timers:
                continue
            if self.workers is not None:  # it would hold the listening sockets past their close
                self.workers.drop_spare()
            self._close_timers[ls.name] = self.loop.call_at(max(at, now), self._close_due,
                                                            ls.name)

    def _close_due(self, name: str) -> None:
        self._closing.add(name)
        self._close_timers[name] = self.loop.call_later(CLOSE_WAIT, self._close_held, name)
        self._check_closing()

    def _check_closing(self) -> None:
        for name in list(self._closing):
            if not any(name in s.get("accepting", ()) for s in self._statuses()):
                self._close_held(name)

    def _close_held(self, name: str, handed_over: bool = False) -> None:
        self._closing.discard(name)
        timer = self._close_timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        socks = self.held.pop(name, None)
        if socks is None:
            return
        if self.workers is not None:
            self.workers.drop_spare()
        ls = next(ls for ls in self.listeners if ls.name == name)
        queued = 0 if handed_over or ls.socket_shared else sum(accept_queue(s) for s in socks)
        for sock in socks:
            sock.close()
        if queued:
            self.drain_stats.cx_reset_listener_close += queued
            log.warning("listener %s closed with %d connection(s) not yet accepted: reset",
                        name, queued)
        log.info("listener %s stopped accepting", name)
        self.on_change()

    # -- the end ----------------------------------------------------------------------------
    def finish(self, step: Step, quit_why: str | None, limit: float) -> Awaitable[None]:
        assert self.workers is not None
        self.workers.finish(step.value, quit_why)
        return self._closed_when_workers_have(limit)

    async def _closed_when_workers_have(self, limit: float) -> None:
        assert self.workers is not None
        await self.workers.wait_exited(limit - self.loop.time() + 2.0)
        for name in list(self.held):
            self._close_held(name)
        for g in self.quic.values():
            g.close()

    # -- admin ------------------------------------------------------------------------------
    def refresh(self) -> Awaitable[None] | None:
        """Before an admin answer made of the workers' numbers: ask them (a poll sees a
        request that began a millisecond ago, as with one process)."""
        return None if self.workers is None else self.workers.gather_stats()

    def housekeep(self) -> None:
        if self.workers is not None:  # counters for a successor, gauges for the timeline
            self.loop.create_task(self.workers.gather_stats())

    def _worker_stats(self) -> list[list[Stat]]:
        out = []
        ws = self.workers
        shared: dict[str, int] = {}
        for w in ws.workers if ws is not None else ():
            for row in w.stats:
                if row[2] != COUNTER and row[0].endswith(SHARED_GAUGES):
                    shared[row[0]] = min(shared.get(row[0], row[1]), row[1])
        if shared:
            out.append([Stat(name, value, "gauge") for name, value in shared.items()])
        for w in ws.workers if ws is not None else ():
            stats = [s for s in _stats_of(w) if not s.name.endswith(SHARED_GAUGES)
                     or s.kind == COUNTER]  # the same in every worker (above)
            # the spread over the workers (Envoy's per-worker listener stats, summed over
            # the listeners): what each one took
            cx = sum(row[1] for row in w.stats if row[0].endswith(".downstream_cx_total")
                     and row[0].startswith(("http.", "tcp.")))
            rq = sum(row[1] for row in w.stats if row[0].endswith(".downstream_rq_total")
                     and row[0].startswith("http."))
            stats.append(Stat(f"worker.{w.index}.downstream_cx_total", cx, COUNTER))
            stats.append(Stat(f"worker.{w.index}.downstream_rq_total", rq, COUNTER))
            out.append(stats)
        return out

    def stats_snapshot(self) -> list[Stat]:
        """This process's own stats (server state, listener manager, active health checks)
        and the workers' (summed, merged), with what dead workers and a previous process
        counted."""
        own = [s for s in self.registry.snapshot() if _main_stat(s.name)]
        merged = merge([own, *self._worker_stats()])
        carried = self.registry.carried
        gone = self.gone_counters
        if carried or gone:  # a hot restart's counters and dead workers', for the workers'
            names = {s.name for s in own}
            merged = [Stat(s.name, s.value + carried.get(s.name, 0) + gone.get(s.name, 0),
                           s.kind)
                      if s.kind == COUNTER and s.name not in names else s for s in merged]
        self.registry.used.update(s.name for s in merged if s.value)
        return merged

    def counters(self) -> dict[str, int]:
        return {s.name: s.value for s in self.stats_snapshot() if s.kind == COUNTER}

    def reset_counters(self) -> None:
        self.gone_counters.clear()  # counted by workers that died: 0 from now on too
        if self.workers is not None:
            self.workers.broadcast({"op": "reset_counters"})

    def set_log_level(self, name: str | None, level: str) -> None:
        if self.workers is not None:
            self.workers.broadcast({"op": "log_level", "name": name, "level": level})

    def reopen_logs(self) -> None:
        if self.workers is not None:
            self.workers.broadcast({"op": "reopen"})

    def clusters_view(self) -> list[dict[str, Any]]:
        """Endpoint states and health from here; request and connection counts summed over
        the workers."""
        view = clusters_view(self.clusters.values())
        ws = self.workers
        for w in ws.workers if ws is not None else ():
            add_cluster_counts(view, w.clusters)
        return view

    def listeners_info(self) -> list[dict[str, Any]]:
        statuses = self._statuses()
        now = self.loop.time()
        out = []
        for ls in self.listeners:
            info = {"name": ls.name, "address": fmt_addr(ls.sockname),
                    "accepting": any(ls.name in s.get("accepting", ()) for s in statuses),
                    "draining": ls.drain.draining,
                    "connections": sum(int(s.get("listeners", {}).get(ls.name, 0))
                                       for s in statuses)}
            info.update(ls.probes_info(now))  # every worker's probers and talkers, as reported
            out.append(info)
        return out

    def probe_trackers(self) -> list[tuple[str, ProbeTracker]]:
        """The main process's own trackers, fed from every worker's status (``_status``)."""
        return probe_trackers(self.listeners)

    def watch_traffic(self, on: bool) -> None:
        if self.workers is not None:
            self.workers.broadcast({"op": "watch", "on": on}, replay=True)

    def workers_info(self) -> dict[str, Any]:
        ws = self.workers
        spare = ws.spare if ws is not None else None
        return {
            "workers": [
                {"index": w.index, "pid": w.pid, "ready": w.ready,
                 "connections": int(w.status.get("connections", 0)),
                 "requests_in_flight": int(w.status.get("active", 0)),
                 "rq_total": int(w.status.get("rq_total", 0))}
                for w in (ws.workers if ws is not None else ())],
            "spare_worker": None if spare is None else {"pid": spare.pid,
                                                        "loaded": spare.loaded},
        }


def _stats_of(w: Worker) -> list[Stat]:
    """A worker's data-plane stats as it last sent them (not the main process's)."""
    stats = []
    for row in w.stats:
        name = row[0]
        if _main_stat(name):
            continue
        if len(row) > 3:
            stats.append(Stat(name, row[1], row[2],
                              HistogramValue(tuple(row[3]), float(row[4]))))
        else:
            stats.append(Stat(name, row[1], row[2]))
    return stats


def _main_stat(name: str) -> bool:
    """The process's own stats (server state, listener manager, active health checks), not
    the workers' — though the drain's counts are theirs (``server.drain.active`` is not)."""
    if name.startswith(MAIN_DATA_PLANE):
        return name == "server.drain.active"
    return name.startswith(MAIN_PREFIXES) or ".health_check." in name
