"""HTTP/1.1 downstream connection: parse with httptools, proxy each request through an
``Exchange``, and carry out the drain core's decisions for this connection.

Requests are answered in order: only the head of the queue talks to an upstream; pipelined
requests behind it wait with reading paused. Bodies stream both ways with flow control
(pause_reading / resume_reading); nothing buffers a whole body. Once the request whose answer
closes the connection has been read, nothing after it is parsed (no request smuggled behind a
400, a 501 or a ``Connection: close`` reaches an upstream).

A request sent on a reused pooled connection keeps its first bytes (``REPLAY_LIMIT``) until the
upstream answers, so a connection the upstream had already closed is retried once on a fresh
one — only for idempotent methods or requests with an ``Idempotency-Key`` or ``Resume-Seq``
(RFC 9110 §9.2.2).

Drain (docs/drain.md): ``ConnectionDrain.on_response`` decides per response whether to add
``Connection: close``; one lazily re-armed timer covers the header timeout, the idle timeout
and the drain moments; a close is staged (shutdown write, drain reads briefly, close) so the
last response is not lost to a reset (RFC 9112 §9.6).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol

import httptools

from lameduck.drain import ConnAction, ConnectionDrain, DrainedBy, ListenerDrain, ProcessDrain
from lameduck.drain.endpoint import Layer
from lameduck.drain.retry import IDEMPOTENT_METHODS, REPLAY_SAFE_FIELDS, may_retry
from lameduck.drain.tunnel import Flow, TunnelKind
from lameduck.http1.upstream import H1Upstream
from lameduck.http1.wire import (
    LAST_CHUNK,
    absolute_form,
    chunk,
    find_cookie,
    simple_response,
    status_line,
)
from lameduck.proxy.fields import (
    HOP_BY_HOP,
    accepts_trailers,
    drop_nominated,
    trailer_block,
    trailer_fields,
    valid_authority,
)
from lameduck.proxy.local import RETRY_AFTER
from lameduck.proxy.replay import REPLAY_LIMIT
from lameduck.tunnel.relay import Pending, Relay, abort_with_rst, open_destination
from lameduck.upstream.connector import UpstreamConn, UpstreamError

if TYPE_CHECKING:
    from collections.abc import Callable

    from lameduck.stats import ClusterStats, DrainStats, HttpStats
    from lameduck.upstream.cluster import Cluster
    from lameduck.upstream.pool import Endpoint
    from lameduck.upstream.router import Router

log = logging.getLogger("lameduck.http1")

# Reasons reading is paused; reading resumes when none is left.
PAUSE_PIPELINE = 1  # a request waits behind the one being answered
PAUSE_UPSTREAM = 2  # the upstream cannot take the request body faster
PAUSE_BUFFER = 4  # body bytes wait for an upstream connection
PAUSE_CLOSING = 8
PAUSE_UPGRADE = 16  # an Upgrade request waits for the upstream's answer

BODY_BUFFER_LIMIT = 256 * 1024
LINGER = 2.0  # seconds a staged close keeps reading before it closes
GOING_AWAY = simple_response(503, b"going away\n", close=True, extra=((b"retry-after", b"1"),))
GOING_AWAY_HEAD = simple_response(503, b"going away\n", close=True,
                                  extra=((b"retry-after", b"1"),), head_only=True)
# Request fields the proxy looks at (the rest are forwarded as they come).
REQUEST_SPECIAL = HOP_BY_HOP | REPLAY_SAFE_FIELDS | {
    b"host", b"x-forwarded-for", b"x-forwarded-proto", b"expect",
}
QUERY: Final = 63  # "?", as a byte value: ``in`` looks for it with memchr
# An HTTP/2 client with prior knowledge opens with this (RFC 9113 §3.4).
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class ListenerContext(Protocol):
    """What a downstream connection needs from its listener (wired in ``listeners``)."""

    loop: asyncio.AbstractEventLoop
    name: str
    stats: HttpStats
    drain_stats: DrainStats
    drain: ListenerDrain
    process: ProcessDrain
    router: Router
    rng: Callable[[], float]
    connections: set[H1Downstream]
    health_check_path: bytes | None
    request_headers_timeout: float
    idle_timeout: float
    max_request_headers: int
    scheme: bytes
    connect_timeout: float

    def connect_target(self, authority: bytes | None) -> tuple[str, int] | None: ...
    def connect(self, cluster: Cluster, endpoint: Endpoint) -> asyncio.Future[UpstreamConn]: ...
    def on_connection_closed(self, conn: H1Downstream) -> None: ...
    def on_request_done(self) -> None: ...

    def upgrade_h2(self, conn: H1Downstream, data: bytes) -> bool:
        """The connection opened with the HTTP/2 preface (``data`` holds all bytes read so
        far): True if the listener took it over (it calls ``conn.hand_over()``), False to
        read it as HTTP/1."""
        ...


class HeaderTooLarge(Exception):
    pass


class Exchange:
    """One request and its response, from headers-complete to the last response byte.

    Defaults live on the class: a keep-alive GET sets five attributes, not thirty (this is
    allocated once per request, on the hot path).
    """

    head = b""
    local: bytes | None = None
    close = False  # the connection closes after this response
    admitted = False
    chunked_req = False
    req_done = False
    buffered: list[bytes] | None = None
    buffered_size = 0
    cluster: Cluster | None = None
    cstats: ClusterStats | None = None
    endpoint: Endpoint | None = None
    route_timeout = 0.0
    reused = False
    retried = False  # sent again once on a fresh connection (a stale pooled one, a refusal)
    tries = 0  # retries on other endpoints (retry_policy.num_retries)
    retrying = False  # counted in the cluster's retries in flight (the retry budget)
    retryable = False  # idempotent method, Idempotency-Key or Resume-Seq (RFC 9110 §9.2.2)
    pkey: str | None = None  # persistence key: the source IP, or the cookie's record key
    set_cookie: bytes | None = None  # a persistence cookie to insert in the response
    can_replay = False
    replay: list[bytes] | None = None
    replay_size = 0
    status = 0
    resp_started = False
    resp_chunked = False
    te_trailers = False  # the client sent "TE: trailers"
    req_trailers: list[tuple[bytes, bytes]] | None = None  # the request's trailer section
    resp_done = False
    upgrade = False  # a WebSocket Upgrade request: a 101 turns the connection into a tunnel
    connect: tuple[str, int] | None = None  # a CONNECT's destination (on the allow-list)
    early = b""  # bytes the client sent after an Upgrade request, before the 101

    def __init__(self, down: H1Downstream, method: bytes, keep_alive: bool, v10: bool) -> None:
        self.down = down
        self.method = method
        self.is_head = method == b"HEAD"
        self.keep_alive = keep_alive
        self.v10 = v10
        # Set here, not as a class default: mypyc leaves a protocol-typed default undefined.
        self.up: UpstreamConn | None = None

    # -- request body -----------------------------------------------------------------------
    def request_body(self, data: bytes) -> None:
        if self.local is not None:
            return  # answered locally: the body is read and dropped
        self._send(data)

    def request_complete(self) -> None:
        self.req_done = True
        if self.req_trailers:
            self.req_trailers = trailer_fields(self.req_trailers) or None
        if self.local is not None:
            if self.resp_started:
                self.finish()  # the local answer went out before the request had ended
            return
        up = self.up
        if up is not None and up.sink is self:
            up.end(self.req_trailers)  # else ``attach`` ends it, after what was held

    def _send(self, data: bytes) -> None:
        """Request bytes to the upstream, or held (bounded) until one is attached."""
        up = self.up
        if up is not None and up.sink is self:
            if self.can_replay:
                self._keep(data)
            up.write(data)
            return
        if self.buffered is None:
            self.buffered = []
        self.buffered.append(data)
        self.buffered_size += len(data)
        if self.buffered_size > BODY_BUFFER_LIMIT:
            self.down.pause(PAUSE_BUFFER)

    def _keep(self, data: bytes) -> None:
        """Remember request bytes sent on a reused connection, for a retry (bounded)."""
        size = self.replay_size + len(data)
        if size > REPLAY_LIMIT:
            self.can_replay = False
            self.replay = None
            return
        self.replay_size = size
        if self.replay is None:
            self.replay = [data]
        else:
            self.replay.append(data)

    # -- upstream ---------------------------------------------------------------------------
    def start(self) -> None:
        """This exchange reached the head of the queue: answer it or send it upstream."""
        down = self.down
        if self.local is not None:
            if not self.close and self.keep_alive and down.response_drains():
                # a local answer drains its connection like any other response
                self.close = True
                self.local = self.local.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
            down.write(self.local)
            self.resp_started = True
            if self.req_done or self.close:
                self.finish()
            else:
                # Finish when the rest of the request (its body, dropped) has been read, so the
                # connection stays in sync for the next one; a client that stops sending it is
                # idle, and the idle timeout closes it.
                down.idle_since = now = down.loop.time()
                down.arm(now + down.ctx.idle_timeout)
            return
        if self.connect is not None:
            host, port = self.connect
            ctx = down.ctx
            open_destination(down.loop, host, port, ctx.connect_timeout).add_done_callback(
                self._destination)
            return
        cluster = self.cluster
        assert cluster is not None
        ep = cluster.pick() if cluster.persistence is None else self._sticky(cluster)
        if ep is None:
            self.no_upstream(cluster)
            return
        self.endpoint = ep
        conn = ep.acquire()
        if conn is not None:
            self.reused = True
            self.attach(conn)  # type: ignore[arg-type]
        else:
            self.reused = False
            down.ctx.connect(cluster, ep).add_done_callback(self._connected)

    def _sticky(self, cluster: Cluster) -> Endpoint | None:
        """The drain-stop persistence decision; a new record under a cookie sets the cookie."""
        key = self.pkey
        ep, now_key = cluster.pick_sticky(key, Layer.L7, self.down.loop.time(),
                                           cluster.by_cookie)
        if now_key is not None and now_key != key:
            self.pkey = now_key
            if cluster.by_cookie:
                self.set_cookie = b"set-cookie: %s=%s; Path=/; HttpOnly\r\n" % (
                    cluster.cookie_name, now_key.encode())
        return ep

    def no_upstream(self, cluster: Cluster) -> None:
        """No READY, healthy endpoint: 503 and when to come back (Envoy: no healthy upstream)."""
        cluster.stats.upstream_cx_none_healthy += 1
        self.local_error(503, b"no healthy upstream\n", RETRY_AFTER)

    def _connected(self, fut: asyncio.Future[UpstreamConn]) -> None:
        if self.resp_done or self.down.gone:
            if not fut.cancelled() and fut.exception() is None:
                fut.result().close()
            return
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self._never_sent()
            return
        self.attach(fut.result())

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
        if self.resp_started or self.down.gone or self.down.closing:
            return False
        target = cluster.retry_target(ep, self.tries, self.retrying)
        if target is None:
            return False
        self.tries += 1
        self._retry(target)
        return True

    def _destination(self, fut: asyncio.Future[tuple[asyncio.Transport, Pending]]) -> None:
        """A CONNECT's destination answered (or not): 200 and the tunnel, or a 503."""
        down = self.down
        failed = fut.cancelled() or fut.exception() is not None
        if self.resp_done or down.gone or down.closing:
            if not failed:
                fut.result()[0].abort()
            return
        if failed or fut.result()[1].lost:
            if not failed:
                fut.result()[0].abort()
            self.resp_started = True
            down.count_status(503)
            down.write(simple_response(503, b"connect error\n", close=True))
            self.finish()
            return
        t, pending = fut.result()
        down.count_status(200)
        self.resp_started = True
        # RFC 9110 §9.3.6: a 2xx to CONNECT has no body, no framing; never Connection: close
        down.start_tunnel(self, b"HTTP/1.1 200 Connection Established\r\n\r\n", t,
                          pending.buf, TunnelKind.OPAQUE, False, None)
        if pending.eof and down.relay is not None:
            down.relay.eof(Flow.TO_CLIENT)  # the destination half-closed before the relay began

    def attach(self, up: UpstreamConn) -> None:
        if self.resp_done or self.down.closing:
            up.close()  # cut or answered meanwhile: this request is not sent
            return
        self.up = up
        cs = self.cstats
        ep = self.endpoint
        assert cs is not None and ep is not None
        cs.upstream_rq_total += 1
        cs.upstream_rq_active += 1
        ep.rq_total += 1
        ep.rq_active += 1
        # Kept for a retry: a safe request (idempotent, Idempotency-Key, Resume-Seq), or any
        # request on an HTTP/2 stream (which the upstream may refuse as unprocessed).
        self.can_replay = self.retryable or up.multiplexed
        if not up.alive:  # lost between the pool (or the connect) and now
            if self.reused:
                self.on_upstream_error(UpstreamError.RESET, False)
            else:
                self._detach(reusable=False)
                self._never_sent()
            return
        if self.down.write_paused:
            up.pause_reading()  # the client is behind: this response waits for it too
        up.start(self, self.head, self.is_head, self.route_timeout, self.chunked_req)
        if self.up is not up:
            return  # refused at once (an HTTP/2 connection that went away): retried or answered
        if self.buffered:
            for piece in self.buffered:
                if self.can_replay:
                    self._keep(piece)
                up.write(piece)
            self.buffered = None
            self.buffered_size = 0
            self.down.resume(PAUSE_BUFFER)
        if self.req_done and up.sink is self:
            up.end(self.req_trailers)

    def _detach(self, reusable: bool) -> None:
        up = self.up
        if up is None:
            return
        self.up = None
        cs = self.cstats
        assert cs is not None and self.endpoint is not None
        cs.upstream_rq_active -= 1
        self.endpoint.rq_active -= 1
        if up.sink is self:
            up.sink = None
        # A flow-control pause on either side belongs to this exchange, not to what comes next.
        if self.down.paused & PAUSE_UPSTREAM:
            self.down.resume(PAUSE_UPSTREAM)
        if up.read_paused:
            up.resume_reading()
        ep = self.endpoint
        if (reusable and self.req_done and ep is not None and up.reusable
                and ep.release(up, self.down.ctx.loop.time())):
            return
        up.close()

    # -- ExchangeSink: what the upstream reports ----------------------------------------------
    def on_informational(self, status: int, lines: list[bytes]) -> None:
        if not self.v10 and not self.resp_started:
            self.down.write(status_line(status) + b"".join(lines) + b"\r\n")

    def on_response_head(
        self, status: int, lines: list[bytes], length: int | None, chunked: bool,
    ) -> None:
        down = self.down
        self._answered(status)
        bodyless = self.is_head or status == 204 or status == 304
        close = self.close or not self.keep_alive or down.response_drains()
        out = lines
        out.insert(0, status_line(status))
        if not bodyless and length is None:
            if self.v10:
                close = True  # close-delimited for an HTTP/1.0 client
            else:
                self.resp_chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
        if close:
            out.append(b"connection: close\r\n")
            self.close = True
        elif self.v10:
            out.append(b"connection: keep-alive\r\n")
        if self.set_cookie is not None:
            out.append(self.set_cookie)
        out.append(b"\r\n")
        self.resp_started = True
        down.write(b"".join(out))

    def _answered(self, status: int) -> None:
        """The upstream answered: count the status; no retry from here on."""
        self.status = status
        if self.can_replay:
            self.can_replay = False
            self.replay = None
        cs = self.cstats
        cluster = self.cluster
        ep = self.endpoint
        assert cs is not None and cluster is not None and ep is not None
        if 200 <= status < 300:
            cs.upstream_rq_2xx += 1
            self.down.stats.downstream_rq_2xx += 1
            cluster.request_ok(ep)
        else:
            cs.count_status(status)
            self.down.stats.count_status(status)
            if status >= 500:
                cluster.request_failed(ep, 502 <= status <= 504)
            else:
                cluster.request_ok(ep)

    def on_whole_response(self, status: int, data: bytes, end: int) -> bool:
        """The fast path: a complete plain response (see ``wire.whole_response``) forwarded as
        it came, head and body in one write. False: the caller parses it instead."""
        if (self.is_head or self.v10 or self.close or not self.keep_alive or not self.req_done
                or self.set_cookie is not None):
            return False
        down = self.down
        self._answered(status)
        self.resp_started = True
        if down.response_drains():
            self.close = True
            down.write(data[:end] + b"\r\nconnection: close" + data[end:])
        else:
            down.write(data)
        self._detach(reusable=True)
        self.finish()
        return True

    def on_upgrade(self, lines: list[bytes], upgrade: bytes, rest: bytes) -> bool:
        """The upstream switched protocols (101): relay the 101, then the tunnel. False when
        this request did not ask for it (the caller fails the exchange)."""
        if not self.upgrade or self.down.closing:
            return False
        self._answered(101)
        self.resp_started = True
        head = (b"HTTP/1.1 101 Switching Protocols\r\n" + b"".join(lines)
                + b"connection: upgrade\r\nupgrade: %s\r\n\r\n" % upgrade)
        deflate = any(line[:25].lower() == b"sec-websocket-extensions:"
                      and b"permessage-deflate" in line.lower() for line in lines)
        up = self.up
        assert isinstance(up, H1Upstream) and up.transport is not None
        self.down.start_tunnel(self, head, up.transport, rest, TunnelKind.WEBSOCKET, deflate, up)
        return True

    def on_response_body(self, data: bytes) -> None:
        if self.resp_chunked:
            data = chunk(data)
        self.down.write(data)

    def on_response_complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        if self.resp_chunked:
            # Trailers only to a client that said it takes them (RFC 9110 §6.5.1).
            self.down.write(trailer_block(trailers) if trailers and self.te_trailers
                            else LAST_CHUNK)
        self._detach(reusable=True)
        self.finish()

    def on_upstream_error(self, status: int, after_head: bool) -> None:
        cs = self.cstats
        cluster = self.cluster
        ep = self.endpoint
        assert cs is not None and cluster is not None and ep is not None
        up_was = self.up
        can_replay = self.can_replay
        self._detach(reusable=False)
        if status == UpstreamError.TIMEOUT:
            cs.upstream_rq_timeout += 1
            ep.rq_timeout += 1
        else:
            cs.upstream_rq_rx_reset += 1
        if after_head or self.resp_started:
            # Bytes of this response already went out (its status was counted): the client
            # can only see a reset.
            self.down.abort_with_active_request()
            return
        if (status == UpstreamError.RESET and can_replay and self.reused and up_was is not None
                and not up_was.got_bytes and not self.retried and not self.down.gone):
            # A pooled connection the upstream had already closed: retry once on a fresh one,
            # replaying what was sent (only safe requests get here: see ``attach``).
            self._retry(ep)
            return
        cluster.request_failed(ep, True)
        # ``retryable``: idempotent, Idempotency-Key or Resume-Seq (set when the head was read)
        if (status == UpstreamError.RESET and can_replay
                and may_retry(sent=True, idempotent=self.retryable, idempotency_key=False,
                              unprocessed=False, response_started=self.resp_started)
                and self._retry_elsewhere()):
            # reset before any response byte, safe to send again (RFC 9110 §9.2.2), and its body is
            # still kept (``can_replay`` alone says only that: an HTTP/2 stream keeps it for
            # a refusal)
            return
        body = {502: b"upstream reset before response\n", 503: b"upstream connect error\n",
                504: b"upstream request timeout\n"}[status]
        self.local_error(status, body)

    def on_upstream_refused(self) -> None:
        """HTTP/2 proved it unprocessed: sent again, to another endpoint if there is one."""
        can_replay = self.can_replay
        ep = self.endpoint
        cluster = self.cluster
        assert ep is not None and cluster is not None
        self._detach(reusable=False)
        if can_replay and not self.resp_started and not self.down.gone:
            if self._retry_elsewhere():
                return
            if not self.retried:
                self._retry(ep)  # no other endpoint: a fresh connection to the same one
                return
        cs = self.cstats
        assert cs is not None
        cs.upstream_rq_rx_reset += 1
        self.local_error(503, b"upstream refused the request\n")

    def _retry(self, target: Endpoint) -> None:
        """Send the request again to ``target`` on a fresh connection, replaying what was
        sent."""
        self.retried = True
        self.can_replay = False
        cluster = self.cluster
        assert cluster is not None
        cs = cluster.stats
        cs.upstream_rq_retry += 1
        if not self.retrying:
            self.retrying = True
            cluster.retry_started()
        if self.replay:
            self.buffered = self.replay + (self.buffered or [])
            self.buffered_size += self.replay_size
        self.replay = None
        self.replay_size = 0
        self.reused = False
        if target is not self.endpoint:
            self.endpoint = target
            if self.pkey is not None:
                cluster.rebind(self.pkey, target, self.down.loop.time())
        self.down.ctx.connect(cluster, target).add_done_callback(self._connected)

    def local_error(self, status: int, body: bytes,
                    extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
        """Answer with a local error response, unless the response already started."""
        if self.down.closing:
            return  # cut at the deadline meanwhile: its answer went out already
        close = (self.close or not self.keep_alive or not self.req_done
                 or self.down.response_drains())
        self.close = close
        self.local = b""
        self.resp_started = True
        self.down.count_status(status)
        self.down.write(simple_response(status, body, close=close, head_only=self.is_head,
                                        extra=extra))
        self.finish()

    def cork(self) -> None:
        self.down.wbuf = []

    def uncork(self) -> None:
        self.down.flush()

    def pause_request_body(self) -> None:
        self.down.pause(PAUSE_UPSTREAM)

    def resume_request_body(self) -> None:
        self.down.resume(PAUSE_UPSTREAM)

    # -- end --------------------------------------------------------------------------------
    def finish(self) -> None:
        if self.resp_done:
            return
        self.resp_done = True
        self.down.exchange_done(self)


class H1Downstream(asyncio.Protocol):
    """One client connection."""

    def __init__(self, ctx: ListenerContext) -> None:
        self.ctx = ctx
        self.loop = ctx.loop
        self.stats = ctx.stats
        self.headers_timeout = ctx.request_headers_timeout
        self.max_headers = ctx.max_request_headers
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()
        self.reading: Exchange | None = None  # the exchange whose request is being received
        self.paused = 0
        self.write_paused = False
        self.closing = False
        self.gone = False
        self.last_read = False  # the last request this connection will answer has been read
        self.aborted = False  # we reset the connection (not the client)
        self.wbuf: list[bytes] | None = None  # writes held while corked (see flush)
        self.peer = b""
        self.url = b""
        self.lines: list[bytes] = []  # request fields forwarded as they are, formatted
        self.special: list[tuple[bytes, bytes]] = []  # (lower-case name, value) to look at
        self.header_bytes = 0
        self.raw_head_bytes = 0  # bytes of a request head still incomplete after a read
        self.in_headers = False
        self.req_started = 0.0
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.drain: ConnectionDrain = None  # type: ignore[assignment]  # set at connection_made
        self.router = ctx.router
        self.first_read = True  # until the HTTP/2 preface is ruled out (see ``_sniff``)
        self.sniffed = b""  # the first bytes, while they are a strict prefix of the preface
        self.upgrading: Exchange | None = None  # an Upgrade request awaiting its answer
        self.relay: Relay | None = None  # the tunnel this connection became (after a 101)
        # The read being parsed, and whether its first request begins at its first byte: then
        # that request's version can be read off its request line (see ``_version``).
        self.rdata = b""
        self.rfirst = False
        self.first_in_read = False  # the request being read began its read (``rfirst``)

    # -- asyncio ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ctx = self.ctx
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = peer[0].encode() if peer else b""
        self.forwarded = b"x-forwarded-for: %s\r\nx-forwarded-proto: %s\r\n\r\n" % (
            self.peer, ctx.scheme)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = self.loop.time()
        self.idle_since = now
        self.drain = ConnectionDrain(ctx.drain, now, ctx.rng)
        ctx.connections.add(self)
        st = ctx.stats
        st.downstream_cx_total += 1
        st.downstream_cx_active += 1
        st.downstream_cx_http1_active += 1
        self.arm(now + ctx.idle_timeout)
        self.arm_drain()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.last_read:
            return
        pending = self.upgrading  # a local: narrowing self.upgrading would outlive feed_data
        if pending is not None:
            pending.early += data  # read before the pause took effect
            return  # a staged close drains what the client still sends; so does the tail
        if self.first_read:
            data = self._sniff(data)
            if not data:
                return
        # At a message boundary (nothing of a request pending), a request begun in this read
        # starts at its first byte (or after blank lines llhttp skips).
        self.rfirst = self.reading is None and not self.in_headers
        self.rdata = data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            offset = e.args[0] if e.args else len(data)
            upgrading = self.upgrading  # set by on_message_complete, inside feed_data
            if upgrading is not None:
                # A WebSocket Upgrade: what follows is for the tunnel, if the upstream agrees.
                upgrading.early += data[offset:]
                self.pause(PAUSE_UPGRADE)
                self.rdata = b""
                return
            # The request was complete (a stripped Upgrade or a refused CONNECT); what
            # follows is either a new request or tunnel bytes we do not relay.
            self.parser = httptools.HttpRequestParser(self)
            self.rdata = b""
            rest = data[offset:]
            if rest and not self.closing and not self.last_read:
                self.data_received(rest)
            return
        except httptools.HttpParserCallbackError as e:
            if isinstance(e.__context__, HeaderTooLarge):
                self.protocol_error(431, b"request header fields too large\n")
            else:
                log.exception("error in request handling")
                self.protocol_error(400, b"bad request\n")
        except httptools.HttpParserError:
            self.protocol_error(400, b"bad request\n")
            return
        self.rdata = b""  # not kept past its read
        if self.in_headers:
            # llhttp keeps a header that has not ended yet in its own buffer, out of sight of
            # on_header: bound the head by the bytes that went in too (whole reads spent inside
            # one head; the read it began in is not counted, so this errs by one read at most).
            if self.raw_head_bytes < 0:
                self.raw_head_bytes = 0  # began in this read
            else:
                self.raw_head_bytes += len(data)
                if self.raw_head_bytes > self.ctx.max_request_headers:
                    self.protocol_error(431, b"request header fields too large\n")

    def _sniff(self, data: bytes) -> bytes:
        """The first read(s): an HTTP/2 prior-knowledge preface goes to the listener. Returns
        the bytes to parse as HTTP/1 (empty: held as a strict prefix of the preface, or taken
        over)."""
        if self.sniffed:
            data = self.sniffed + data
            self.sniffed = b""
        if len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
            self.sniffed = data  # "PRI * HT", or just "P" of a POST: wait for more
            return b""
        self.first_read = False
        if data[:len(H2_PREFACE)] == H2_PREFACE and self.ctx.upgrade_h2(self, data):
            return b""
        return data

    def hand_over(self) -> None:
        """The listener took this connection over (HTTP/2): stop the timers and ignore every
        later callback. The listener updates its connection set and gauges itself."""
        self.gone = True
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool:
        # A client half-close: finish what is in flight, then close (HTTP/1 has no half-open
        # use). Keeping the transport lets the responses still go out.
        if self.gone:
            return True  # handed over: the transport is not ours to close
        if self.closing or not self.queue:
            return False
        if self.reading is not None:
            # The client ended the connection in the middle of a request body: the request
            # can never complete, so nothing useful can be answered.
            self.ctx.stats.downstream_rq_rx_reset += 1
            return False
        self.closing_after_queue()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.gone:
            return  # handed over (see ``hand_over``): no longer ours
        self.gone = True
        self.closing = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        ctx = self.ctx
        ctx.connections.discard(self)
        st = ctx.stats
        st.downstream_cx_active -= 1
        st.downstream_cx_http1_active -= 1
        if self.queue:
            if not self.aborted:
                st.downstream_cx_destroy_remote_active_rq += 1
            for ex in list(self.queue):
                ex._detach(reusable=False)
                self._settle(ex, completed=False)
            self.queue.clear()
        self.drain.closed()
        ctx.on_connection_closed(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.queue:
            up = self.queue[0].up
            if up is not None:
                up.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.queue:
            up = self.queue[0].up
            if up is not None:
                up.resume_reading()

    # -- flow control -----------------------------------------------------------------------
    def pause(self, reason: int) -> None:
        if not self.paused and self.transport is not None and not self.gone:
            self.transport.pause_reading()
        self.paused |= reason

    def resume(self, reason: int) -> None:
        if not self.paused & reason:
            return
        self.paused &= ~reason
        if not self.paused and self.transport is not None and not self.gone:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.wbuf is not None:
            self.wbuf.append(data)
        elif not self.gone:
            assert self.transport is not None
            self.transport.write(data)

    def flush(self) -> None:
        """Send what was written while corked, in one write."""
        buf = self.wbuf
        if buf is None:
            return
        self.wbuf = None
        if buf and not self.gone and self.transport is not None:
            self.transport.write(buf[0] if len(buf) == 1 else b"".join(buf))

    def reset(self) -> None:
        """Abort with a TCP reset, not a FIN: a cut close-delimited body must not look whole."""
        self.wbuf = None
        t = self.transport
        if t is None or self.gone or self.aborted:
            return
        self.aborted = True
        self.closing = True  # no staged close after this: a write_eof would turn it into a FIN
        self.last_read = True
        abort_with_rst(t)

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.first_in_read = self.rfirst
        self.rfirst = False  # the next request in this read does not start at its first byte
        self.url = b""
        self.lines = []
        self.special = []
        self.header_bytes = 0
        self.raw_head_bytes = -1
        self.in_headers = True
        self.req_started = now = self.loop.time()
        at = now + self.headers_timeout
        if self.timer is None or at < self.timer_at:
            self.arm(at)

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.header_bytes += len(url)
        if self.header_bytes > self.max_headers:
            raise HeaderTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value) + 4
        if self.header_bytes > self.max_headers:
            raise HeaderTooLarge
        if not self.in_headers:  # a trailer field after a chunked body
            ex = self.reading
            if ex is not None:
                if ex.req_trailers is None:
                    ex.req_trailers = []
                ex.req_trailers.append((name, value))
            return
        n = name.lower()
        if n in REQUEST_SPECIAL:
            self.special.append((n, value))
        else:
            self.lines.append(b"%s: %s\r\n" % (name, value))

    def on_headers_complete(self) -> None:
        self.in_headers = False
        if self.last_read:
            return  # pipelined behind the last request this connection answers: dropped
        ctx = self.ctx
        parser = self.parser
        method = parser.get_method()
        version = self._version(method)
        v10 = version == "1.0"
        ex = Exchange(self, method, parser.should_keep_alive(), v10)
        self.reading = ex
        self.queue.append(ex)
        st = ctx.stats
        st.downstream_rq_total += 1
        st.downstream_rq_http1_total += 1
        st.downstream_rq_active += 1
        if v10 or version == "1.1":
            self._prepare(ex, method)
        else:
            # llhttp takes HTTP/0.9 (no version) and 2.0 request lines; neither is HTTP/1.x.
            ex.close = True
            self._local(ex, 505 if version >= "2" else 400,
                        b"http version not supported\n" if version >= "2" else b"bad request\n")
        if len(self.queue) == 1:
            ex.start()
        else:
            self.pause(PAUSE_PIPELINE)

    def _version(self, method: bytes) -> str:
        """The request's HTTP version, as ``get_http_version`` gives it. That formats a string
        (2k instructions, more than all the rest of the head's handling); an HTTP/1.1 request
        that began the read is recognized by its request line instead."""
        if self.first_in_read and self.rdata.startswith(
                b"%s %s HTTP/1.1\r\n" % (method, self.url)):
            return "1.1"
        return self.parser.get_http_version()

    def _local(self, ex: Exchange, status: int, body: bytes) -> None:
        """Answer ``ex`` from here instead of an upstream (sent when its turn comes)."""
        ex.local = simple_response(status, body, close=ex.close or not ex.keep_alive,
                                   head_only=ex.is_head)
        self.count_status(status)

    def _prepare(self, ex: Exchange, method: bytes) -> None:
        """Route the request and build the head sent upstream, or a local answer."""
        ctx = self.ctx
        url = self.url
        host: bytes | None = None
        hosts = 0
        xff: bytes | None = None
        conn_tokens: bytes = b""
        te: bytes | None = None
        upgrade: bytes | None = None
        retryable = method in IDEMPOTENT_METHODS
        expect = False
        out = self.lines
        for n, value in self.special:
            if n == b"host":
                host = value
                hosts += 1
            elif n in HOP_BY_HOP:
                if n == b"connection":
                    conn_tokens += b"," + value.lower()
                elif n == b"upgrade":
                    upgrade = value
                elif n == b"transfer-encoding":
                    # several fields are one list (RFC 9110 §5.3)
                    te = value if te is None else te + b"," + value
                elif n == b"te" and accepts_trailers(value):
                    ex.te_trailers = True
            elif n == b"x-forwarded-for":
                xff = value if xff is None else xff + b", " + value
            elif n in REPLAY_SAFE_FIELDS:  # the app applies it once: safe to send again
                retryable = True
                out.append(b"%s: %s\r\n" % (n, value))
            elif n == b"expect":
                expect = True
                out.append(b"expect: %s\r\n" % value)
            # x-forwarded-proto: replaced below
        if conn_tokens:
            out = drop_nominated(out, conn_tokens)
            if (upgrade is not None and method == b"GET" and upgrade.strip().lower() == b"websocket"
                    and b"upgrade" in (t.strip() for t in conn_tokens.split(b","))):
                # RFC 6455 §4.1: relayed as asked; a 101 turns the connection into a tunnel.
                ex.upgrade = True
                ex.close = True  # answered without a 101, the connection cannot be reused
                out.append(b"connection: upgrade\r\nupgrade: websocket\r\n")
        if ex.te_trailers:
            # The client takes trailers, and so does lameduck on its behalf (RFC 9110 §10.1.4;
            # TE is this hop's own field, so Connection names it).
            out.append(b"te: trailers\r\nconnection: te\r\n")
        if method == b"CONNECT":
            ex.close = True  # answered without a tunnel, the connection closes after
            target = ctx.connect_target(url)
            if target is None:
                self._local(ex, 403, b"CONNECT not allowed\n")
                return
            if not ctx.process.ledger.begin():
                ex.local = GOING_AWAY
                ctx.stats.downstream_rq_going_away += 1
                self.count_status(503)
                return
            ex.admitted = True
            ex.connect = target
            return
        if te is not None:
            if te.strip().lower() != b"chunked":
                # llhttp framed it (chunked last) or will reject it; either way we cannot
                # forward a coding we do not know the end of (RFC 9112 §6.1).
                ex.close = True
                self._local(ex, 501, b"transfer coding not implemented\n")
                return
            if ex.v10:
                # RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means faulty framing: answer this
                # one, then close.
                ex.close = True
            ex.chunked_req = True
            out.append(b"transfer-encoding: chunked\r\n")
        if hosts > 1 or (host is not None and not valid_authority(host)):
            # RFC 9112 §3.2: several Host fields, or one that is not a host[:port], is a 400
            ex.close = True
            self._local(ex, 400, b"missing or repeated host\n" if hosts > 1
                        else b"bad host\n")
            return
        if url[:1] != b"/" and url != b"*":
            absolute = absolute_form(url)
            if absolute is None:
                ex.close = True
                self._local(ex, 400, b"bad request target\n")
                return
            # RFC 9112 §3.2.2: the target's authority replaces Host, for routing and upstream;
            # the upstream gets the origin form.
            host, url = absolute
        elif host is None and not ex.v10:
            # RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400
            ex.close = True
            self._local(ex, 400, b"missing or repeated host\n")
            return
        # RFC 9112 §3.2: Host on every request; empty where the target names no authority
        # (an HTTP/1.0 request without one).
        out.insert(0, b"host: %s\r\n" % (host if host is not None else b""))
        path = url.partition(b"?")[0] if QUERY in url else url  # one memchr, no tuple
        # Answered here, a client that sent "Expect: 100-continue" will not send the body it
        # held back: the connection cannot be reused after the answer (RFC 9110 §10.1.1).
        if ctx.health_check_path is not None and path == ctx.health_check_path:
            live = ctx.process.live
            ex.close = expect
            self._local(ex, 200 if live else 503, b"OK\n" if live else b"DRAINING\n")
            return
        route = self.router.match(host, path)
        if route is None:
            ex.close = expect
            self._local(ex, 404, b"no route\n")
            return
        if ex.upgrade and route.cluster.connector is not None:
            # an HTTP/2 cluster: a WebSocket would need RFC 8441 upstream, not supported
            self._local(ex, 501, b"websocket to an HTTP/2 upstream not supported\n")
            return
        if not ctx.process.ledger.begin():
            ex.close = True
            ex.local = GOING_AWAY if not ex.is_head else GOING_AWAY_HEAD
            ctx.stats.downstream_rq_going_away += 1
            self.count_status(503)
            return
        ex.admitted = True
        ex.retryable = retryable
        cluster = route.cluster
        ex.cluster = cluster
        ex.cstats = cluster.stats
        if cluster.persistence is not None:
            ex.pkey = (find_cookie(out, cluster.cookie_name) if cluster.by_cookie
                       else self.peer.decode())
        ex.route_timeout = route.timeout
        if xff:
            out.append(b"x-forwarded-for: %s, %s\r\nx-forwarded-proto: %s\r\n\r\n"
                       % (xff, self.peer, ctx.scheme))
        else:
            out.append(self.forwarded)  # this connection's peer, formatted once
        ex.head = method + b" " + url + b" HTTP/1.1\r\n" + b"".join(out)

    def on_body(self, body: bytes) -> None:
        ex = self.reading
        if ex is not None:
            ex.request_body(body)

    def on_message_complete(self) -> None:
        ex = self.reading
        self.reading = None
        if ex is not None:
            if ex.upgrade or ex.connect is not None:
                self.upgrading = ex  # llhttp raises HttpParserUpgrade right after this
            elif ex.close or not ex.keep_alive:
                # Its response closes the connection: requests pipelined behind it will not
                # be answered, so they are not read (nor sent upstream).
                self.last_read = True
            ex.request_complete()

    # -- response side ----------------------------------------------------------------------
    def count_status(self, status: int) -> None:
        self.ctx.stats.count_status(status)

    def response_drains(self) -> bool:
        """The drain core's per-response decision (``Connection: close``)."""
        d = self.drain
        if d.drained_by is None and d.listener.quiet:
            return False  # the common case: no drain anywhere, no clock read needed
        was_open = d.drained_by is None
        if not d.on_response(self.loop.time(), self.ctx.rng):
            return False
        if was_open:
            self.ctx.stats.downstream_cx_drain_close += 1
            if d.drained_by is DrainedBy.RESPONSE:
                self.ctx.drain_stats.cx_drained_by_response += 1
        return True

    def _settle(self, ex: Exchange, completed: bool = True) -> None:
        """Take a finished (or abandoned) exchange off the books."""
        ctx = self.ctx
        st = self.stats
        st.downstream_rq_active -= 1
        if ex.retrying:  # every way an exchange ends comes here: its retry slot is given back
            ex.retrying = False
            assert ex.cluster is not None
            ex.cluster.retry_ended(0 < ex.status < 500)
        if ex.admitted:
            ex.admitted = False
            ledger = ctx.process.ledger
            if completed and ex.resp_started:
                ledger.end()
            else:
                ledger.abandon()
            if ledger.draining:  # a shutdown is waiting for the ledger to empty
                ctx.on_request_done()
        if ex.resp_done and ex.resp_started:
            st.downstream_rq_completed += 1

    def exchange_done(self, ex: Exchange) -> None:
        """The response of the head exchange is complete."""
        if self.gone:
            return
        queue = self.queue
        if not queue or queue[0] is not ex:
            return
        queue.popleft()
        self._settle(ex)
        if ex.close or not ex.req_done:
            # Closing (or the response finished before the request body, so the stream cannot
            # be resynced): requests pipelined behind are dropped unanswered, as HTTP/1.1
            # allows (RFC 9112 §9.3.2), and off the books at once.
            self._drop_queue()
            self.staged_close()
            return
        if queue:
            queue[0].start()
            if len(queue) == 1:
                self.resume(PAUSE_PIPELINE)
            return
        if self.paused:
            self.resume(PAUSE_PIPELINE)
        self.idle_since = now = self.loop.time()
        at = now + self.ctx.idle_timeout
        if self.timer is None or at < self.timer_at:
            self.arm(at)
        if self.drain.drained_by is not None and self.drain.on_idle(now) is ConnAction.CLOSE:
            self.staged_close()

    def _drop_queue(self) -> None:
        """Forget the requests still queued (never started): the connection is closing."""
        self.reading = None
        queue = self.queue
        while queue:
            ex = queue.popleft()
            ex.resp_done = True  # a late callback finds it finished
            ex._detach(reusable=False)
            self._settle(ex)

    # -- errors and cuts ----------------------------------------------------------------------
    def protocol_error(self, status: int, body: bytes) -> None:
        """Malformed input: answer in order if we can, then close."""
        if self.closing or self.last_read:
            return  # nothing after the last answered request is read: no answer owed
        st = self.ctx.stats
        st.downstream_cx_protocol_error += 1
        ex = self.reading
        self.reading = None
        self.in_headers = False
        self.last_read = True
        self.pause(PAUSE_CLOSING)
        if ex is not None:
            self._broken_body(ex, status, body)
            return
        resp = simple_response(status, body, close=True)
        st.downstream_rq_total += 1
        self.count_status(status)
        if not self.queue:
            self.write(resp)
            self.staged_close()
            return
        # Behind requests still being answered: answer it when its turn comes.
        ex = Exchange(self, b"", False, False)
        ex.local = resp
        ex.close = True
        ex.req_done = True
        st.downstream_rq_active += 1
        self.queue.append(ex)

    def _broken_body(self, ex: Exchange, status: int, body: bytes) -> None:
        """The body of the request being received is malformed (bad chunk framing): the
        request can never complete. Answer it with the error if nothing was sent yet."""
        ex.close = True
        if ex.local is not None:
            # already answered (or to be answered) from here: that answer stands
            ex.req_done = True
            if ex.resp_started:
                ex.finish()
            return
        if self.queue and self.queue[0] is not ex:
            # queued behind others: it never reaches the upstream
            ex.req_done = True
            self._local(ex, status, body)
            return
        if ex.resp_started:
            self.abort_with_active_request()
            return
        ex._detach(reusable=False)
        ex.local_error(status, body)

    def abort_with_active_request(self) -> None:
        """An upstream failed after this response started: the client can only see a reset."""
        self.ctx.stats.downstream_cx_destroy_local_active_rq += 1
        self.reset()

    def closing_after_queue(self) -> None:
        if self.queue:
            self.queue[-1].close = True
        else:
            self.staged_close()

    # -- tunnel (after a 101) -------------------------------------------------------------------
    def start_tunnel(self, ex: Exchange, head: bytes, ut: asyncio.Transport, rest: bytes,
                     kind: TunnelKind, deflate: bool, up: H1Upstream | None) -> None:
        """Send the 101 (or CONNECT's 200) and relay both sockets from now on; ``up`` is the
        upstream connection that switched protocols (None for a CONNECT destination)."""
        t = self.transport
        assert t is not None
        self.upgrading = None
        self.write(head)
        self.flush()  # the 101 goes out before any relayed byte
        st = self.ctx.stats
        st.downstream_cx_upgrades_total += 1
        st.downstream_cx_upgrades_active += 1
        if up is not None:
            up.sink = None
            up.alive = False  # never back to the pool
        early, ex.early = ex.early, b""
        self.paused = 0
        relay = Relay(self.loop, t, ut, kind, self.ctx.drain.grace,
                      lambda cut: self._tunnel_ended(ex, up, cut), rsv1_allowed=deflate)
        self.relay = relay
        relay.start(early, rest)
        if self.drain.proactive_fired:
            relay.drain_by(DrainedBy.PROACTIVE)  # its moment has passed already

    def _tunnel_ended(self, ex: Exchange, up: H1Upstream | None, cut: bool) -> None:
        """Both sockets of the tunnel are closed: settle the books of both connections."""
        self.relay = None
        self.ctx.stats.downstream_cx_upgrades_active -= 1
        ex._detach(reusable=False)
        if up is not None:
            up.connection_lost(None)  # the pool's and the cluster's bookkeeping
        ex.resp_done = True
        if cut and ex.admitted:
            ex.admitted = False
            self.ctx.process.ledger.cut_one()
            self.ctx.drain_stats.cut_reset += 1
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
            self._settle(ex, completed=not cut)
        self.connection_lost(None)

    def cut(self) -> None:
        """The shutdown deadline: a 503 where no response byte was sent, else a reset."""
        if self.relay is not None:
            self.relay.drain_by(DrainedBy.END)  # reset both sides; counted when they are gone
            return
        ds = self.ctx.drain_stats
        reset = False
        for ex in list(self.queue):
            if not ex.admitted:
                continue
            self.ctx.process.ledger.cut_one()
            ex.admitted = False
            ex.resp_done = True  # a connect still pending finds it finished and sends nothing
            ex._detach(reusable=False)
            if ex.resp_started:
                ds.cut_reset += 1
                reset = True
            else:
                ds.cut_before_response += 1
        if reset or self.transport is None:
            self.reset()
            return
        if self.queue and self.queue[0].resp_started:
            # a local response in progress is complete already; nothing to add
            pass
        elif self.queue:
            self.count_status(503)
            self.write(GOING_AWAY_HEAD if self.queue[0].is_head else GOING_AWAY)
        self.staged_close()

    # -- closing ------------------------------------------------------------------------------
    def staged_close(self) -> None:
        """Shut down writing, keep reading briefly, then close (RFC 9112 §9.6)."""
        if self.closing:
            return
        self.closing = True
        self.last_read = True  # what the parser still holds of this read is not a request
        self.drain.close()
        t = self.transport
        if t is None or self.gone:
            return
        self.flush()
        if self.paused:
            self.paused = 0
            t.resume_reading()
        if t.can_write_eof():
            t.write_eof()
            if self.timer is not None:  # an earlier timer (a drain moment) must not end it early
                self.timer.cancel()
                self.timer = None
            self.arm(self.loop.time() + LINGER)
        else:
            t.close()

    def no_new_work(self) -> None:
        """T has passed: nothing to send now. HTTP/1.1 has no notice outside a response; a
        request that still comes is answered going away with ``Connection: close``."""

    def close_at_end(self) -> None:
        """The drain is over: an idle connection is closed now."""
        if self.relay is not None:
            self.relay.drain_by(DrainedBy.END)
            return
        if self.drain.drain_at_end(self.loop.time()):
            self.ctx.drain_stats.cx_closed_at_end += 1
        self.staged_close()

    # -- timers ---------------------------------------------------------------------------------
    def arm(self, at: float) -> None:
        if at == math.inf:
            return
        if self.timer is not None:
            if self.timer_at <= at:
                return
            self.timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self.on_timer)

    def arm_drain(self) -> None:
        at = self.drain.next_deadline()
        if at is not None:
            self.arm(at)

    def on_drain_event(self, event: object) -> None:
        """A drain started on this connection's listener: draw the moment, arm the timer."""
        self.drain.on_drain_event(event, self.ctx.rng)  # type: ignore[arg-type]
        self.arm_drain()

    def on_timer(self) -> None:
        self.timer = None
        if self.gone:
            return
        t = self.transport
        now = self.loop.time()
        ctx = self.ctx
        if self.closing:
            if t is not None:
                t.close()
            return
        nxt: list[float] = []
        queue = self.queue
        # busy: a request is being answered (not just a local answer awaiting a request body)
        busy = bool(queue) and (queue[0].local is None or not queue[0].resp_started)
        if self.in_headers:
            at = self.req_started + ctx.request_headers_timeout
            if now >= at:
                ctx.stats.downstream_rq_header_timeout += 1
                self.protocol_error(408, b"request header timeout\n")
                return
            nxt.append(at)
        elif not busy:
            at = self.idle_since + ctx.idle_timeout
            if now >= at:
                ctx.stats.downstream_cx_idle_timeout += 1
                self.staged_close()
                return
            nxt.append(at)
        d = self.drain
        dl = d.next_deadline()
        if dl is not None and now >= dl:
            was_open = d.drained_by is None
            action = d.on_timer(now, idle=not busy and not self.in_headers)
            if was_open and d.drained_by is DrainedBy.PROACTIVE:
                ctx.stats.downstream_cx_drain_close += 1
                ctx.drain_stats.cx_drained_proactive += 1
            if action is ConnAction.DRAIN and self.relay is not None:
                # The proactive moment (also of a connection a response drained): its tunnel
                # ends now (as in Envoy).
                self.relay.drain_by(DrainedBy.PROACTIVE)
            if action is ConnAction.CLOSE:
                self.staged_close()
                return
            dl = d.next_deadline()
        if dl is not None:
            nxt.append(dl)
        if nxt:
            self.arm(min(nxt))
