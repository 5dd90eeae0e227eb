"""Peer errors, each with the code RFC 9113 gives it, and the flood limits. Frames are built
with hyperframe (or by hand where hyperframe refuses to build them)."""

from __future__ import annotations

import struct

import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from lameduck.http2.connection import (
    PREFACE,
    ConnectionError,
    DataReceived,
    ErrorCode,
    H2Limits,
    H2Server,
    HeadersTooLarge,
    RequestReceived,
    StreamReset,
)
from tests.unit.test_h2_connection import GET, Raw, frames_of, post

EH = ["END_HEADERS"]
EHS = ["END_HEADERS", "END_STREAM"]


def raw_frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    n = len(payload)
    return struct.pack(">BHBBL", n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def conn_error(events: list, raw: Raw, code: ErrorCode) -> None:
    assert isinstance(events[-1], ConnectionError), events
    assert events[-1].code == code
    assert raw.goaway().error_code == code
    assert raw.server.closed


def stream_error(events: list, raw: Raw, sid: int, code: ErrorCode) -> None:
    assert StreamReset(sid, code) in events, events
    assert raw.rst(sid).error_code == code
    assert not raw.server.closed


# -- preface -------------------------------------------------------------------------------


def test_bad_preface() -> None:
    srv = H2Server()
    ev = srv.receive(b"GET / HTTP/1.1\r\n\r\n", 0.0)
    assert ev[-1].code == ErrorCode.PROTOCOL_ERROR and srv.closed
    assert frames_of(srv.data_to_send())[-1].error_code == ErrorCode.PROTOCOL_ERROR


def test_preface_not_followed_by_settings() -> None:
    srv = H2Server()
    ev = srv.receive(PREFACE + PingFrame(0, b"12345678").serialize(), 0.0)
    assert ev[-1].code == ErrorCode.PROTOCOL_ERROR


def test_preface_in_pieces() -> None:
    srv = H2Server()
    data = PREFACE + SettingsFrame(0).serialize()
    for i in range(len(data)):
        assert srv.receive(data[i:i + 1], 0.0) == []
    assert not srv.closed and srv._state == 2


# -- frame sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [
    raw_frame(0x6, 0, 0, b"1234567"),  # PING 7
    raw_frame(0x3, 0, 1, b"123"),  # RST_STREAM 3
    raw_frame(0x8, 0, 0, b"12345"),  # WINDOW_UPDATE 5
    raw_frame(0x4, 0, 0, b"12345"),  # SETTINGS not 6n
    raw_frame(0x4, 1, 0, b"123456"),  # SETTINGS ack with payload
    raw_frame(0x7, 0, 0, b"1234"),  # GOAWAY < 8
    raw_frame(0x0, 0, 1, b"x" * 16385),  # above our max frame size
])
def test_frame_size_errors(frame: bytes) -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    conn_error(raw.send(frame), raw, ErrorCode.FRAME_SIZE_ERROR)


def test_priority_of_wrong_length_is_a_stream_error() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    ev = raw.send(raw_frame(0x2, 0, 1, b"1234"))
    stream_error(ev, raw, 1, ErrorCode.FRAME_SIZE_ERROR)


# -- stream ids and states -----------------------------------------------------------------


def test_even_stream_id() -> None:
    raw = Raw()
    conn_error(raw.send(HeadersFrame(2, raw.block(GET), flags=EHS)), raw,
               ErrorCode.PROTOCOL_ERROR)


def test_lower_stream_id() -> None:
    raw = Raw()
    raw.send(HeadersFrame(5, raw.block(GET), flags=EHS))
    conn_error(raw.send(HeadersFrame(3, raw.block(GET), flags=EHS)), raw,
               ErrorCode.PROTOCOL_ERROR)


def test_reused_closed_stream_id() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    raw.server.send_headers(1, 200, [], end_stream=True)
    conn_error(raw.send(HeadersFrame(1, raw.block(GET), flags=EHS)), raw,
               ErrorCode.STREAM_CLOSED)


