"""HTTP/2 upstreams (a cluster with ``protocol: h2``): many exchanges share one connection.

An exchange (HTTP/1 or HTTP/2 downstream) talks to an upstream through the same calls either
way (``UpstreamConn`` in ``http1.upstream``); here each exchange gets an ``H2UpstreamStream``,
and the streams of an endpoint share the ``H2UpstreamConnection``s kept in its
``Endpoint.shared`` list. A connection takes new streams while the upstream's
MAX_CONCURRENT_STREAMS (and ours) allow; past that, or once the upstream sent GOAWAY, a new
connection is opened. Where a stream goes and when it is sent is decided in
``upstream.shared`` (``Placement``, ``SharedConn``); this module is the HTTP/2 of it: the
frame layer, the streams' events, the socket. What HTTP/2 proves unprocessed
(REFUSED_STREAM, or a stream above a GOAWAY's last id) is handed back to the exchange as
refused: safe to send again whatever the method (RFC 9113 §8.7). That is how lameduck rides
through an upstream's own drain without failing a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from lameduck.proxy.fields import trailer_fields
from lameduck.proxy.message import RequestHead
from lameduck.upstream.connector import (
    ExchangeSink,
    ResponseTimeouts,
    UpstreamConn,
    UpstreamError,
)
from lameduck.upstream.shared import REFUSE, SEND, Placement, SharedConn

from .client import H2Client
from .connection import H2Limits
from .events import (
    ConnectionError,
    DataReceived,
    Event,
    GoAwayReceived,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from .frames import ErrorCode

if TYPE_CHECKING:
    from lameduck.stats import ClusterStats
    from lameduck.upstream.cluster import Cluster
    from lameduck.upstream.pool import Endpoint

# Request body bytes held per stream (flow control) before the client is paused.
OUTBOUND_HIGH: Final = 256 * 1024


def head_fields(head: RequestHead) -> list[tuple[bytes, bytes]]:
    """``head`` as an HTTP/2 header list, formatted once: pseudo-fields first (RFC 9113 §8.3),
    no :authority where the request named none (an HTTP/1.0 one without Host, RFC 9113
    §8.3.1). "te: trailers" is the one TE HTTP/2 allows (gRPC needs it); the connection layer
    lower-cases the names and leaves out connection-specific fields (RFC 9113 §8.2.2)."""
    authority = head.authority
    fields = [(b":method", head.method), (b":scheme", b"http"),
              (b":authority", authority), (b":path", head.path)] if authority else [
              (b":method", head.method), (b":scheme", b"http"), (b":path", head.path)]
    fields.extend(head.fields)
    if head.te_trailers:
        fields.append((b"te", b"trailers"))
    return fields


class H2UpstreamStream(UpstreamConn):
    """One exchange's stream: what an ``H1Upstream`` is to an exchange, on a shared socket."""

    transport = None  # never handed to a tunnel (no 101 in HTTP/2)

    def __init__(self, conn: H2UpstreamConnection) -> None:
        super().__init__(multiplexed=True)
        self.conn = conn
        self.sid = 0  # 0 until its HEADERS are sent
        self.started = False
        self.head_seen = False
        self.ended = False  # our END_STREAM went out (or the stream is gone)
        self.done = False  # finished on the wire (complete, reset, refused or lost)
        self.unacked = 0  # response bytes received, not yet acknowledged (paused)
        # The route timeout and the per_try_idle_timeout, from the request's end: one timer,
        # re-armed when it fires early (an upstream byte moved the idle deadline on).
        self.timer: asyncio.TimerHandle | None = None
        self.timeouts = ResponseTimeouts()
        # Waiting for a free stream slot: the request as it will be sent.
        self.fields: list[tuple[bytes, bytes]] = []
        self.body = False
        self.no_body = False
        self.held: list[bytes] = []
        self.held_size = 0
        self.held_paused = False
        self.end_trailers: list[tuple[bytes, bytes]] | None = None  # the request's trailers

    @property
    def reusable(self) -> bool:
        """A stream is used once; the connection is what is shared."""
        return False

    # -- what an exchange calls ----------------------------------------------------------------
    def start(self, sink: ExchangeSink, head: RequestHead) -> None:
        self.started = True
        self.sink = sink
        self.fields = head_fields(head)
        self.body = head.has_body
        self.no_body = head.method == b"HEAD"
        self.ended = not self.body
        how = self.conn.start(self)
        if how == SEND:
            self.send_head()
        elif how == REFUSE:
            self.refuse()  # never sent: the exchange may try again, then answers 503
        # else queued: sent when a slot frees (or refused with the rest)

    def send_head(self) -> None:
        conn = self.conn
        h2 = conn.h2
        self.sid = sid = h2.send_request(self.fields, end_stream=not self.body,
                                         head=self.no_body)
        self.fields = []
        conn.streams[sid] = self
        if self.held:
            for data in self.held:
                h2.send_data(sid, data)
            self.held = []
            self.held_size = 0
        if self.body and self.ended:
            self._end_stream()
        conn.kick()
        if self.held_paused and h2.outbound_buffered(sid) <= OUTBOUND_HIGH:
            self.held_paused = False
            if self.sink is not None:
                self.sink.resume_request_body()
        elif self.held_paused:
            self.held_paused = False  # still over: WindowOpened resumes it

    def write(self, data: bytes) -> None:
        if self.done or not data:
            return
        if not self.sid:
            self.held.append(data)
            self.held_size += len(data)
            if self.held_size > OUTBOUND_HIGH and not self.held_paused and self.sink is not None:
                self.held_paused = True  # waiting for a slot: hold the client back too
                self.sink.pause_request_body()
            return
        conn = self.conn
        conn.h2.send_data(self.sid, data)
        conn.kick()
        if conn.h2.outbound_buffered(self.sid) > OUTBOUND_HIGH and self.sink is not None:
            self.sink.pause_request_body()  # resumed on WindowOpened

    def end(self, trailers: list[tuple[bytes, bytes]] | None, timeout: float,
            idle_timeout: float) -> None:
        """The request was sent whole: the timeouts run from here (see ``UpstreamConn``)."""
        if self.done:
            return
        if (timeout > 0 or idle_timeout > 0) and (
                at := self.timeouts.start(self.conn.loop.time(), timeout, idle_timeout)):
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.conn.loop.call_at(at, self._timed_out)
        if self.ended:
            return
        self.ended = True
        self.end_trailers = trailers
        if self.sid:
            self._end_stream()
            self.conn.kick()

    def _end_stream(self) -> None:
        if self.end_trailers:
            self.conn.h2.send_trailers(self.sid, self.end_trailers)
        else:
            self.conn.h2.send_data(self.sid, b"", end_stream=True)

    def pause_reading(self) -> None:
        """The client is behind: stop acknowledging this stream's DATA, so its window closes."""
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False
        if self.unacked:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_stream_data(self.sid, n)
            self.conn.kick()

    def close(self) -> None:
        """The exchange lets go: a stream it did not see to the end is cancelled."""
        self.sink = None
        if self.done:
            return
        conn = self.conn
        self._finish()
        if not self.started:
            conn.give_back()
        elif self.sid:
            conn.h2.reset_stream(self.sid, ErrorCode.CANCEL)
            conn.stats.upstream_rq_tx_reset += 1
            conn.kick()
        conn.stream_gone()

    def abort(self) -> None:
        self.close()

    # -- what the connection reports -----------------------------------------------------------
    def _finish(self) -> None:
        self.done = True
        self.alive = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.sid:
            self.conn.streams.pop(self.sid, None)
        elif self.started:
            self.conn.leave(self)  # it waited for a slot
        self.unacked = 0  # only stream credit, and the stream is done

    def _timed_out(self) -> None:
        self.timer = None
        sink = self.sink
        if sink is None or self.done:
            return
        # cut: RST_STREAM (CANCEL) upstream
        if at := self.timeouts.expire(self.conn.loop.time(), sink, self.head_seen, self.close):
            self.timer = self.conn.loop.call_at(at, self._timed_out)

    def on_response(self, ev: ResponseReceived) -> None:
        sink = self.sink
        self.got_bytes = True
        if sink is None:
            return
        if self.timeouts.idle:  # no clock read per frame without an idle timeout
            self.timeouts.touch(self.conn.loop.time())
        if ev.status < 200:
            sink.on_informational(ev.status, ev.headers)
            return
        length: int | None = None
        for name, value in ev.headers:
            if name == b"content-length":
                length = int(value)
        self.head_seen = True
        sink.on_response_head(ev.status, ev.headers, length, False)
        if ev.end_stream and self.sink is sink:
            self.complete()

    def on_data(self, ev: DataReceived) -> None:
        sink = self.sink
        h2 = self.conn.h2
        # The connection's credit goes back at once: the bytes are handed on, and a paused
        # stream must not hold the window its neighbours on this connection share.
        h2.acknowledge_connection_data(ev.flow_len)
        if sink is None:
            h2.acknowledge_stream_data(self.sid, ev.flow_len)
            return
        if self.timeouts.idle:  # no clock read per frame without an idle timeout
            self.timeouts.touch(self.conn.loop.time())
        if ev.data:
            sink.on_response_body(ev.data)
        if self.read_paused:
            self.unacked += ev.flow_len
        else:
            h2.acknowledge_stream_data(self.sid, ev.flow_len)
        if ev.end_stream and self.sink is sink:
            self.complete()

    def complete(self, trailers: list[tuple[bytes, bytes]] | None = None) -> None:
        sink = self.sink
        if not self.ended and self.sid:
            # Answered before the request body was all sent (a 413, an early 200): stop
            # sending it, or the stream stays open on both sides and holds a slot for good.
            self.conn.h2.reset_stream(self.sid, ErrorCode.CANCEL)
            self.conn.kick()
        self.ended = True
        self._finish()
        self.sink = None
        self.conn.stream_gone()
        if sink is not None:
            sink.on_response_complete(trailers)

    def take_over(self) -> asyncio.Transport | None:
        return None  # no 101 in HTTP/2: a stream never becomes a tunnel of its own

    def tunnel_closed(self) -> None:
        pass

    def refuse(self) -> None:
        """Never sent (or proved unprocessed): the exchange may send it again elsewhere."""
        self.on_reset(ErrorCode.REFUSED_STREAM)

    def on_reset(self, code: int) -> None:
        sink = self.sink
        self.ended = True
        self._finish()
        self.sink = None
        self.conn.stream_gone()
        if sink is None:
            return
        if code == ErrorCode.REFUSED_STREAM and not self.head_seen:
            sink.on_upstream_refused()
        else:
            sink.on_upstream_error(UpstreamError.RESET, self.head_seen)


