"""A lean sans-IO HTTP/2 server connection (RFC 9113) and the frame layer it shares with the
client (``client.py``): bytes in, events out, bytes to send.

Why not the ``h2`` library: per-frame objects and validation layers cost ~8x our budget, and
its GOAWAY ends the connection (python-hyper/h2#1181) where lameduck's drain needs two
(docs/drain.md). Frames are read in place from the bytes of each read (only a frame not whole
yet is kept, in a bytearray) and dispatched on the type number; streams are small slotted
objects.

``H2Connection`` is the part that does not depend on the role: the frame loop, DATA and
CONTINUATION, the control frames, flow control both ways, stream endings and the abuse
counters. ``H2Server`` adds the preface it expects, its SETTINGS, request validation,
responses and the two-step drain; ``client.H2Client`` the other side, for upstreams. The
three are compiled together by mypyc (an interpreted class cannot subclass a compiled one).

Rules the server keeps (RFC 9113 unless noted; those not about requests, refusal or the
drain are kept by the client too — see client.py for how they read from its side):

- Preface: the client magic, then a SETTINGS frame, else GOAWAY(PROTOCOL_ERROR) (§3.4).
  Our SETTINGS: MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE,
  ENABLE_CONNECT_PROTOCOL=1 (RFC 8441), MAX_FRAME_SIZE if not the default; then a
  connection WINDOW_UPDATE up to ``connection_window``. SETTINGS are acked both ways.
- Frame size: above what we accept, bad fixed lengths (PING 8, RST/WINDOW_UPDATE 4,
  SETTINGS 6n, ack 0, GOAWAY ≥ 8) → FRAME_SIZE_ERROR; PRIORITY ≠ 5 → stream error (§6.3).
- Stream ids: client streams are odd and increase; an even id, a lower id never opened, or
  DATA/WINDOW_UPDATE/RST_STREAM on an idle stream → PROTOCOL_ERROR (§5.1.1, §5.1).
  Frames on closed streams (§5.1): ignored after we reset the stream; WINDOW_UPDATE,
  RST_STREAM, PRIORITY ignored; DATA → stream error STREAM_CLOSED; HEADERS → connection
  error STREAM_CLOSED. Closed ids are remembered for the last ``_CLOSED_MEMORY`` streams.
- Header blocks: CONTINUATION must follow on the same stream with nothing in between, else
  PROTOCOL_ERROR; the buffered block is bounded (a CONTINUATION flood gets
  ENHANCE_YOUR_CALM). Every block is decoded even when the stream is refused or closed, to
  keep the HPACK table in step; decoding errors → COMPRESSION_ERROR.
- Requests (§8.3): pseudo-fields before regular ones, no duplicates or unknown ones; non-CONNECT
  has :method :scheme :path; CONNECT has only :method and :authority, extended CONNECT
  (RFC 8441 :protocol) has all four; names lower-case visible ASCII, values without NUL/CR/LF
  or edge whitespace; no connection-specific fields; te only "trailers"; content-length must
  match the DATA received. A malformed request → RST_STREAM(PROTOCOL_ERROR) + StreamReset.
  Trailers must end the stream and carry no pseudo-fields. The field rules are HTTP/3's too
  (RFC 9114 §4.2, §4.3): they live in ``proxy.sections``, for both codecs. Host vs
  :authority is left to the shell.
- Refusal: past MAX_CONCURRENT_STREAMS or above the final GOAWAY's id → RST_STREAM
  (REFUSED_STREAM), not reported. A PRIORITY (frame or HEADERS flag) that depends on its own
  stream → stream error PROTOCOL_ERROR; PRIORITY is otherwise ignored and opens nothing.
- Flow control (§5.2, §6.9): receive windows enforced (connection → connection error, stream
  → stream error FLOW_CONTROL_ERROR); windows above 2^31-1 → FLOW_CONTROL_ERROR; increment 0
  → PROTOCOL_ERROR; the peer's INITIAL_WINDOW_SIZE changes apply to open streams (may go
  negative). Our output never fails on flow control: it waits per stream and leaves, one
  frame per stream per round, as WINDOW_UPDATEs arrive. Until our SETTINGS are acked the
  client may still count with 65535 per stream, so that is honoured too.
- Abuse (CVE-2023-44487 and kin): client resets and resets the client caused, PINGs,
  SETTINGS, empty DATA/CONTINUATION frames are counted in fixed windows; control replies
  queued past ``max_pending_output`` count as a flood. Any of these → GOAWAY(ENHANCE_YOUR_CALM).
- PUSH_PROMISE from a client → PROTOCOL_ERROR; unknown frame types are ignored.
- GOAWAY: ``start_drain`` sends (2^31-1, NO_ERROR); ``final_goaway`` sends the highest id
  handed to the shell, after which new streams are refused; the connection keeps serving
  the rest. A client's GOAWAY is reported; its open streams go on.
- A connection error queues GOAWAY(last processed, code), reports ConnectionError, and ends
  input processing; ``receive`` never raises for what the peer sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from lameduck.proxy.sections import (
    CACHE_ENTRY_MAX,
    OUT_NAMES,
    Malformed,
    out_name,
    outgoing,
    request_fields,
    trailers_ok,
)

from .codec import INSERTED, STATELESS, DecodeError, Decoder, Encoder, HeaderBomb
from .events import (
    ConnectionError,
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersTooLarge,
    RequestReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from .frames import (
    ACK,
    CONTINUATION,
    DATA,
    DATA_END_PREFIX,
    DATA_PREFIX,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    HEADERS_END_PREFIX,
    HEADERS_PREFIX,
    MAX_FRAME_LIMIT,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTING,
    SETTINGS,
    SETTINGS_ACK,
    SETTINGS_ENABLE_CONNECT_PROTOCOL,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_HEADER_TABLE_SIZE,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    SHORT,
    WINDOW_UPDATE,
    ErrorCode,
    error_code,
    frame_header,
    goaway,
    pack_header,
    ping_ack,
    rst_stream,
    settings_frame,
    stream_id_octets,
    window_update,
)

__all__ = [
    "MAX_STREAM_ID", "PREFACE", "ConnectionError", "DataReceived", "ErrorCode", "Event",
    "GoAwayReceived", "H2Connection", "H2Limits", "H2Server", "HeadersTooLarge",
    "RequestReceived", "StreamReset", "TrailersReceived", "WindowOpened",
]

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_STREAM_ID: Final = 2**31 - 1
# The peer's SETTINGS_MAX_CONCURRENT_STREAMS until its SETTINGS arrive (RFC 9113 §6.5.2 advises
# no less than 100), and once they came without one: no limit, above any u32 it could name.
DEFAULT_MAX_CONCURRENT: Final = 100
UNLIMITED_STREAMS: Final = 1 << 32
# A client stream's ``content_length`` until the final response head (see ``_Stream``).
AWAITING_RESPONSE: Final = -2
AWAITING_HEAD_RESPONSE: Final = -3

# Typed, so that mypyc works on the fields as native ints rather than generic objects.
_unpack_setting: Final[Callable[[bytes, int], tuple[int, int]]] = SETTING.unpack_from


def _u32(data: bytes, p: int) -> int:
    """A 32-bit big-endian field of a frame's payload."""
    return data[p] << 24 | data[p + 1] << 16 | data[p + 2] << 8 | data[p + 3]

