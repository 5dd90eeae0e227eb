"""An HTTP/2 stream as one side of the tunnel ``Relay`` (``lameduck.tunnel.relay``): a CONNECT
stream (RFC 9113 §8.5) relayed to its TCP destination, or a WebSocket over an extended CONNECT
(RFC 8441) relayed to its upstream.

What the client sends is acknowledged (WINDOW_UPDATE) once the relay wrote it, so the client's
window is the bound on what waits here; what the relay writes goes out as DATA, and the other
side is paused while the client's window holds it back. END_STREAM and FIN map onto each other,
so half-closes pass through.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lameduck.http2.connection import ErrorCode

if TYPE_CHECKING:
    from lameduck.http2.downstream import H2Downstream, H2Stream

OUTBOUND_HIGH = 256 * 1024


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
