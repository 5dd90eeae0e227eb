"""A TCP (Layer-4) listener: bytes relayed to an endpoint of one cluster.

Each connection is one ``Exchange`` with no head (``message.STREAM``): admitted to the
process ledger, given an endpoint (persistence by source IP, and the Layer-4 drain-stop rule: a
record for a DRAIN endpoint is discarded at once), connected, retried after a connect failure
(nothing was sent: another endpoint, or the same one after a back-off, under the cluster's
retry policy and budget) and settled and logged as an HTTP request is. Its access-log line is
Envoy's TCP proxy line: ``"- - -"``, response code 0, the flags (UH no healthy upstream, UF
connect failure, CA/CB cut by the drain, DC the client went away first) and the bytes each way.

The drain is the one connection drain manager of the HTTP listeners (``proxy.downstream``):
each connection draws its proactive moment like an HTTP one; a TCP connection has no request
to finish, so from that moment it is closed (FIN both ways) as soon as it has carried no byte
for ``quiet_period``; what is left at the deadline is reset. Each relayed connection counts as
in flight, so the process waits for it up to the deadline.
"""

from __future__ import annotations

import asyncio
import math
import random
import socket
from collections.abc import Callable

from lameduck.config import ListenerConfig
from lameduck.drain import ConnectionDrain, DrainedBy, ListenerDrain, ProcessDrain
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.listeners.base import BACKLOG, Listener, Overflow
from lameduck.proxy.accesslog import UH, open_access_log
from lameduck.proxy.downstream import STOP, Downstream
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.message import STREAM
from lameduck.stats import DrainStats, TcpStats
from lameduck.tunnel.relay import Pending, Relay, destination, open_destination
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.connector import ExchangeSink, UpstreamConn
from lameduck.upstream.pool import Endpoint


class TcpUpstream(UpstreamConn):
    """The upstream socket of one relayed connection, as an exchange holds an upstream
    connection: ``start`` hands it to the downstream's relay, ``sever`` is its endpoint's drain
    stop. Never pooled."""

    def __init__(self, listener: TcpListener, ep: Endpoint, transport: asyncio.Transport,
                 pending: Pending) -> None:
        super().__init__(multiplexed=False)
        self.listener = listener
        self.endpoint = ep
        self.transport = transport
        self.pending = pending
        self.relay: Relay | None = None
        self.closed = False
        cs = listener.cluster.stats
        cs.upstream_cx_total += 1
        cs.upstream_cx_active += 1
        ep.cx_total += 1
        ep.cx_active += 1
        ep.conns.add(self)

    @property
    def reusable(self) -> bool:
        return False

    def start(self, sink: ExchangeSink, head: object) -> None:
        """The exchange attached: its downstream relays both sockets from now on."""
        assert isinstance(sink, Exchange)
        self.sink = sink
        down = sink.down
        assert isinstance(down, TcpDownstream)
        down.relay_to(self)

    def write(self, data: bytes) -> None:
        """Client bytes read before the relay began (the exchange held and counted them)."""
        self.transport.write(data)

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        """The client shut down writing before the relay began: the FIN goes on."""
        if self.relay is not None:
            self.relay.eof(Flow.TO_UPSTREAM)

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def close(self) -> None:
        """Off the endpoint's books; a socket the relay never took is closed."""
        if self.closed:
            return
        self.closed = True
        ep = self.endpoint
        ep.conns.discard(self)
        ep.cx_active -= 1
        self.listener.cluster.stats.upstream_cx_active -= 1
        if self.relay is None:
            self.transport.abort()

    def sever(self) -> None:
        """Its endpoint's drain stop: the relay is reset."""
        if self.relay is not None:
            self.relay.end(reset=True)
        elif isinstance(self.sink, Exchange):
            self.sink.down.reset()

    def take_over(self) -> asyncio.Transport | None:
        return None

    def tunnel_closed(self) -> None:
        self.close()