# How a forgotten stream ended: frames that still arrive for it are judged by this.
_CLOSED_BY_US: Final = 1  # we reset it (or refused it): ignore what was already in flight
_CLOSED_BY_PEER: Final = 2  # the client reset it
_CLOSED_DONE: Final = 3  # both sides ended
_CLOSED_MEMORY: Final = 4096

class _ProtocolError(Exception):
    """A connection error: unwinds ``receive`` to the point where GOAWAY is queued."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(slots=True)
class H2Limits:
    max_concurrent_streams: int = 100
    initial_window_size: int = 1 << 20  # advertised per stream (receive side)
    connection_window: int = 1 << 24  # receive window for the whole connection
    max_frame_size: int = DEFAULT_MAX_FRAME  # what we accept
    max_header_list_size: int = 64 * 1024  # decoded, RFC 9113 §6.5.2 accounting
    max_resets_per_window: int = 200
    reset_window: float = 10.0
    max_pings_per_window: int = 100
    max_settings_per_window: int = 100
    max_empty_frames_per_window: int = 100
    control_window: float = 10.0
    max_pending_output: int = 1 << 20


class _Rate:
    """A fixed-window counter: cheap, and enough to tell a flood from a busy client."""

    __slots__ = ("count", "limit", "start", "window")

    def __init__(self, limit: int, window: float, now: float) -> None:
        self.limit = limit
        self.window = window
        self.start = now
        self.count = 0

    def hit(self, now: float) -> bool:
        if now - self.start >= self.window:
            self.start = now
            self.count = 0
        self.count += 1
        return self.count > self.limit


class _Stream:
    """One stream's state, for either role. ``content_length``: -1 none, >= 0 the length the
    peer's head declared (the DATA must add up to it); on a client stream also
    ``AWAITING_RESPONSE`` or ``AWAITING_HEAD_RESPONSE`` until the final response head, so
    DATA before it is caught by the same single test in ``_on_data``."""

    __slots__ = (
        "blocked_once", "content_length", "id_octets", "pending", "pending_end",
        "pending_trailers", "received", "recv_closed", "recv_window", "rejected", "send_done",
        "send_ended", "send_window", "sid", "unacked",
    )

    def __init__(self, sid: int, send_window: int, recv_window: int, end: bool) -> None:
        self.sid = sid
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_closed = end
        self.send_ended = False  # the shell has given its end
        self.send_done = False  # END_STREAM is on the wire (queued)
        self.pending: bytearray | None = None  # DATA held back by flow control
        self.pending_end = False
        self.pending_trailers: list[tuple[bytes, bytes]] | None = None
        self.blocked_once = False
        self.content_length = -1
        self.received = 0
        self.unacked = 0
        self.rejected = False  # HeadersTooLarge: body discarded here
        self.id_octets = b""  # the stream id as frame headers carry it, once a frame is sent

    def frame_id(self) -> bytes:
        octets = self.id_octets
        if not octets:
            octets = self.id_octets = stream_id_octets(self.sid)
        return octets


class _Sent:
    """A field of the last head sent on the connection, as the shell gave it, and its octets
    with what they depend on (``codec.STATELESS``, a table generation, ``codec.INSERTED``)."""

    __slots__ = ("name", "octets", "stamp", "value")

    def __init__(self, name: bytes, value: bytes, octets: bytes, stamp: int) -> None:
        self.name = name
        self.value = value
        self.octets = octets
        self.stamp = stamp


# Fields of a head remembered for the next one: heads longer than this encode the rest anew.
_SENT_MAX: Final = 64


class H2Connection:
    """What both roles share: the frame loop, flow control both ways, stream endings, the
    abuse counters. The subclass says how a connection starts (``initiate``; ``_state``) and
    what a header block means (``_on_block``). Not used on its own."""

    def __init__(self, limits: H2Limits | None = None, now: float = 0.0) -> None:
        lim = limits if limits is not None else H2Limits()
        self.limits = lim
        self._buf = bytearray()  # a frame begun, not whole yet
        self._want = 9  # how long _buf must be before its first frame is whole
        self._in = b""  # the bytes being parsed (``_frames``)
        self._out: list[bytes] = []
        self._out_size = 0
        # 0: expecting the client magic (server), 1: the peer's SETTINGS, 2: running.
        self._state = 0
        self._initiated = False
        self._dec = Decoder()
        self._enc = Encoder()
        # The last head sent, field by field (``_octets``), and its block.
        self._sent: list[_Sent] = []
        self._sent_block = b""
        self._sent_count = 0  # fields (with :status) of the head ``_sent_block`` holds
        self._head_missed = False
        self._streams: dict[int, _Stream] = {}
        self._closed_ids: dict[int, int] = {}
        self._closed_ring: list[int] = []
        self._ring_pos = 0
        self._blocked: dict[int, _Stream] = {}
        self._highest = 0  # highest client stream id seen on a HEADERS (client: opened)
        self._now = now
        # Our receive side.
        self._accept_frame = max(lim.max_frame_size, DEFAULT_MAX_FRAME)
        self._recv_window = DEFAULT_WINDOW
        self._recv_initial = max(lim.initial_window_size, DEFAULT_WINDOW)  # until acked
        self._settings_acked = False
        self._conn_unacked = 0
        self._conn_threshold = max(lim.connection_window // 2, 1)
        self._stream_threshold = max(lim.initial_window_size // 2, 1)
        self._block_cap = 2 * lim.max_header_list_size + 16384
        self._list_hard_cap = 4 * lim.max_header_list_size
        # The peer's settings (our send side).
        self._send_window = DEFAULT_WINDOW
        self._peer_initial = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self.peer_max_header_list_size: int | None = None
        self.peer_max_concurrent_streams = DEFAULT_MAX_CONCURRENT
        self._max_enable_push = 1  # the highest SETTINGS_ENABLE_PUSH the peer may send
        # CONTINUATION in progress.
        self._cont_sid = 0
        self._cont_buf = bytearray()
        self._cont_end_stream = False
        self._cont_bad_priority = False
        # Abuse counters.
        self._resets = _Rate(lim.max_resets_per_window, lim.reset_window, now)
        self._pings = _Rate(lim.max_pings_per_window, lim.control_window, now)
        self._settings = _Rate(lim.max_settings_per_window, lim.control_window, now)
        self._empties = _Rate(lim.max_empty_frames_per_window, lim.control_window, now)
        # State the shell reads.
        self.goaway_sent = 0
        self.last_processed = 0
        # Streams handed to the shell in the read being handled (ascending), after the last
        # one before it: the shell decides on them only once ``receive`` has returned.
        self._handed: list[int] = []
        self.closed = False
        self.peer_goaway: int | None = None
        self.resets_received = 0
        self.resets_sent = 0
        self.pings = 0
        self.settings = 0
        self.empty_frames = 0
        self.flood = 0

    # ------------------------------------------------------------------ shell-facing state

    @property
    def open_streams(self) -> int:
        """Streams not closed: either side still open, or output still held back."""
        return len(self._streams)

    def outbound_buffered(self, stream_id: int) -> int:
        st = self._streams.get(stream_id)
        if st is None or st.pending is None:
            return 0
        return len(st.pending)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return data

    # ------------------------------------------------------------------ output helpers

    def _queue(self, frame: bytes) -> None:
        self._out.append(frame)
        self._out_size += len(frame)

    def _queue_reply(self, frame: bytes) -> None:
        """A control frame the peer made us send: bounded, or it is a flood."""
        if self._out_size > self.limits.max_pending_output:
            self.flood += 1
            raise _ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "peer does not read our replies")
        self._queue(frame)

    def initiate(self) -> None:
        """Queue what opens the connection on our side (the subclass knows what)."""
        raise NotImplementedError

    def _announce(self, settings: list[tuple[int, int]]) -> None:
        """Queue our SETTINGS and raise the connection window (RFC 9113 §3.4, §6.9.2)."""
        self._initiated = True
        lim = self.limits
        if self._accept_frame != DEFAULT_MAX_FRAME:
            settings.append((SETTINGS_MAX_FRAME_SIZE, self._accept_frame))
        self._queue(settings_frame(settings))
        if lim.connection_window > DEFAULT_WINDOW:
            self._queue(window_update(0, lim.connection_window - DEFAULT_WINDOW))
            self._recv_window = lim.connection_window

    # ------------------------------------------------------------------ receiving

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Feed bytes from the socket; returns what happened. Never raises for peer errors."""
        events: list[Event] = []
        if self.closed:
            return events
        self._now = now
        if self._handed:
            self._handed = []  # the shell has decided on every stream of the last read
        buf = self._buf
        if buf:
            # The rest of a frame begun in an earlier read: gathered here until it is whole,
            # then parsed with what follows it as one bytes object.
            buf += data
            if self._state == 2 and len(buf) < self._want:
                return events
            data = bytes(buf)
            buf.clear()
        try:
            if self._state != 2:
                if not self._initiated:
                    self.initiate()
                if self._state == 0:
                    if len(data) < 24:
                        if not PREFACE.startswith(data):
                            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "bad preface")
                        buf += data
                        return events
                    if data[:24] != PREFACE:
                        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "bad preface")
                    data = data[24:]
                    self._state = 1
            self._frames(data, events)
        except _ProtocolError as exc:
            self._connection_error(exc.code, exc.reason, events)
        return events

    def _frames(self, data: bytes, events: list[Event]) -> None:
        """The whole frames in ``data``, read in place (the handlers find their payload in
        ``self._in`` between the offsets they are given); the rest is kept in ``_buf``."""
        n = len(data)
        pos = 0
        length = -1
        self._in = data
        try:
            while n - pos >= 9:
                # The 9-octet frame header (RFC 9113 §4.1), octet by octet: mypyc indexes
                # bytes natively, where struct.unpack_from is a call into the interpreter.
                length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
                if length > self._accept_frame:
                    raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "frame too large")
                end = pos + 9 + length
                if end > n:
                    break
                ftype = data[pos + 3]
                flags = data[pos + 4]
                sid = ((data[pos + 5] & 0x7F) << 24 | data[pos + 6] << 16 | data[pos + 7] << 8
                       | data[pos + 8])
                length = -1
                if self._cont_sid and ftype != CONTINUATION:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION")
                if self._state == 1:
                    if ftype != SETTINGS or flags & ACK:
                        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS must come first")
                    self._state = 2
                p = pos + 9
                pos = end
                if ftype == DATA:
                    self._on_data(sid, flags, p, end, events)
                elif ftype == HEADERS:
                    self._on_headers(sid, flags, p, end, events)
                elif ftype == WINDOW_UPDATE:
                    self._on_window_update(sid, p, end - p, events)
                elif ftype == RST_STREAM:
                    self._on_rst_stream(sid, p, end - p, events)
                elif ftype == SETTINGS:
                    self._on_settings(sid, flags, p, end - p, events)
                elif ftype == PING:
                    if sid:
                        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
                    if end - p != 8:
                        raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "PING length")
                    if not flags & ACK:
                        self.pings += 1
                        if self._pings.hit(self._now):
                            self._flooded("PING flood")
                        self._queue_reply(ping_ack(data[p:end]))
                elif ftype == PRIORITY:
                    self._on_priority(sid, p, end - p, events)
                elif ftype == CONTINUATION:
                    self._on_continuation(sid, flags, p, end, events)
                elif ftype == GOAWAY:
                    if sid:
                        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
                    if end - p < 8:
                        raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY length")
                    self._on_goaway(_u32(data, p) & 0x7FFFFFFF, error_code(_u32(data, p + 4)),
                                    events)
                elif ftype == PUSH_PROMISE:
                    self._on_push_promise()
                # Unknown frame types are ignored (RFC 9113 §4.1, §5.5).
        finally:
            self._in = b""
            if pos < n:
                # A frame not whole yet: what it needs before it is worth parsing again.
                self._want = 9 + length if length >= 0 else 9
                self._buf += data[pos:] if pos else data

    def _on_goaway(self, last: int, code: ErrorCode | int, events: list[Event]) -> None:
        """The peer's GOAWAY: reported; its streams up to ``last`` go on."""
        self.peer_goaway = last
        events.append(GoAwayReceived(last, code))

    def _on_push_promise(self) -> None:
        """A client cannot push (RFC 9113 §8.4); H2Client, which never enables push, gives
        its own reason."""
        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _flooded(self, reason: str) -> None:
        self.flood += 1
        raise _ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, reason)

    def _connection_error(self, code: ErrorCode, reason: str, events: list[Event]) -> None:
        if self.closed:
            return
        self._queue(goaway(self.last_processed, code))
        self.goaway_sent = 2
        self.closed = True
        self._buf.clear()
        events.append(ConnectionError(code, reason))

    def _padding(self, flags: int, p: int, end: int) -> tuple[int, int]:
        """Strip PADDED (RFC 9113 §6.1, §6.2): padding as long as the rest is an error."""
        if flags & PADDED:
            if p >= end:
                raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "no room for the pad length")
            pad = self._in[p]
            p += 1
            if pad > end - p:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding exceeds the payload")
            end -= pad
        return p, end

    def _is_idle(self, sid: int) -> bool:
        return sid > self._highest or not sid & 1

    # DATA ---------------------------------------------------------------------------------

    def _on_data(self, sid: int, flags: int, p: int, end: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        flow = end - p
        if flow > self._recv_window:
            raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "connection window exceeded")
        self._recv_window -= flow
        st = self._streams.get(sid)
        if st is None:
            if self._is_idle(sid):
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            self._give_back(flow)
            if self._closed_ids.get(sid) != _CLOSED_BY_US:
                self._stream_error(sid, ErrorCode.STREAM_CLOSED, events, report=False)
            return
        p, end = self._padding(flags, p, end)
        if st.recv_closed:
            self._give_back(flow)
            self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        if flow > st.recv_window:
            self._give_back(flow)
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
            return
        st.recv_window -= flow
        end_stream = bool(flags & END_STREAM)
        size = end - p
        st.received += size
        cl = st.content_length
        # cl < -1: a client stream whose final response head has not come (§8.1).
        if cl != -1 and (cl < 0 or st.received > cl or (end_stream and st.received != cl)):
            self._give_back(flow)
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if size == 0 and not end_stream:
            self.empty_frames += 1
            if self._empties.hit(self._now):
                self._flooded("empty DATA frames")
        if end_stream:
            st.recv_closed = True
        if st.rejected:
            self._give_back(flow)
        else:
            events.append(DataReceived(sid, self._in[p:end], flow, end_stream))
        if end_stream and st.send_done:
            self._forget(st, _CLOSED_DONE)

    def _give_back(self, n: int) -> None:
        """Connection credit for bytes nobody will acknowledge (dropped here)."""
        if n:
            self._conn_unacked += n
            if self._conn_unacked >= self._conn_threshold:
                self._queue(window_update(0, self._conn_unacked))
                self._recv_window += self._conn_unacked
                self._conn_unacked = 0

    def acknowledge_received_data(self, stream_id: int, n: int) -> None:
        """The shell consumed ``n`` flow-controlled bytes: re-open the windows in batches of
        half a window, as nghttp2 does. Valid after the stream has gone (connection only)."""
        if n <= 0 or self.closed:
            return
        self._give_back(n)
        self.acknowledge_stream_data(stream_id, n)

    def acknowledge_connection_data(self, n: int) -> None:
        """Connection credit only: the bytes left the connection's buffers (handed on), while
        their stream stays held back (a slow reader must not stall its neighbours)."""
        if n > 0 and not self.closed:
            self._give_back(n)

    def acknowledge_stream_data(self, stream_id: int, n: int) -> None:
        """Stream credit only (the connection's was given with ``acknowledge_connection_data``)."""
        if n <= 0 or self.closed:
            return
        st = self._streams.get(stream_id)
        if st is not None and not st.recv_closed:
            st.unacked += n
            if st.unacked >= self._stream_threshold:
                self._queue(window_update(stream_id, st.unacked))
                st.recv_window += st.unacked
                st.unacked = 0

    # HEADERS / CONTINUATION ---------------------------------------------------------------

    def _on_headers(self, sid: int, flags: int, p: int, end: int, events: list[Event]) -> None:
        if sid == 0 or not sid & 1:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on a server stream id")
        p, end = self._padding(flags, p, end)
        bad_priority = False
        if flags & PRIORITY_FLAG:
            if end - p < 5:
                raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority fields")
            bad_priority = (_u32(self._in, p) & 0x7FFFFFFF) == sid
            p += 5
        if flags & END_HEADERS:
            self._on_block(sid, self._in[p:end], bool(flags & END_STREAM),
                           bad_priority, events)
            return
        self._cont_sid = sid
        self._cont_buf = bytearray(self._in[p:end])
        self._cont_end_stream = bool(flags & END_STREAM)
        self._cont_bad_priority = bad_priority
        if len(self._cont_buf) > self._block_cap:
            self._flooded("header block too large")

    def _on_continuation(self, sid: int, flags: int, p: int, end: int,
                         events: list[Event]) -> None:
        if not self._cont_sid or sid != self._cont_sid:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        cont = self._cont_buf
        cont += self._in[p:end]
        if len(cont) > self._block_cap:
            self._flooded("header block too large")
        if not flags & END_HEADERS:
            if p == end:
                self.empty_frames += 1
                if self._empties.hit(self._now):
                    self._flooded("empty CONTINUATION frames")
            return
        self._cont_sid = 0
        self._cont_buf = bytearray()
        self._on_block(sid, bytes(cont), self._cont_end_stream, self._cont_bad_priority, events)

    def _decode(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
        try:
            return self._dec.decode(block, self._list_hard_cap)
        except HeaderBomb:
            self._flooded("header list far above the limit")
            raise  # unreachable: _flooded raises
        except DecodeError as exc:
            raise _ProtocolError(ErrorCode.COMPRESSION_ERROR, f"HPACK: {exc}") from exc

    def _on_block(self, sid: int, block: bytes, end_stream: bool, bad_priority: bool,
                  events: list[Event]) -> None:
        """A complete header block (the subclass knows what it means); it must be decoded
        even when it is dropped, so that the HPACK table stays in step."""
        raise NotImplementedError

    def _on_trailers(self, st: _Stream, headers: list[tuple[bytes, bytes]], end_stream: bool,
                     bad_priority: bool, events: list[Event]) -> None:
        sid = st.sid
        if st.recv_closed:
            self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        if bad_priority or not end_stream:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if not trailers_ok(headers):
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if st.content_length >= 0 and st.received != st.content_length:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        st.recv_closed = True
        if not st.rejected:
            events.append(TrailersReceived(sid, headers))
        if st.send_done:
            self._forget(st, _CLOSED_DONE)

    # Control frames -----------------------------------------------------------------------

    def _on_window_update(self, sid: int, p: int, length: int, events: list[Event]) -> None:
        if length != 4:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        inc = _u32(self._in, p) & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += inc
            if self._send_window > MAX_WINDOW:
                raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
            if self._blocked:
                self._flush_blocked(events)
            return
        st = self._streams.get(sid)
        if st is None:
            if self._is_idle(sid):
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: may still be in flight (§5.1)
        if inc == 0:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        st.send_window += inc
        if st.send_window > MAX_WINDOW:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
            return
        if st.pending is not None and self._send_window > 0:
            self._flush_stream(st, events, 1 << 30)

    def _on_rst_stream(self, sid: int, p: int, length: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if length != 4:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM length")
        st = self._streams.get(sid)
        if st is None:
            if self._is_idle(sid):
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            return
        self.resets_received += 1
        self._forget(st, _CLOSED_BY_PEER)
        events.append(StreamReset(sid, error_code(_u32(self._in, p))))
        if self._resets.hit(self._now):
            self._flooded("rapid reset")

    def _on_priority(self, sid: int, p: int, length: int, events: list[Event]) -> None:
        if sid == 0:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if length != 5:
            self._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR, events, report=sid in self._streams)
            return
        if (_u32(self._in, p) & 0x7FFFFFFF) == sid:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events, report=sid in self._streams)

    def _on_settings(self, sid: int, flags: int, p: int, length: int,
                     events: list[Event]) -> None:
        if sid:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if length:
                raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            if not self._settings_acked:
                self._settings_acked = True
                ours = self.limits.initial_window_size
                delta = ours - self._recv_initial
                self._recv_initial = ours
                if delta:
                    for st in self._streams.values():
                        st.recv_window += delta
            return
        if length % 6:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length")
        self.settings += 1
        if self._settings.hit(self._now):
            self._flooded("SETTINGS flood")
        if self.settings == 1:  # the first SETTINGS: no limit unless it names one (§6.5.2)
            self.peer_max_concurrent_streams = UNLIMITED_STREAMS
        payload = self._in
        for off in range(p, p + length, 6):
            key, value = _unpack_setting(payload, off)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE")
                delta = value - self._peer_initial
                self._peer_initial = value
                if delta:
                    for st in self._streams.values():
                        st.send_window += delta
                        if st.send_window > MAX_WINDOW:
                            raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "window overflow")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LIMIT:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE")
                self._peer_max_frame = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                self._enc.set_max_table_size(value)
            elif key == SETTINGS_ENABLE_PUSH:
                if value > 1:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "boolean setting above 1")
                if value > self._max_enable_push:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH from a server")
            elif key == SETTINGS_ENABLE_CONNECT_PROTOCOL:
                if value > 1:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "boolean setting above 1")
            elif key == SETTINGS_MAX_HEADER_LIST_SIZE:
                self.peer_max_header_list_size = value
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_concurrent_streams = value
        self._queue_reply(SETTINGS_ACK)
        if self._blocked and self._send_window > 0:
            self._flush_blocked(events)

    # Stream endings -----------------------------------------------------------------------

    def _remember(self, sid: int, kind: int) -> None:
        """Keep how ``sid`` ended, for the last ``_CLOSED_MEMORY`` streams. The order is kept
        apart: finding a dict's oldest key means scanning past the ones deleted before it."""
        closed = self._closed_ids
        if sid in closed:
            closed[sid] = kind
        else:
            self._remember_new(sid, kind)

    def _remember_new(self, sid: int, kind: int) -> None:
        """``_remember`` for a stream not remembered yet."""
        closed = self._closed_ids
        ring = self._closed_ring  # the remembered ids, oldest at _ring_pos once full
        if len(ring) < _CLOSED_MEMORY:
            ring.append(sid)
        else:
            pos = self._ring_pos
            del closed[ring[pos]]
            ring[pos] = sid
            self._ring_pos = pos + 1 if pos + 1 < _CLOSED_MEMORY else 0
        closed[sid] = kind

    def _forget(self, st: _Stream, kind: int) -> None:
        sid = st.sid
        del self._streams[sid]
        if st.pending is not None:
            self._blocked.pop(sid, None)
        # An open stream was never remembered: a stream is remembered once it is closed (or
        # refused, or reset unopened), and an id is opened only above every id seen before.
        self._remember_new(sid, kind)

    def _stream_error(self, sid: int, code: ErrorCode, events: list[Event],
                      report: bool = True) -> None:
        """RST_STREAM because the peer broke a rule on this stream; it counts toward the
        rapid-reset limit, so a peer cannot make us write resets without bound."""
        self._queue_reply(rst_stream(sid, code))
        self.resets_sent += 1
        st = self._streams.get(sid)
        if st is not None:
            self._forget(st, _CLOSED_BY_US)
        elif not self._is_idle(sid):
            self._remember(sid, _CLOSED_BY_US)
        if report:
            events.append(StreamReset(sid, code))
        if self._resets.hit(self._now):
            self._flooded("too many stream errors")

    def _local_end(self, st: _Stream) -> None:
        """Our END_STREAM is queued: close, or stop a client still sending to a 431."""
        st.send_done = True
        if st.recv_closed:
            self._forget(st, _CLOSED_DONE)
        elif st.rejected:
            self._queue(rst_stream(st.sid, ErrorCode.NO_ERROR))
            self.resets_sent += 1
            self._forget(st, _CLOSED_BY_US)

    # ------------------------------------------------------------------ sending

    def _send_head(self, st: _Stream, status: bytes | None, headers: list[tuple[bytes, bytes]],
                   end_stream: bool) -> None:
        """``:status`` (a response's, else None) then ``headers``, lower-cased and without
        connection-specific fields, as one header block."""
        sent = self._sent
        out: list[bytes] | None = None  # the octets, from the first field not sent as before
        self._head_missed = False
        i = 0
        if status is not None:
            octets = self._octets(0, _STATUS_NAME, status)
            if self._head_missed:
                out = [octets]
            i = 1
        for name, value in headers:
            octets = self._octets(i, name, value)
            if out is not None:
                out.append(octets)
            elif self._head_missed:
                out = [sent[j].octets for j in range(i)]  # those before: sent as before
                out.append(octets)
            i += 1
        if len(sent) > i:
            del sent[i:]
            if out is None:
                out = [f.octets for f in sent]
        elif out is None and self._sent_count != i:
            # The last head had more fields than are kept (``_SENT_MAX``): its block holds
            # them too, so this one's is joined from its own.
            out = [f.octets for f in sent]
        self._sent_count = i
        if out is None:
            # The same fields as the last head, every one sent as it was then with the table
            # as it was then: the same octets (joining them would give the same bytes again).
            block = self._sent_block
        else:
            block = b"".join(out)
            self._sent_block = block
        updates = self._enc.updates()  # none but after a SETTINGS_HEADER_TABLE_SIZE change
        self._emit_block(st, updates + block if updates else block, end_stream)
        if end_stream:
            st.send_ended = True
            self._local_end(st)

    def _octets(self, i: int, name: bytes, value: bytes) -> bytes:
        """The octets of the ``i``-th field of the head being sent, as the shell gave it (its
        name in any case; b"" for a connection-specific field, RFC 9113 §8.2.2).

        Nearly every response of a connection carries the fields of the one before, most of
        them with the same values (Server, Content-Type...), and the encoder's octets for a
        field are a function of the field and of the dynamic table (RFC 7541 §2.3): when the
        last head had this very field at this place, and its octets depended on the field
        alone or the table has not changed since (``Encoder.generation``), they are sent
        again as they are, without lower-casing the name and looking the field up again.
        Anything else is encoded afresh (and kept for the next head)."""
        enc = self._enc
        sent = self._sent
        if i < len(sent):
            prev = sent[i]
            stamp = prev.stamp
            if ((stamp == STATELESS or stamp == enc.generation) and prev.value == value
                    and prev.name == name):
                return prev.octets
        self._head_missed = True
        out = OUT_NAMES.get(name)
        if out is None:
            out = out_name(name)
        if out:
            sent_value = value
            if value and (value[-1] == 32 or value[-1] == 9 or value[0] == 32 or value[0] == 9):
                # An HTTP/1.1 field value as llhttp reports it keeps trailing OWS (and a
                # caller's may carry either); HTTP/2 has none (RFC 9113 §8.2.1, a peer treats
                # it as malformed), and it is no part of the value (RFC 9110 §5.5).
                sent_value = value.strip(b" \t")
            octets, stamp = enc.field((out, sent_value))
        else:
            octets = b""
            stamp = STATELESS
        kept = octets
        if len(name) + len(value) > CACHE_ENTRY_MAX:
            # Not kept: a large field would be held (twice) until the next head.
            value = kept = b""
            stamp = INSERTED
        if i < len(sent):
            prev = sent[i]
            prev.name = name
            prev.value = value
            prev.octets = kept
            prev.stamp = stamp
        elif i < _SENT_MAX:
            sent.append(_Sent(name, value, kept, stamp))
        return octets

    def _emit_block(self, st: _Stream, block: bytes, end_stream: bool) -> None:
        mf = self._peer_max_frame
        n = len(block)
        if n <= mf:
            out = self._out
            if n < SHORT:
                out.append((HEADERS_END_PREFIX if end_stream else HEADERS_PREFIX)[n])
                out.append(st.frame_id())
            else:
                out.append(pack_header(n >> 16, n & 0xFFFF, HEADERS,
                                       END_HEADERS | END_STREAM if end_stream else END_HEADERS,
                                       st.sid))
            out.append(block)
            self._out_size += n + 9
            return
        sid = st.sid
        self._queue(frame_header(mf, HEADERS, END_STREAM if end_stream else 0, sid)
                    + block[:mf])
        for off in range(mf, n, mf):
            chunk = block[off:off + mf]
            last = off + mf >= n
            self._queue(frame_header(len(chunk), CONTINUATION, END_HEADERS if last else 0, sid)
                        + chunk)

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> int:
        """Body bytes. What the windows do not allow now is held for this stream and leaves
        as WINDOW_UPDATEs arrive: how much that is now (``outbound_buffered``) is returned."""
        st = self._streams.get(stream_id)
        if st is None or st.send_ended or self.closed:
            return 0
        if end_stream:
            st.send_ended = True
        pend = st.pending
        if pend is not None:
            pend += data
            st.pending_end = end_stream
            return len(pend)
        n = len(data)
        allowed = min(st.send_window, self._send_window)  # two arguments: native in mypyc
        if allowed >= n or n == 0:
            self._emit_data(st, data, end_stream)
            st.send_window -= n
            self._send_window -= n
            if end_stream:
                self._local_end(st)
            return 0
        if allowed > 0:
            self._emit_data(st, data[:allowed], False)
            st.send_window -= allowed
            self._send_window -= allowed
        pend = bytearray(data[allowed:] if allowed > 0 else data)
        st.pending = pend
        st.pending_end = end_stream
        st.blocked_once = True
        self._blocked[stream_id] = st
        return len(pend)

    def _emit_data(self, st: _Stream, data: bytes, end_stream: bool) -> None:
        mf = self._peer_max_frame
        n = len(data)
        out = self._out
        if n < SHORT:  # SHORT <= the smallest max frame size (16384)
            out.append((DATA_END_PREFIX if end_stream else DATA_PREFIX)[n])
            out.append(st.frame_id())
            if n:
                out.append(data)
            self._out_size += n + 9
            return
        sid = st.sid
        if n <= mf:
            out.append(pack_header(n >> 16, n & 0xFFFF, DATA, END_STREAM if end_stream else 0,
                                   sid))
            out.append(data)
            self._out_size += n + 9
            return
        for off in range(0, n, mf):
            chunk = data[off:off + mf]
            last = end_stream and off + mf >= n
            size = len(chunk)
            out.append(pack_header(size >> 16, size & 0xFFFF, DATA, END_STREAM if last else 0,
                                   sid))
            out.append(chunk)
            self._out_size += size + 9

    def send_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        """Trailer fields; they end the stream (after any held-back DATA)."""
        st = self._streams.get(stream_id)
        if st is None or st.send_ended or self.closed:
            return
        st.send_ended = True
        fields = outgoing(headers)
        if st.pending is not None:
            st.pending_trailers = fields
            return
        self._emit_block(st, self._enc.encode(fields), True)
        self._local_end(st)

    def _flush_stream(self, st: _Stream, events: list[Event], frames: int) -> None:
        """Send up to ``frames`` DATA frames of what this stream holds back."""
        pend = st.pending
        assert pend is not None
        mf = self._peer_max_frame
        while pend and frames > 0 and st.send_window > 0 and self._send_window > 0:
            # Two-argument min: mypyc compiles it to a comparison, not a builtin call.
            n = min(min(len(pend), mf), min(st.send_window, self._send_window))
            chunk = bytes(pend[:n])
            del pend[:n]
            self._emit_data(st, chunk, not pend and st.pending_end
                            and st.pending_trailers is None)
            st.send_window -= n
            self._send_window -= n
            frames -= 1
        if pend:
            return
        st.pending = None
        del self._blocked[st.sid]
        if st.pending_trailers is not None:
            self._emit_block(st, self._enc.encode(st.pending_trailers), True)
            st.pending_trailers = None
            self._local_end(st)
        elif st.pending_end:
            self._local_end(st)
        elif not st.send_ended:
            events.append(WindowOpened(st.sid))

    def _flush_blocked(self, events: list[Event]) -> None:
        """Round robin, one frame per stream per round, while the connection window lasts."""
        while self._send_window > 0 and self._blocked:
            moved = False
            for st in list(self._blocked.values()):
                if self._send_window <= 0:
                    break
                if st.send_window > 0:
                    self._flush_stream(st, events, 1)
                    moved = True
            if not moved:
                break

    def reset_stream(self, stream_id: int, code: ErrorCode = ErrorCode.CANCEL) -> None:
        """The shell gives up on a stream (upstream failed, client gone...)."""
        st = self._streams.get(stream_id)
        if st is None or self.closed:
            return
        self._queue(rst_stream(stream_id, code))
        self.resets_sent += 1
        self._forget(st, _CLOSED_BY_US)

    def close(self, code: ErrorCode = ErrorCode.NO_ERROR, debug: bytes = b"") -> None:
        """GOAWAY(last processed, code) and stop processing input."""
        if self.closed:
            return
        self._queue(goaway(self.last_processed, code, debug))
        self.goaway_sent = 2
        self.closed = True
        self._buf.clear()


