"""A TCP (Layer-4) listener: bytes relayed to an endpoint of one cluster.

Persistence is by source IP and the Layer-4 drain-stop rule holds: a record for a DRAIN endpoint is
discarded at once (drain stop does not apply). The drain: each connection draws its proactive
moment like an HTTP one; a TCP connection has no request to finish, so from that moment it is
closed (FIN both ways) as soon as it has carried no byte for ``quiet_period``; what is left at
the deadline is reset. Each relayed connection counts as in flight, so the process waits for
it up to the deadline. A connect failure is retried on another endpoint (nothing was sent).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Callable

from lameduck.config import ListenerConfig
from lameduck.drain import ConnectionDrain, ListenerDrain, ProcessDrain
from lameduck.drain.endpoint import Layer
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.listeners.base import Listener
from lameduck.proxy.downstream import no_delay
from lameduck.stats import DrainStats, TcpStats
from lameduck.tunnel.relay import Pending, Relay, abort_with_rst, destination, open_destination
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.pool import Endpoint

log = logging.getLogger("lameduck.tcp")


class TcpDownstream(asyncio.Protocol):
    """One client connection of a TCP listener, then its relay."""

    def __init__(self, ctx: TcpListener) -> None:
        self.ctx = ctx
        self.loop = ctx.loop
        self.transport: asyncio.Transport | None = None
        self.relay: Relay | None = None
        self.endpoint: Endpoint | None = None
        self.early: list[bytes] = []  # client bytes before the upstream answered
        self.early_eof = False
        self.gone = False
        self.admitted = False
        self.finished = False
        self.deadline_cut = False  # reset by the shutdown deadline (a drain cut)
        self.tries = 0
        self.retrying = False  # holds a slot in the cluster's retry budget
        self.pkey: str | None = None  # the source IP, with persistence
        self.timer: asyncio.TimerHandle | None = None
        self.drain: ConnectionDrain = None  # type: ignore[assignment]  # set at connection_made

    # -- accept, pick, connect ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ctx = self.ctx
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
            self._close(reset=True)
            return
        if not ctx.process.ledger.begin():
            self._close(reset=False)  # past the drain time: going away
            return
        self.admitted = True
        self._connect(ep)
        self._arm()

    def _connect(self, ep: Endpoint) -> None:
        self.endpoint = ep
        fut = open_destination(self.loop, ep.host, ep.port, self.ctx.cluster.connect_timeout)
        fut.add_done_callback(self._connected)

    def _connected(self, fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
        ep = self.endpoint
        cluster = self.ctx.cluster
        assert ep is not None
        wanted = not (self.gone or self.finished)
        got = destination(fut, wanted)
        if not wanted:
            return
        if got is None:
            ep.cx_connect_fail += 1
            cluster.connect_failed(ep)
            self.ctx.stats.upstream_connect_fail += 1
            # The same policy and budget as an HTTP request's retry (retry_policy).
            other = cluster.retry_target(ep, self.tries, self.retrying)
            if other is not None:
                self.tries += 1
                self.retrying = cluster.retry_started(self.retrying)
                if self.pkey is not None:  # the record follows the endpoint that answers
                    cluster.rebind(self.pkey, other, self.loop.time())
                self._connect(other)
                return
            self._close(reset=True)  # nothing reachable: not a drain cut (abandoned)
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
        if self.drain.drained_by is not None:
            self._arm()  # its proactive moment came while it was connecting

    # -- before the relay takes the sockets -----------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.early.append(data)
        if sum(map(len, self.early)) > 256 * 1024 and self.transport is not None:
            self.transport.pause_reading()  # Relay.start resumes it

    def eof_received(self) -> bool:
        self.early_eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """Only while connecting (the relay's own protocol reads the socket after)."""
        self.gone = True
        self._finish(cut=False)

    # -- the end ----------------------------------------------------------------------------------
    def _ended(self, cut: bool) -> None:
        self.gone = True
        self._finish(cut)

    def _finish(self, cut: bool) -> None:
        if self.finished:
            return
        self.finished = True
        ctx = self.ctx
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        ctx.connections.discard(self)
        ctx.stats.downstream_cx_active -= 1
        if self.retrying:  # however it ends, its retry slot is given back
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
        ledger = ctx.process.ledger
        if cut:
            ctx.stats.downstream_cx_cut += 1
        if self.admitted:
            if self.deadline_cut:
                ledger.cut_one()
            elif cut or self.relay is None:
                ledger.abandon()  # severed by a drain stop, or never relayed
            else:
                ledger.end()
        self.drain.closed()
        ctx.on_change()

    def _close(self, reset: bool) -> None:
        """End the connection (both sides once relaying): a FIN, or a reset."""
        relay = self.relay
        if relay is not None:
            relay.end(reset)
            return
        t = self.transport
        if t is not None and not t.is_closing():
            if reset:
                abort_with_rst(t)
            else:
                t.close()
        if reset and not self.finished:
            self.gone = True
            self._finish(cut=self.deadline_cut)

    def sever(self) -> None:
        """Its endpoint's drain stop severs it (the endpoint's ``conns``)."""
        self._close(reset=True)

    # -- drain ------------------------------------------------------------------------------------
    def on_drain_event(self, event: object) -> None:
        self.drain.on_drain_event(event, self.ctx.rng)  # type: ignore[arg-type]
        self._arm()

    def _arm(self) -> None:
        if self.finished:
            return
        at = self.drain.next_deadline() if self.drain.drained_by is None else None
        if self.drain.drained_by is not None and self.relay is not None:
            at = self.relay.last_activity + self.ctx.quiet_period
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if at is not None:
            self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if self.finished:
            return
        now = self.loop.time()
        d = self.drain
        if d.drained_by is None:
            d.on_timer(now, idle=False)  # the proactive moment: from now on, close when quiet
            if d.drained_by is None:
                self._arm()
                return
        relay = self.relay
        if relay is None:
            self._arm()  # still connecting: checked again once relaying
            return
        if now - relay.last_activity >= self.ctx.quiet_period:
            self.ctx.stats.downstream_cx_drain_close += 1
            self.ctx.drain_stats.cx_drained_proactive += 1
            self._close(reset=False)
            return
        self._arm()

    def cut(self) -> None:
        """The shutdown deadline: reset what is left."""
        if not self.finished:
            self.deadline_cut = True
            self._close(reset=True)

    def close_at_end(self) -> None:
        self.cut()

    def no_new_work(self) -> None:
        """T has passed: a relayed byte stream has no request to turn away, nothing to do."""


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

    def on_change(self) -> None:
        self._on_change()

    async def start(self, sock: socket.socket | None = None) -> None:
        if sock is None:
            sock = self.bind()
        self.sockname = sock.getsockname()
        self.server = await self.loop.create_server(lambda: TcpDownstream(self), sock=sock)
