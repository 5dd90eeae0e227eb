"""Fuzz target: frames from a client, after the connection preface, into the sans-IO HTTP/2
server (``H2Server``, RFC 9113), in reads cut as the input says, with a shell that answers
every request, gives flow-control credit back and, as the input says, drains the connection
(the two GOAWAYs) or resets a stream.

Invariants: ``receive`` never raises (RFC 9113 §5.4: a peer's error is a stream or connection
error, not ours); a connection error is reported once, with a GOAWAY carrying its code as the
last frame written (§5.4.1) and nothing read after it; everything written parses as frames
(hyperframe, an independent reader); memory stays within what we advertised: the HPACK
dynamic table within SETTINGS_HEADER_TABLE_SIZE (RFC 7541 §4.2), unparsed input within one
frame of our SETTINGS_MAX_FRAME_SIZE, a header block within its cap, open streams within
SETTINGS_MAX_CONCURRENT_STREAMS, and the memory of closed streams within its ring.
"""

from __future__ import annotations

import random

from hyperframe.frame import Frame, GoAwayFrame

from lameduck.http2.connection import (
    _CLOSED_MEMORY,
    PREFACE,
    ConnectionError,
    DataReceived,
    ErrorCode,
    H2Limits,
    H2Server,
    HeadersTooLarge,
    RequestReceived,
)

MAX_INPUT = 1 << 15
# Small limits, so a short input reaches them.
LIMITS = H2Limits(max_concurrent_streams=4, initial_window_size=1 << 16,
                  connection_window=1 << 17, max_header_list_size=2048,
                  max_resets_per_window=20, max_pings_per_window=10,
                  max_settings_per_window=10, max_empty_frames_per_window=10,
                  max_pending_output=1 << 14)


def frames(data: bytes) -> list[Frame]:
    """Parse what the server wrote; raises if it is not a sequence of whole frames."""
    out = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 9, f"a frame header cut short at {pos}"
        frame, length = Frame.parse_frame_header(view[pos:pos + 9])
        assert length <= 16384, f"a frame of {length} bytes above the peer's default maximum"
        assert pos + 9 + length <= len(data), "a frame cut short"
        frame.parse_body(view[pos + 9:pos + 9 + length])
        out.append(frame)
        pos += 9 + length
    return out


def bounded(srv: H2Server) -> None:
    assert srv._dec._size <= srv._dec.max_allowed, (srv._dec._size, srv._dec.max_allowed)
    if not srv.closed:
        assert len(srv._buf) < 9 + srv._accept_frame, len(srv._buf)
    assert len(srv._cont_buf) <= srv._block_cap, len(srv._cont_buf)
    assert len(srv._streams) <= LIMITS.max_concurrent_streams, len(srv._streams)
    assert len(srv._closed_ids) <= _CLOSED_MEMORY
    assert len(srv._closed_ring) <= _CLOSED_MEMORY
    for st in srv._streams.values():
        assert st.pending is None or len(st.pending) <= 2


def fuzz_one(data: bytes) -> None:
    """The first two bytes seed the cuts and the shell's choices; the rest follow the preface."""
    rng = random.Random(data[:2])
    body = data[2:MAX_INPUT]
    srv = H2Server(LIMITS)
    now = 0.0
    srv.receive(PREFACE, now)
    wrote = srv.data_to_send()
    error: ConnectionError | None = None
    pos = 0
    while pos < len(body):
        n = rng.choice((1, 9, 10, 100, 1 << 20))
        chunk = body[pos:pos + n]
        pos += n
        now += rng.choice((0.0, 0.001, 1.0))
        events = srv.receive(chunk, now)
        if error is not None:
            assert not events, f"events after the connection error: {events}"
        for ev in events:
            assert error is None, f"{ev} after {error}"
            if isinstance(ev, ConnectionError):
                error = ev
                assert srv.closed
            elif isinstance(ev, RequestReceived):
                srv.send_headers(ev.stream_id, 200, [(b"content-type", b"text/plain")])
                srv.send_data(ev.stream_id, b"ok", end_stream=True)
            elif isinstance(ev, HeadersTooLarge):
                srv.send_headers(ev.stream_id, 431, [], end_stream=True)
            elif isinstance(ev, DataReceived):
                srv.acknowledge_received_data(ev.stream_id, ev.flow_len)
        choice = rng.random()
        if not srv.closed and choice < 0.05:
            srv.start_drain()
        elif not srv.closed and choice < 0.08:
            srv.final_goaway()
        elif not srv.closed and choice < 0.1 and srv._streams:
            srv.reset_stream(rng.choice(sorted(srv._streams)), ErrorCode.CANCEL)
        bounded(srv)
        out = srv.data_to_send()
        if error is not None and out:
            last = frames(out)[-1]
            assert isinstance(last, GoAwayFrame) and last.error_code == error.code, (
                last, error)
        wrote += out
    written = frames(wrote)
    if error is not None:
        last = written[-1]
        assert isinstance(last, GoAwayFrame) and last.error_code == error.code, (last, error)
    if srv.closed and error is None:
        raise AssertionError("closed without a reported connection error")
