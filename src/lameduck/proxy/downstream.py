"""A downstream connection's drain, whatever it speaks: one manager for HTTP/1.1, HTTP/2 and
TCP listeners.

The drain core (``drain.ConnectionDrain``) decides when this connection drains: a response the
policy picks, its proactive moment, G after that, the end. This carries the decisions out the
same way for every codec, and asks the codec only for what differs:

- ``drain_notice()``: tell the client to go elsewhere (HTTP/2: GOAWAY 2^31-1; HTTP/1.1: nothing
  to send — the next response carries ``Connection: close``);
- ``final_notice()``: the last word (HTTP/2: the final GOAWAY naming the last stream it
  processed, RFC 9113 §6.8; HTTP/1.1: nothing);
- ``drain_tunnels(by)``: its WebSocket and CONNECT tunnels, which end by their own rules;
- ``busy()``, ``timeouts(now)``: whether an exchange is in flight, and the codec's own
  deadlines (request header timeout, idle timeout).

A connection's own limits drain it the same way: ``max_connection_duration`` is a moment of
the drain core; ``max_requests_per_connection`` is counted down by the codec, which calls
``last_request()`` at the last one (docs/timeouts.md).
- ``drained(by)``: what being drained means; by default it counts and sends
  ``drain_notice()``. A TCP connection has nobody to tell: it closes once quiet instead.

One lazily re-armed timer covers the codec's deadlines and the drain's moments. A close is
staged (RFC 9112 §9.6: write what is pending, shut down writing, keep reading for ``LINGER``,
then close) so that the last response is not lost to a reset. Envoy's connection manager plays
the same part for its codecs.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from mypy_extensions import mypyc_attr

from lameduck.drain import ConnAction, ConnectionDrain, DrainedBy, Ledger, ListenerDrain
from lameduck.proxy.accesslog import PD, RD
from lameduck.proxy.admission import Client, client_for
from lameduck.proxy.exchange import Exchange, ExchangeContext
from lameduck.proxy.local import (
    CUT_ANSWER,
    CUT_GRPC_TRAILERS,
    CUT_STATUS,
    GOING_AWAY_BODY,
    RETRY_AFTER,
)
from lameduck.stats import ConnectionStats, DrainStats
from lameduck.tunnel.relay import Relay, abort_with_rst
from lameduck.upstream.connector import Fields

LINGER: Final = 2.0  # seconds a staged close keeps reading before it closes
STOP: Final = -1.0  # ``timeouts``: the codec closed the connection, nothing to re-arm
# The context every connection timer runs in. Without one, call_at copies the current context
# for each timer (an 80-byte object every idle connection keeps with its timer); lameduck sets
# no context variables, and the loop runs one callback at a time, so one context serves all.
TIMER_CONTEXT: Final = contextvars.Context()


class ConnectionContext(ExchangeContext, Protocol):
    """What a downstream connection needs from its listener, whatever it speaks."""

    drain_stats: DrainStats
    drain: ListenerDrain
    rng: Callable[[], float]
    connections: set[Any]
    idle_timeout: float
    scheme: bytes
    connect_timeout: float

    def on_connection_closed(self, conn: Any) -> None: ...


class HttpConnectionContext(ConnectionContext, Protocol):
    """An HTTP listener's per-connection limits (math.inf / 0: none), the same for both codecs."""

    max_connection_duration: float
    max_requests_per_connection: int
    send_timeout: float
    request_body_timeout: float