@pytest.mark.parametrize("frame", [
    DataFrame(1, b"x"),
    WindowUpdateFrame(1, 1),
    RstStreamFrame(1, 8),
])
def test_frames_on_idle_streams(frame: object) -> None:
    raw = Raw()
    conn_error(raw.send(frame), raw, ErrorCode.PROTOCOL_ERROR)


def test_data_on_half_closed_remote_stream() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    stream_error(raw.send(DataFrame(1, b"x")), raw, 1, ErrorCode.STREAM_CLOSED)


def test_data_on_closed_stream() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    raw.server.send_headers(1, 200, [], end_stream=True)
    ev = raw.send(DataFrame(1, b"x"))
    assert ev == [] and raw.rst(1).error_code == ErrorCode.STREAM_CLOSED


def test_frames_after_client_reset() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    assert raw.send(RstStreamFrame(1, 8)) == [StreamReset(1, ErrorCode.CANCEL)]
    assert raw.send(WindowUpdateFrame(1, 10), RstStreamFrame(1, 8)) == []  # tolerated
    assert raw.send(DataFrame(1, b"x")) == []
    assert raw.rst(1).error_code == ErrorCode.STREAM_CLOSED


def test_frames_after_we_reset_are_ignored() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    raw.server.reset_stream(1)
    raw.server.data_to_send()
    ev = raw.send(DataFrame(1, b"x" * 10), HeadersFrame(1, raw.block([(b"x", b"y")]), flags=EHS))
    assert ev == [] and raw.sent == [] and not raw.server.closed


def test_priority_on_idle_stream_does_not_open_it() -> None:
    raw = Raw()
    assert raw.send(PriorityFrame(3, depends_on=0, stream_weight=16)) == []
    ev = raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    assert isinstance(ev[0], RequestReceived)
    assert raw.server.open_streams == 1


def test_priority_on_itself() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    stream_error(raw.send(PriorityFrame(1, depends_on=1)), raw, 1, ErrorCode.PROTOCOL_ERROR)
    ev = raw.send(HeadersFrame(3, raw.block(GET), depends_on=3, flags=[*EHS, "PRIORITY"]))
    stream_error(ev, raw, 3, ErrorCode.PROTOCOL_ERROR)


def test_priority_on_stream_zero() -> None:
    raw = Raw()
    conn_error(raw.send(raw_frame(0x2, 0, 0, b"\0\0\0\1\x10")), raw, ErrorCode.PROTOCOL_ERROR)


def test_push_promise_from_client() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    ev = raw.send(PushPromiseFrame(1, promised_stream_id=2, data=raw.block(GET), flags=EH))
    conn_error(ev, raw, ErrorCode.PROTOCOL_ERROR)


def test_unknown_frame_type_ignored() -> None:
    raw = Raw()
    assert raw.send(raw_frame(0xFA, 0xFF, 0, b"whatever")) == []
    assert not raw.server.closed


# -- header blocks -------------------------------------------------------------------------


def test_continuation_sequence() -> None:
    raw = Raw()
    block = raw.block([*GET, (b"x-a", b"1" * 100)])
    ev = raw.send(HeadersFrame(1, block[:10], flags=["END_STREAM"]),
                  ContinuationFrame(1, block[10:50]), ContinuationFrame(1, block[50:], flags=EH))
    assert isinstance(ev[0], RequestReceived) and ev[0].headers == [(b"x-a", b"1" * 100)]


@pytest.mark.parametrize("between", [
    PingFrame(0, b"12345678"),
    ContinuationFrame(3, b"\x82", flags=EH),
    HeadersFrame(3, b"\x82", flags=EH),
])
def test_anything_between_headers_and_continuation(between: object) -> None:
    raw = Raw()
    block = raw.block(GET)
    ev = raw.send(HeadersFrame(1, block[:2]), between)
    conn_error(ev, raw, ErrorCode.PROTOCOL_ERROR)


def test_continuation_without_headers() -> None:
    raw = Raw()
    conn_error(raw.send(ContinuationFrame(1, b"\x82", flags=EH)), raw, ErrorCode.PROTOCOL_ERROR)