class TcpDownstream(Downstream):
    """One client connection of a TCP listener: its exchange, then its relay.

    The connection drain manager (``Downstream``) carries out the drain as for HTTP; what a
    byte stream changes: nobody can be told to go away, so being drained means "close once
    quiet" (``drained``), busy means "carried a byte within ``quiet_period``" (``busy``), and a
    close ends both sides through the relay (``staged_close``).
    """

    def __init__(self, ctx: TcpListener) -> None:
        super().__init__(ctx)
        self.tcp: TcpListener = ctx
        self.ex: Exchange | None = None
        self.relay: Relay | None = None
        self.quiet_close = False  # drained: close once no byte has passed for quiet_period
        self.deadline_cut = False  # reset by the shutdown deadline (a drain cut)

    # -- accept: the exchange admits, picks and connects -------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ctx = self.tcp
        self.transport = t = transport  # type: ignore[assignment]
        ctx.connections.add(self)
        st = ctx.stats
        st.downstream_cx_total += 1
        st.downstream_cx_active += 1
        now = self.loop.time()
        self.drain = ConnectionDrain(ctx.drain, now, ctx.rng)
        cluster = ctx.cluster
        pkey = None
        if cluster.persistence is not None:
            peer = t.get_extra_info("peername")
            pkey = peer[0] if peer else ""  # by source IP (a cookie is HTTP's)
        self.ex = ex = Exchange(self, b"", STREAM)
        st.downstream_rq_active += 1  # (the exchange's books; not published for TCP)
        if not ex.admit_stream(cluster, pkey, now, ctx.access_log is not None):
            st.downstream_rq_active -= 1
            ex.log_unbooked(now)
            self.ex = None
            return
        self.arm_drain()
        ex.start()

    def relay_to(self, up: TcpUpstream) -> None:
        """The upstream is connected: both sockets are relayed from now on."""
        ex = self.ex
        t = self.transport
        assert ex is not None and t is not None
        pending = up.pending
        self.relay = relay = Relay(self.loop, t, up.transport, TunnelKind.OPAQUE, 0.0,
                                   self._ended)
        up.relay = relay
        ex.tunnel_opened(0)
        relay.start(b"", pending.buf)
        if pending.eof:
            relay.eof(Flow.TO_CLIENT)
        if self.quiet_close:
            self.arm(relay.last_activity + self.tcp.quiet_period)  # drained while connecting

    # -- before the relay takes the sockets: the exchange holds what the client sends ------------
    def data_received(self, data: bytes) -> None:
        if self.ex is not None:
            self.ex.request_body(data, 0)

    def eof_received(self) -> bool:
        if self.ex is not None:
            self.ex.request_complete()
        return True

    # -- what the exchange asks (the rest, never asked of a stream, stays Downstream's) --------
    def going_away(self, ex: Exchange) -> None:
        """Past the drain time: a byte stream can only be closed."""
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        """No endpoint could take it (no healthy one, or none reachable): reset."""
        if ex.flags & UH:
            self.tcp.stats.downstream_cx_no_route += 1
        self.reset()

    def hold_request(self, ex: Exchange) -> None:
        if self.transport is not None:
            self.transport.pause_reading()  # the relay resumes it when it starts

    def resume_request(self, ex: Exchange) -> None:
        if self.transport is not None and self.relay is None:
            self.transport.resume_reading()

    def release_request(self, ex: Exchange, credit: int) -> None:
        """No window to give back."""

    def exchange_done(self, ex: Exchange) -> None:
        """Answered from here (``send_local`` reset it): off the books as not completed."""
        ex.settle(False)
        self.ex = None

    def abort(self, ex: Exchange) -> None:
        self.reset()

    def cork(self) -> None:
        """Nothing to batch: the relay writes as bytes come."""

    def uncork(self) -> None:
        """See ``cork``."""

    def _ended(self, cut: bool) -> None:
        """The relay closed both sides (its protocols read the sockets, not this one)."""
        relay = self.relay
        ex = self.ex
        assert relay is not None
        ep = ex.endpoint if ex is not None else None
        if ep is not None:
            if cut:
                ep.rq_error += 1
            else:
                ep.rq_success += 1
        if cut:
            self.tcp.stats.downstream_cx_cut += 1
        if ex is not None:
            self.ex = None
            ex.detach()  # the upstream's books (``TcpUpstream.close``)
            # a tunnel the deadline reset is cut (CA); one its endpoint's drain stop severed,
            # or lameduck reset otherwise, is off the books unfinished
            ex.tunnel_closed(self.deadline_cut, relay.rx, relay.tx)
            ex.settled_here()
            ex.settle(not cut)
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
        self.aborted = True
        relay.end(reset=True)

    def abandon_all(self) -> None:
        """The client connection is gone before its exchange settled (the client left while
        it connected, the deadline cut it): off the books."""
        ex = self.ex
        if ex is None:
            return
        self.ex = None
        ex.settled_here()  # a connect still under way finds it over
        ex.client_gone()
        ex.settle(False)

    # -- from outside: the shutdown deadline ------------------------------------------------------
    def cut(self) -> None:
        """The shutdown deadline: reset what is left."""
        if self.gone:
            return
        self.deadline_cut = True
        ex = self.ex
        if self.relay is None and ex is not None and ex.admitted:
            # still connecting: cut before it was relayed (CB); a byte stream has no answer
            ex.deadline_cut(answerable=False)
            self.tcp.stats.downstream_cx_cut += 1
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
        al = cfg.access_log
        self.access_log = None if al is None else open_access_log(al.path, al.format, loop)
        self.connections: set[TcpDownstream] = set()  # type: ignore[assignment]

    def connect(self, cluster: Cluster, ep: Endpoint) -> asyncio.Future[TcpUpstream]:
        """A socket to ``ep``, with what it sends before the relay starts; a failure is the
        future's exception (the exchange retries or answers)."""
        out: asyncio.Future[TcpUpstream] = self.loop.create_future()
        opening = self.open(cluster, ep)

        def opened(fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
            got = destination(fut, not out.done())
            if got is None:
                if not out.done():
                    ep.cx_connect_fail += 1
                    self.stats.upstream_connect_fail += 1
                    out.set_exception(ConnectionError(f"connect to {ep.address} failed"))
                return
            out.set_result(TcpUpstream(self, ep, *got))

        opening.add_done_callback(opened)
        return out

    def open(self, cluster: Cluster,
             ep: Endpoint) -> asyncio.Future[tuple[asyncio.Transport, Pending]]:
        """The socket itself (``Pending`` keeps what the endpoint sends meanwhile)."""
        return open_destination(self.loop, ep.host, ep.port, cluster.connect_timeout)

    def on_request_done(self) -> None:
        self._on_change()

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
