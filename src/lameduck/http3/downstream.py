"""HTTP/3 downstream connection: the asyncio shell around one sans-IO ``H3Server``.

Each request stream is one ``proxy.exchange.Exchange``, in the same ledger, stats and access
log as HTTP/1.1 and HTTP/2; this connection writes what the exchange decides as HTTP/3
frames (the ``DownstreamPort``). Its datagrams come from the listener's UDP socket
(``listeners/quic.py`` routes them here by connection id) and leave through it.

Drain (docs/http3.md): the connection drain manager (``proxy.downstream.Downstream``) decides,
as for HTTP/2; this says it in HTTP/3. The first notice is GOAWAY(2^62-4) with no more streams
granted, the final one G later is GOAWAY(the first stream not processed), streams above it are
rejected (H3_REQUEST_REJECTED: safe to retry, RFC 9114 §4.1.1), an idle drained connection
ends with CONNECTION_CLOSE(H3_NO_ERROR) once the client has acknowledged what it was sent
(``quic_close``), and the deadline resets what is still open.

What a QUIC connection has no use for: the TCP close's FIN and reads after it (QUIC's own
CONNECTION_CLOSE ends it, RFC 9000 §10.2), tunnels (no extended CONNECT is offered,
RFC 9220; a CONNECT is answered 501), and flow-control credit handed back by hand (aioquic
raises the client's windows as data arrive; a request body its upstream does not take has
its stream's window frozen, ``H3Server.hold``, so the client waits as an HTTP/2 one does).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from lameduck.drain import DrainedBy
from lameduck.http3.codec import (
    H3_REQUEST_CANCELLED,
    H3_REQUEST_REJECTED,
    BodyReceived,
    ConnectionClosed,
    ConnectionIdIssued,
    ConnectionIdRetired,
    H3Server,
    HeadersTooLarge,
    RequestReceived,
    StreamRefused,
    StreamReset,
    TrailersReceived,
)
from lameduck.proxy.downstream import LINGER, Downstream
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.fields import trailer_fields
from lameduck.proxy.local import (
    local_answer,
)
from lameduck.proxy.message import HTTP3
from lameduck.upstream.connector import Fields

if TYPE_CHECKING:
    from aioquic.quic.connection import NetworkAddress

log = logging.getLogger("lameduck.http3")

# A stream's response bytes waiting in QUIC's send buffer (the client's windows, congestion)
# before its upstream is paused; resumed once below it.
OUTBOUND_HIGH = 256 * 1024


class QuicEndpointPort(Protocol):
    """What a connection needs from the UDP socket it lives on (``listeners.quic``)."""

    def sendto(self, data: bytes, addr: NetworkAddress) -> None: ...
    def cid_issued(self, cid: bytes, conn: H3Downstream) -> None: ...
    def cid_retired(self, cid: bytes) -> None: ...
    def forget(self, conn: H3Downstream) -> None: ...


class QuicTransport:
    """The connection as ``proxy.downstream.Downstream`` sees a transport: its peer, and a
    close that is QUIC's CONNECTION_CLOSE(H3_NO_ERROR) (RFC 9114 §5.2); there is no socket
    of its own to reset or to shut down for writing."""

    __slots__ = ("conn", "peer")

    def __init__(self, conn: H3Downstream, peer: NetworkAddress) -> None:
        self.conn = conn
        self.peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        """Stream data the client has not acknowledged: the exit flush waits for it."""
        h3 = self.conn.h3
        return 0 if h3.closing else h3.unacked()

    def is_closing(self) -> bool:
        return self.conn.h3.closing or self.conn.close_by is not None

    def close(self) -> None:
        self.conn.quic_close()

    def abort(self) -> None:
        self.conn.quic_close(now=True)

    def write(self, data: bytes) -> None:  # pragma: no cover - HTTP/3 writes datagrams
        raise RuntimeError("an HTTP/3 connection writes datagrams (flush)")


# A request stream is a plain ``Exchange`` (version HTTP3, its stream id as ``sid``): the
# exchange is compiled (hot.txt) and this module is not, and an interpreted class cannot
# subclass a compiled one. What HTTP/2 keeps on its stream subclass (the body's clock, the
# paused source) this connection keeps by stream id.


class H3Downstream(Downstream):
    """One client connection speaking HTTP/3 over QUIC."""

    def __init__(self, ctx: Any, endpoint: QuicEndpointPort, h3: H3Server,
                 peer: NetworkAddress) -> None:
        super().__init__(ctx)
        self.alt_svc = None  # Alt-Svc advertises HTTP/3 on TCP, not over HTTP/3 itself
        self.stats = ctx.stats
        self.endpoint = endpoint
        self.h3 = h3
        self.peer = peer
        self.streams: dict[int, Exchange] = {}
        self.corked = 0
        self.take_limits(ctx)
        self.log_on = ctx.access_log is not None
        self.rx_at = 0.0
        self.quic_timer: asyncio.TimerHandle | None = None
        self.quic_timer_at = 0.0
        self.flush_soon = False  # a flush is scheduled for the end of this pass of the loop
        self.cids: set[bytes] = set()  # its connection ids the endpoint routes by
        self.body_at: dict[int, float] = {}  # loop time of a stream's last body byte
        self.paused: set[int] = set()  # streams whose upstream waits for QUIC's send buffer
        self.close_by: float | None = None  # a close waits for ACKs until then (``quic_close``)
        self.close_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The first datagram of a new connection was accepted: on the listener's books."""
        drain = self.accepted()
        self.opened(QuicTransport(self, self.peer), drain)  # type: ignore[arg-type]
        st = self.stats
        st.downstream_cx_http3_total += 1
        st.downstream_cx_http3_active += 1
        if drain.drained_by is not None:
            self.drain_notice()
        if not self.ctx.process.ledger.accepting:
            self.final_notice()
        self.arm_drain()

    # -- datagrams and QUIC's timer ------------------------------------------------------------
    def datagram_received(self, data: bytes, addr: NetworkAddress) -> None:
        if self.gone:
            return
        self.rx_at = now = self.loop.time()
        self._run(self.h3.receive_datagram(data, addr, now))

    def _on_quic_timer(self) -> None:
        self.quic_timer = None
        if not self.gone:
            self._run(self.h3.handle_timer(self.loop.time()))

    def _run(self, events: list[Any]) -> None:
        self.corked += 1
        try:
            for ev in events:
                self._event(ev)
        finally:
            self.corked -= 1
        if self.paused:
            self._resume_sources()
        self.kick()

    def kick(self) -> None:
        """Send what is queued once this pass of the loop is over: the datagrams read in one
        pass (a read burst) and the responses that ended in it leave in the fewest packets,
        with one ACK for them all (RFC 9000 §13.2.1 lets a receiver acknowledge several
        packets at once), instead of a flush per datagram and per response."""
        if not self.corked and not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self.flush_soon = False
        self.flush()

    def flush(self) -> None:
        """Send what QUIC queued, and follow its one timer (loss recovery, ACK delay, idle):
        re-armed only when it must fire sooner (fired early, aioquic's ``handle_timer`` does
        nothing that is not due, and the timer is armed anew from there)."""
        if self.gone:
            return
        h3 = self.h3
        send = self.endpoint.sendto
        if self.close_by is not None and (not h3.unacked() or self.loop.time() >= self.close_by):
            self._close_now()
        for data, addr in h3.datagrams_to_send(self.loop.time()):
            send(data, addr)
        at = h3.get_timer()
        if at is None:
            if self.quic_timer is not None:
                self.quic_timer.cancel()
                self.quic_timer = None
        elif self.quic_timer is None or at < self.quic_timer_at:
            if self.quic_timer is not None:
                self.quic_timer.cancel()
            self.quic_timer_at = at
            self.quic_timer = self.loop.call_at(at, self._on_quic_timer)

    def quic_close(self, now: bool = False) -> None:
        """CONNECTION_CLOSE(H3_NO_ERROR) once the client has acknowledged every byte sent, or
        LINGER (as a staged TCP close's) after this at the latest: once a close is queued
        aioquic retransmits no stream data, so the end of a last response lost on the way
        would never arrive (RFC 9000 §10.2). ``now``: no waiting (an abort). The connection
        ends when QUIC says it has."""
        h3 = self.h3
        if h3.closing:
            return
        if now or not h3.unacked():
            self._close_now()
        elif self.close_by is None:
            self.close_by = at = self.loop.time() + LINGER
            self.close_timer = self.loop.call_at(at, self.flush)
        self.flush()

    def _close_now(self) -> None:
        self.close_by = None
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        self.h3.close()

    def _event(self, ev: object) -> None:
        t = type(ev)
        if t is BodyReceived:
            b: BodyReceived = ev  # type: ignore[assignment]
            s = self.streams.get(b.stream_id)
            if s is not None:
                self.body_at[s.sid] = self.rx_at
                if b.data:
                    s.request_body(b.data, 0)
                if b.end_stream:
                    s.request_complete()
        elif t is RequestReceived:
            self.on_request(ev)  # type: ignore[arg-type]
        elif t is TrailersReceived:
            tr: TrailersReceived = ev  # type: ignore[assignment]
            s = self.streams.get(tr.stream_id)
            if s is not None:
                s.request_complete(trailer_fields(tr.fields) or None)
        elif t is StreamReset or t is StreamRefused:
            sid: int = ev.stream_id  # type: ignore[attr-defined]
            s = self.streams.get(sid)
            if t is StreamReset:
                self.ctx.h3stats.rx_reset += 1
            elif ev.code == H3_REQUEST_REJECTED:  # type: ignore[attr-defined]
                return  # above the final GOAWAY: never ours
            if s is not None:
                self.stats.downstream_rq_rx_reset += 1
                s.detach()
                s.client_gone(stream_reset=True)
                self._settle(s, completed=False)
        elif t is HeadersTooLarge:
            self._too_large(ev.stream_id)  # type: ignore[attr-defined]
        elif t is ConnectionIdIssued:
            self.endpoint.cid_issued(ev.cid, self)  # type: ignore[attr-defined]
        elif t is ConnectionIdRetired:
            self.endpoint.cid_retired(ev.cid)  # type: ignore[attr-defined]
        elif t is ConnectionClosed:
            self.connection_lost(None)

    # -- the connection's end ----------------------------------------------------------------
    def connection_lost(self, exc: Exception | None) -> None:
        if self.quic_timer is not None:
            self.quic_timer.cancel()
            self.quic_timer = None
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        self.close_by = None
        was_gone = self.gone
        super().connection_lost(exc)
        if not was_gone:
            self.endpoint.forget(self)

    def abandon_all(self) -> None:
        self.stats.downstream_cx_http3_active -= 1
        if self.streams:
            gone: list[Exchange] = list(self.streams.values())
            for s in gone:
                s.detach()
            self.clients_gone(gone)
            for s in gone:
                self._settle(s, completed=False)

    def busy(self) -> bool:
        return bool(self.streams)

    # -- DownstreamPort: an exchange's decisions, in HTTP/3 ------------------------------------
    def answer(self, ex: Exchange, status: int, body: bytes,
               extra: tuple[tuple[bytes, bytes], ...]) -> None:
        self.respond(ex, status, body, extra)
        ex.finish()

    def going_away(self, ex: Exchange) -> None:
        """Past the drain time: the final GOAWAY (this connection takes no more) and the stream
        rejected, H3_REQUEST_REJECTED: not processed, safe to retry (RFC 9114 §4.1.1)."""
        ex.response_over()
        self.h3.unprocess(ex.sid)
        # the GOAWAY first, as on HTTP/2: a client that reads the rejection first could try
        # again on this very connection
        self.final_notice()
        self.reset_stream(ex, H3_REQUEST_REJECTED)

    def hold_request(self, ex: Exchange) -> None:
        """Its upstream takes no more for now (or none is attached and the exchange holds
        enough): the stream's window stays where it is, so the client waits."""
        self.h3.hold(ex.sid)

    def resume_request(self, ex: Exchange) -> None:
        self.h3.release(ex.sid)
        self.body_at[ex.sid] = self.loop.time()  # the client could not send meanwhile
        self.kick()

    def release_request(self, ex: Exchange, credit: int) -> None:
        pass  # no credit is taken by hand (aioquic raises the windows as it reads)

    def send_informational(self, ex: Exchange, status: int, fields: Fields) -> None:
        if status != 100 and status != 101:  # 100 is hop-by-hop in effect; 101 has no place
            self.h3.send_head(ex.sid, status, fields)
            self.kick()

    def send_head(self, ex: Exchange, status: int, fields: Fields,
                  length: int | None) -> None:
        self.response_drains(ex)
        bodyless = ex.is_head or status == 204 or status == 304
        self.h3.send_head(ex.sid, status, ex.head_fields(fields), end_stream=bodyless)
        if bodyless:
            ex.response_over()
        self.kick()

    def send_whole(self, ex: Exchange, status: int, data: bytes, end: int,
                   fields: Fields | None) -> bool:
        return False  # the parser's path: head, body, end

    def send_upgrade(self, ex: Exchange, fields: Fields, upgrade: bytes,
                     rest: bytes) -> bool:
        return False  # no WebSocket over HTTP/3 (no extended CONNECT offered)

    def send_body(self, ex: Exchange, data: bytes) -> None:
        if ex.resp_done:
            return
        self.h3.send_body(ex.sid, data)
        self.kick()
        up = ex.up
        if up is not None and ex.sid not in self.paused \
                and self.h3.buffered(ex.sid) > OUTBOUND_HIGH:
            self.paused.add(ex.sid)
            up.pause_reading()

    def _resume_sources(self) -> None:
        """ACKs arrived: streams whose send buffer went down take their upstream's bytes
        again."""
        for sid in list(self.paused):
            if self.h3.buffered(sid) <= OUTBOUND_HIGH:
                self.paused.discard(sid)
                s = self.streams.get(sid)
                if s is not None and s.up is not None:
                    s.up.resume_reading()

    def send_end(self, ex: Exchange, trailers: list[tuple[bytes, bytes]] | None) -> None:
        if not ex.resp_done:
            if trailers:
                self.h3.send_trailers(ex.sid, trailers)
            else:
                self.h3.send_body(ex.sid, b"", end_stream=True)
            self.kick()

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        self.respond(ex, status, body, extra)

    def abort(self, ex: Exchange) -> None:
        self.reset_stream(ex, H3_REQUEST_CANCELLED)

    def cork(self) -> None:
        self.corked += 1

    def uncork(self) -> None:
        self.corked -= 1
        if not self.corked:
            self.kick()

    def exchange_done(self, ex: Exchange) -> None:
        """The response of ``ex`` went out whole (the codec stops a request still coming,
        STOP_SENDING(H3_NO_ERROR), RFC 9114 §4.1.1)."""
        if ex.sid not in self.streams:
            return
        if not ex.req_done:
            ex.request_cut_short()
        self._settle(ex, completed=True)
        self.kick()

    # -- requests ---------------------------------------------------------------------------
    def on_request(self, ev: RequestReceived) -> None:
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http3_total += 1
        st.downstream_rq_active += 1
        sid = ev.stream_id
        head = ev.head
        s = Exchange(self, head.method, HTTP3, sid)
        s.head_received(self.rx_at, head.path, head.fields, head.authority, self.log_on)
        self.streams[sid] = s
        self.count_request()
        if ev.end_stream:
            s.no_request_body()
        else:
            self.body_at[sid] = now = self.rx_at
            self.arm(now + self.body_timeout)
        if head.method == b"CONNECT":
            s.answer_local(501, b"CONNECT is not served over HTTP/3\n")
            return
        if s.admit(self.ctx, head, self.client):
            s.start()

    def _too_large(self, sid: int) -> None:
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http3_total += 1
        st.downstream_rq_active += 1
        s = Exchange(self, b"", HTTP3, sid)
        s.request_cut_short()
        self.streams[sid] = s
        s.answer_local(431, b"request header fields too large\n")

    def respond(self, s: Exchange, status: int, body: bytes,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Send a local answer the exchange booked (it drains the connection like any
        response)."""
        self.response_drains(s)
        s.response_begun()
        code, fields, data = local_answer(status, body, extra, s.grpc, s.is_head)
        self.h3.send_head(s.sid, code, fields, end_stream=data is None)
        if data is not None:
            self.h3.send_body(s.sid, data, end_stream=True)
        self.kick()

    def stream_trailers(self, s: Exchange, fields: Fields) -> None:
        self.h3.send_trailers(s.sid, fields)

    def cancel_stream(self, s: Exchange) -> None:
        self.reset_stream(s, H3_REQUEST_CANCELLED)

    def reset_stream(self, s: Exchange, code: int) -> None:
        self.h3.cancel(s.sid, code)
        s.response_over()
        s.detach()
        self._settle(s, completed=False)
        self.kick()

    def _settle(self, s: Exchange, completed: bool) -> None:
        if self.streams.pop(s.sid, None) is None:
            return
        self.paused.discard(s.sid)
        self.body_at.pop(s.sid, None)
        s.settle(completed)
        if not self.streams:
            self.on_idle(self.loop.time())

    # -- drain --------------------------------------------------------------------------------
    def drain_notice(self) -> None:
        """GOAWAY(2^62-4) and no more streams: go elsewhere (RFC 9114 §5.2). The codec sends
        each GOAWAY once (and none once closing)."""
        self.h3.drain_start()
        self.kick()

    def final_notice(self) -> None:
        """The final GOAWAY: streams from the first one not processed are rejected."""
        self.final_sent = True
        self.h3.drain_final()
        self.kick()

    def drain_tunnels(self, by: DrainedBy) -> None:
        pass  # no tunnels over HTTP/3

    def cut(self) -> None:
        """The shutdown deadline, as ``Exchange.deadline_cut`` decides it for each stream on
        the books; then the final GOAWAY and, once nothing is open, CONNECTION_CLOSE."""
        for s in list(self.streams.values()):
            if not s.admitted:
                continue
            s.detach()
            self.cut_stream(s)
        self.final_notice()
        self.kick()
        if not self.streams:
            self.staged_close()

    # -- timers -------------------------------------------------------------------------------
    def timeouts(self, now: float) -> float:
        if self.streams:
            return self._body_timeouts(now)
        return self.idle_timeouts(now)

    def _body_timeouts(self, now: float) -> float:
        """request_body_timeout per stream, as HTTP/2's: a 408, or a reset once the response
        began (``Exchange.body_timed_out``)."""
        timeout = self.body_timeout
        at = float("inf")
        if timeout == at:
            return at
        for s in list(self.streams.values()):
            if s.req_done or not s.has_body or s.up_paused or s.held:
                continue
            end = self.body_at.get(s.sid, 0.0) + timeout
            if now >= end:
                if s.body_timed_out():
                    self.reset_stream(s, H3_REQUEST_CANCELLED)
            elif end < at:
                at = end
        self.kick()
        return at