def test_continuation_flood_is_stopped() -> None:
    raw = Raw(H2Limits(max_header_list_size=8192))
    raw.send(HeadersFrame(1, raw.block(GET)))
    ev: list = []
    for _ in range(10):
        ev = raw.send(ContinuationFrame(1, b"\x40\x01a\x01b" * 800))
        if ev:
            break
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)
    assert raw.server.flood == 1


def test_empty_continuation_flood() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET)))
    ev = raw.send(*[ContinuationFrame(1, b"") for _ in range(101)])
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)


def test_hpack_garbage_is_compression_error() -> None:
    raw = Raw()
    conn_error(raw.send(HeadersFrame(1, b"\xff\xff\xff\xff\xff\xff", flags=EHS)), raw,
               ErrorCode.COMPRESSION_ERROR)


def test_padding_too_long() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    conn_error(raw.send(raw_frame(0x0, 0x8, 1, b"\x05abc")), raw, ErrorCode.PROTOCOL_ERROR)


def test_headers_too_large() -> None:
    raw = Raw(H2Limits(max_header_list_size=1000))
    big = [*GET, (b"x-big", b"v" * 2000)]
    ev = raw.send(HeadersFrame(1, raw.block(big), flags=EH), DataFrame(1, b"body"))
    assert ev == [HeadersTooLarge(1, False)]  # the body is not reported
    raw.server.send_headers(1, 431, [], end_stream=True)
    out = frames_of(raw.server.data_to_send())
    assert [f.type for f in out] == [0x1, 0x3] and out[1].error_code == ErrorCode.NO_ERROR
    # The HPACK table is still in step.
    ev = raw.send(HeadersFrame(3, raw.block(big[:4]), flags=EHS))
    assert isinstance(ev[0], RequestReceived) and not raw.server.closed


def test_header_bomb_is_a_connection_error() -> None:
    raw = Raw(H2Limits(max_header_list_size=1000))
    raw.send(HeadersFrame(1, raw.block([*GET, (b"x-big", b"v" * 3000)]), flags=EHS))
    # Each one-octet reference to that entry expands to 3000+ bytes.
    conn_error(raw.send(HeadersFrame(3, b"\x82\x87\x84" + b"\xbe" * 10, flags=EHS)), raw,
               ErrorCode.ENHANCE_YOUR_CALM)


MALFORMED = [
    [(b":method", b"GET"), (b":path", b"/")],  # no :scheme
    [(b":method", b"GET"), (b":scheme", b"https")],  # no :path
    [(b":scheme", b"https"), (b":path", b"/")],  # no :method
    [*GET, (b":method", b"GET")],  # duplicate
    [*GET, (b":status", b"200")],  # response pseudo-field
    [*GET, (b":foo", b"x")],  # unknown pseudo-field
    [GET[0], (b"accept", b"*/*"), *GET[1:]],  # pseudo after regular
    [*GET, (b"Accept", b"*/*")],  # upper case
    [*GET, (b"connection", b"keep-alive")],
    [*GET, (b"transfer-encoding", b"chunked")],
    [*GET, (b"upgrade", b"h2c")],
    [*GET, (b"keep-alive", b"5")],
    [*GET, (b"proxy-connection", b"x")],
    [*GET, (b"te", b"gzip")],
    [*GET, (b"x", b"a\r\nb")],
    [*GET, (b"x", b" padded")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"")],
    [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/a b")],
    [(b":method", b"G T"), (b":scheme", b"https"), (b":path", b"/")],
    [(b":method", b"CONNECT"), (b":authority", b"a:1"), (b":path", b"/")],
    [(b":method", b"CONNECT")],
    [(b":method", b"GET"), (b":protocol", b"websocket"), (b":scheme", b"https"),
     (b":path", b"/"), (b":authority", b"a")],
    [(b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"https"),
     (b":path", b"/")],  # extended CONNECT without :authority
    [*GET, (b"content-length", b"abc")],
    [*GET, (b"content-length", b"5")],  # END_STREAM with content-length 5
]