class _Again:
    """What a request head's block meant, kept for the same block again.

    A client repeats its request heads (the same method, path and fields, every one indexed
    once its table has them: h2load, gRPC stubs, API clients polling one URL), and HPACK
    decoding is a function of the block and of the dynamic table (RFC 7541 §3): a block that
    decoded without touching the table (no insertion, no size update) decodes to the same
    fields again for as long as the table has not changed (``Decoder.generation``), and the
    same fields pass the same checks (``sections.request_fields``, RFC 9113 §8.2, §8.3) and
    have the same size (§6.5.2). So the server keeps the last such block and, once it came
    twice in a row, what ``request_fields`` made of it: the next time, neither decoding nor
    checking it again."""

    __slots__ = ("authority", "cl", "method", "path", "protocol", "regular", "scheme", "size")

    def __init__(self, size: int, ev: RequestReceived, cl: int) -> None:
        self.size = size
        self.cl = cl
        self.method = ev.method
        self.scheme = ev.scheme
        self.authority = ev.authority
        self.path = ev.path
        self.protocol = ev.protocol
        # A copy: the event's own list is the shell's to keep (or change).
        self.regular: tuple[tuple[bytes, bytes], ...] = tuple(ev.headers)


# Blocks longer than this are not kept for the next request (``_Again``).
_AGAIN_MAX: Final = 1024


