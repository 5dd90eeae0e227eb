"""HTTP/2 downstream connection: the asyncio shell around the sans-IO ``H2Server``.

Each stream is one ``proxy.exchange.Exchange``, in the same ledger and stats as HTTP/1.1;
this connection writes what it decides as HTTP/2 frames (the ``DownstreamPort``).
Bodies stream both ways under flow control: request DATA is acknowledged (WINDOW_UPDATE) only
once it was handed to the upstream socket, and a stream whose response waits for the client's
window pauses its upstream.

Drain (docs/drain.md): the first response the policy drains, or the proactive moment, sends
GOAWAY(2^31-1, NO_ERROR) at once and the connection keeps serving; G later the final GOAWAY names
the highest stream processed, streams opened above it are refused (REFUSED_STREAM: safe to
retry), and the connection closes (staged) once its last stream has ended.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any, Protocol, cast

from lameduck.drain import ConnectionDrain, DrainedBy
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.http2.connection import (
    ConnectionError as H2ConnectionError,
)
from lameduck.http2.connection import (
    DataReceived,
    ErrorCode,
    H2Limits,
    H2Server,
    HeadersTooLarge,
    RequestReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from lameduck.http2.tunnel import StreamSide
from lameduck.proxy.downstream import STOP, Downstream, HttpConnectionContext
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.fields import trailer_fields
from lameduck.proxy.local import (
    local_answer,
)
from lameduck.proxy.message import HTTP2, RequestHead
from lameduck.stats import HttpStats
from lameduck.tunnel.relay import Pending, Relay, destination, open_destination
from lameduck.upstream.connector import Fields, UpstreamConn

if TYPE_CHECKING:

    from lameduck.stats import Http2Stats


class H2ListenerContext(HttpConnectionContext, Protocol):
    """What an HTTP/2 connection needs from its listener (wired in ``listeners``)."""

    h2stats: Http2Stats
    h2_limits: H2Limits


log = logging.getLogger("lameduck.http2")

# A stream's response bytes held back by the client's flow-control window before its upstream is
# paused; and request bytes held for an upstream not attached yet (the window bounds them too).
OUTBOUND_HIGH = 256 * 1024


class H2Stream(Exchange):
    """An exchange with what only an HTTP/2 stream keeps: its request body's clock and the
    parts of a tunnel (a CONNECT or a WebSocket): this stream as the client side of its relay."""

    # Loop time of the stream's last request-body byte, or of its credit's return
    # (request_body_timeout; HTTP/1.1 keeps one per connection).
    body_at = 0.0

    def __init__(self, down: H2Downstream, method: bytes, sid: int) -> None:
        super().__init__(down, method, HTTP2, sid)
        # Set here, not as class defaults: mypyc leaves an Any-typed default undefined.
        self.side: Any = None  # a StreamSide (from the CONNECT, or the upstream's 101)
        self.relay: Any = None  # a Relay


class H2Downstream(Downstream):
    """One client connection speaking HTTP/2 (h2c prior knowledge, or TLS with ALPN h2)."""

    def __init__(self, ctx: H2ListenerContext, limits: H2Limits | None = None) -> None:
        super().__init__(ctx)
        self.stats: HttpStats = ctx.stats
        self.h2stats = ctx.h2stats
        self.h2 = H2Server(limits or ctx.h2_limits, self.loop.time())
        self.streams: dict[int, H2Stream] = {}
        self.corked = 0
        self.goaways = 0  # GOAWAY frames sent for the drain: 0, 1 (2^31-1), 2 (final)
        self.take_limits(ctx)
        self.log_on = ctx.access_log is not None
        self.rx_at = 0.0  # loop time of the last read: the DATA it carried is that recent
        # The head of the last whole HTTP/1.1 response (``send_whole``) and its fields.

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A connection that spoke HTTP/2 from its first byte (TLS with ALPN h2)."""
        self.adopt(transport, self.accepted(), b"")

    def adopt(self, transport: asyncio.BaseTransport, drain: ConnectionDrain,
              data: bytes, fresh: bool = True) -> None:
        """Take the connection over (from its first byte, or from the HTTP/1 protocol that saw
        the prior-knowledge preface, ``fresh`` False: its drain state, with its proactive
        moment, carries on, and it was counted as accepted there)."""
        ctx = self.ctx
        self.opened(transport, drain, fresh)
        st = self.stats
        st.downstream_cx_http2_total += 1
        st.downstream_cx_http2_active += 1
        self.h2.initiate()
        if drain.drained_by is not None:
            self.drain_notice()  # drained before it spoke HTTP/2
        if not ctx.process.ledger.accepting:
            self.final_notice()  # past T: no stream will be taken, say so before any is sent
        self.arm_drain()
        if data:
            self.data_received(data)
        else:
            self.kick()

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        h2 = self.h2
        self.rx_at = now = self.loop.time()
        events = h2.receive(data, now)
        self.corked += 1
        try:
            for ev in events:
                self._event(ev)
        finally:
            self.corked -= 1
        if h2.closed and not self.closing:
            self.kick()
            self.staged_close()
            return
        self.kick()

    def _event(self, ev: object) -> None:
        t = type(ev)
        if t is DataReceived:
            d = cast(DataReceived, ev)
            s = self.streams.get(d.stream_id)
            if s is None:
                self.h2.acknowledge_received_data(d.stream_id, d.flow_len)
                return
            self._request_data(s, d.data, d.flow_len, d.end_stream)
        elif t is RequestReceived:
            self.on_request(cast(RequestReceived, ev))
        elif t is TrailersReceived:
            tr = cast(TrailersReceived, ev)
            s = self.streams.get(tr.stream_id)
            if s is not None:
                s.request_complete(trailer_fields(tr.headers) or None)
        elif t is StreamReset:
            self.h2stats.rx_reset += 1
            s = self.streams.get(cast(StreamReset, ev).stream_id)
            if s is not None:
                self.stats.downstream_rq_rx_reset += 1
                self._detach(s)
                s.client_gone(stream_reset=True)
                self._settle(s, completed=False)
        elif t is WindowOpened:
            s = self.streams.get(cast(WindowOpened, ev).stream_id)
            if s is not None and not self.write_paused:
                self._room(s)
        elif t is HeadersTooLarge:
            self._too_large(cast(HeadersTooLarge, ev).stream_id)
        elif t is H2ConnectionError:
            self.stats.downstream_cx_protocol_error += 1
            if cast(H2ConnectionError, ev).code == ErrorCode.ENHANCE_YOUR_CALM:
                self.h2stats.flood += 1
            else:
                self.h2stats.rx_messaging_error += 1
            log.debug("HTTP/2 connection error: %s", ev)
        # GoAwayReceived: the client opens no more streams; those it has open finish.

    def eof_received(self) -> bool:
        return False

    def abandon_all(self) -> None:
        self.stats.downstream_cx_http2_active -= 1
        if self.streams:
            gone = list(self.streams.values())
            for s in gone:
                self._detach(s)
            self.clients_gone(gone)
            for s in gone:
                self._settle(s, completed=False)

    def busy(self) -> bool:
        return bool(self.streams)

    def pause_writing(self) -> None:
        self.writing_paused()
        for s in self.streams.values():
            if s.side is not None:
                s.side.pause_source()
            elif s.up is not None:
                s.up.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        h2 = self.h2
        for s in self.streams.values():
            if h2.outbound_buffered(s.sid) <= OUTBOUND_HIGH:
                self._room(s)

    def _room(self, s: H2Stream) -> None:
        """The client can take more of stream ``s``: its source (upstream, tunnel) goes on."""
        if s.side is not None:
            s.side.window_opened()
        elif s.up is not None:
            s.up.resume_reading()

    def kick(self) -> None:
        """Write what the HTTP/2 layer queued, unless corked (one write per read)."""
        if not self.corked:
            self.flush()

    def flush(self) -> None:
        if self.gone or (self.closing and self.eof_sent):
            return
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    # -- DownstreamPort: an exchange's decisions, in HTTP/2 ------------------------------------
    def _request_data(self, s: H2Stream, data: bytes, flow_len: int, end: bool) -> None:
        s.body_at = self.rx_at  # a field store: the timer is re-armed lazily (``timeouts``)
        if s.side is not None:
            if end:
                s.request_cut_short()  # the tunnel's data are no request body
            s.side.received(data, flow_len, end)
            return
        s.request_body(data, flow_len)
        if end:
            s.request_complete()

    def _detach(self, s: H2Stream, cut: bool = False) -> None:
        """``s`` ends without its upstream, and without its tunnel: that is booked with the
        bytes it relayed (``cut`` by the drain) and its relay let go of this stream."""
        side = s.side
        if side is not None:
            relay = s.relay
            s.side = None
            s.relay = None
            self.stats.downstream_cx_upgrades_active -= 1
            if relay is not None:
                s.tunnel_closed(cut, relay.rx, relay.tx)
            side.gone()
        s.detach()

    def answer(self, ex: Exchange, status: int, body: bytes,
               extra: tuple[tuple[bytes, bytes], ...]) -> None:
        self.respond(ex, status, body, extra)
        ex.finish()

    def going_away(self, ex: Exchange) -> None:
        """Past the drain time: REFUSED_STREAM tells the client it is safe to retry the stream
        elsewhere (RFC 9113 §8.7), and the final GOAWAY that this connection takes no more: a
        refusal alone would not stop a client from choosing it again (a connection opened
        just before T has had no response to drain it)."""
        ex.response_over()
        self.h2.unprocess(ex.sid)
        # The GOAWAY first: a client that reads the refusal first may retry on this very
        # connection before it reads the GOAWAY (a gRPC client retries a refused stream once).
        self.final_notice()
        self.reset_stream(cast(H2Stream, ex), ErrorCode.REFUSED_STREAM)

    def hold_request(self, ex: Exchange) -> None:
        pass  # not acknowledged until handed on: the stream's window holds the client

    def resume_request(self, ex: Exchange) -> None:
        self._body_clock(cast(H2Stream, ex))

    def release_request(self, ex: Exchange, credit: int) -> None:
        if ex.sid in self.streams:
            self.h2.acknowledge_received_data(ex.sid, credit)
            self._body_clock(cast(H2Stream, ex))
            self.kick()

    def _body_clock(self, ex: H2Stream) -> None:
        """Credit given back (or an upstream that takes more): while lameduck held it the
        client could not send, so request_body_timeout starts again from now."""
        if not ex.req_done:
            ex.body_at = now = self.loop.time()
            self.arm(now + self.body_timeout)  # no-op unless earlier than the timer's

    def send_informational(self, ex: Exchange, status: int, fields: Fields) -> None:
        if status != 100:  # 100 is hop-by-hop in effect (RFC 9110 §15.2.1)
            self.h2.send_headers(ex.sid, status, fields)  # it lower-cases the names

    def send_head(self, ex: Exchange, status: int, fields: Fields,
                  length: int | None) -> None:
        self.response_drains(ex)
        bodyless = ex.is_head or status == 204 or status == 304
        fields = ex.head_fields(fields)
        if self.alt_svc is not None:
            fields = [*fields, (b"alt-svc", self.alt_svc_value())]
        self.h2.send_headers(ex.sid, status, fields, end_stream=bodyless)
        if bodyless:
            ex.response_over()  # the upstream still ends its message; we are done here

    def send_whole(self, ex: Exchange, status: int, data: bytes, end: int,
                   fields: Fields | None) -> bool:
        """A complete plain HTTP/1.1 response in one piece (``http1.wire.whole_response``
        passed it: token names, no obs-fold, one Content-Length that the body matches, no
        hop-by-hop field left), as HEADERS and one DATA frame with END_STREAM: its fields as
        the HTTP/1.1 parser would have given them, without running it. A bodiless one (HEAD,
        204, 304) takes the parser's path. Reached when the HTTP/1.1 upstream offers whole
        responses to HTTP/2 requests (``H1Upstream.start`` decides which it scans for one)."""
        if ex.is_head or status == 204 or status == 304 or fields is None:
            return False
        self.corked += 1  # head and body leave in one write, as the parser's path corks them
        try:
            self.send_head(ex, status, fields, None)
            self.h2.send_data(ex.sid, data[end + 4:], end_stream=True)
        finally:
            self.corked -= 1
        return True

    def send_upgrade(self, ex: Exchange, fields: Fields, upgrade: bytes,
                     rest: bytes) -> bool:
        """The upstream accepted the WebSocket (101): 200 on the stream, then relay it."""
        up = ex.up
        if up is None:
            return False
        transport = up.take_over()
        if transport is None:
            return False
        assert ex.cluster is not None
        ex.cluster.stats.count_status(101)
        ex.tunnel_opened(200)  # RFC 8441 §5: the client gets 200 for the upstream's 101
        self.response_drains(ex)  # it may drain the connection; the tunnel itself stays
        fields = [(n.lower(), v) for n, v in fields
                  if n.lower() in (b"sec-websocket-protocol", b"sec-websocket-extensions")]
        deflate = any(n == b"sec-websocket-extensions" and b"permessage-deflate" in v.lower()
                      for n, v in fields)
        self.h2.send_headers(ex.sid, 200, fields)
        s = cast(H2Stream, ex)
        self._relay(s, self._tunnel(s), transport, TunnelKind.WEBSOCKET, up, deflate, rest)
        return True

    def send_body(self, ex: Exchange, data: bytes) -> None:
        if ex.resp_done:
            return
        held = self.h2.send_data(ex.sid, data)
        up = ex.up
        if up is not None and held > OUTBOUND_HIGH:
            up.pause_reading()  # resumed on WindowOpened

    def send_end(self, ex: Exchange, trailers: list[tuple[bytes, bytes]] | None) -> None:
        if not ex.resp_done:
            if trailers:
                self.h2.send_trailers(ex.sid, trailers)  # they end the stream
            else:
                self.h2.send_data(ex.sid, b"", end_stream=True)

    def send_local(self, ex: Exchange, status: int, body: bytes,
                   extra: tuple[tuple[bytes, bytes], ...]) -> None:
        self.respond(ex, status, body, extra)

    def abort(self, ex: Exchange) -> None:
        self.reset_stream(cast(H2Stream, ex), ErrorCode.INTERNAL_ERROR)

    def cork(self) -> None:
        self.corked += 1

    def uncork(self) -> None:
        self.corked -= 1
        if not self.corked:
            self.kick()

    def exchange_done(self, ex: Exchange) -> None:
        """The response of ``ex`` went out whole."""
        if ex.sid not in self.streams:
            return
        if not ex.req_done:
            # RFC 9113 §8.1: a complete response may end a request the client is still
            # sending; NO_ERROR tells it to stop without failing the response.
            self.h2.reset_stream(ex.sid, ErrorCode.NO_ERROR)
            ex.request_cut_short()
        self._settle(cast(H2Stream, ex), completed=True)
        self.kick()

    # -- requests ---------------------------------------------------------------------------
    def on_request(self, ev: RequestReceived) -> None:
        ctx = self.ctx
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http2_total += 1
        st.downstream_rq_active += 1
        sid = ev.stream_id
        s = H2Stream(self, ev.method, sid)
        s.head_received(self.rx_at, ev.path or b"", ev.headers, ev.authority, self.log_on)
        self.streams[sid] = s
        self.count_request()  # the last: GOAWAY now; the streams opened meanwhile go on
        if ev.end_stream:
            s.no_request_body()
        else:
            # a body follows: request_body_timeout runs from the head (as nginx's from the
            # body's first read); the connection's one timer, moved earlier if need be
            s.body_at = now = self.rx_at
            self.arm(now + self.body_timeout)
        method = ev.method
        if method == b"CONNECT":
            if ev.protocol != b"websocket":
                self._connect(s, ev)
                return
            # RFC 8441: a WebSocket; to the HTTP/1.1 upstream it is a GET with an Upgrade
            # (its DATA are frames for the tunnel, no request body)
            head = RequestHead(b"GET", ev.authority, ev.path or b"/", ev.headers, HTTP2,
                               False, b"websocket")
        else:
            head = RequestHead(method, ev.authority, ev.path or b"/", ev.headers, HTTP2,
                               not ev.end_stream)
        if s.admit(ctx, head, self.client):
            s.start()

    # -- tunnels (CONNECT, WebSocket) ---------------------------------------------------------
    def _connect(self, s: H2Stream, ev: RequestReceived) -> None:
        """A CONNECT stream: relayed to its destination if the listener allows it (else 403)."""
        ctx = self.ctx
        if ev.protocol is not None:
            # an extended CONNECT for a protocol other than websocket
            s.answer_local(501, b"protocol not supported\n")
            return
        if not s.admit_connect(ctx, ev.authority):
            return
        assert s.connect is not None
        host, port = s.connect
        side = self._tunnel(s)
        if ev.end_stream:
            side.received(b"", 0, True)  # nothing to send: FIN once connected
        open_destination(self.loop, host, port, ctx.connect_timeout).add_done_callback(
            lambda fut: self._destination(s, side, fut))

    def _destination(self, s: H2Stream, side: StreamSide,
                     fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
        """A CONNECT's destination answered (or not): 200 and the relay, or a 503."""
        wanted = s.side is side  # not reset, cut or lost meanwhile
        got = destination(fut, wanted)
        if not wanted:
            return
        if got is None:
            self._detach(s)
            body = b"connect error\n"
            s.tunnel_refused(503, body)
            self.respond(s, 503, body)
            s.finish()
            self.kick()
            return
        t, pending = got
        s.tunnel_opened(200)
        self.response_drains(s)  # it may drain the connection; the tunnel itself stays
        self.h2.send_headers(s.sid, 200, [])  # before any byte of the destination's
        relay = self._relay(s, side, t, TunnelKind.OPAQUE, None, False, pending.buf)
        if pending.eof:
            relay.eof(Flow.TO_CLIENT)  # the destination half-closed before the relay began

    def _tunnel(self, s: H2Stream) -> StreamSide:
        """Stream ``s`` becomes a tunnel: its DATA are no request body but bytes to relay."""
        self.stats.downstream_cx_upgrades_total += 1
        self.stats.downstream_cx_upgrades_active += 1
        side = StreamSide(self, s)
        s.side = side
        return side

    def _relay(self, s: H2Stream, side: StreamSide, t: asyncio.Transport, kind: TunnelKind,
               up: UpstreamConn | None, deflate: bool, to_client: bytes) -> Relay:
        """Relay stream ``s`` and ``t`` (the upstream that switched protocols, ``up``, or a
        CONNECT's destination), its 200 sent; ``to_client``: what ``t`` sent before."""
        relay = Relay(self.loop, side, t, kind, self.ctx.drain.grace,
                      lambda cut: self._relay_ended(s, up, cut), rsv1_allowed=deflate,
                      http2=True)
        s.relay = relay
        self.start_relay(relay, b"", to_client)
        self.kick()
        return relay

    def _relay_ended(self, s: H2Stream, up: UpstreamConn | None, cut: bool) -> None:
        """Both sides of a stream's relay are closed: settle the books (unless the stream went
        first, reset by the client or its connection lost: booked then). A stream we reset
        (cut by the drain, a CONNECT's destination broken) is no completed request."""
        relay = s.relay
        reset = relay is not None and s.side.reset
        if relay is not None:
            self._detach(s, cut)
        if up is not None:
            up.tunnel_closed()  # the pool's and the cluster's bookkeeping
        if relay is not None:
            s.settled_here()
            s.request_cut_short()
            self._settle(s, completed=not reset)
            self.kick()

    def _too_large(self, sid: int) -> None:
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http2_total += 1
        st.downstream_rq_active += 1
        s = H2Stream(self, b"", sid)
        s.request_cut_short()  # H2Server drops the body and resets the stream after our answer
        self.streams[sid] = s
        s.answer_local(431, b"request header fields too large\n")

    def respond(self, s: Exchange, status: int, body: bytes,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Send a local answer the exchange booked, on stream ``s`` (it drains the connection
        like any response)."""
        self.response_drains(s)
        s.response_begun()
        code, fields, data = local_answer(status, body, extra, s.grpc, s.is_head)
        self.h2.send_headers(s.sid, code, fields, end_stream=data is None)
        if data is not None:
            self.h2.send_data(s.sid, data, end_stream=True)

    def stream_trailers(self, s: Exchange, fields: Fields) -> None:
        self.h2.send_trailers(s.sid, fields)

    def cancel_stream(self, s: Exchange) -> None:
        self.reset_stream(s, ErrorCode.CANCEL)  # type: ignore[arg-type]  # one of ours

    def reset_stream(self, s: H2Stream, code: ErrorCode) -> None:
        self.h2stats.tx_reset += 1
        self.h2.reset_stream(s.sid, code)
        s.response_over()
        self._detach(s)
        self._settle(s, completed=False)
        self.kick()

    def _settle(self, s: H2Stream, completed: bool) -> None:
        if self.streams.pop(s.sid, None) is None:
            return
        if s.unacked:
            # Request bytes read but never handed upstream (answered, reset or failed before
            # an upstream took them): the connection window gets them back all the same.
            self.h2.acknowledge_received_data(s.sid, s.take_unacked())
        s.settle(completed)
        if not self.streams:
            self.on_idle(self.loop.time())

    # -- drain --------------------------------------------------------------------------------
    def drain_notice(self) -> None:
        """GOAWAY(2^31-1, NO_ERROR): go elsewhere, streams in flight carry on (RFC 9113 §6.8)."""
        if self.goaways == 0 and not self.h2.closed:
            self.goaways = 1
            self.h2stats.goaway_sent += 1
            self.h2.start_drain()
            self.kick()

    def final_notice(self) -> None:
        """The final GOAWAY: streams above the last one processed are refused."""
        self.drain_notice()
        if self.goaways == 1 and not self.h2.closed:
            self.goaways = 2
            self.final_sent = True
            self.h2stats.goaway_sent += 1
            self.h2.final_goaway()
            self.kick()

    def drain_tunnels(self, by: DrainedBy) -> None:
        for s in list(self.streams.values()):
            if s.relay is not None:
                # by its own rules: a WebSocket's close handshake, a CONNECT reset G later
                s.relay.drain_by(by)
            elif s.side is not None and by is DrainedBy.END:
                self.reset_stream(s, ErrorCode.CANCEL)  # a CONNECT still connecting

    def cut(self) -> None:
        """The shutdown deadline, as ``Exchange.deadline_cut`` decides it for each stream on
        the books, in frames; then the final GOAWAY."""
        for s in list(self.streams.values()):
            if s.relay is not None:
                s.relay.drain_by(DrainedBy.END)  # reset; counted when both sides are gone
                continue
            if not s.admitted:
                continue
            self._detach(s)  # (a CONNECT's destination socket too)
            self.cut_stream(s)
        self.final_notice()
        self.kick()
        if not self.streams:
            self.staged_close()

    # -- timers -----------------------------------------------------------------------------------
    def timeouts(self, now: float) -> float:
        if self.streams:
            return self._body_timeouts(now)
        return self.idle_timeouts(now)

    def idle_close(self) -> None:
        self.h2.close(ErrorCode.NO_ERROR)  # GOAWAY(NO_ERROR) before the close (RFC 9113 §6.8)
        self.staged_close()

    def _body_timeouts(self, now: float) -> float:
        """request_body_timeout per stream (nginx ``client_body_timeout``): the next expiry
        among streams whose body is still coming, or ``STOP`` if the connection closed.
        Streams lameduck holds back (credit not returned, an upstream that takes no more) and
        tunnels (their DATA are no request body) are not the client's silence: skipped."""
        timeout = self.body_timeout
        if timeout == math.inf:
            return math.inf
        at = math.inf
        expired: list[H2Stream] | None = None
        for s in self.streams.values():
            if (s.req_done or not s.has_body or s.unacked or s.up_paused or s.held
                    or s.side is not None):
                continue
            end = s.body_at + timeout
            if now >= end:
                if expired is None:
                    expired = []
                expired.append(s)
            elif end < at:
                at = end
        if expired is not None:
            for s in expired:
                self._body_timeout(s)
            self.kick()
            if self.closing:
                return STOP  # its last stream ended a drained connection: the close is staged
        return at

    def _body_timeout(self, s: H2Stream) -> None:
        """request_body_timeout on ``s``, as ``Exchange.body_timed_out`` decides it: its 408
        (then ``exchange_done``'s RST_STREAM(NO_ERROR): a server may answer before the request
        ends and tell the client to stop sending, RFC 9113 §8.1), or RST_STREAM(CANCEL). The
        connection's other streams go on."""
        if s.body_timed_out():
            self.reset_stream(s, ErrorCode.CANCEL)
