"""The data plane in this process: its listeners, their connections and the clusters behind
them. A one-process lameduck's lifecycle drives it directly; a worker drives it as its main
process says.

It carries out what the drain core decided, on the connections: a drain event to every
connection of the listeners it reached, no new work from T, the cut, the staged close at the
end; and it counts what the decisions read (connections, requests in flight, the drain's
counts).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable
from typing import Any

from lameduck.drain import DrainEvent, ListenerDrain, Step
from lameduck.drain.probers import ProbeTracker
from lameduck.drain.timeline import Reading
from lameduck.listeners import Listener, TcpListener
from lameduck.listeners.base import probe_trackers
from lameduck.restart.hot import HasFileno
from lameduck.server.build import Built
from lameduck.server.lifecycle import EXIT_FLUSH
from lameduck.server.views import clusters_view, fmt_addr
from lameduck.stats import DrainStats, Stat


class LocalPlane:
    """The listeners and clusters ``build`` made, served by this process."""

    cut_where = ""
    idle_where = ""

    def __init__(self, loop: asyncio.AbstractEventLoop, built: Built) -> None:
        self.loop = loop
        self.process = built.process
        self.listeners = built.listeners
        self.clusters = built.clusters
        self.registry = built.registry
        self.drain_stats = built.drain_stats

    # -- start ------------------------------------------------------------------------------
    def bind(self, listener: Listener) -> socket.socket:
        return listener.bind()

    async def serve(self, listener: Listener, sock: socket.socket) -> None:
        await listener.start(sock)

    async def serving(self) -> None:
        """Nothing more to start: the listeners accept."""

    def handover_sockets(self) -> list[tuple[str, str, HasFileno]]:
        return [(ls.name, str(ls.cfg.address), ls.server.sockets[0])
                for ls in self.listeners if ls.server is not None]

    def handover_quic(self) -> list[tuple[str, str, HasFileno, dict[int, HasFileno]]]:
        out: list[tuple[str, str, HasFileno, dict[int, HasFileno]]] = []
        for ls in self.listeners:
            quic = ls.quic
            if quic is not None and quic.sock is not None and quic.accepting:
                udp, forward = quic.handover()
                out.append((ls.name, str(ls.cfg.address), udp, forward))
                # the rest of the port's SO_REUSEPORT group read here (made for workers)
                out += [(f"{ls.name}@{i}", str(ls.cfg.address), extra, {})
                        for i, extra in enumerate(quic.extra, 1)]
        return out

    def quic_handed_over(self, names: list[str]) -> None:
        for ls in self.listeners:
            if ls.quic is not None and ls.name in names:
                ls.quic.handed_over()

    # -- counts -----------------------------------------------------------------------------
    def connections(self) -> int:
        """Downstream connections open, on every listener (those in their TLS handshake, and
        TLS ones that have sent nothing yet, too)."""
        return sum(len(ls.connections) + len(ls.handshakes) + len(ls.silent)
                   for ls in self.listeners)

    def unread(self, heads: bool = True) -> int:
        """TLS handshakes under way, and request heads partly read (a request its client
        sent, which nothing answers before it ends). ``heads`` False: the handshakes only,
        without a look at every connection (a worker's status outside a shutdown)."""
        if not heads:
            return sum(len(ls.handshakes) for ls in self.listeners)
        return self.unheard()[0]

    def unheard(self) -> tuple[int, float]:
        """One look at every connection for what an exit waits for besides requests: how
        many have a request on the way not read yet (``unread``), and the latest accept of
        one that has sent nothing yet (``silent_since``; 0: none)."""
        n = 0
        since = 0.0
        for ls in self.listeners:
            n += len(ls.handshakes)
            for conn in ls.connections:
                if conn.head_unread():
                    n += 1
                else:
                    at = conn.silent_since()
                    if at > since:
                        since = at
            for silent in ls.silent:
                if silent.accepted_at > since:
                    since = silent.accepted_at
        return n, since

    def queued(self) -> int:
        """Connections in the accept queues of the listeners still accepting."""
        return sum(ls.queued() for ls in self.listeners)

    def in_flight(self) -> int:
        """A drain.sh completion test is downstream_rq_active + upstream_rq_active == 0; as a
        count, a proxied request is one, not two: the larger of the two sides (TCP
        connections being relayed count downstream: they have no requests)."""
        up = sum(c.stats.upstream_rq_active for c in self.clusters.values())
        down = 0
        for ls in self.listeners:
            st = ls.stats  # type: ignore[attr-defined]
            down += (st.downstream_cx_active if isinstance(ls, TcpListener)
                     else st.downstream_rq_active)
        return max(up, down)

    def draining_listeners(self) -> int:
        return sum(1 for ls in self.listeners if ls.connections)

    def accepting_listeners(self) -> int:
        return sum(1 for ls in self.listeners if ls.accepting)

    def current(self) -> bool:
        """The counts are read where they are kept: always current."""
        return True

    def poll(self) -> bool:
        return False  # nobody to ask

    def sync_drain_counts(self) -> DrainStats:
        """``server.drain.completed/refused/cut`` are the ledger's own counts, not kept twice."""
        ds, ledger = self.drain_stats, self.process.ledger
        ds.completed, ds.refused, ds.cut = ledger.completed, ledger.refused, ledger.cut
        return ds

    def reading(self) -> Reading:
        """In flight now (summed over listeners) and the drain counters so far."""
        requests = connections = upgrades = 0
        for ls in self.listeners:
            st = ls.stats  # type: ignore[attr-defined]
            connections += st.downstream_cx_active
            if isinstance(ls, TcpListener):
                upgrades += st.downstream_cx_active  # a relayed TCP connection is a tunnel
            else:
                requests += st.downstream_rq_active
                upgrades += st.downstream_cx_upgrades_active
        ds = self.sync_drain_counts()
        return Reading(requests, connections, upgrades, ds.cx_drained_by_response,
                       ds.cx_drained_proactive, ds.cx_closed_at_end, ds.refused, ds.cut)

    # -- drains -----------------------------------------------------------------------------
    def drain_listeners(self, event: DrainEvent, reached: list[ListenerDrain], graceful: bool,
                        skip_exit: bool, inbound_only: bool) -> None:
        self.broadcast(event, reached)

    def shutdown(self, event: DrainEvent, reached: list[ListenerDrain], notify: bool) -> None:
        if notify:
            self.broadcast(event, reached)
        for ls in self.listeners:
            ls.schedule_stop()

    def broadcast(self, event: DrainEvent, reached: list[ListenerDrain]) -> None:
        """``event`` to every connection of the listeners it reached; every listener follows
        its drain's ``stop_at``."""
        names = {ld.name for ld in reached}
        for ls in self.listeners:
            if ls.name in names:
                ls.broadcast(event)
            else:
                ls.schedule_stop()

    def hand_over(self) -> None:
        """A successor accepts on the same sockets from now: what is queued is its own."""
        self.stop_accepting(handed_over=True)

    def stop_accepting(self, handed_over: bool = False) -> None:
        for ls in self.listeners:
            ls.stop_accepting(handed_over=handed_over)

    def healthcheck(self, failed: bool) -> None:
        """Nothing more: the listeners read the drain core's health-check state."""

    def no_new_work(self) -> None:
        for ls in self.listeners:
            ls.schedule_stop()  # a listener closing at T closes first: nobody new
            for conn in list(ls.connections):
                conn.no_new_work()

    def finish(self, step: Step, quit_why: str | None, limit: float) -> Awaitable[None]:
        self.stop_accepting()
        for ls in self.listeners:
            ls.close_silent()  # idle: closed, as an idle HTTP/1.1 connection is below
        if step is Step.CUT:
            for ls in self.listeners:
                ls.cut_handshakes()
                for conn in list(ls.connections):
                    conn.cut()
        for ls in self.listeners:
            for conn in list(ls.connections):
                conn.close_at_end()
        return self._closed_after_flush(limit, linger=step is Step.EXIT and quit_why is None)

    def _unsent(self) -> bool:
        """Response bytes still waiting in a connection's write buffer."""
        for ls in self.listeners:
            for conn in ls.connections:
                t = conn.transport
                if t is not None and not conn.gone and t.get_write_buffer_size():
                    return True
        return False

    async def _closed_after_flush(self, limit: float, linger: bool) -> None:
        """Connections close as their last writes leave; past ``limit`` (or once nothing is
        left to write) the rest are aborted. A clean exit (``linger``) also gives clients a
        short flush to close first. After a cut or a quit the deadline has passed: once every
        byte is with the kernel (which still sends it after the close, and the connection's
        FIN with it: a staged close sent that already) the process goes."""
        short = self.loop.time() + (EXIT_FLUSH if linger else 0.0)
        while self.connections() and self.loop.time() < limit:
            if self.loop.time() >= short and not self._unsent():
                break  # what is left has been written; its clients may linger
            await asyncio.sleep(0.01)
        for ls in self.listeners:
            ls.close_silent()
            ls.cut_handshakes()  # begun after the exit was decided: what it ends is counted
            for conn in list(ls.connections):
                if conn.transport is not None:
                    conn.transport.abort()
        for cluster in self.clusters.values():
            cluster.close_idle()

    # -- admin ------------------------------------------------------------------------------
    def refresh(self) -> Awaitable[None] | None:
        return None  # its numbers are its own

    def stats_snapshot(self) -> list[Stat]:
        self.sync_drain_counts()
        return self.registry.snapshot()

    def counters(self) -> dict[str, int]:
        return self.registry.counters()

    def reset_counters(self) -> None:
        """Nothing more: its counters are in the process's registry, reset there."""

    def set_log_level(self, name: str | None, level: str) -> None:
        """Nothing more: its loggers are the process's."""

    def reopen_logs(self) -> None:
        """Nothing more: its log files are the process's."""

    def clusters_view(self) -> list[dict[str, Any]]:
        return clusters_view(self.clusters.values())

    def listeners_info(self) -> list[dict[str, Any]]:
        now = self.loop.time()
        out = []
        for ls in self.listeners:
            info = {"name": ls.name, "address": fmt_addr(ls.sockname),
                    "accepting": ls.accepting, "draining": ls.drain.draining,
                    "connections": len(ls.connections)}
            info.update(ls.probes_info(now))
            out.append(info)
        return out

    def workers_info(self) -> dict[str, Any]:
        return {}

    def probe_trackers(self) -> list[tuple[str, ProbeTracker]]:
        return probe_trackers(self.listeners)

    def watch_traffic(self, on: bool) -> None:
        for ls in self.listeners:
            ls.watch(on)

    def housekeep(self) -> None:
        now = self.loop.time()
        for cluster in self.clusters.values():
            cluster.expire_idle(now)