class H2Server(H2Connection):
    """One server-side HTTP/2 connection. See the module docstring for the rules."""

    def __init__(self, limits: H2Limits | None = None, now: float = 0.0) -> None:
        super().__init__(limits, now)
        # The last request head's block decoded without touching the table, the table's
        # generation then, and (once it came twice in a row) what it meant.
        self._last_block = b""
        self._last_gen = -1
        self._again: _Again | None = None

    def initiate(self) -> None:
        """Queue our SETTINGS and raise the connection window (RFC 9113 §3.4, §6.9.2)."""
        if self._initiated:
            return
        lim = self.limits
        self._announce([
            (SETTINGS_MAX_CONCURRENT_STREAMS, lim.max_concurrent_streams),
            (SETTINGS_INITIAL_WINDOW_SIZE, lim.initial_window_size),
            (SETTINGS_MAX_HEADER_LIST_SIZE, lim.max_header_list_size),
            (SETTINGS_ENABLE_CONNECT_PROTOCOL, 1),
        ])

    # ------------------------------------------------------------------ receiving

    def _on_block(self, sid: int, block: bytes, end_stream: bool, bad_priority: bool,
                  events: list[Event]) -> None:
        dec = self._dec
        gen = dec.generation
        st = self._streams.get(sid)
        # The block of the last request head again, with the table as it was (``_Again``)?
        same = gen == self._last_gen and st is None and block == self._last_block
        again = self._again if same else None
        if again is not None:
            headers: list[tuple[bytes, bytes]] = []  # not decoded: see _Again
            size = again.size
        else:
            headers, size = self._decode(block)
        if st is not None:
            self._on_trailers(st, headers, end_stream, bad_priority, events)
            return
        if sid <= self._highest:
            kind = self._closed_ids.get(sid)
            if kind == _CLOSED_BY_US:
                return  # in flight when we reset it (§5.1 closed)
            if kind is None:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "stream id not increasing")
            raise _ProtocolError(ErrorCode.STREAM_CLOSED, "HEADERS on a closed stream")
        self._highest = sid
        if self.goaway_sent == 2 and sid > self.last_processed:
            self._refuse(sid, counted=False)  # after the final GOAWAY: safe to retry
            return
        if bad_priority:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if len(self._streams) >= self.limits.max_concurrent_streams:
            self._refuse(sid, counted=True)
            return
        if size > self.limits.max_header_list_size:
            st = self._open(sid, end_stream)
            st.rejected = True
            self._processed(sid)
            events.append(HeadersTooLarge(sid, end_stream))
            return
        if again is not None:
            cl = again.cl
            if end_stream and cl > 0:  # the one check of request_fields the frame decides
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
                return
            ev = RequestReceived(sid, again.method, again.scheme, again.authority, again.path,
                                 again.protocol, list(again.regular), end_stream)
        else:
            try:
                method, scheme, authority, path, protocol, regular, cl = request_fields(
                    headers, end_stream)
            except Malformed:
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
                return
            ev = RequestReceived(sid, method, scheme, authority, path, protocol, regular,
                                 end_stream)
            if dec.generation == gen and len(block) <= _AGAIN_MAX:
                if same:
                    self._again = _Again(size, ev, cl)  # the second time in a row: kept
                else:
                    self._last_block = block
                    self._last_gen = gen
                    self._again = None
        st = self._open(sid, end_stream)
        st.content_length = cl
        self._processed(sid)
        events.append(ev)

    def _open(self, sid: int, end_stream: bool) -> _Stream:
        st = _Stream(sid, self._peer_initial, self._recv_initial, end_stream)
        self._streams[sid] = st
        return st

    def _refuse(self, sid: int, counted: bool) -> None:
        self._queue_reply(rst_stream(sid, ErrorCode.REFUSED_STREAM))
        self.resets_sent += 1
        self._remember(sid, _CLOSED_BY_US)
        if counted and self._resets.hit(self._now):
            self._flooded("too many refused streams")

    def send_headers(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]],
                     end_stream: bool = False) -> None:
        """A response head. 1xx may precede the final one (not with end_stream; no 101 in
        HTTP/2, §8.6). Names are lower-cased and connection-specific fields dropped, so an
        HTTP/1 upstream's head can be passed as it is. A stream already gone is ignored."""
        if status < 200 and (end_stream or status == 101 or status < 100):
            raise ValueError(f"status {status} cannot be sent here")
        st = self._streams.get(stream_id)
        if st is None or st.send_ended or self.closed:
            return
        self._send_head(st, _STATUS[status - 100] if status < 600 else b"%d" % status, headers,
                        end_stream)

    # ------------------------------------------------------------------ draining

    def start_drain(self) -> None:
        """Phase 1 (docs/drain.md): tell the client to go elsewhere, keep serving everything."""
        if self.goaway_sent == 0 and not self.closed:
            self._queue(goaway(MAX_STREAM_ID, ErrorCode.NO_ERROR))
            self.goaway_sent = 1

    def _processed(self, sid: int) -> None:
        if not self._handed:
            self._handed.append(self.last_processed)
        self._handed.append(sid)
        self.last_processed = sid

    def unprocess(self, sid: int) -> None:
        """The shell turned a stream of this read away untouched (going away), and so every
        later one of it (the process takes no new work from then on): a GOAWAY sent from now
        on names the stream before it, so the client knows it was not processed (RFC 9113
        §6.8) whichever of GOAWAY and RST_STREAM it reads first."""
        before = [i for i in self._handed if i < sid]
        if before and before[-1] < self.last_processed:
            self.last_processed = before[-1]

    def final_goaway(self) -> None:
        """Phase 2: the highest stream handed to the shell; newer ones are refused."""
        if self.goaway_sent < 2 and not self.closed:
            self._queue(goaway(self.last_processed, ErrorCode.NO_ERROR))
            self.goaway_sent = 2


_STATUS_NAME: Final = b":status"
_STATUS: Final[tuple[bytes, ...]] = tuple(b"%d" % code for code in range(100, 600))