@mypyc_attr(allow_interpreted_subclasses=True)  # the TCP listener's, and the tests' codecs
class Downstream(asyncio.Protocol):
    """The parts of a client connection that do not depend on its protocol."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.loop: asyncio.AbstractEventLoop = ctx.loop
        self.cx_stats: ConnectionStats = ctx.stats  # the codec keeps its own, typed
        # The process's in-flight ledger, read once a connection (not through two lookups by
        # name per request); a worker's is in place before it accepts.
        self.ledger: Ledger = ctx.process.ledger
        self.transport: asyncio.Transport | None = None
        self.client: Client = None  # type: ignore[assignment]  # set once connected
        # The flags together: compiled, each is a byte of the struct (see H1Downstream).
        self.closing = False
        self.gone = False
        self.aborted = False  # we reset the connection (not the client)
        self.eof_sent = False
        self.final_sent = False  # the final notice went out: close once idle
        self.write_paused = False
        self.unseen = False  # accepted, no request begun yet: the ledger's ``fresh``
        # x-envoy-upstream-service-time on what it proxies (the listener's, read once here)
        self.envoy_headers: bool = not ctx.suppress_envoy_headers
        self.paused_at = 0.0  # writing paused since (the send timeout counts from here)
        self.send_timeout = math.inf  # an HTTP codec sets its listener's (take_limits)
        self.body_timeout = math.inf  # and its request_body_timeout
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.drain: ConnectionDrain = None  # type: ignore[assignment]  # set once connected
        # Requests this connection still takes before it drains (max_requests_per_connection);
        # counted down by the codec, -1: no limit (it never reaches 0).
        self.requests_left = -1
        self.drain_flags = 0  # PD once drained proactively: every request settled after has it
        # The client's address as the access log writes it (%DOWNSTREAM_REMOTE_ADDRESS%), read
        # on the first line that asks; "" if the transport had none.
        self.log_peer: str | None = None
        # Alt-Svc the listener advertises on TCP (``h3=":PORT"; ma=N``, RFC 7838 §3) when it
        # serves HTTP/3 too; None: no HTTP/3, nothing added.
        self.alt_svc: bytes | None = ctx.alt_svc

    def take(self, transport: asyncio.BaseTransport, fresh: bool = True) -> None:
        """This connection's socket, and its peer (for X-Forwarded-For). Small writes go out at
        once without a setsockopt here: the loop sets TCP_NODELAY on every TCP transport it
        makes (uvloop's TCPTransport.new, asyncio's since Python 3.6), which the underlying
        socket of a TLS one is too. ``fresh`` False: taken over from another codec, which
        counted it as accepted (the ledger, the health-check path's watch) already."""
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        ctx = self.ctx
        host = peer[0] if peer else ""
        self.client = client_for(host, ctx.scheme, ctx.generate_request_id)
        if not fresh:
            return
        traffic = ctx.traffic  # watched (leave: confirm): a new connection is evidence
        if traffic is not None:
            traffic.connection(self.loop.time(), host)
        self.unseen = True
        self.ledger.accepted()

    def accepted(self) -> ConnectionDrain:
        """A connection accepted by this listener (not one taken over from another codec):
        on the listener's books, with a drain state of its own."""
        st = self.cx_stats
        st.downstream_cx_total += 1
        st.downstream_cx_active += 1
        ctx = self.ctx
        return ConnectionDrain(ctx.drain, self.loop.time(), ctx.rng, ctx.max_connection_duration)

    def opened(self, transport: asyncio.BaseTransport, drain: ConnectionDrain,
               fresh: bool = True) -> None:
        """Serve ``transport`` under ``drain`` (its own, or the one the connection carries
        on with: ``fresh`` False): among the listener's connections, its idle clock started."""
        ctx = self.ctx
        self.take(transport, fresh)
        self.drain = drain
        ctx.connections.add(self)
        self.idle_since = now = self.loop.time()
        self.arm(now + ctx.idle_timeout)

    def start_relay(self, relay: Relay, early: bytes, rest: bytes) -> None:
        """A tunnel begins (after a 101, or CONNECT's 200): one that begins after this
        connection's proactive drain moment is drained at once, its moment passed already."""
        relay.start(early, rest)
        if self.drain.proactive_fired:
            relay.drain_by(DrainedBy.PROACTIVE)

    # -- what the codec says ----------------------------------------------------------------
    def busy(self) -> bool:
        raise NotImplementedError

    def head_unread(self) -> bool:
        """A request head has begun to arrive and not ended (HTTP/1.1): a request its client
        sent, not yet on the ledger's books, that nothing can answer before it ends. An exit
        waits for it and the deadline cuts it (``head_cut``), as a request in flight."""
        return False

    def silent_since(self) -> float:
        """Its accept, while it has sent nothing of a request (0: it has): an exit waits G
        from there for the request that may be on its way (``ProcessDrain.arriving_until``)."""
        if self.unseen and not self.head_unread():
            return self.drain.accepted_at
        return 0.0

    def cut_stream(self, s: Exchange) -> None:
        """The shutdown deadline for one stream of a multiplexed connection (HTTP/2, HTTP/3),
        as ``Exchange.deadline_cut`` decides: ``503`` going away if nothing of its response
        went out, gRPC's trailers-only status once its head has, else a reset (the codec's
        CANCEL / H3_REQUEST_CANCELLED)."""
        what = s.deadline_cut()
        if what == CUT_ANSWER:
            self.respond(s, 503, GOING_AWAY_BODY, RETRY_AFTER)
            s.finish()
        elif what == CUT_STATUS:
            self.stream_trailers(s, CUT_GRPC_TRAILERS)
            s.finish()
        else:
            self.cancel_stream(s)

    def respond(self, s: Exchange, status: int, body: bytes,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """A whole local answer on stream ``s`` (multiplexed codecs)."""
        raise NotImplementedError

    def stream_trailers(self, s: Exchange, fields: Fields) -> None:
        """Trailers that end stream ``s`` (multiplexed codecs)."""
        raise NotImplementedError

    def cancel_stream(self, s: Exchange) -> None:
        """Reset stream ``s``: the deadline cancelled it (multiplexed codecs)."""
        raise NotImplementedError

    def head_cut(self) -> None:
        """The shutdown deadline cut a request head partly read: counted as a request cut
        before its response (the codec answers it 503 going away if nothing is ahead of it)."""
        self.ledger.cut_unheard(1)
        self.ctx.drain_stats.cut_before_response += 1

    def timeouts(self, now: float) -> float:
        """Act on the codec's own deadlines: the next one (``math.inf``: none), or ``STOP``."""
        raise NotImplementedError

    def drain_notice(self) -> None:
        raise NotImplementedError

    def final_notice(self) -> None:
        raise NotImplementedError

    def drain_tunnels(self, by: DrainedBy) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def writing_paused(self) -> None:
        """The client stopped taking bytes: from now it has ``send_timeout`` to take some
        (nginx ``send_timeout``, HAProxy ``timeout client``); each resume starts it again."""
        self.write_paused = True
        self.paused_at = now = self.loop.time()
        self.arm(now + self.send_timeout)

    def on_staged_close(self, t: asyncio.Transport) -> None:
        """A staged close begins: stop taking requests, keep reading (to drain the socket)."""

    def abandon_all(self) -> None:
        """The connection is gone: take what was in flight off the books."""
        raise NotImplementedError

    def clients_gone(self, gone: Sequence[Exchange]) -> None:
        """The connection ended (or its client half-closed) with ``gone`` in flight: each ends
        by the exchange's rule (``Exchange.client_gone``), and the connection counts once as
        destroyed by its client with requests active (Envoy's
        downstream_cx_destroy_remote_active_rq), unless lameduck reset it. The codec settles
        each after (its own books: a queue, a stream's window)."""
        if gone and not self.aborted:
            gone[0].stats.downstream_cx_destroy_remote_active_rq += 1
        for ex in gone:
            ex.client_gone()

    # -- the drain core's decisions --------------------------------------------------------------
    def response_drains(self, ex: Any = None) -> bool:
        """The drain core's per-response decision; the first one that drains sends the notice
        (and is flagged RD in the access log: ``ex``, the exchange it answers)."""
        d = self.drain
        if d.drained_by is None and d.listener.quiet:
            return False  # the common case: no drain anywhere, no clock read needed
        was_open = d.drained_by is None
        if not d.on_response(self.loop.time(), self.ctx.rng):
            return False
        if was_open:
            if ex is not None:
                ex.flags |= RD
            self.drained(DrainedBy.RESPONSE)
            self.arm_drain()  # its grace G is one of the drain's moments
        return True

    def local_fields(self) -> tuple[tuple[bytes, bytes], ...]:
        """The fields every answer made here carries, as a proxied one does: on TCP, the
        listener's Alt-Svc when it serves HTTP/3 (so a client that only ever got a health
        check or an error still learns of it, and of its ``clear`` in a drain)."""
        if self.alt_svc is None:
            return ()
        return ((b"alt-svc", self.alt_svc_value()),)

    def alt_svc_value(self) -> bytes:
        """The Alt-Svc field value for a response on this (TCP) connection whose listener
        serves HTTP/3 (``alt_svc`` set): its offer, or ``clear`` (RFC 7838 §3: forget every
        alternative) once its listener drains or the connection was drained, so clients stay
        on TCP and leave with it instead of opening QUIC connections to an instance on its
        way out."""
        d = self.drain
        if d.drained_by is not None or not d.listener.quiet:
            return b"clear"
        return self.alt_svc  # type: ignore[return-value]  # set: the caller checked

    def drained(self, by: DrainedBy) -> None:
        """The connection was drained (by a response, or its proactive moment): count it and
        tell the client. A codec with nobody to tell (TCP) changes what draining means."""
        self.cx_stats.downstream_cx_drain_close += 1
        ds = self.ctx.drain_stats
        if by is DrainedBy.RESPONSE:
            ds.cx_drained_by_response += 1
        elif by is DrainedBy.MAX_DURATION:
            self.ctx.stats.downstream_cx_max_duration_reached += 1
        elif by is DrainedBy.MAX_REQUESTS:
            self.ctx.stats.downstream_cx_max_requests_reached += 1
        elif by is DrainedBy.END:  # idle_close: on_response, still untold at T + G
            ds.cx_closed_at_end += 1
        else:
            ds.cx_drained_proactive += 1
            self.drain_flags |= PD
        self.drain_notice()

    def take_limits(self, ctx: HttpConnectionContext) -> None:
        """An HTTP connection's limits, from its listener (a TCP connection has none)."""
        n = ctx.max_requests_per_connection
        if n > 0:
            self.requests_left = n
        self.send_timeout = ctx.send_timeout
        self.body_timeout = ctx.request_body_timeout

    def count_request(self) -> bool:
        """One more request taken; True if it was the last this connection takes
        (max_requests_per_connection): the connection drains now."""
        if self.unseen:
            self._heard()
        self.requests_left -= 1
        if self.requests_left:
            return False
        self.last_request()
        return True

    def _heard(self) -> None:
        """Its first request began, or it closed unheard: no longer the ledger's ``fresh``."""
        self.unseen = False
        self.ledger.heard()

    def last_request(self) -> None:
        """The request that used up max_requests_per_connection (Envoy's): the connection drains
        now, so its response says so (HTTP/1.1 ``Connection: close``; HTTP/2 GOAWAY)."""
        if self.drain.drain_by_limit(self.loop.time(), DrainedBy.MAX_REQUESTS):
            self.drained(DrainedBy.MAX_REQUESTS)
            self.arm_drain()  # its grace G, as for a connection a response drained

    def on_drain_event(self, event: object) -> None:
        """A drain started on this connection's listener: draw the moment, arm the timer."""
        self.drain.on_drain_event(event, self.ctx.rng)  # type: ignore[arg-type]
        self.arm_drain()

    def arm_drain(self) -> None:
        at = self.drain.next_deadline()
        if at is not None:
            self.arm(at)

    def arm(self, at: float) -> None:
        if at == math.inf:
            return
        if self.timer is not None:
            if self.timer_at <= at:
                return
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self.on_timer, context=TIMER_CONTEXT)

    def on_timer(self) -> None:
        self.timer = None
        if self.gone:
            return
        if self.closing:
            if self.transport is not None:
                self.transport.close()  # the staged close's linger is over
            return
        now = self.loop.time()
        if self.write_paused:
            sent_by = self.paused_at + self.send_timeout
            if now >= sent_by:
                # Nothing more can reach a client that does not read: a reset, not a FIN
                # behind bytes it will never take.
                self.ctx.stats.downstream_cx_send_timeout += 1
                self.reset()
                return
            self.arm(sent_by)
        at = self.timeouts(now)
        if at == STOP:
            return
        d = self.drain
        dl = d.next_deadline()
        if dl is not None and now >= dl:
            was_open = d.drained_by is None
            action = d.on_timer(now, idle=not self.busy())
            if was_open and d.drained_by is not None:
                self.drained(d.drained_by)  # its proactive moment, or max_connection_duration
            if action is ConnAction.DRAIN:
                # The proactive moment (also of a connection a response drained): its tunnels
                # end from now, by their own rules (as in Envoy).
                self.drain_tunnels(DrainedBy.PROACTIVE)
            if d.grace_elapsed:
                self.final_notice()
            if action is ConnAction.CLOSE or (self.final_sent and not self.busy()):
                self.staged_close()
                return
            dl = d.next_deadline()
        if dl is not None and dl < at:
            at = dl
        self.arm(at)

    def on_idle(self, now: float) -> None:
        """The last exchange ended: the idle clock starts; a drained connection may close."""
        if self.closing:
            return
        self.idle_since = now
        self.arm(now + self.ctx.idle_timeout)
        d = self.drain
        if self.final_sent or (d.drained_by is not None
                               and d.on_idle(now) is ConnAction.CLOSE):
            self.staged_close()

    def idle_timeouts(self, now: float) -> float:
        """Nothing in flight (an HTTP codec's ``timeouts``): idle for the listener's
        idle_timeout (Envoy's connection idle_timeout) since ``on_idle``, the connection closes
        (``idle_close``), counted as downstream_cx_idle_timeout: ``STOP``; else when it will."""
        at = self.idle_since + self.ctx.idle_timeout
        if now < at:
            return at
        self.ctx.stats.downstream_cx_idle_timeout += 1
        self.idle_close()
        return STOP

    def idle_close(self) -> None:
        """The idle timeout closes the connection (HTTP/2 sends GOAWAY first)."""
        self.staged_close()

    def no_new_work(self) -> None:
        """T has passed: the process takes no new request. HTTP/2 says so now (the final
        GOAWAY), rather than G after a drain that may have begun just before T; HTTP/1.1 has no
        notice outside a response, and a request that still comes is answered going away.
        With ``drain.idle_close: on_response`` an idle connection whose client has not been told
        is left alone: that answer tells it, or the drain's end (T + G) closes it."""
        if not self.closing:
            now = self.loop.time()
            if not self.busy() and self.drain.holds_open(now):
                return
            self.final_notice()
            if self.final_sent and not self.busy():
                # the last word is said and nothing is in flight: closed by the drain's end
                # (a connection accepted after its proactive window had none; counted as
                # close_at_end counts, or the drain report would not know it)
                if self.drain.drain_at_end(now):
                    self.ctx.drain_stats.cx_closed_at_end += 1
                self.staged_close()

    def close_at_end(self) -> None:
        """The drain is over: the last notice now; the connection closes once it is idle."""
        if self.drain.drain_at_end(self.loop.time()):
            self.ctx.drain_stats.cx_closed_at_end += 1
        self.drain_tunnels(DrainedBy.END)
        self.final_notice()
        if not self.busy():
            self.staged_close()

    # -- what an exchange asks of its connection: the codec carries it out ----------------------
    # (The exchange holds its connection as this native class: its reads of ``closing`` or
    # ``loop`` and these calls are direct, not lookups by name through a protocol.)
    def answer(self, ex: Exchange, status: int, body: bytes,
               extra: tuple[tuple[bytes, bytes], ...]) -> None:
        """Admission refused ``ex`` (no route, health check, ...): send this answer with the
        ``extra`` fields (the exchange has booked it)."""
        raise NotImplementedError

    def going_away(self, ex: Exchange) -> None:
        """Past the drain time: tell the client to send ``ex`` elsewhere."""
        raise NotImplementedError

    def hold_request(self, ex: Exchange) -> None:
        """Stop reading ``ex``'s body for now (HTTP/2: its window already bounds it)."""
        raise NotImplementedError

    def resume_request(self, ex: Exchange) -> None:
        raise NotImplementedError

    def release_request(self, ex: Exchange, credit: int) -> None:
        """``credit`` flow-controlled request bytes were handed on (HTTP/2: WINDOW_UPDATE)."""
        raise NotImplementedError

    def send_informational(self, ex: Exchange, status: int, fields: Fields) -> None:
        raise NotImplementedError

    def send_head(self, ex: Exchange, status: int, fields: Fields, length: int | None) -> None:
        raise NotImplementedError

    def send_whole(self, ex: Exchange, status: int, data: bytes, end: int,
                   fields: Fields | None) -> bool:
        raise NotImplementedError

    def send_upgrade(self, ex: Exchange, fields: Fields, upgrade: bytes, rest: bytes) -> bool:
        raise NotImplementedError

    def send_body(self, ex: Exchange, data: bytes) -> None:
        raise NotImplementedError

    def send_end(self, ex: Exchange, trailers: list[tuple[bytes, bytes]] | None) -> None:
        raise NotImplementedError

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        """A local error in place of the upstream's response (booked by the exchange)."""
        raise NotImplementedError

    def abort(self, ex: Exchange) -> None:
        """The upstream failed after the response started: the client can only see a reset."""
        raise NotImplementedError

    def cork(self) -> None:
        raise NotImplementedError

    def uncork(self) -> None:
        raise NotImplementedError

    def exchange_done(self, ex: Exchange) -> None:
        raise NotImplementedError

    # -- closing ------------------------------------------------------------------------------
    def staged_close(self) -> None:
        """Flush, shut down writing, keep reading briefly, then close (no last byte lost)."""
        if self.closing:
            return
        self.closing = True
        self.drain.close()
        t = self.transport
        if t is None or self.gone:
            return
        self.flush()  # also when corked: nothing is written after the FIN
        self.on_staged_close(t)
        if t.can_write_eof():
            self.eof_sent = True
            t.write_eof()
            if self.timer is not None:  # an earlier timer (a drain moment) must not end it early
                self.timer.cancel()
                self.timer = None
            self.arm(self.loop.time() + LINGER)
        else:
            t.close()

    def reset(self) -> None:
        """Abort with a TCP reset, not a FIN: a cut body must not look whole."""
        t = self.transport
        if t is None or self.gone or self.aborted:
            return
        self.aborted = True
        self.closing = True  # no staged close after this: a write_eof would turn it into a FIN
        abort_with_rst(t)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return
        self.gone = True
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.cx_stats.downstream_cx_active -= 1
        if self.unseen:
            self._heard()
        events = self.drain.listener.events
        if events:  # closed while its listener drains: ms since the (first) drain began
            ms = (self.loop.time() - events[0].start) * 1000.0
            self.cx_stats.downstream_cx_drain_time.record(ms)
        self.abandon_all()
        self.drain.closed()
        ctx = self.ctx
        ctx.connections.discard(self)
        ctx.on_connection_closed(self)
