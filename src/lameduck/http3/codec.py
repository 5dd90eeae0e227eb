"""A sans-IO HTTP/3 server connection (RFC 9114 over QUIC, RFC 9000): datagrams in, neutral
events out, datagrams to send; the clock is the caller's (``now``), and there is no socket,
no task and no timer here.

QUIC, TLS and QPACK are aioquic's (``QuicConnection``, ``H3Connection``, pylsqpack), which are
sans-IO already. This module is the translation between them and lameduck's layers: a
request head becomes a ``proxy.message.RequestHead`` (version ``HTTP3``), its DATA body
chunks, its trailers a field list; the exchange's answer (head, body, trailers) becomes
HEADERS and DATA frames. It also owns what aioquic does not offer: the server's GOAWAY and
the stream refusals that go with it.

Rules it keeps (RFC 9114 unless noted):

- Requests (§4.1, §4.2, §4.3): the field rules are HTTP/2's (``proxy.sections``, one set for
  both codecs). A malformed request is a stream error H3_MESSAGE_ERROR (§4.1.2): its stream
  is reset and stopped, the connection goes on. aioquic checks a subset of the same rules
  first (and, stricter than §4.3.1, wants ``:authority``); what it finds is turned into the
  same stream error, not the connection error aioquic would make of it.
- Responses: 1xx heads may precede the final one (never 101, §4.5); names are lower-cased
  and connection-specific fields dropped (``sections.outgoing``); trailers end the stream.
- GOAWAY (§5.2, §7.2.6): ``drain_start`` sends GOAWAY(2^62-4) - every request the client
  may open will still be processed, but go elsewhere for new ones - and from then on the
  connection grants no more streams (QUIC MAX_STREAMS is no longer raised as streams close,
  RFC 9000 §4.6). ``drain_final`` sends GOAWAY(last processed + 4): requests on that stream
  id or above were not processed; those that arrive are reset and stopped with
  H3_REQUEST_REJECTED (§4.1.1: safe to retry elsewhere). The identifier only decreases.
- Deadline: the caller resets the streams still open (``cancel``, H3_REQUEST_CANCELLED),
  then CONNECTION_CLOSE with H3_NO_ERROR (§5.2, §8.1) once they are acknowledged.
  ``close`` is the last step of a drain.

What aioquic keeps private and this module relies on, in one place each: the control
stream's id (``H3Connection._local_control_stream_id``) to write GOAWAY on, the limit
object behind MAX_STREAMS for the client's bidirectional streams
(``QuicConnection._local_max_streams_bidi``), replaced by one that can be frozen, a
stream's send state (``QuicStreamSender._buffer``, ``_buffer_fin``, ``_reset_error_code``:
``_unacked``) to tell how much is unacknowledged, the connection ids QUIC issues
(``QuicConnection._host_cids``, drawn in ``__init__`` and ``_replenish_connection_ids``:
``_Quic``) to mark them with the process generation, and a stream's receive window
(``QuicStream.max_stream_data_local``), frozen while its request body is held (``hold``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Final

from lameduck.extras import missing_extra
from lameduck.proxy.message import HTTP3, RequestHead
from lameduck.proxy.sections import Malformed, outgoing, request_fields, trailers_ok
from lameduck.stats import Http3Stats

try:
    from aioquic.buffer import encode_uint_var
    from aioquic.h3.connection import (
        H3_ALPN,
        FrameType,
        H3Connection,
        H3Stream,
        MessageError,
        Setting,
        encode_frame,
    )
    from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
    from aioquic.quic import events as quic
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import Limit, NetworkAddress, QuicConnection
    from aioquic.quic.stream import QuicStream
except ModuleNotFoundError as e:  # pragma: no cover - the extra is a test dependency
    raise missing_extra("http3", "lameduck.http3", e) from e

__all__ = [
    "GOAWAY_ALL", "H3_ALPN", "H3_MESSAGE_ERROR", "H3_NO_ERROR", "H3_REQUEST_CANCELLED",
    "H3_REQUEST_REJECTED", "BodyReceived", "ConnectionClosed", "ConnectionIdIssued",
    "ConnectionIdRetired", "Event", "H3Server", "HeadersTooLarge", "RequestReceived",
    "StreamRefused", "StreamReset", "TrailersReceived",
]

# RFC 9114 §8.1 error codes.
H3_NO_ERROR: Final = 0x100
H3_REQUEST_REJECTED: Final = 0x10B
H3_REQUEST_CANCELLED: Final = 0x10C
H3_MESSAGE_ERROR: Final = 0x10E
# RFC 9114 §5.2: the largest client-initiated bidirectional stream id, the first GOAWAY's
# "every request may still come" (a varint holds up to 2^62-1).
GOAWAY_ALL: Final = 2**62 - 4


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A well-formed request head on ``stream_id``; ``scheme`` is ``:scheme`` (None for a
    CONNECT), which the head itself does not carry."""

    stream_id: int
    head: RequestHead
    scheme: bytes | None
    end_stream: bool