@pytest.mark.parametrize("headers", MALFORMED)
def test_malformed_requests(headers: list[tuple[bytes, bytes]]) -> None:
    raw = Raw()
    ev = raw.send(HeadersFrame(1, raw.block(headers), flags=EHS))
    stream_error(ev, raw, 1, ErrorCode.PROTOCOL_ERROR)
    assert raw.server.last_processed == 0 and raw.server.open_streams == 0


def test_options_star_is_fine() -> None:
    raw = Raw()
    ev = raw.send(HeadersFrame(1, raw.block([(b":method", b"OPTIONS"), (b":scheme", b"https"),
                                              (b":path", b"*")]), flags=EHS))
    assert ev[0].path == b"*"


@pytest.mark.parametrize("chunks", [[b"12345"], [b"12", b"3"], [b"1234567"]])
def test_content_length_mismatch(chunks: list[bytes]) -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post(4)), flags=EH))
    frames = [DataFrame(1, c) for c in chunks]
    frames[-1].flags.add("END_STREAM")
    ev = raw.send(*frames)
    stream_error(ev, raw, 1, ErrorCode.PROTOCOL_ERROR)


def test_trailers_rules() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    stream_error(raw.send(HeadersFrame(1, raw.block([(b"x", b"y")]), flags=EH)), raw, 1,
                 ErrorCode.PROTOCOL_ERROR)  # trailers without END_STREAM
    raw.send(HeadersFrame(3, raw.block(post()), flags=EH))
    stream_error(raw.send(HeadersFrame(3, raw.block([(b":path", b"/")]), flags=EHS)), raw, 3,
                 ErrorCode.PROTOCOL_ERROR)  # pseudo-field in trailers


# -- flow control --------------------------------------------------------------------------


def test_stream_window_exceeded() -> None:
    raw = Raw(H2Limits(initial_window_size=100))
    raw.send(SettingsFrame(flags=["ACK"]))
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    stream_error(raw.send(DataFrame(1, b"x" * 101)), raw, 1, ErrorCode.FLOW_CONTROL_ERROR)


def test_stream_window_default_honoured_before_settings_ack() -> None:
    raw = Raw(H2Limits(initial_window_size=100))
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    ev = raw.send(DataFrame(1, b"x" * 1000))  # the client may still count with 65535
    assert isinstance(ev[0], DataReceived)


def test_connection_window_exceeded() -> None:
    raw = Raw(H2Limits(connection_window=65535, max_frame_size=16384))
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    ev: list = []
    for _ in range(5):
        ev = raw.send(DataFrame(1, b"x" * 16000))
    conn_error(ev, raw, ErrorCode.FLOW_CONTROL_ERROR)


@pytest.mark.parametrize("sid", [0, 1])
def test_window_overflow(sid: int) -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    ev = raw.send(WindowUpdateFrame(sid, 2**31 - 1))
    if sid:
        stream_error(ev, raw, 1, ErrorCode.FLOW_CONTROL_ERROR)
    else:
        conn_error(ev, raw, ErrorCode.FLOW_CONTROL_ERROR)


def test_window_update_of_zero() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=EHS))
    stream_error(raw.send(raw_frame(0x8, 0, 1, b"\0\0\0\0")), raw, 1, ErrorCode.PROTOCOL_ERROR)
    conn_error(raw.send(raw_frame(0x8, 0, 0, b"\0\0\0\0")), raw, ErrorCode.PROTOCOL_ERROR)


def test_initial_window_size_too_large() -> None:
    raw = Raw()
    conn_error(raw.send(raw_frame(0x4, 0, 0, struct.pack(">HL", 4, 2**31))), raw,
               ErrorCode.FLOW_CONTROL_ERROR)


@pytest.mark.parametrize(("key", "value"), [(5, 16383), (5, 2**24), (2, 2), (8, 2)])
def test_bad_settings_values(key: int, value: int) -> None:
    raw = Raw()
    conn_error(raw.send(raw_frame(0x4, 0, 0, struct.pack(">HL", key, value))), raw,
               ErrorCode.PROTOCOL_ERROR)