class H2UpstreamConnection(SharedConn):
    """One HTTP/2 connection to an endpoint, shared by the streams of many exchanges; its
    stream slots are counted by ``SharedConn``."""

    def __init__(self, endpoint: Endpoint, stats: ClusterStats, limits: H2Limits,
                 max_streams: int, expected: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(max_streams, expected)
        self.endpoint = endpoint
        self.stats = stats
        self.loop = loop
        self.h2 = H2Client(limits, loop.time())
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2UpstreamStream] = {}
        self.closed_here = False
        self.flush_pending = False
        self.idle_since = loop.time()
        self.on_closed: list[Callable[[H2UpstreamConnection], None]] = []

    # -- what SharedConn asks ----------------------------------------------------------------
    def wire_can_open(self) -> bool:
        return self.h2.can_open

    def on_wire(self) -> int:
        return len(self.streams)

    def peer_limit(self) -> int:
        h2 = self.h2
        return h2.peer_max_concurrent_streams if h2.settings else -1

    def new_stream(self) -> H2UpstreamStream:
        return H2UpstreamStream(self)

    def now(self) -> float:
        return self.loop.time()

    def close(self) -> None:
        """GOAWAY(NO_ERROR) and close: no stream is cut (only idle ones are closed so)."""
        if self.transport is None or self.closed_here:
            return
        self.closed_here = True
        self.alive = False
        self.h2.close()
        self.flush()
        self.transport.close()

    def sever(self) -> None:
        """Cut by its endpoint's drain stop: GOAWAY and close; its streams fail."""
        self.close()

    def kick(self) -> None:
        """Write what the frame layer queued, once per loop iteration."""
        if not self.flush_pending:
            self.flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.flush_pending = False
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # -- asyncio -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.stats.upstream_cx_total += 1
        self.stats.upstream_cx_http2_total += 1
        self.stats.upstream_cx_active += 1
        ep = self.endpoint
        ep.cx_total += 1
        ep.cx_active += 1
        ep.conns.add(self)
        self.h2.initiate()
        self.flush()

    def data_received(self, data: bytes) -> None:
        h2 = self.h2
        events = h2.receive(data, self.loop.time())
        streams = self.streams
        # What one read produces for a client leaves in one write, and leaves at all: an
        # HTTP/2 client connection writes what its streams queued when uncorked.
        corked: list[ExchangeSink] = []
        for ev in events:
            t = type(ev)
            if t is GoAwayReceived or t is ConnectionError:
                continue
            s = streams.get(ev.stream_id)  # type: ignore[union-attr]
            if s is not None and s.sink is not None and s.sink not in corked:
                s.sink.cork()
                corked.append(s.sink)
        try:
            self._dispatch(events)
        finally:
            for sink in corked:
                sink.uncork()

    def _dispatch(self, events: list[Event]) -> None:
        streams = self.streams
        for ev in events:
            t = type(ev)
            if t is DataReceived:
                s = streams.get(ev.stream_id)  # type: ignore[union-attr]
                if s is not None:
                    s.on_data(ev)  # type: ignore[arg-type]
                else:
                    self.h2.acknowledge_received_data(ev.stream_id, ev.flow_len)  # type: ignore[union-attr]
            elif t is ResponseReceived:
                s = streams.get(ev.stream_id)  # type: ignore[union-attr]
                if s is not None:
                    s.on_response(ev)  # type: ignore[arg-type]
            elif t is TrailersReceived:
                s = streams.get(ev.stream_id)  # type: ignore[union-attr]
                if s is not None:
                    s.complete(trailer_fields(ev.headers) or None)  # type: ignore[union-attr]
            elif t is StreamReset:
                s = streams.get(ev.stream_id)  # type: ignore[union-attr]
                if s is not None:
                    s.on_reset(ev.code)  # type: ignore[union-attr]
            elif t is WindowOpened:
                s = streams.get(ev.stream_id)  # type: ignore[union-attr]
                if s is not None and s.sink is not None:
                    s.sink.resume_request_body()
            elif t is GoAwayReceived:
                if not self.goaway:
                    self.goaway = True  # no new streams here; the pool opens another
                    self.stats.upstream_cx_close_notify += 1
            elif t is ConnectionError:
                self.alive = False
        self.flush()
        if not self.alive and self.transport is not None:
            self.closed_here = True
            self.transport.close()  # connection_lost fails what is left
            return
        if self.goaway:
            self.refuse_waiting()  # retried on another connection
            if not self.busy:
                self.close()
            return
        self.start_waiting()  # the upstream's SETTINGS may have made room

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if not self.closed_here:
            self.stats.upstream_cx_destroy_remote += 1
        self.stats.upstream_cx_active -= 1
        ep = self.endpoint
        ep.cx_active -= 1
        ep.conns.discard(self)
        self.refuse_waiting()
        for s in list(self.streams.values()):
            s.on_reset(ErrorCode.INTERNAL_ERROR)
        for cb in self.on_closed:
            cb(self)
        self.on_closed = []


class H2Pool(Placement):
    """Streams for the exchanges of one ``protocol: h2`` cluster (its ``connect``): placed by
    ``Placement``, on connections opened here."""

    def __init__(self, cluster: Cluster, limits: H2Limits, max_streams: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(max_streams, loop)
        self.cluster = cluster
        self.limits = limits

    async def open(self, ep: Endpoint, expected: int) -> SharedConn:
        cluster = self.cluster
        stats = cluster.stats

        def factory() -> H2UpstreamConnection:
            conn = H2UpstreamConnection(ep, stats, self.limits, self.max_streams, expected,
                                        self.loop)
            conn.on_closed.append(ep.forget_shared)
            return conn

        began = self.loop.time()
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(factory, ep.host, ep.port), cluster.connect_timeout)
            stats.upstream_cx_connect_ms.record((self.loop.time() - began) * 1000.0)
        except TimeoutError:
            stats.upstream_cx_connect_timeout += 1
            ep.cx_connect_fail += 1
            raise
        except OSError:
            ep.cx_connect_fail += 1
            raise
        if not conn.alive:
            raise ConnectionResetError("upstream closed the connection at once")
        return conn
