"""A TCP (Layer-4) listener: bytes relayed to an endpoint of one cluster.

Persistence is by source IP and the Layer-4 drain-stop rule holds: a record for a DRAIN endpoint is
discarded at once (drain stop does not apply). The drain is the one connection drain manager of
the HTTP listeners (``proxy.downstream``): each connection draws its proactive moment like an
HTTP one; a TCP connection has no request to finish, so from that moment it is closed (FIN both
ways) as soon as it has carried no byte for ``quiet_period``; what is left at the deadline is
reset. Each relayed connection counts as in flight, so the process waits for
it up to the deadline. A connect failure is retried on another endpoint (nothing was sent).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
from collections.abc import Callable

from lameduck.config import ListenerConfig
from lameduck.drain import ConnectionDrain, DrainedBy, ListenerDrain, ProcessDrain
from lameduck.drain.endpoint import Layer
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.listeners.base import BACKLOG, Listener, Overflow
from lameduck.proxy.downstream import STOP, Downstream, no_delay
from lameduck.stats import DrainStats, TcpStats
from lameduck.tunnel.relay import Pending, Relay, destination, open_destination
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.pool import Endpoint

log = logging.getLogger("lameduck.tcp")


class TcpDownstream(Downstream):
    """One client connection of a TCP listener, then its relay.

    The connection drain manager (``Downstream``) carries out the drain as for HTTP; what a
    byte stream changes: nobody can be told to go away, so being drained means "close once
    quiet" (``drained``), busy means "carried a byte within ``quiet_period``" (``busy``), and a
    close ends both sides through the relay (``staged_close``).
    """

    def __init__(self, ctx: TcpListener) -> None:
        super().__init__(ctx)
        self.tcp: TcpListener = ctx
        self.relay: Relay | None = None
        self.endpoint: Endpoint | None = None
        self.early: list[bytes] = []  # client bytes before the upstream answered
        self.early_eof = False
        self.admitted = False
        self.quiet_close = False  # drained: close once no byte has passed for quiet_period
        self.deadline_cut = False  # reset by the shutdown deadline (a drain cut)
        self.relay_cut = False  # the relay ended with a reset
        self.tries = 0
        self.retrying = False  # holds a slot in the cluster's retry budget
        self.pkey: str | None = None  # the source IP, with persistence

    # -- accept, pick, connect ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ctx = self.tcp
        self.transport = t = transport  # type: ignore[assignment]
        ctx.connections.add(self)
        st = ctx.stats
        st.downstream_cx_total += 1
        st.downstream_cx_active += 1
        no_delay(t)
        now = self.loop.time()
        self.drain = ConnectionDrain(ctx.drain, now, ctx.rng)
        cluster = ctx.cluster
        if cluster.persistence is not None:
            peer = t.get_extra_info("peername")
            self.pkey = peer[0] if peer else ""
            ep, _ = cluster.pick_sticky(self.pkey, Layer.L4, now, cookie=False)
        else:
            ep = cluster.pick()
        if ep is None:
            cluster.stats.upstream_cx_none_healthy += 1
            st.downstream_cx_no_route += 1
            self.reset()
            return
        if not ctx.process.ledger.begin():
            self.closing = True
            t.close()  # past the drain time: going away
            return
        self.admitted = True
        self._connect(ep)
        self.arm_drain()

    def _connect(self, ep: Endpoint) -> None:
        self.endpoint = ep
        self.tcp.connect(ep).add_done_callback(self._connected)

    def _connected(self, fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
        ep = self.endpoint
        cluster = self.tcp.cluster
        assert ep is not None
        wanted = not self.closing
        got = destination(fut, wanted)
        if not wanted:
            return
        if got is None:
            ep.cx_connect_fail += 1
            cluster.connect_failed(ep)
            self.tcp.stats.upstream_connect_fail += 1
            # The same policy and budget as an HTTP request's retry (retry_policy).
            other = cluster.retry_target(ep, self.tries, self.retrying)
            if other is not None:
                self.tries += 1
                self.retrying = cluster.retry_started(self.retrying)
                if self.pkey is not None:  # the record follows the endpoint that answers
                    cluster.rebind(self.pkey, other, self.loop.time())
                self._connect(other)
                return
            self.reset()  # nothing reachable: not a drain cut (abandoned)
            return
        ut, pending = got
        t = self.transport
        assert t is not None
        cs = cluster.stats
        cs.upstream_cx_total += 1
        cs.upstream_cx_active += 1
        ep.cx_total += 1
        ep.cx_active += 1
        ep.rq_total += 1
        ep.rq_active += 1
        ep.conns.add(self)
        self.relay = relay = Relay(self.loop, t, ut, TunnelKind.OPAQUE, 0.0, self._ended)
        relay.start(b"".join(self.early), pending.buf)
        self.early = []
        if self.early_eof:
            relay.eof(Flow.TO_UPSTREAM)
        if pending.eof:
            relay.eof(Flow.TO_CLIENT)
        if self.quiet_close:
            self.arm(relay.last_activity + self.tcp.quiet_period)  # drained while connecting

    # -- before the relay takes the sockets -----------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.early.append(data)
        if sum(map(len, self.early)) > 256 * 1024 and self.transport is not None:
            self.transport.pause_reading()  # Relay.start resumes it

    def eof_received(self) -> bool:
        self.early_eof = True
        return True

    def _ended(self, cut: bool) -> None:
        """The relay closed both sides (its protocols read the sockets, not this one)."""
        self.relay_cut = cut
        self.connection_lost(None)

    # -- what the drain manager asks --------------------------------------------------------------
    def busy(self) -> bool:
        relay = self.relay
        return relay is None or self.loop.time() - relay.last_activity < self.tcp.quiet_period

    def timeouts(self, now: float) -> float:
        relay = self.relay
        if not self.quiet_close or relay is None:
            return math.inf
        at = relay.last_activity + self.tcp.quiet_period
        if now >= at:
            self.staged_close()
            return STOP
        return at

    def drained(self, by: DrainedBy) -> None:
        """Its proactive moment: from now on it closes as soon as it is quiet."""
        self.quiet_close = True
        if self.relay is not None and not self.busy():
            self.staged_close()
        elif self.relay is not None:
            self.arm(self.relay.last_activity + self.tcp.quiet_period)

    def drain_notice(self) -> None:
        """A byte stream has no way to say "go elsewhere"."""

    def final_notice(self) -> None:
        """Nor a last word: it is closed once quiet, or reset at the deadline."""

    def drain_tunnels(self, by: DrainedBy) -> None:
        if by is DrainedBy.END:
            self.cut()

    def flush(self) -> None:
        """The relay writes what is buffered before it closes."""

    def staged_close(self) -> None:
        """Close both sides with a FIN (the relay writes what is buffered first)."""
        if self.closing:
            return
        self.closing = True
        self.drain.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.drain.drained_by is not None:
            self.tcp.stats.downstream_cx_drain_close += 1
            if self.drain.drained_by is DrainedBy.PROACTIVE:
                self.tcp.drain_stats.cx_drained_proactive += 1
        if self.relay is not None:
            self.relay.end(reset=False)
        elif self.transport is not None:
            self.transport.close()

    def reset(self) -> None:
        relay = self.relay
        if relay is None:
            super().reset()
            return
        self.closing = True
        relay.end(reset=True)

    def abandon_all(self) -> None:
        """Settle the ledger, the endpoint and the retry budget, however it ended."""
        ctx = self.tcp
        cut = self.relay_cut
        if self.retrying:  # its retry slot is given back
            self.retrying = False
            ctx.cluster.retry_ended(self.relay is not None)
        ep = self.endpoint
        if self.relay is not None and ep is not None:
            ep.conns.discard(self)
            ep.cx_active -= 1
            ep.rq_active -= 1
            ctx.cluster.stats.upstream_cx_active -= 1
            if cut:
                ep.rq_error += 1
            else:
                ep.rq_success += 1
        if cut or (self.deadline_cut and self.relay is None):
            ctx.stats.downstream_cx_cut += 1
        if self.admitted:
            ledger = ctx.process.ledger
            if self.deadline_cut:
                ledger.cut_one()
            elif cut or self.relay is None:
                ledger.abandon()  # severed by a drain stop, or never relayed
            else:
                ledger.end()

    # -- from outside: an endpoint's drain stop, the shutdown deadline ----------------------------
    def sever(self) -> None:
        """Its endpoint's drain stop severs it (the endpoint's ``conns``)."""
        self.reset()

    def cut(self) -> None:
        """The shutdown deadline: reset what is left."""
        if not self.gone:
            self.deadline_cut = True
            self.reset()


class TcpListener(Listener):
    """A `protocol: tcp` listener in front of one cluster."""

    def __init__(self, cfg: ListenerConfig, loop: asyncio.AbstractEventLoop,
                 process: ProcessDrain, drain: ListenerDrain, cluster: Cluster,
                 stats: TcpStats, drain_stats: DrainStats, on_change: Callable[[], None],
                 rng: Callable[[], float] = random.random) -> None:
        super().__init__(cfg, loop, process, drain, on_change)
        self.cluster = cluster
        self.stats = stats
        self.drain_stats = drain_stats
        self.rng = rng
        self.quiet_period = cfg.quiet_period
        self.connections: set[TcpDownstream] = set()  # type: ignore[assignment]

    def connect(self, ep: Endpoint) -> asyncio.Future[tuple[asyncio.Transport, Pending]]:
        """A socket to ``ep``, with what it sends before the relay starts."""
        return open_destination(self.loop, ep.host, ep.port, self.cluster.connect_timeout)

    def on_connection_closed(self, conn: TcpDownstream) -> None:
        self._on_change()

    async def start(self, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = self.bind()
        self.sockname = sock.getsockname()
        Listener.running.add(self)  # under the process's downstream connection cap
        self.server = await self.loop.create_server(
            lambda: TcpDownstream(self) if self.has_room() else Overflow(self), sock=sock,
            backlog=BACKLOG)
