"""A lean sans-IO HTTP/2 client connection (RFC 9113), for upstreams spoken to in HTTP/2:
bytes in, events out, bytes to send.

It is ``H2Server``'s other half: the frame loop, flow control, control frames, stream endings
and abuse counters are ``connection.H2Connection``'s, shared with the server; field checks
and their cache are ``proxy.sections``' (HTTP/3 keeps the same rules). This module adds what
only a client does: the preface it sends, opening streams, and judging responses.

Rules it keeps (RFC 9113 unless noted), from the client's side:

- Preface: ``initiate`` (or the first ``receive``/``send_request``) queues the client magic,
  our SETTINGS (ENABLE_PUSH=0, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE, MAX_FRAME_SIZE if
  not the default), then a connection WINDOW_UPDATE up to ``connection_window``. The server's
  first frame must be SETTINGS, else GOAWAY(PROTOCOL_ERROR) (§3.4). SETTINGS acked both ways.
- Streams: ours are odd and increase from 1. ``can_open``: not closed, no GOAWAY received,
  fewer open than the server's MAX_CONCURRENT_STREAMS (100 until its SETTINGS come; no limit
  if they name none; later changes apply at once), ids left. HEADERS, DATA, WINDOW_UPDATE or
  RST_STREAM on a stream we never opened (odd above the highest we opened, or any even id:
  push is disabled) → PROTOCOL_ERROR (§5.1, §5.1.1). Frames on a stream we reset are ignored
  (§5.1); HEADERS on a stream that ended otherwise → connection error STREAM_CLOSED, DATA →
  stream error STREAM_CLOSED.
- Push: a PUSH_PROMISE, or the server's SETTINGS_ENABLE_PUSH other than 0 → PROTOCOL_ERROR
  (§6.5.2, §8.4).
- Responses (§8.1, §8.2, §8.3.2): exactly one :status, first, three digits from 100 to 599
  but not 101 (§8.6); no other pseudo-fields; names lower-case visible ASCII, values without
  NUL/CR/LF or edge whitespace; no connection-specific fields; te only "trailers";
  content-length digits, repeats equal. Any number of interim (1xx) heads may come before the
  final one; a 1xx with END_STREAM, or one after the final head, is malformed; so is DATA
  before the final head. The DATA must add up to content-length (too much: at once; too
  little: at END_STREAM), except for the response to a HEAD request and 204/304, which have
  no content (RFC 9110 §6.4.1): any DATA payload there is malformed, whatever the
  content-length says. After the final head a header block is trailers: it must end the
  stream and carry no pseudo-fields. A malformed response → RST_STREAM(PROTOCOL_ERROR) +
  StreamReset (the shell answers 502). A head above our MAX_HEADER_LIST_SIZE →
  RST_STREAM(CANCEL) + StreamReset: a client may drop what it cannot process (§10.5.1).
- Requests: ``send_request`` encodes the fields in the order given, the pseudo-fields first;
  names are lower-cased and connection-specific fields dropped, as ``send_headers`` does on
  the server. Heads above the server's MAX_FRAME_SIZE go out as HEADERS + CONTINUATION.
  Bodies and trailers as on the server (``send_data``, ``send_trailers``): what the windows
  do not allow is held per stream, and WindowOpened says when it has all left.
- Flow control: received DATA is acknowledged by the shell (``acknowledge_received_data``);
  the windows reopen only then, so a slow reader holds the server back.
- GOAWAY from the server: reported (GoAwayReceived); our streams above its last id are
  forgotten and reported as StreamReset(REFUSED_STREAM) — never processed, safe to retry
  (§6.8) — the others go on, and no stream opens after it. RST_STREAM from the server is
  reported as it is (REFUSED_STREAM: safe to retry, §8.7; NO_ERROR after a complete
  response: stop sending the request body, §8.1).
- ``close`` sends GOAWAY(0, code): we process no server-initiated streams. A connection error
  does the same with its code and reports ConnectionError; ``receive`` never raises for what
  the peer sends.
- Abuse: PINGs, SETTINGS, empty DATA/CONTINUATION frames, the server's resets and those it
  caused, replies it does not read: the server's limits apply → GOAWAY(ENHANCE_YOUR_CALM).
"""

from __future__ import annotations

from typing import Final, cast

from lameduck.proxy.sections import (
    CONTENT_LENGTH,
    COOKIE,
    FIELD_KINDS,
    STATUS_FIELD,
    Malformed,
    Row,
    classify,
)

from .connection import (
    _CLOSED_BY_US,
    _CLOSED_DONE,
    AWAITING_HEAD_RESPONSE,
    AWAITING_RESPONSE,
    MAX_STREAM_ID,
    PREFACE,
    H2Connection,
    H2Limits,
    _ProtocolError,
    _Stream,
)
from .events import Event, ResponseReceived, StreamReset
from .frames import (
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    ErrorCode,
)

__all__ = ["H2Client", "ResponseReceived"]

_NO_CONTENT: Final = frozenset({204, 304})  # statuses whose responses carry no content


