"""An HTTP/2 CONNECT stream (RFC 9113 §8.5) relayed to a TCP destination on the allow-list.

DATA from the client goes to the socket (acknowledged once written, so the client's window is
the bound on what waits here); bytes from the socket go out as DATA (the socket is paused while
the client's window holds them back). END_STREAM and FIN map onto each other, so half-closes
pass through. The drain core's ``TunnelDrain`` decides the end when the connection is drained:
a CONNECT stream sends no further response, so it cannot be told to go away; drained
proactively it is reset once G has elapsed (as Envoy's draining docs have it), and counted.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lameduck.drain.connection import DrainedBy
from lameduck.drain.tunnel import TunnelAction, TunnelDrain, TunnelKind
from lameduck.http2.connection import ErrorCode

if TYPE_CHECKING:
    from lameduck.http2.downstream import H2Downstream, H2Stream

OUTBOUND_HIGH = 256 * 1024


class H2ConnectTunnel(asyncio.Protocol):
    """The destination socket of one CONNECT stream."""

    def __init__(self, conn: H2Downstream, stream: H2Stream, host: str, port: int,
                 grace: float) -> None:
        self.conn = conn
        self.stream = stream
        self.host = host
        self.port = port
        self.drain = TunnelDrain(TunnelKind.OPAQUE, grace, http2=True)
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []  # client bytes before the socket is open
        self.unacked = 0
        self.write_paused = False
        self.client_done = False  # END_STREAM from the client
        self.up_done = False  # FIN from the destination
        self.ended = False
        # Not a byte to the client before its 200 HEADERS: ``_opened`` sends them after
        # connection_made, and a destination that speaks first is read meanwhile (uvloop
        # starts reading after connection_made whatever it asked), so its bytes wait here.
        self.opened = False  # the 200 HEADERS went out
        self.early = b""  # destination bytes that came before it
        self.early_eof = False
        self.timer: asyncio.TimerHandle | None = None
        self.rx = 0  # bytes relayed from the client, and to it (the access log's)
        self.tx = 0

    # -- opening ----------------------------------------------------------------------------
    def open(self, timeout: float) -> None:
        loop = self.conn.loop
        fut = asyncio.ensure_future(asyncio.wait_for(
            loop.create_connection(lambda: self, self.host, self.port), timeout))
        fut.add_done_callback(self._opened)

    def _opened(self, fut: asyncio.Future[tuple[asyncio.Transport, H2ConnectTunnel]]) -> None:
        failed = fut.cancelled() or fut.exception() is not None
        if self.ended:
            if not failed and self.transport is not None:
                self.transport.abort()
            return
        conn = self.conn
        if failed:
            self.ended = True
            self._give_back()
            conn.tunnel_failed(self.stream)
            return
        conn.tunnel_open(self.stream)
        self.opened = True
        t = self.transport
        assert t is not None
        if self.early:
            early, self.early = self.early, b""
            self.data_received(early)
        if self.early_eof:
            self.eof_received()
        for piece in self.pending:
            t.write(piece)
        self.pending = []
        if self.unacked:
            n, self.unacked = self.unacked, 0
            conn.h2.acknowledge_received_data(self.stream.sid, n)
        if self.client_done and t.can_write_eof():
            t.write_eof()
        conn.kick()

    # -- client side ------------------------------------------------------------------------
    def from_client(self, data: bytes, flow_len: int, end: bool) -> None:
        if self.ended:
            self.conn.h2.acknowledge_received_data(self.stream.sid, flow_len)
            return
        t = self.transport
        self.rx += len(data)
        if t is None or not self.opened:
            # Held until ``_opened`` writes what came before, in order: the socket may be
            # connected (connection_made) a loop turn before the future's callback runs.
            if data:
                self.pending.append(data)
            self.unacked += flow_len
            t = None
        else:
            if data:
                t.write(data)
            if self.write_paused:
                self.unacked += flow_len
            else:
                self.conn.h2.acknowledge_received_data(self.stream.sid, flow_len)
        if end:
            self.client_done = True
            if t is not None and t.can_write_eof() and not t.is_closing():
                t.write_eof()
            self._maybe_done()

    def window_opened(self) -> None:
        if self.transport is not None and not self.ended and self.stream.resp_started:
            self.transport.resume_reading()

    def pause_reading(self) -> None:
        """The client's socket is full: stop reading the destination."""
        if self.transport is not None and not self.ended:
            self.transport.pause_reading()

    # -- destination side (asyncio) ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.ended:
            return
        if not self.opened:
            self.early += data
            return
        conn = self.conn
        sid = self.stream.sid
        self.tx += len(data)
        conn.h2.send_data(sid, data)
        if conn.h2.outbound_buffered(sid) > OUTBOUND_HIGH and self.transport is not None:
            self.transport.pause_reading()
        conn.kick()

    def eof_received(self) -> bool:
        if not self.opened:
            self.early_eof = True
            return True
        if not self.ended:
            self.up_done = True
            self.conn.h2.send_data(self.stream.sid, b"", end_stream=True)
            self.conn.kick()
            self._maybe_done()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ended:
            return
        if not self.up_done:
            # The destination reset or vanished: RFC 9113 §8.5 says CONNECT_ERROR.
            self._end(ErrorCode.CONNECT_ERROR, cut=False)
            return
        self._maybe_done()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.unacked:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_received_data(self.stream.sid, n)
            self.conn.kick()

    # -- ending -----------------------------------------------------------------------------
    def _maybe_done(self) -> None:
        if self.client_done and self.up_done and not self.ended:
            self.ended = True
            self._cancel_timer()
            if self.transport is not None:
                self.transport.close()
            self.drain.ended()
            self.conn.tunnel_done(self.stream)

    def _give_back(self) -> None:
        """Client bytes read but never written to the destination: window credit all the same."""
        if self.unacked:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_received_data(self.stream.sid, n)

    def _end(self, code: ErrorCode, cut: bool) -> None:
        """Reset the stream and drop the socket."""
        if self.ended:
            return
        self.ended = True
        self._give_back()
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()
        self.conn.tunnel_reset(self.stream, code, cut)

    def abort(self) -> None:
        """The stream is gone (client reset, connection lost, cut): drop the socket."""
        if not self.ended:
            self.ended = True
            self._give_back()
            self._cancel_timer()
            if self.transport is not None:
                self.transport.abort()

    def drain_by(self, by: DrainedBy) -> None:
        if self.ended:
            return
        self._act(self.drain.drain(self.conn.loop.time(), by))
        at = self.drain.next_deadline()
        if at is not None and not self.ended:
            self._cancel_timer()
            self.timer = self.conn.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if not self.ended:
            self._act(self.drain.timer(self.conn.loop.time()))
        # uvloop's timers have millisecond resolution and may fire just before the deadline:
        # then nothing happened yet, and the timer must be set again (or the tunnel would
        # never be reset).
        at = self.drain.next_deadline()
        if at is not None and not self.ended and self.timer is None:
            self.timer = self.conn.loop.call_at(at, self._on_timer)

    def _act(self, action: TunnelAction) -> None:
        if action is TunnelAction.RESET_BOTH:
            self._end(ErrorCode.CANCEL, cut=True)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class StreamSide(asyncio.Transport):
    """An HTTP/2 stream as the client side of a ``Relay``: writes become DATA, the FIN
    END_STREAM, an abort RST_STREAM(CANCEL); what the client sends is fed in by the shell.
    Reading is paused by holding back WINDOW_UPDATEs. Until the relay takes it (a CONNECT's
    destination is still connecting), what the client sends is held, its credit with it.

    On a CONNECT stream, a close before the destination's FIN went out as END_STREAM means the
    destination's TCP connection broke: RST_STREAM(CONNECT_ERROR) (RFC 9113 §8.5)."""

    def __init__(self, conn: H2Downstream, stream: H2Stream) -> None:
        super().__init__()
        self.conn = conn
        self.stream = stream
        self.end: asyncio.Protocol | None = None  # the relay's end reading this side
        self.closing = False
        self.eof_sent = False
        self.reset = False  # it ended with our RST_STREAM
        self.paused = False
        self.unacked = 0
        self.lost = False
        self.early: list[bytes] = []  # what the client sent before the relay took it
        self.early_eof = False

    # -- what the relay calls -----------------------------------------------------------------
    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.end = protocol  # type: ignore[assignment]

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.end is not None
        return self.end

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or self.eof_sent or not data:
            return
        conn = self.conn
        conn.h2.send_data(self.stream.sid, bytes(data))
        conn.kick()
        if conn.h2.outbound_buffered(self.stream.sid) > OUTBOUND_HIGH and self.end is not None:
            self.end.pause_writing()  # type: ignore[attr-defined]  # the client's window is full

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if not self.eof_sent and not self.closing:
            self.eof_sent = True
            self.conn.h2.send_data(self.stream.sid, b"", end_stream=True)
            self.conn.kick()

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if self.closing:
            return
        if self.stream.connect is not None and not self.eof_sent:
            self._reset(ErrorCode.CONNECT_ERROR)  # the destination is gone without its FIN
            return
        self.write_eof()
        self.closing = True
        self.conn.loop.call_soon(self.gone)

    def abort(self) -> None:
        if not self.closing:
            self._reset(ErrorCode.CANCEL)

    def _reset(self, code: ErrorCode) -> None:
        self.closing = self.reset = True
        conn = self.conn
        conn.h2.reset_stream(self.stream.sid, code)
        conn.h2stats.tx_reset += 1
        conn.kick()
        conn.loop.call_soon(self.gone)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        end = self.end
        if self.early and end is not None:
            early, self.early = self.early, []
            for data in early:
                end.data_received(data)
        if self.early_eof and end is not None:
            self.early_eof = False
            end.eof_received()
        if self.unacked and not self.paused:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_received_data(self.stream.sid, n)
            self.conn.kick()

    # -- what the shell calls ---------------------------------------------------------------------
    def received(self, data: bytes, flow_len: int, end_stream: bool) -> None:
        if self.lost:
            self.conn.h2.acknowledge_received_data(self.stream.sid, flow_len)
            return
        end = self.end
        if end is None:  # held until the relay starts reading (``resume_reading``)
            if data:
                self.early.append(data)
            self.unacked += flow_len
            self.early_eof = self.early_eof or end_stream
            return
        if data:
            end.data_received(data)
        if self.paused:
            self.unacked += flow_len
        else:
            self.conn.h2.acknowledge_received_data(self.stream.sid, flow_len)
        if end_stream:
            end.eof_received()

    def window_opened(self) -> None:
        if self.end is not None and not self.lost:
            self.end.resume_writing()  # type: ignore[attr-defined]

    def pause_source(self) -> None:
        """The client's socket is full: stop reading the other side."""
        if self.end is not None and not self.lost:
            self.end.pause_writing()  # type: ignore[attr-defined]

    def gone(self) -> None:
        """The stream ended (closed or reset by us, reset by the client, connection lost)."""
        if self.lost:
            return
        self.lost = True
        self.closing = True
        self.early = []
        if self.unacked:
            n, self.unacked = self.unacked, 0
            self.conn.h2.acknowledge_received_data(self.stream.sid, n)
        if self.end is not None:
            self.end.connection_lost(None)