@dataclass(frozen=True, slots=True)
class BodyReceived:
    """A chunk of a request's body (maybe empty when ``end_stream`` alone ends it)."""

    stream_id: int
    data: bytes
    end_stream: bool


@dataclass(frozen=True, slots=True)
class TrailersReceived:
    """The request's trailer section; it ends the request (RFC 9114 §4.1)."""

    stream_id: int
    fields: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The client gave up a request handed on: it reset the stream (RESET_STREAM), or asked
    for no more of the response (STOP_SENDING)."""

    stream_id: int
    code: int


@dataclass(frozen=True, slots=True)
class StreamRefused:
    """We reset and stopped a request stream: malformed (H3_MESSAGE_ERROR: its head, never
    handed on, or its trailer section, after a RequestReceived) or above the final GOAWAY
    (H3_REQUEST_REJECTED, never handed on)."""

    stream_id: int
    code: int


@dataclass(frozen=True, slots=True)
class HeadersTooLarge:
    """A request head larger than SETTINGS_MAX_FIELD_SECTION_SIZE (RFC 9114 §4.2.2): never
    handed on; the caller answers it 431 on ``stream_id`` (``send_head``/``send_body``)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class ConnectionIdIssued:
    """QUIC issued a new connection id for this connection (RFC 9000 §5.1): datagrams
    addressed to it are this connection's."""

    cid: bytes


