"""HTTP/2 downstream connection: the asyncio shell around the sans-IO ``H2Server``.

Each stream is one request in the same ledger and stats as HTTP/1, proxied to the HTTP/1.1
upstream pools through an ``H2Stream`` (the ``ExchangeSink`` an ``H1Upstream`` reports to).
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
import base64
import logging
import math
import os
import socket
from typing import TYPE_CHECKING, Any, Protocol, cast

from lameduck.drain import ConnAction, ConnectionDrain, DrainedBy
from lameduck.drain.endpoint import Layer
from lameduck.drain.retry import IDEMPOTENT_METHODS, REPLAY_SAFE_FIELDS, may_retry
from lameduck.drain.tunnel import TunnelKind
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
from lameduck.http2.tunnel import H2ConnectTunnel, StreamSide
from lameduck.proxy.fields import (
    HOP_BY_HOP,
    accepts_trailers,
    cookie_value,
    trailer_fields,
    valid_authority,
)
from lameduck.proxy.local import (
    GRPC_UNAVAILABLE,
    RETRY_AFTER,
    grpc_fields,
    grpc_local_reply,
    is_grpc,
)
from lameduck.proxy.replay import REPLAY_LIMIT
from lameduck.tunnel.relay import Relay, abort_with_rst
from lameduck.upstream.connector import UpstreamConn, UpstreamError

if TYPE_CHECKING:
    from collections.abc import Callable

    from lameduck.drain import ListenerDrain, ProcessDrain
    from lameduck.stats import ClusterStats, DrainStats, Http2Stats, HttpStats
    from lameduck.upstream.cluster import Cluster
    from lameduck.upstream.pool import Endpoint
    from lameduck.upstream.router import Router


class H2ListenerContext(Protocol):
    """What an HTTP/2 connection needs from its listener (wired in ``listeners``)."""

    loop: asyncio.AbstractEventLoop
    stats: HttpStats
    h2stats: Http2Stats
    h2_limits: H2Limits
    drain_stats: DrainStats
    drain: ListenerDrain
    process: ProcessDrain
    router: Router
    rng: Callable[[], float]
    connections: set[Any]
    health_check_path: bytes | None
    idle_timeout: float
    scheme: bytes
    connect_timeout: float

    def connect_target(self, authority: bytes | None) -> tuple[str, int] | None: ...
    def connect(self, cluster: Cluster, endpoint: Endpoint) -> asyncio.Future[UpstreamConn]: ...
    def on_connection_closed(self, conn: Any) -> None: ...
    def on_request_done(self) -> None: ...

log = logging.getLogger("lameduck.http2")

LINGER = 2.0  # seconds a staged close keeps reading before it closes
# A stream's response bytes held back by the client's flow-control window before its upstream is
# paused; and request bytes held for an upstream not attached yet (the window bounds them too).
OUTBOUND_HIGH = 256 * 1024
# Request fields not forwarded to an HTTP/1.1 upstream: connection-specific ones (a conforming
# client sends none; RFC 9113 §8.2.2), and those the proxy writes itself.
DROPPED = HOP_BY_HOP | {b"host", b"x-forwarded-proto", b"content-length"}
TEXT = b"text/plain; charset=utf-8"


def _local_headers(body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()) -> list[
        tuple[bytes, bytes]]:
    return [(b"content-type", TEXT), (b"content-length", b"%d" % len(body)), *extra]


class H2Stream:
    """One request stream, from HEADERS to the end of its response."""

    __slots__ = (
        "admitted",
        "body",
        "buffered",
        "chunked_req",
        "cluster",
        "conn",
        "cstats",
        "endpoint",
        "grpc",
        "head",
        "is_head",
        "local",
        "method",
        "pkey",
        "relay",
        "replay",
        "replay_size",
        "req_done",
        "req_trailers",
        "resp_done",
        "resp_started",
        "retried",
        "retryable",
        "retrying",
        "reused",
        "route_timeout",
        "set_cookie",
        "sid",
        "side",
        "status",
        "tries",
        "tunnel",
        "unacked",
        "up",
        "up_write_paused",
        "ws",
    )

    def __init__(self, conn: H2Downstream, sid: int, method: bytes) -> None:
        self.conn = conn
        self.sid = sid
        self.method = method
        self.is_head = method == b"HEAD"
        self.admitted = False
        self.local = False  # answered here, not by an upstream
        self.cluster: Cluster | None = None
        self.cstats: ClusterStats | None = None
        self.endpoint: Endpoint | None = None
        self.route_timeout = 0.0
        self.head = b""
        self.body = False  # the request has a body (DATA frames follow)
        self.chunked_req = False
        self.buffered: list[bytes] | None = None  # request bytes before an upstream is attached
        # Request bytes sent on an HTTP/2 upstream stream, kept (bounded) in case the upstream
        # refuses it unprocessed; None when not kept.
        self.replay: list[bytes] | None = None
        self.replay_size = 0
        self.unacked = 0  # flow-controlled bytes received, not yet given back to the client
        self.up: UpstreamConn | None = None
        self.up_write_paused = False
        self.req_done = False
        self.req_trailers: list[tuple[bytes, bytes]] | None = None  # the request's trailers
        self.resp_started = False
        self.resp_done = False
        self.status = 0
        self.reused = False
        self.retryable = False
        self.retried = False  # sent again once on a fresh connection (stale pooled, refused)
        self.tries = 0  # retries on other endpoints (retry_policy.num_retries)
        self.retrying = False  # counted in the cluster's retries in flight (the retry budget)
        self.pkey: str | None = None  # persistence key: source IP, or the cookie's record key
        self.set_cookie: bytes | None = None  # a persistence cookie's value to set
        self.tunnel: H2ConnectTunnel | None = None  # a CONNECT stream's destination socket
        self.ws = False  # an extended CONNECT for a WebSocket (RFC 8441)
        self.grpc = False  # a gRPC call: local answers are gRPC statuses
        self.side: StreamSide | None = None  # this stream as a relay side, after the 101
        self.relay: Relay | None = None

    # -- request side -----------------------------------------------------------------------
    def request_data(self, data: bytes, flow_len: int, end: bool) -> None:
        conn = self.conn
        if self.side is not None:
            if end:
                self.req_done = True
            self.side.received(data, flow_len, end)
            return
        if self.tunnel is not None:
            if end:
                self.req_done = True
            self.tunnel.from_client(data, flow_len, end)
            return
        if self.local or self.resp_done:
            conn.h2.acknowledge_received_data(self.sid, flow_len)  # read and dropped
            if end:
                self.req_done = True
            return
        piece = data
        up = self.up
        if up is not None and up.sink is self:
            if piece:
                if self.replay is not None:
                    self._keep(piece)
                up.write(piece)
            if self.up_write_paused:
                self.unacked += flow_len
            else:
                conn.h2.acknowledge_received_data(self.sid, flow_len)
        else:
            if piece:
                if self.buffered is None:
                    self.buffered = []
                self.buffered.append(piece)
            self.unacked += flow_len  # acknowledged once written upstream
        if end:
            self.request_complete()

    def request_complete(self) -> None:
        self.req_done = True
        if self.local or self.resp_done:
            return
        up = self.up
        if up is not None and up.sink is self:
            up.end(self.req_trailers)  # else ``attach`` ends it, after what was held

    # -- upstream ---------------------------------------------------------------------------
    def start(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        ep = cluster.pick() if cluster.persistence is None else self._sticky(cluster)
        if ep is None:
            cluster.stats.upstream_cx_none_healthy += 1
            self.local_error(503, b"no healthy upstream\n", RETRY_AFTER)
            return
        self.endpoint = ep
        conn = ep.acquire()
        if conn is not None:
            self.reused = True
            self.attach(conn)  # type: ignore[arg-type]
        else:
            self.reused = False
            self.conn.ctx.connect(cluster, ep).add_done_callback(self._connected)

    def _connected(self, fut: asyncio.Future[UpstreamConn]) -> None:
        if self.resp_done or self.conn.gone:
            if not fut.cancelled() and fut.exception() is None:
                fut.result().close()
            return
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self._never_sent()
            return
        self.attach(fut.result())

    def _sticky(self, cluster: Cluster) -> Endpoint | None:
        """The drain-stop persistence decision; a new record under a cookie sets the cookie."""
        key = self.pkey
        ep, now_key = cluster.pick_sticky(key, Layer.L7, self.conn.loop.time(),
                                           cluster.by_cookie)
        if now_key is not None and now_key != key:
            self.pkey = now_key
            if cluster.by_cookie:
                self.set_cookie = b"%s=%s; Path=/; HttpOnly" % (cluster.cookie_name,
                                                               now_key.encode())
        return ep

    def _never_sent(self) -> None:
        """The connection failed before the request went: any request may go elsewhere."""
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        cluster.connect_failed(ep)
        if not self._retry_elsewhere():
            self.local_error(UpstreamError.CONNECT, b"upstream connect error\n")

    def _retry_elsewhere(self) -> bool:
        """Send the request to another endpoint if the policy and budget allow (the caller
        has checked that it is safe)."""
        cluster = self.cluster
        ep = self.endpoint
        assert cluster is not None and ep is not None
        if self.resp_started or self.conn.gone or self.conn.closing:
            return False
        target = cluster.retry_target(ep, self.tries, self.retrying)
        if target is None:
            return False
        self.tries += 1
        self._retry(target)
        return True

    def attach(self, up: UpstreamConn) -> None:
        conn = self.conn
        if self.resp_done or conn.closing:
            up.close()
            return
        self.up = up
        cs = self.cstats
        ep = self.endpoint
        assert cs is not None and ep is not None
        cs.upstream_rq_total += 1
        cs.upstream_rq_active += 1
        ep.rq_total += 1
        ep.rq_active += 1
        if not up.alive:
            if self.reused:
                self.on_upstream_error(UpstreamError.RESET, False)
            else:
                self.detach(reusable=False)
                self._never_sent()
            return
        if conn.write_paused:
            up.pause_reading()
        if (up.multiplexed or self.retryable) and self.body:
            # kept for a retry: a safe request, or any on an HTTP/2 stream (it may be refused
            # unprocessed)
            self.replay = []
            self.replay_size = 0
        up.start(self, self.head, self.is_head, self.route_timeout, self.chunked_req)
        if self.up is not up:
            return  # refused at once (an HTTP/2 connection that went away): retried or answered
        if self.buffered:
            for piece in self.buffered:
                if self.replay is not None:
                    self._keep(piece)
                up.write(piece)
            self.buffered = None
        if self.req_done and up.sink is self:
            up.end(self.req_trailers)
        if self.unacked and not self.up_write_paused:
            n, self.unacked = self.unacked, 0
            conn.h2.acknowledge_received_data(self.sid, n)
        conn.kick()

    def detach(self, reusable: bool) -> None:
        if self.tunnel is not None:
            self.tunnel.abort()
            self.conn.tunnel_gone(self)
        up = self.up
        if up is None:
            return
        self.up = None
        assert self.cstats is not None and self.endpoint is not None
        self.cstats.upstream_rq_active -= 1
        self.endpoint.rq_active -= 1
        if up.sink is self:
            up.sink = None
        if up.read_paused:
            up.resume_reading()
        ep = self.endpoint
        if (reusable and self.req_done and ep is not None and up.reusable
                and ep.release(up, self.conn.loop.time())):
            return
        up.close()

    # -- ExchangeSink -------------------------------------------------------------------------
    def on_informational(self, status: int, lines: list[bytes]) -> None:
        if status != 100 and not self.resp_started:  # 100 is hop-by-hop in effect (RFC 9110)
            self.conn.h2.send_headers(self.sid, status, _fields(lines))

    def on_response_head(
        self, status: int, lines: list[bytes], length: int | None, chunked: bool,
    ) -> None:
        conn = self.conn
        self._answered(status)
        conn.response_drains()
        self.resp_started = True
        bodyless = self.is_head or status == 204 or status == 304
        fields = _fields(lines)
        if self.set_cookie is not None:
            fields.append((b"set-cookie", self.set_cookie))
        conn.h2.send_headers(self.sid, status, fields, end_stream=bodyless)
        if bodyless:
            self.resp_done = True  # the upstream still ends its message; we are done here

    def _answered(self, status: int) -> None:
        self.status = status
        self.replay = None  # processed: never sent again
        cs = self.cstats
        cluster = self.cluster
        ep = self.endpoint
        assert cs is not None and cluster is not None and ep is not None
        st = self.conn.stats
        if 200 <= status < 300:
            cs.upstream_rq_2xx += 1
            st.downstream_rq_2xx += 1
            cluster.request_ok(ep)
        else:
            cs.count_status(status)
            st.count_status(status)
            if status >= 500:
                cluster.request_failed(ep, 502 <= status <= 504)
            else:
                cluster.request_ok(ep)

    def on_whole_response(self, status: int, data: bytes, end: int) -> bool:
        return False  # the HTTP/1 fast path forwards bytes as they came: not for HTTP/2

    def on_upgrade(self, lines: list[bytes], upgrade: bytes, rest: bytes) -> bool:
        """The upstream accepted the WebSocket (101): 200 on the stream, then relay it."""
        up = self.up
        conn = self.conn
        if not self.ws or up is None or conn.closing:
            return False  # a 101 we did not ask for is a bad response
        transport = up.take_over()
        if transport is None:
            return False
        cs = self.cstats
        assert cs is not None
        cs.count_status(101)
        conn.stats.count_status(200)
        conn.response_drains()  # it may drain the connection; the tunnel itself stays
        fields = [(n, v) for n, v in _fields(lines)
                  if n in (b"sec-websocket-protocol", b"sec-websocket-extensions")]
        deflate = any(n == b"sec-websocket-extensions" and b"permessage-deflate" in v.lower()
                      for n, v in fields)
        self.resp_started = True
        conn.h2.send_headers(self.sid, 200, fields)
        conn.stats.downstream_cx_upgrades_total += 1
        conn.stats.downstream_cx_upgrades_active += 1
        side = StreamSide(conn, self)
        self.side = side
        relay = Relay(conn.loop, side, transport, TunnelKind.WEBSOCKET, conn.ctx.drain.grace,
                      lambda cut: conn.ws_ended(self, up, cut), rsv1_allowed=deflate)
        self.relay = relay
        relay.start(b"", rest)
        if conn.drain.proactive_fired:
            relay.drain_by(DrainedBy.PROACTIVE)  # the moment has passed already
        conn.kick()
        return True

    def on_response_body(self, data: bytes) -> None:
        if self.resp_done:
            return
        conn = self.conn
        conn.h2.send_data(self.sid, data)
        up = self.up
        if up is not None and conn.h2.outbound_buffered(self.sid) > OUTBOUND_HIGH:
            up.pause_reading()  # resumed on WindowOpened

    def on_response_complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        conn = self.conn
        if not self.resp_done:
            if trailers:
                conn.h2.send_trailers(self.sid, trailers)  # they end the stream
            else:
                conn.h2.send_data(self.sid, b"", end_stream=True)
        self.detach(reusable=True)
        self.finish()
        conn.kick()

    def on_upstream_error(self, status: int, after_head: bool) -> None:
        cs = self.cstats
        cluster = self.cluster
        ep = self.endpoint
        assert cs is not None and cluster is not None and ep is not None
        up_was = self.up
        self.detach(reusable=False)
        if status == UpstreamError.TIMEOUT:
            cs.upstream_rq_timeout += 1
            ep.rq_timeout += 1
        else:
            cs.upstream_rq_rx_reset += 1
        conn = self.conn
        if after_head or self.resp_started:
            # Bytes of this response went out (its status was counted): the client can only
            # see the stream reset.
            conn.reset_stream(self, ErrorCode.INTERNAL_ERROR)
            return
        replay = self.replay
        self.replay = None
        # ``retryable``: idempotent, Idempotency-Key or Resume-Seq (set when the head was read)
        safe = (may_retry(sent=True, idempotent=self.retryable, idempotency_key=False,
                          unprocessed=False, response_started=self.resp_started)
                and (not self.body or replay is not None))
        if (status == UpstreamError.RESET and self.reused and safe and not self.retried
                and up_was is not None and not up_was.got_bytes and not conn.gone):
            # A pooled connection the upstream had already closed: retry once on a fresh one.
            if replay:
                self.buffered = replay + (self.buffered or [])
            self._retry(ep)
            return
        cluster.request_failed(ep, True)
        if status == UpstreamError.RESET and safe:
            # reset before any response byte, and safe to send again (RFC 9110 §9.2.2)
            if replay:
                self.buffered = replay + (self.buffered or [])
            if self._retry_elsewhere():
                return
        body = {502: b"upstream reset before response\n", 503: b"upstream connect error\n",
                504: b"upstream request timeout\n"}[status]
        self.local_error(status, body)

    def _keep(self, data: bytes) -> None:
        replay = self.replay
        assert replay is not None
        self.replay_size += len(data)
        if self.replay_size > REPLAY_LIMIT:
            self.replay = None  # too much to keep: a refusal will be answered, not retried
        else:
            replay.append(data)

    def on_upstream_refused(self) -> None:
        """Unprocessed (RFC 9113 §8.7): sent again, to another endpoint if there is one, with
        the body sent so far (kept up to REPLAY_LIMIT)."""
        self.detach(reusable=False)
        conn = self.conn
        cs = self.cstats
        ep = self.endpoint
        assert cs is not None and ep is not None
        replay = self.replay
        self.replay = None
        if not self.resp_started and not conn.gone and (not self.body or replay is not None):
            if replay:
                self.buffered = replay + (self.buffered or [])
            if self._retry_elsewhere():
                return
            if not self.retried:
                self._retry(ep)  # no other endpoint: a fresh connection to the same one
                return
        cs.upstream_rq_rx_reset += 1
        self.local_error(503, b"upstream refused the request\n")

    def _retry(self, target: Endpoint) -> None:
        self.retried = True
        self.reused = False
        cluster = self.cluster
        assert cluster is not None
        cluster.stats.upstream_rq_retry += 1
        if not self.retrying:
            self.retrying = True
            cluster.retry_started()
        if target is not self.endpoint:
            self.endpoint = target
            if self.pkey is not None:
                cluster.rebind(self.pkey, target, self.conn.loop.time())
        self.conn.ctx.connect(cluster, target).add_done_callback(self._connected)

    def local_error(self, status: int, body: bytes,
                    extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        conn = self.conn
        if conn.closing or self.resp_done:
            return
        self.local = True
        conn.respond(self, status, body, extra)
        self.finish()
        conn.kick()

    def cork(self) -> None:
        self.conn.corked += 1

    def uncork(self) -> None:
        conn = self.conn
        conn.corked -= 1
        if not conn.corked:
            conn.kick()

    def pause_request_body(self) -> None:
        self.up_write_paused = True

    def resume_request_body(self) -> None:
        self.up_write_paused = False
        if self.unacked and self.up is not None:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_received_data(self.sid, n)
            self.conn.kick()

    def finish(self) -> None:
        if self.resp_done and self.sid not in self.conn.streams:
            return
        self.resp_done = True
        self.conn.stream_done(self)


def _cookie(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """Cookie ``name`` from the request (HTTP/2 may split cookies over several fields)."""
    for n, v in headers:
        if n == b"cookie":
            value = cookie_value(v, name)
            if value is not None:
                return value
    return None


def _fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """HTTP/1 header lines (``Name: value\\r\\n``) as lower-case HTTP/2 fields."""
    out = []
    for line in lines:
        name, _, value = line[:-2].partition(b":")
        out.append((name.lower(), value.strip()))
    return out


class H2Downstream(asyncio.Protocol):
    """One client connection speaking HTTP/2 (h2c prior knowledge, or TLS with ALPN h2)."""

    def __init__(self, ctx: H2ListenerContext, limits: H2Limits | None = None) -> None:
        self.ctx = ctx
        self.loop = ctx.loop
        self.stats = ctx.stats
        self.h2stats = ctx.h2stats
        self.h2 = H2Server(limits or ctx.h2_limits, self.loop.time())
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}
        self.corked = 0
        self.closing = False
        self.gone = False
        self.eof_sent = False
        self.aborted = False
        self.write_paused = False
        self.peer = b""
        self.forwarded = b""
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.drain: ConnectionDrain = None  # type: ignore[assignment]
        self.goaways = 0  # GOAWAY frames sent for the drain: 0, 1 (2^31-1), 2 (final)

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """A connection that spoke HTTP/2 from its first byte (TLS with ALPN h2)."""
        now = self.loop.time()
        st = self.stats
        st.downstream_cx_total += 1
        st.downstream_cx_active += 1
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.adopt(transport, ConnectionDrain(self.ctx.drain, now, self.ctx.rng), b"")

    def adopt(self, transport: asyncio.BaseTransport, drain: ConnectionDrain,
              data: bytes) -> None:
        """Take the connection over (from its first byte, or from the HTTP/1 protocol that saw
        the prior-knowledge preface: its drain state, with its proactive moment, carries on)."""
        ctx = self.ctx
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0].encode() if peer else b""
        self.forwarded = b"x-forwarded-for: %s\r\nx-forwarded-proto: %s\r\n\r\n" % (
            self.peer, ctx.scheme)
        self.drain = drain
        ctx.connections.add(self)
        st = self.stats
        st.downstream_cx_http2_total += 1
        st.downstream_cx_http2_active += 1
        self.idle_since = now = self.loop.time()
        self.h2.initiate()
        self.arm(now + ctx.idle_timeout)
        if drain.drained_by is not None:
            self._goaway_first()  # drained before it spoke HTTP/2
        self.arm_drain()
        if data:
            self.data_received(data)
        else:
            self.kick()

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        h2 = self.h2
        events = h2.receive(data, self.loop.time())
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
            s.request_data(d.data, d.flow_len, d.end_stream)
        elif t is RequestReceived:
            self.on_request(cast(RequestReceived, ev))
        elif t is TrailersReceived:
            tr = cast(TrailersReceived, ev)
            s = self.streams.get(tr.stream_id)
            if s is not None:
                s.req_trailers = trailer_fields(tr.headers) or None
                s.request_complete()
        elif t is StreamReset:
            self.h2stats.rx_reset += 1
            s = self.streams.get(cast(StreamReset, ev).stream_id)
            if s is not None and s.side is not None:
                s.side.gone()  # the relay closes the upstream and settles the stream
            elif s is not None:
                self.stats.downstream_rq_rx_reset += 1
                s.resp_done = True
                s.detach(reusable=False)
                self._settle(s, completed=False)
        elif t is WindowOpened:
            s = self.streams.get(cast(WindowOpened, ev).stream_id)
            if s is not None and not self.write_paused:
                if s.side is not None:
                    s.side.window_opened()
                elif s.up is not None:
                    s.up.resume_reading()
                elif s.tunnel is not None:
                    s.tunnel.window_opened()
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

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return
        self.gone = True
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        st = self.stats
        st.downstream_cx_active -= 1
        st.downstream_cx_http2_active -= 1
        if self.streams:
            if not self.aborted:
                st.downstream_cx_destroy_remote_active_rq += 1
            for s in list(self.streams.values()):
                if s.side is not None:
                    s.side.gone()
                s.resp_done = True
                s.detach(reusable=False)
                self._settle(s, completed=False)
        self.drain.closed()
        self.ctx.connections.discard(self)
        self.ctx.on_connection_closed(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        for s in self.streams.values():
            if s.side is not None:
                s.side.pause_source()
            elif s.up is not None:
                s.up.pause_reading()
            elif s.tunnel is not None:
                s.tunnel.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        h2 = self.h2
        for s in self.streams.values():
            if h2.outbound_buffered(s.sid) <= OUTBOUND_HIGH:
                if s.side is not None:
                    s.side.window_opened()
                elif s.up is not None:
                    s.up.resume_reading()
                elif s.tunnel is not None:
                    s.tunnel.window_opened()

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

    # -- requests ---------------------------------------------------------------------------
    def on_request(self, ev: RequestReceived) -> None:
        ctx = self.ctx
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http2_total += 1
        st.downstream_rq_active += 1
        sid = ev.stream_id
        s = H2Stream(self, sid, ev.method)
        self.streams[sid] = s
        s.body = not ev.end_stream
        s.req_done = ev.end_stream
        method = ev.method
        if method == b"CONNECT":
            if ev.protocol != b"websocket":
                self._connect(s, ev)
                return
            # RFC 8441: a WebSocket; to the HTTP/1.1 upstream it is a GET with an Upgrade
            s.ws = True
            s.body = False  # its DATA are frames for the tunnel, not a request body
            method = b"GET"
        path = ev.path if ev.path is not None else b"/"  # None only for CONNECT (above)
        authority = ev.authority
        host = authority
        out: list[bytes] = []
        xff: bytes | None = None
        content_length: bytes | None = None
        retryable = method in IDEMPOTENT_METHODS
        te_trailers = False
        for name, value in ev.headers:
            if name in DROPPED:
                if name == b"content-length":
                    content_length = value
                elif name == b"host" and host is None:
                    host = value
                elif name == b"te":
                    te_trailers = accepts_trailers(value)
                continue
            if name == b"x-forwarded-for":
                xff = value if xff is None else xff + b", " + value
            else:
                if name in REPLAY_SAFE_FIELDS:
                    retryable = True
                elif name == b"content-type" and is_grpc(value):
                    s.grpc = True
                out.append(b"%s: %s\r\n" % (name, value))
        if host is None:
            self._local(s, 400, b"missing authority\n")
            return
        if not valid_authority(host):
            # routed and forwarded by it: one that could mean two things is refused
            self._local(s, 400, b"bad authority\n")
            return
        out.insert(0, b"host: %s\r\n" % host)
        if te_trailers:  # gRPC's "te: trailers": the upstream may answer with trailers
            out.append(b"te: trailers\r\nconnection: te\r\n")
        if s.ws:
            out.append(b"connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: %s\r\n"
                       % base64.b64encode(os.urandom(16)))
            retryable = False
        elif s.body:
            if content_length is not None:
                out.append(b"content-length: %s\r\n" % content_length)
            else:
                s.chunked_req = True
                out.append(b"transfer-encoding: chunked\r\n")
        elif content_length is not None and method not in (b"GET", b"HEAD"):
            out.append(b"content-length: %s\r\n" % content_length)
        p = path.partition(b"?")[0]
        if ctx.health_check_path is not None and p == ctx.health_check_path:
            live = ctx.process.live
            self._local(s, 200 if live else 503, b"OK\n" if live else b"DRAINING\n")
            return
        route = ctx.router.match(host, p)
        if route is None:
            self._local(s, 404, b"no route\n")
            return
        if s.ws and route.cluster.connector is not None:
            # an HTTP/2 cluster: a WebSocket would need RFC 8441 upstream, not supported
            self._local(s, 501, b"websocket to an HTTP/2 upstream not supported\n")
            return
        if not ctx.process.ledger.begin():
            # Past the drain time: REFUSED_STREAM tells the client it is safe to retry it
            # elsewhere (RFC 9113 §8.7), and the final GOAWAY that this connection takes no
            # more: a refusal alone would not stop a client from choosing it again (a
            # connection opened just before T has had no response to drain it).
            st.downstream_rq_going_away += 1
            s.resp_done = True
            self.h2.unprocess(s.sid)
            self.reset_stream(s, ErrorCode.REFUSED_STREAM)
            self._goaway_final()
            return
        s.admitted = True
        s.retryable = retryable
        cluster = route.cluster
        s.cluster = cluster
        s.cstats = cluster.stats
        if cluster.persistence is not None:
            s.pkey = (_cookie(ev.headers, cluster.cookie_name) if cluster.by_cookie
                      else self.peer.decode())
        s.route_timeout = route.timeout
        if xff:
            out.append(b"x-forwarded-for: %s, %s\r\nx-forwarded-proto: %s\r\n\r\n"
                       % (xff, self.peer, ctx.scheme))
        else:
            out.append(self.forwarded)
        s.head = method + b" " + path + b" HTTP/1.1\r\n" + b"".join(out)
        s.start()

    # -- CONNECT tunnels ------------------------------------------------------------------------
    def _connect(self, s: H2Stream, ev: RequestReceived) -> None:
        """A CONNECT stream: relayed to its destination if the listener allows it (else 403)."""
        ctx = self.ctx
        if ev.protocol is not None:
            # an extended CONNECT for a protocol other than websocket
            self._local(s, 501, b"protocol not supported\n")
            return
        target = ctx.connect_target(ev.authority)
        if target is None:
            self._local(s, 403, b"CONNECT not allowed\n")
            return
        if not ctx.process.ledger.begin():
            self.stats.downstream_rq_going_away += 1
            s.resp_done = True
            self.reset_stream(s, ErrorCode.REFUSED_STREAM)
            return
        s.admitted = True
        self.stats.downstream_cx_upgrades_total += 1
        self.stats.downstream_cx_upgrades_active += 1
        s.tunnel = H2ConnectTunnel(self, s, target[0], target[1], ctx.drain.grace)
        s.tunnel.open(ctx.connect_timeout)
        if ev.end_stream:
            s.tunnel.from_client(b"", 0, True)  # nothing to send: FIN once connected
        if self.drain.proactive_fired:
            s.tunnel.drain_by(DrainedBy.PROACTIVE)  # the moment has passed already

    def tunnel_open(self, s: H2Stream) -> None:
        self.stats.count_status(200)
        self.response_drains()  # it may drain the connection; the tunnel itself stays
        s.resp_started = True
        self.h2.send_headers(s.sid, 200, [])

    def tunnel_failed(self, s: H2Stream) -> None:
        self.tunnel_gone(s)
        if s.sid in self.streams:
            self._local(s, 503, b"connect error\n")
            self.kick()

    def tunnel_done(self, s: H2Stream) -> None:
        """Both directions ended (END_STREAM and FIN): a completed request."""
        self.tunnel_gone(s)
        s.req_done = True
        s.finish()
        self.kick()

    def tunnel_reset(self, s: H2Stream, code: ErrorCode, cut: bool) -> None:
        self.tunnel_gone(s)
        if cut and s.admitted:
            # Ended by the drain (G after the proactive moment, as in Envoy): counted as cut.
            s.admitted = False
            self.ctx.process.ledger.cut_one()
            self.ctx.drain_stats.cut_reset += 1
        if s.sid in self.streams:
            self.reset_stream(s, code)

    def ws_ended(self, s: H2Stream, up: UpstreamConn, cut: bool) -> None:
        """Both sides of a WebSocket stream's relay are closed: settle the books."""
        if s.relay is None:
            return
        s.relay = None
        self.stats.downstream_cx_upgrades_active -= 1
        s.detach(reusable=False)
        up.tunnel_closed()  # the pool's and the cluster's bookkeeping
        s.resp_done = True
        if cut and s.admitted:
            s.admitted = False
            self.ctx.process.ledger.cut_one()
            self.ctx.drain_stats.cut_reset += 1
        s.req_done = True
        self._settle(s, completed=not cut)
        self.kick()

    def tunnel_gone(self, s: H2Stream) -> None:
        """The stream no longer has a destination socket (counted once)."""
        if s.tunnel is not None:
            s.tunnel = None
            self.stats.downstream_cx_upgrades_active -= 1

    def _local(self, s: H2Stream, status: int, body: bytes) -> None:
        s.local = True
        self.respond(s, status, body)
        s.finish()

    def _too_large(self, sid: int) -> None:
        st = self.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http2_total += 1
        st.downstream_rq_active += 1
        s = H2Stream(self, sid, b"")
        s.req_done = True  # H2Server drops the body and resets the stream after our answer
        self.streams[sid] = s
        self._local(s, 431, b"request header fields too large\n")

    def respond(self, s: H2Stream, status: int, body: bytes,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """A local answer on stream ``s`` (it drains the connection like any response)."""
        self.stats.count_status(status)
        self.response_drains()
        s.resp_started = True
        h2 = self.h2
        if s.grpc:
            # Trailers-only, HTTP 200: the gRPC status says why (counted as the HTTP status).
            h2.send_headers(s.sid, 200, grpc_local_reply(status, body), end_stream=True)
        elif s.is_head:
            h2.send_headers(s.sid, status, _local_headers(body, extra), end_stream=True)
        else:
            h2.send_headers(s.sid, status, _local_headers(body, extra))
            h2.send_data(s.sid, body, end_stream=True)

    def reset_stream(self, s: H2Stream, code: ErrorCode) -> None:
        self.h2stats.tx_reset += 1
        self.h2.reset_stream(s.sid, code)
        s.resp_done = True
        s.detach(reusable=False)
        self._settle(s, completed=False)
        self.kick()

    def stream_done(self, s: H2Stream) -> None:
        """The response of ``s`` went out whole."""
        if not s.req_done and s.sid in self.streams:
            # RFC 9113 §8.1: a complete response may end a request the client is still
            # sending; NO_ERROR tells it to stop without failing the response.
            self.h2.reset_stream(s.sid, ErrorCode.NO_ERROR)
            s.req_done = True
        self._settle(s, completed=True)

    def _settle(self, s: H2Stream, completed: bool) -> None:
        if self.streams.pop(s.sid, None) is None:
            return
        if s.unacked:
            # Request bytes read but never handed upstream (answered, reset or failed before
            # an upstream took them): the connection window gets them back all the same.
            n, s.unacked = s.unacked, 0
            self.h2.acknowledge_received_data(s.sid, n)
        ctx = self.ctx
        st = self.stats
        st.downstream_rq_active -= 1
        if s.retrying:  # every way a stream ends comes here: its retry slot is given back
            s.retrying = False
            assert s.cluster is not None
            s.cluster.retry_ended(0 < s.status < 500)
        if s.admitted:
            s.admitted = False
            ledger = ctx.process.ledger
            if completed and s.resp_started:
                ledger.end()
            else:
                ledger.abandon()
            if ledger.draining:
                ctx.on_request_done()
        if completed and s.resp_started:
            st.downstream_rq_completed += 1
        if not self.streams:
            self._idle()

    def _idle(self) -> None:
        """The last stream ended: the idle clock starts; a drained connection past G closes."""
        if self.closing:
            return
        self.idle_since = now = self.loop.time()
        self.arm(now + self.ctx.idle_timeout)
        d = self.drain
        if self.goaways >= 2 or (d.drained_by is not None and d.on_idle(now) is ConnAction.CLOSE):
            self.staged_close()

    # -- drain --------------------------------------------------------------------------------
    def response_drains(self) -> bool:
        """The drain core's per-response decision: GOAWAY instead of ``Connection: close``."""
        d = self.drain
        if d.drained_by is None and d.listener.quiet:
            return False
        was_open = d.drained_by is None
        if not d.on_response(self.loop.time(), self.ctx.rng):
            return False
        if was_open:
            self.stats.downstream_cx_drain_close += 1
            if d.drained_by is DrainedBy.RESPONSE:
                self.ctx.drain_stats.cx_drained_by_response += 1
            self._goaway_first()
            self.arm_drain()
        return True

    def _goaway_first(self) -> None:
        if self.goaways == 0 and not self.h2.closed:
            self.goaways = 1
            self.h2stats.goaway_sent += 1
            self.h2.start_drain()
            self.kick()

    def _goaway_final(self) -> None:
        self._goaway_first()
        if self.goaways == 1 and not self.h2.closed:
            self.goaways = 2
            self.h2stats.goaway_sent += 1
            self.h2.final_goaway()
            self.kick()

    def on_drain_event(self, event: object) -> None:
        self.drain.on_drain_event(event, self.ctx.rng)  # type: ignore[arg-type]
        self.arm_drain()

    def arm_drain(self) -> None:
        at = self.drain.next_deadline()
        if at is not None:
            self.arm(at)

    def no_new_work(self) -> None:
        """T has passed: the process takes no new stream, so the final GOAWAY goes out now
        rather than G after a drain that may have begun just before T. A client that sent a
        stream meanwhile learns from it that the stream was not processed."""
        if not self.closing:
            self._goaway_final()

    def close_at_end(self) -> None:
        """The drain is over: the final GOAWAY now; the connection closes once its streams end."""
        if self.drain.drain_at_end(self.loop.time()):
            self.ctx.drain_stats.cx_closed_at_end += 1
        for s in list(self.streams.values()):
            if s.relay is not None:
                s.relay.drain_by(DrainedBy.END)
        self._goaway_final()
        if not self.streams:
            self.staged_close()

    def cut(self) -> None:
        """The shutdown deadline: a 503 on streams with no response byte sent, else a reset."""
        ds = self.ctx.drain_stats
        ledger = self.ctx.process.ledger
        for s in list(self.streams.values()):
            if s.relay is not None:
                s.relay.drain_by(DrainedBy.END)  # reset; counted when both sides are gone
                continue
            if not s.admitted:
                continue
            ledger.cut_one()
            s.admitted = False
            s.detach(reusable=False)
            if s.resp_started:
                ds.cut_reset += 1
                if s.grpc and not s.resp_done:
                    # A call whose response started (a server stream) ends with a status
                    # the client can act on, not a reset.
                    self.h2.send_trailers(s.sid, grpc_fields(
                        GRPC_UNAVAILABLE, b"going away: cut at the drain deadline"))
                    s.local = True
                    s.finish()
                else:
                    self.reset_stream(s, ErrorCode.CANCEL)
            else:
                ds.cut_before_response += 1
                s.local = True
                self.respond(s, 503, b"going away\n", ((b"retry-after", b"1"),))
                s.finish()
        self._goaway_final()
        self.kick()
        if not self.streams:
            self.staged_close()

    # -- closing --------------------------------------------------------------------------------
    def staged_close(self) -> None:
        """Flush, shut down writing, keep reading briefly, then close (no last frame lost)."""
        if self.closing:
            return
        self.closing = True
        self.drain.close()
        t = self.transport
        if t is None or self.gone:
            return
        self.flush()  # also when corked: nothing is written after the FIN
        if t.can_write_eof():
            self.eof_sent = True
            t.write_eof()
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            self.arm(self.loop.time() + LINGER)
        else:
            t.close()

    def reset(self) -> None:
        t = self.transport
        if t is None or self.gone or self.aborted:
            return
        self.aborted = True
        self.closing = True
        abort_with_rst(t)

    # -- timers -----------------------------------------------------------------------------------
    def arm(self, at: float) -> None:
        if at == math.inf:
            return
        if self.timer is not None:
            if self.timer_at <= at:
                return
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self.on_timer)

    def on_timer(self) -> None:
        self.timer = None
        if self.gone:
            return
        now = self.loop.time()
        if self.closing:
            if self.transport is not None:
                self.transport.close()
            return
        ctx = self.ctx
        nxt: list[float] = []
        busy = bool(self.streams)
        if not busy:
            at = self.idle_since + ctx.idle_timeout
            if now >= at:
                self.stats.downstream_cx_idle_timeout += 1
                self.h2.close(ErrorCode.NO_ERROR)
                self.staged_close()
                return
            nxt.append(at)
        d = self.drain
        dl = d.next_deadline()
        if dl is not None and now >= dl:
            was_open = d.drained_by is None
            action = d.on_timer(now, idle=not busy)
            if was_open and d.drained_by is DrainedBy.PROACTIVE:
                self.stats.downstream_cx_drain_close += 1
                ctx.drain_stats.cx_drained_proactive += 1
                self._goaway_first()
            if action is ConnAction.DRAIN:
                # The proactive moment (also of a connection a response drained): its tunnels
                # are reset G from now (as in Envoy).
                for s in list(self.streams.values()):
                    if s.tunnel is not None:
                        s.tunnel.drain_by(DrainedBy.PROACTIVE)
                    elif s.relay is not None:
                        s.relay.drain_by(DrainedBy.PROACTIVE)  # the close handshake, up to G
            if d.grace_elapsed:
                self._goaway_final()
            if action is ConnAction.CLOSE or (self.goaways >= 2 and not self.streams):
                self.staged_close()
                return
            dl = d.next_deadline()
        if dl is not None:
            nxt.append(dl)
        if nxt:
            self.arm(min(nxt))