def test_client_goaway_frame() -> None:
    raw = Raw()
    ev = raw.send(GoAwayFrame(0, last_stream_id=0, error_code=2))
    assert ev[0].last_stream_id == 0 and ev[0].code == ErrorCode.INTERNAL_ERROR
    assert raw.server.peer_goaway == 0 and not raw.server.closed


def test_settings_on_a_stream_and_goaway_on_a_stream() -> None:
    raw = Raw()
    conn_error(raw.send(raw_frame(0x4, 0, 1, b"")), raw, ErrorCode.PROTOCOL_ERROR)
    raw = Raw()
    conn_error(raw.send(raw_frame(0x7, 0, 1, b"\0" * 8)), raw, ErrorCode.PROTOCOL_ERROR)


def test_refused_past_max_concurrent_streams() -> None:
    raw = Raw(H2Limits(max_concurrent_streams=2))
    for sid in (1, 3):
        raw.send(HeadersFrame(sid, raw.block(GET), flags=EHS))
    ev = raw.send(HeadersFrame(5, raw.block(GET), flags=EHS))
    assert ev == [] and raw.rst(5).error_code == ErrorCode.REFUSED_STREAM
    raw.server.send_headers(1, 200, [], end_stream=True)
    ev = raw.send(HeadersFrame(7, raw.block(GET), flags=EHS))
    assert isinstance(ev[0], RequestReceived)


# -- floods --------------------------------------------------------------------------------


def test_rapid_reset() -> None:
    raw = Raw(H2Limits(max_resets_per_window=50))
    ev: list = []
    for i in range(51):
        sid = 2 * i + 1
        ev = raw.send(HeadersFrame(sid, raw.block(GET), flags=EH), RstStreamFrame(sid, 8))
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)
    assert raw.server.resets_received == 51 and raw.server.flood == 1


def test_resets_spread_over_time_are_fine() -> None:
    raw = Raw(H2Limits(max_resets_per_window=10, reset_window=1.0))
    for i in range(30):
        raw.now = i * 0.2
        sid = 2 * i + 1
        raw.send(HeadersFrame(sid, raw.block(GET), flags=EH), RstStreamFrame(sid, 8))
    assert not raw.server.closed and raw.server.resets_received == 30


def test_stream_errors_count_as_resets() -> None:
    raw = Raw(H2Limits(max_resets_per_window=20))
    ev: list = []
    for i in range(21):
        ev = raw.send(HeadersFrame(2 * i + 1, raw.block([(b":method", b"GET")]), flags=EHS))
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)


@pytest.mark.parametrize(("frame", "counter"), [
    (PingFrame(0, b"12345678"), "pings"),
    (SettingsFrame(0), "settings"),
])
def test_control_floods(frame: object, counter: str) -> None:
    raw = Raw()
    ev = raw.send(*[frame] * (100 - getattr(raw.server, counter)))  # the preface's SETTINGS
    assert not raw.server.closed
    ev = raw.send(frame)
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)
    assert getattr(raw.server, counter) >= 100 and raw.server.flood == 1


def test_empty_data_flood() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(post()), flags=EH))
    ev = raw.send(*[DataFrame(1, b"") for _ in range(101)])
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)
    assert raw.server.empty_frames == 101


def test_unread_replies_are_a_flood() -> None:
    srv = H2Server(H2Limits(max_pending_output=1000, max_pings_per_window=10**6))
    srv.receive(PREFACE + SettingsFrame(0).serialize(), 0.0)
    ev = srv.receive(PingFrame(0, b"12345678").serialize() * 100, 0.0)  # never read
    assert isinstance(ev[-1], ConnectionError) and ev[-1].code == ErrorCode.ENHANCE_YOUR_CALM


def test_input_after_connection_error_is_ignored() -> None:
    raw = Raw()
    raw.send(raw_frame(0x4, 0, 1, b""))
    assert raw.server.closed
    assert raw.send(PingFrame(0, b"12345678")) == []