@dataclass(frozen=True, slots=True)
class ConnectionIdRetired:
    """A connection id of this connection the client retired: no longer this one's."""

    cid: bytes


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The QUIC connection ended (either side's CONNECTION_CLOSE, or idle timeout)."""

    code: int
    reason: str


Event = (RequestReceived | BodyReceived | TrailersReceived | StreamReset | StreamRefused
         | HeadersTooLarge | ConnectionIdIssued | ConnectionIdRetired | ConnectionClosed)


class _Grant(Limit):
    """QUIC's MAX_STREAMS for the client's bidirectional streams: aioquic raises it by one as
    each stream closes (RFC 9000 §4.6); frozen, it stays where it is, so a draining
    connection gives the client no new streams to open."""

    def __init__(self, limit: Limit) -> None:
        self.frozen = False
        self._value = limit.value
        super().__init__(limit.frame_type, limit.name, limit.value)
        self.sent = limit.sent
        self.used = limit.used

    @property  # type: ignore[override]
    def value(self) -> int:
        return self._value

    @value.setter
    def value(self, value: int) -> None:
        if not self.frozen:
            self._value = value


class _Quic(QuicConnection):
    """aioquic's QUIC connection, with every connection id it issues beginning with
    ``prefix``: the listener's mark of the process generation, so that a packet that reaches
    the newer process after a hot restart can be handed to the one that owns its connection
    (as QUIC-LB's server id, draft-ietf-quic-load-balancers). Every connection of a process
    shares the prefix; the rest of each id is random as aioquic draws it, so ids still do
    not link one connection's paths (RFC 9000 §5.1)."""

    def __init__(self, configuration: QuicConfiguration,
                 original_destination_connection_id: bytes, prefix: bytes) -> None:
        super().__init__(configuration=configuration,
                         original_destination_connection_id=original_destination_connection_id)
        self._prefix = prefix
        # the first id is drawn in __init__ and sent in the first Initial: re-mark it before
        first = self._host_cids[0]
        first.cid = self._marked(first.cid)
        self.host_cid = first.cid
        self._local_initial_source_connection_id = first.cid

    def _marked(self, cid: bytes) -> bytes:
        return self._prefix + cid[len(self._prefix):]

    def _replenish_connection_ids(self) -> None:
        """The ids that NEW_CONNECTION_ID frames will offer (RFC 9000 §5.1.1), marked before
        any is sent."""
        n = len(self._host_cids)
        super()._replenish_connection_ids()
        for issued in self._host_cids[n:]:
            issued.cid = self._marked(issued.cid)


class _HeldStream(QuicStream):
    """A QUIC stream whose receive window stays where it is: aioquic doubles a stream's
    MAX_STREAM_DATA as data arrive, whether or not anyone reads them, so a request body the
    upstream does not take would otherwise be buffered without bound. Held, the client's
    window is what it was (RFC 9000 §4.1: the receiver's flow control), and it waits."""

    @property  # type: ignore[override]
    def max_stream_data_local(self) -> int:
        return self.__dict__["max_stream_data_local"]  # type: ignore[no-any-return]

    @max_stream_data_local.setter
    def max_stream_data_local(self, value: int) -> None:
        if "max_stream_data_local" not in self.__dict__:
            self.__dict__["max_stream_data_local"] = value


class _StreamMalformed(Exception):
    """aioquic found a request stream's message malformed. Not one of its ProtocolErrors, so
    it leaves ``handle_event`` instead of closing the connection."""

    def __init__(self, stream_id: int) -> None:
        super().__init__(stream_id)
        self.stream_id = stream_id


class _H3(H3Connection):
    """aioquic's HTTP/3 connection, with a malformed message a stream error (RFC 9114
    §4.1.2) rather than a connection error, and lameduck's SETTINGS: the largest field
    section it takes (SETTINGS_MAX_FIELD_SECTION_SIZE, §7.2.4.1), and no extended CONNECT
    (RFC 9220: no WebSocket over HTTP/3 here)."""

    def __init__(self, quic: QuicConnection, max_field_section_size: int) -> None:
        self._max_field_section = max_field_section_size  # read by __init__'s SETTINGS
        super().__init__(quic)

    def _get_local_settings(self) -> dict[int, int]:
        settings = super()._get_local_settings()
        settings.pop(Setting.ENABLE_CONNECT_PROTOCOL, None)
        if self._max_field_section:
            settings[Setting.MAX_FIELD_SECTION_SIZE] = self._max_field_section
        return settings

    def _handle_request_or_push_frame(self, frame_type: int, frame_data: bytes | None,
                                      stream: H3Stream, stream_ended: bool) -> list[H3Event]:
        try:
            return super()._handle_request_or_push_frame(frame_type, frame_data, stream,
                                                         stream_ended)
        except MessageError as exc:
            raise _StreamMalformed(stream.stream_id) from exc

    def _handle_request_or_push_end(self, stream: H3Stream) -> list[H3Event]:
        try:
            return super()._handle_request_or_push_end(stream)
        except MessageError as exc:
            raise _StreamMalformed(stream.stream_id) from exc


def _unacked(stream: QuicStream) -> int:
    """The one reader of aioquic's send state (``QuicStreamSender``): bytes written and not
    acknowledged (its buffer keeps them until the ACK, for retransmission), plus one for a
    FIN or RESET_STREAM not acknowledged yet (``is_finished`` turns true on that ACK). Once
    reset, the buffer is never resent: only the reset counts."""
    sender = stream.sender
    if sender.is_finished:
        return 0
    if sender._reset_error_code is not None:
        return 1
    return len(sender._buffer) + (sender._buffer_fin is not None)


def _client_bidi(stream_id: int) -> bool:
    return stream_id & 3 == 0  # RFC 9000 §2.1: client-initiated, bidirectional


class _Stream:
    """A request handed on: which halves have ended."""

    __slots__ = ("request_done", "response_done")

    def __init__(self, request_done: bool) -> None:
        self.request_done = request_done
        self.response_done = False


class H3Server:
    """One server-side HTTP/3 connection. See the module docstring for the rules."""

    def __init__(self, configuration: QuicConfiguration,
                 original_destination_connection_id: bytes, max_streams: int = 0,
                 max_field_section_size: int = 0, cid_prefix: bytes = b"",
                 stats: Http3Stats | None = None) -> None:
        """``configuration``: a server's (certificate loaded, ``alpn_protocols`` H3_ALPN);
        ``original_destination_connection_id``: the destination connection id of the
        client's first Initial packet (``aioquic.quic.packet.pull_quic_header``);
        ``max_streams``: the client's concurrent requests (QUIC's initial_max_streams_bidi,
        RFC 9000 §18.2; 0: aioquic's 128); ``max_field_section_size``: the largest request
        head taken (RFC 9114 §4.2.2, size as RFC 9113 §6.5.2 counts it; 0: no limit);
        ``cid_prefix``: the first bytes of every connection id this connection issues
        (shorter than the configuration's ``connection_id_length``); ``stats``: the
        listener's, where the GOAWAYs and stream resets written here are counted."""
        assert len(cid_prefix) < configuration.connection_id_length
        self.quic: QuicConnection = _Quic(configuration, original_destination_connection_id,
                                          cid_prefix)
        self._grant = _Grant(self.quic._local_max_streams_bidi)
        if max_streams:
            self._grant.value = max_streams  # not frozen yet: the setter takes it
            self._grant.sent = max_streams
        self.quic._local_max_streams_bidi = self._grant
        self.max_field_section_size = max_field_section_size
        self.stats = stats if stats is not None else Http3Stats()
        self.h3: _H3 | None = None  # once ALPN chose h3
        self.streams: dict[int, _Stream] = {}
        self.last_processed = -1  # the highest stream id handed on
        self.first_unprocessed: int | None = None  # the lowest handed on, then turned away
        self.goaway_id: int | None = None  # the last GOAWAY's identifier (queued or sent)
        self._goaway_written: int | None = None
        self._ignored: set[int] = set()  # streams whose incoming data is dropped
        self.closing = False  # CONNECTION_CLOSE queued or sent: nothing more is written
        self.closed = False  # the QUIC connection ended (ConnectionClosed reported)

    # -- I/O, the caller's ---------------------------------------------------------------------
    def receive_datagram(self, data: bytes, addr: NetworkAddress,
                         now: float) -> list[Event]:
        self.quic.receive_datagram(data, addr, now)
        return self._events()

    def handle_timer(self, now: float) -> list[Event]:
        self.quic.handle_timer(now)
        return self._events()

    def get_timer(self) -> float | None:
        return self.quic.get_timer()

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, NetworkAddress]]:
        return self.quic.datagrams_to_send(now)

    # -- receiving ----------------------------------------------------------------------------
    def _events(self) -> list[Event]:
        out: list[Event] = []
        q = self.quic
        while (ev := q.next_event()) is not None:
            if isinstance(ev, quic.ProtocolNegotiated):
                if self.h3 is None and ev.alpn_protocol in H3_ALPN:
                    self.h3 = _H3(q, self.max_field_section_size)
                    self._write_goaway()  # a drain that began during the handshake
                continue
            if isinstance(ev, quic.ConnectionIdIssued):
                out.append(ConnectionIdIssued(ev.connection_id))
                continue
            if isinstance(ev, quic.ConnectionIdRetired):
                out.append(ConnectionIdRetired(ev.connection_id))
                continue
            if isinstance(ev, quic.ConnectionTerminated):
                self.closing = self.closed = True
                out.append(ConnectionClosed(ev.error_code, ev.reason_phrase))
                continue
            if isinstance(ev, quic.StopSendingReceived) and ev.stream_id in self.streams:
                # The client wants no more of the response (QUIC has reset our side): the
                # request is given up, as with its RESET_STREAM.
                sid = ev.stream_id
                st = self.streams.pop(sid)
                out.append(StreamReset(sid, ev.error_code))
                if not st.request_done:
                    self._stop_receiving(sid, ev.error_code)
            elif isinstance(ev, (quic.StreamDataReceived, quic.StreamReset)):
                sid = ev.stream_id
                if sid in self._ignored:
                    continue
                if isinstance(ev, quic.StreamReset) and self.streams.pop(sid, None):
                    out.append(StreamReset(sid, ev.error_code))
                elif (isinstance(ev, quic.StreamDataReceived) and _client_bidi(sid)
                      and sid not in self.streams and self.goaway_id is not None
                      and sid >= self.goaway_id):
                    self._refuse(sid, H3_REQUEST_REJECTED, out)  # above the final GOAWAY
                    continue
            h3 = self.h3
            if h3 is None:
                continue
            try:
                h3_events = h3.handle_event(ev)
            except _StreamMalformed as exc:
                self._refuse(exc.stream_id, H3_MESSAGE_ERROR, out)
                continue
            for h in h3_events:
                self._translate(h, out)
        return out

    def _translate(self, ev: H3Event, out: list[Event]) -> None:
        if isinstance(ev, HeadersReceived):
            sid = ev.stream_id
            if sid in self._ignored:
                return
            st = self.streams.get(sid)
            if st is None:
                self._request(sid, ev.headers, ev.stream_ended, out)
            elif not trailers_ok(ev.headers):
                self._refuse(sid, H3_MESSAGE_ERROR, out)
            else:
                st.request_done = True
                out.append(TrailersReceived(sid, ev.headers))
                self._done(sid, st)
        elif isinstance(ev, DataReceived):
            sid = ev.stream_id
            st = self.streams.get(sid)
            if st is None or sid in self._ignored:
                return
            if ev.stream_ended:
                st.request_done = True
            out.append(BodyReceived(sid, ev.data, ev.stream_ended))
            self._done(sid, st)

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]], end_stream: bool,
                 out: list[Event]) -> None:
        """A request head, judged by the rules HTTP/2 keeps (``proxy.sections``)."""
        limit = self.max_field_section_size
        if limit and sum(len(n) + len(v) + 32 for n, v in headers) > limit:
            # answered 431 by the caller: the stream is handed on, with no head
            self.streams[sid] = _Stream(end_stream)
            if sid > self.last_processed:
                self.last_processed = sid
            out.append(HeadersTooLarge(sid))
            return
        try:
            method, scheme, authority, path, protocol, regular, _cl = request_fields(
                headers, end_stream)
        except Malformed:
            self._refuse(sid, H3_MESSAGE_ERROR, out)
            return
        head = RequestHead(method, authority, path if path is not None else b"", regular,
                           HTTP3, not end_stream, protocol)
        self.streams[sid] = _Stream(end_stream)
        if sid > self.last_processed:
            self.last_processed = sid
        out.append(RequestReceived(sid, head, scheme, end_stream))

    def _refuse(self, sid: int, code: int, out: list[Event]) -> None:
        """Reset and stop ``sid``: never handed on, or no longer (malformed trailers)."""
        self.quic.reset_stream(sid, code)
        self.stats.tx_reset += 1
        self.streams.pop(sid, None)
        self._stop_receiving(sid, code)
        out.append(StreamRefused(sid, code))

    def _stop_receiving(self, sid: int, code: int) -> None:
        """STOP_SENDING on ``sid`` and its data dropped from now on; aioquic forgets what it
        holds of the stream (its buffer, and the QPACK header blocks it will never decode,
        RFC 9204 §4.4.2), as when the peer resets it."""
        with contextlib.suppress(ValueError):  # QUIC has let the stream go already
            self.quic.stop_stream(sid, code)
        self._ignored.add(sid)
        if self.h3 is not None:
            self.h3.handle_event(quic.StreamReset(error_code=code, stream_id=sid))

    def _done(self, sid: int, st: _Stream) -> None:
        if st.request_done and st.response_done:
            del self.streams[sid]

    # -- responses ----------------------------------------------------------------------------
    def _open(self, sid: int) -> _Stream | None:
        """The stream, if a response may still be written on it."""
        st = self.streams.get(sid)
        if st is None or st.response_done or self.h3 is None or self.closing or self.closed:
            return None
        return st

    def send_head(self, stream_id: int, status: int, fields: list[tuple[bytes, bytes]],
                  end_stream: bool = False) -> None:
        """A response head: 1xx (never 101, RFC 9114 §4.5; not ending the stream) before the
        final one. Fields as an HTTP/1.1 upstream gave them (``sections.outgoing``)."""
        if status < 200 and (end_stream or status == 101 or status < 100):
            raise ValueError(f"status {status} cannot be sent here")
        st = self._open(stream_id)
        if st is None:
            return
        assert self.h3 is not None
        self.h3.send_headers(stream_id, [(b":status", b"%d" % status), *outgoing(fields)],
                             end_stream)
        if end_stream:
            self._responded(stream_id, st)

    def send_body(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        st = self._open(stream_id)
        if st is None:
            return
        assert self.h3 is not None
        self.h3.send_data(stream_id, data, end_stream)
        if end_stream:
            self._responded(stream_id, st)

    def send_trailers(self, stream_id: int, fields: list[tuple[bytes, bytes]]) -> None:
        """The response's trailer section; it ends the stream."""
        st = self._open(stream_id)
        if st is None:
            return
        assert self.h3 is not None
        self.h3.send_headers(stream_id, outgoing(fields), end_stream=True)
        self._responded(stream_id, st)

    def hold(self, stream_id: int) -> None:
        """Grant the client no more of ``stream_id``'s request body for now (its receive
        window frozen) until ``release``."""
        stream = self.quic._streams.get(stream_id)
        if stream is not None and type(stream) is QuicStream:
            stream.__class__ = _HeldStream

    def release(self, stream_id: int) -> None:
        """The request body of ``stream_id`` flows again: its window grows as aioquic's do
        (a MAX_STREAM_DATA in the next ``datagrams_to_send``)."""
        stream = self.quic._streams.get(stream_id)
        if stream is not None and type(stream) is _HeldStream:
            stream.__class__ = QuicStream

    def buffered(self, stream_id: int) -> int:
        """Response bytes of ``stream_id`` QUIC holds, not yet acknowledged by the client
        (aioquic's send buffer, which nothing else bounds): the caller pauses the source."""
        stream = self.quic._streams.get(stream_id)
        return 0 if stream is None else _unacked(stream)

    def unacked(self) -> int:
        """What the connection has sent or queued on any stream (responses, our control and
        QPACK streams: the GOAWAY) that the client has not acknowledged yet. A close waits
        for it: once CONNECTION_CLOSE is queued aioquic (re)sends no stream data (RFC 9000
        §10.2), so a frame lost just before it would never arrive."""
        return sum(_unacked(stream) for stream in self.quic._streams.values())

    def _responded(self, sid: int, st: _Stream) -> None:
        st.response_done = True
        if not st.request_done:
            # A complete response may end a request the client is still sending (RFC 9114
            # §4.1.1): STOP_SENDING with H3_NO_ERROR; its data are dropped.
            self._stop_receiving(sid, H3_NO_ERROR)
            st.request_done = True
        self._done(sid, st)

    def cancel(self, stream_id: int, code: int = H3_REQUEST_CANCELLED) -> None:
        """Reset and stop a request stream handed on (the exchange gave it up)."""
        st = self.streams.pop(stream_id, None)
        if st is None or self.closing or self.closed:
            return
        self.quic.reset_stream(stream_id, code)
        self.stats.tx_reset += 1
        if not st.request_done:
            self._stop_receiving(stream_id, code)

    # -- drain ----------------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.goaway_id is not None

    def drain_start(self) -> None:
        """Phase 1: GOAWAY(2^62-4) - go elsewhere, every request already possible is still
        served (RFC 9114 §5.2) - and no more streams granted."""
        if self.goaway_id is None:
            self._grant.frozen = True
            self._goaway(GOAWAY_ALL)

    def unprocess(self, stream_id: int) -> None:
        """``stream_id`` was handed on but turned away unprocessed (past the drain time): the
        final GOAWAY names the first such stream as the first not processed, also when
        streams after it were handed on in the same batch of events."""
        if self.first_unprocessed is None or stream_id < self.first_unprocessed:
            self.first_unprocessed = stream_id

    def drain_final(self) -> None:
        """Phase 2: GOAWAY with the first stream id not processed (the last handed on + 4, or
        the first turned away unprocessed); requests on that id or above are refused with
        H3_REQUEST_REJECTED from now on. Called again it sends nothing more, unless a
        stream below the last GOAWAY's was turned away since."""
        self.drain_start()
        gid = self.last_processed + 4 if self.last_processed >= 0 else 0
        if self.first_unprocessed is not None and self.first_unprocessed < gid:
            gid = self.first_unprocessed
        self._goaway(gid)

    def close(self) -> None:
        """CONNECTION_CLOSE with H3_NO_ERROR (RFC 9114 §5.2: after GOAWAY, once idle). Once
        it is queued aioquic sends no stream data: the caller waits for ``unacked`` first."""
        self.closing = True
        self.quic.close(error_code=H3_NO_ERROR)

    def _goaway(self, stream_id: int) -> None:
        """The identifier only decreases (RFC 9114 §5.2): a larger one is not sent."""
        if self.goaway_id is None or stream_id < self.goaway_id:
            self.goaway_id = stream_id
            self._write_goaway()

    def _write_goaway(self) -> None:
        """The one place a GOAWAY frame (type 0x07, a varint stream id; RFC 9114 §7.2.6) is
        written, on our control stream: aioquic has no call for it. Before the handshake has
        chosen h3 there is no control stream yet: it goes out right after our SETTINGS."""
        gid = self.goaway_id
        h3 = self.h3
        if gid is None or h3 is None or gid == self._goaway_written or self.closing:
            return
        control = h3._local_control_stream_id
        assert control is not None
        self.quic.send_stream_data(control, encode_frame(FrameType.GOAWAY,
                                                         encode_uint_var(gid)))
        self._goaway_written = gid
        self.stats.goaway_sent += 1