class H2Client(H2Connection):
    """One client-side HTTP/2 connection. See the module docstring for the rules."""

    def __init__(self, limits: H2Limits | None = None, now: float = 0.0) -> None:
        super().__init__(limits, now)
        self._state = 1  # no magic comes from a server: its SETTINGS first
        self._max_enable_push = 0  # §6.5.2: a server must not enable push
        self._next_id = 1

    def initiate(self) -> None:
        """Queue the preface: the magic, our SETTINGS, a larger connection window (§3.4)."""
        if self._initiated:
            return
        self._queue(PREFACE)
        lim = self.limits
        self._announce([
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, lim.initial_window_size),
            (SETTINGS_MAX_HEADER_LIST_SIZE, lim.max_header_list_size),
        ])

    # ------------------------------------------------------------------ shell-facing state

    @property
    def can_open(self) -> bool:
        """Whether ``send_request`` may open a stream now (the shell asks first, and waits or
        uses another connection if not)."""
        return (not self.closed and self.peer_goaway is None
                and len(self._streams) < self.peer_max_concurrent_streams
                and self._next_id <= MAX_STREAM_ID)

    # ------------------------------------------------------------------ sending

    def send_request(self, headers: list[tuple[bytes, bytes]], end_stream: bool,
                     head: bool = False) -> int:
        """Open the next stream with this request head; its id. ``headers``: :method,
        :scheme, :authority, :path, then the regular fields. ``head``: a HEAD request, whose
        response has no content whatever its content-length says. Raises RuntimeError when
        ``can_open`` is False."""
        if not self.can_open:
            raise RuntimeError("no stream can be opened on this HTTP/2 connection now")
        if not self._initiated:
            self.initiate()
        sid = self._next_id
        self._next_id = sid + 2
        self._highest = sid
        st = _Stream(sid, self._peer_initial, self._recv_initial, False)
        st.content_length = AWAITING_HEAD_RESPONSE if head else AWAITING_RESPONSE
        self._streams[sid] = st
        self._send_head(st, None, headers, end_stream)
        return sid

    # ------------------------------------------------------------------ receiving

    def _on_block(self, sid: int, block: bytes, end_stream: bool, bad_priority: bool,
                  events: list[Event]) -> None:
        """A response head (interim or final) or, after the final one, trailers."""
        headers, size = self._decode(block)
        st = self._streams.get(sid)
        if st is None:
            if sid > self._highest:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on a stream never opened")
            if self._closed_ids.get(sid) == _CLOSED_BY_US:
                return  # in flight when we reset it (§5.1 closed)
            raise _ProtocolError(ErrorCode.STREAM_CLOSED, "HEADERS on a closed stream")
        awaiting = st.content_length
        if awaiting > AWAITING_RESPONSE:  # -1 or a length: the final head came, trailers
            self._on_trailers(st, headers, end_stream, bad_priority, events)
            return
        if bad_priority:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if size > self.limits.max_header_list_size:
            self._stream_error(sid, ErrorCode.CANCEL, events)
            return
        try:
            status, cl = _response(headers)
        except Malformed:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        if status < 200:
            if end_stream:  # an interim head cannot end the stream (§8.1)
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
                return
            events.append(ResponseReceived(sid, status, headers, False))
            return
        if awaiting == AWAITING_HEAD_RESPONSE or status in _NO_CONTENT:
            cl = 0  # no content, whatever content-length describes (§8.1.1)
        elif end_stream and cl > 0:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        st.content_length = cl
        events.append(ResponseReceived(sid, status, headers, end_stream))
        if end_stream:
            st.recv_closed = True
            if st.send_done:
                self._forget(st, _CLOSED_DONE)

    def _on_goaway(self, last: int, code: ErrorCode | int, events: list[Event]) -> None:
        """Streams above ``last`` were not processed (§6.8): refused, so the shell retries."""
        super()._on_goaway(last, code, events)
        refused = [st for st in self._streams.values() if st.sid > last]
        for st in refused:
            self._forget(st, _CLOSED_BY_US)  # anything still in flight for it is ignored
            events.append(StreamReset(st.sid, ErrorCode.REFUSED_STREAM))

    def _on_push_promise(self) -> None:
        """We sent ENABLE_PUSH=0, so any push is a connection error (RFC 9113 §8.4)."""
        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE with push disabled")


def _response(headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """Validate a response head (RFC 9113 §8.1.1, §8.2, §8.3.2): its status and
    content-length (-1 if none). Raises Malformed. ``headers``, the decoder's own list, is
    left with the regular fields only."""
    status = -1
    cl = -1
    seen = 0
    kinds = FIELD_KINDS
    for row in cast("list[Row]", headers):
        kind = kinds.get(row, -1)
        if kind < 0:
            kind = classify(row)
        seen += 1
        if kind <= COOKIE:  # a regular field (in a response, cookie is just one more)
            continue
        value = cast("tuple[bytes, bytes]", row)[1]
        if kind == CONTENT_LENGTH:
            n = int(value)
            if cl >= 0 and n != cl:
                raise Malformed
            cl = n
        elif kind == STATUS_FIELD and seen == 1:  # first, hence also the only one
            status = int(value)
        else:  # a request's pseudo-field, or :status again or after a regular field
            raise Malformed
    if status < 0:
        raise Malformed
    del headers[:1]
    return status, cl
