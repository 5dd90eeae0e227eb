"""H2Server against the real ``h2`` client state machine: requests, bodies, flow control.

``Pair`` (shared by the other test_h2_* files) pipes bytes between an ``h2`` client and an
H2Server in memory, like h11's ConnectionPair: both sides' events are checked at once, and
the strict client catches anything we put on the wire that RFC 9113 forbids.
"""

from __future__ import annotations

from typing import Any

import h2.events as ce
import hpack
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes, Settings
from hyperframe.frame import Frame, SettingsFrame

from lameduck.http2.connection import (
    PREFACE,
    DataReceived,
    ErrorCode,
    H2Limits,
    H2Server,
    RequestReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)

GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"example.com"),
       (b":path", b"/")]


def post(length: int | None = None) -> list[tuple[bytes, bytes]]:
    head = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"example.com"),
            (b":path", b"/upload")]
    if length is not None:
        head.append((b"content-length", b"%d" % length))
    return head


class Pair:
    """An ``h2`` client and an H2Server joined by an in-memory link."""

    def __init__(self, limits: H2Limits | None = None,
                 client_settings: dict[int, int] | None = None) -> None:
        self.client = H2Connection(H2Configuration(client_side=True, header_encoding=None))
        if client_settings:
            self.client.local_settings = Settings(client=True, initial_values=client_settings)
        self.client.initiate_connection()
        self.server = H2Server(limits)
        self.server.initiate()
        self.now = 0.0
        self.server_events: list[Any] = []
        self.client_events: list[Any] = []
        self.pump()

    def pump(self) -> tuple[list[Any], list[Any]]:
        """Move bytes both ways until quiet; the events each side saw in this call."""
        srv: list[Any] = []
        cli: list[Any] = []
        while True:
            up = self.client.data_to_send()
            if up:
                srv += self.server.receive(up, self.now)
            down = self.server.data_to_send()
            if down:
                cli += self.client.receive_data(down)
            if not up and not down:
                break
        self.server_events += srv
        self.client_events += cli
        return srv, cli

    def request(self, headers: list[tuple[bytes, bytes]] | None = None,
                body: bytes | None = None) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, headers or GET, end_stream=body is None)
        if body is not None:
            self.client.send_data(sid, body, end_stream=True)
        return sid


def of(events: list[Any], kind: type) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def frames_of(data: bytes) -> list[Frame]:
    """The frames in a byte string, parsed by hyperframe (an independent reader)."""
    out = []
    view = memoryview(data)
    pos = 0
    while pos < len(data):
        frame, length = Frame.parse_frame_header(view[pos:pos + 9])
        frame.parse_body(view[pos + 9:pos + 9 + length])
        out.append(frame)
        pos += 9 + length
    return out


class Raw:
    """A hand-driven client for frames ``h2`` would never send; its own HPACK encoder."""

    def __init__(self, limits: H2Limits | None = None) -> None:
        self.server = H2Server(limits)
        self.server.initiate()
        self.enc = hpack.Encoder()
        self.now = 0.0
        self.events = self.server.receive(PREFACE + SettingsFrame(0).serialize(), 0.0)
        self.sent = frames_of(self.server.data_to_send())

    def send(self, *frames: Frame | bytes) -> list[Any]:
        data = b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames)
        events = self.server.receive(data, self.now)
        self.sent = frames_of(self.server.data_to_send())
        return events

    def block(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        return self.enc.encode(headers)

    def goaway(self) -> Any:
        found = [f for f in self.sent if f.type == 0x7]
        assert found, self.sent
        return found[-1]

    def rst(self, sid: int) -> Any:
        found = [f for f in self.sent if f.type == 0x3 and f.stream_id == sid]
        assert found, self.sent
        return found[-1]


# ---------------------------------------------------------------------------------- tests


def test_handshake_settings_both_ways() -> None:
    p = Pair()
    changed = of(p.client_events, ce.RemoteSettingsChanged)[0].changed_settings
    assert changed[SettingCodes.MAX_CONCURRENT_STREAMS].new_value == 100
    assert changed[SettingCodes.INITIAL_WINDOW_SIZE].new_value == 1 << 20
    assert changed[SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 64 * 1024
    assert changed[SettingCodes.ENABLE_CONNECT_PROTOCOL].new_value == 1
    assert of(p.client_events, ce.SettingsAcknowledged)
    assert p.client.outbound_flow_control_window == 1 << 24
    assert p.server._settings_acked


def test_get_round_trip() -> None:
    p = Pair()
    sid = p.request([*GET, (b"user-agent", b"t"), (b"accept", b"*/*")])
    srv, _ = p.pump()
    assert srv == [RequestReceived(sid, b"GET", b"https", b"example.com", b"/", None,
                                   [(b"user-agent", b"t"), (b"accept", b"*/*")], True)]
    assert p.server.last_processed == sid and p.server.open_streams == 1
    p.server.send_headers(sid, 200, [(b"Content-Type", b"text/plain"), (b"connection", b"x"),
                                     (b"transfer-encoding", b"chunked")])
    p.server.send_data(sid, b"hello", end_stream=True)
    _, cli = p.pump()
    resp = of(cli, ce.ResponseReceived)[0]
    assert resp.headers == [(b":status", b"200"), (b"content-type", b"text/plain")]
    assert of(cli, ce.DataReceived)[0].data == b"hello"
    assert of(cli, ce.StreamEnded)
    assert p.server.open_streams == 0


def test_many_requests_keep_hpack_in_step() -> None:
    p = Pair()
    for i in range(100):
        sid = p.request([*GET[:3], (b":path", b"/%d" % i), (b"x-n", b"%d" % (i % 7))])
        srv, _ = p.pump()
        assert srv[0].path == b"/%d" % i
        p.server.send_headers(sid, 200 if i % 3 else 404,
                              [(b"x-i", b"%d" % i), (b"server", b"lameduck")], end_stream=True)
        _, cli = p.pump()
        assert of(cli, ce.ResponseReceived)[0].headers[1] == (b"x-i", b"%d" % i)


def test_post_body_both_ways_and_trailers() -> None:
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, [*post(10), (b"te", b"trailers")])
    p.client.send_data(sid, b"01234")
    p.client.send_data(sid, b"56789")
    p.client.send_headers(sid, [(b"x-sum", b"45")], end_stream=True)
    srv, _ = p.pump()
    assert srv[0].method == b"POST" and srv[0].headers[-1] == (b"te", b"trailers")
    datas = of(srv, DataReceived)
    assert b"".join(d.data for d in datas) == b"0123456789"
    assert of(srv, TrailersReceived) == [TrailersReceived(sid, [(b"x-sum", b"45")])]
    for d in datas:
        p.server.acknowledge_received_data(sid, d.flow_len)
    p.server.send_headers(sid, 100, [])
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"abc")
    p.server.send_trailers(sid, [(b"grpc-status", b"0")])
    _, cli = p.pump()
    assert of(cli, ce.InformationalResponseReceived)
    assert of(cli, ce.TrailersReceived)[0].headers == [(b"grpc-status", b"0")]
    assert p.server.open_streams == 0


def test_padded_data_counts_padding() -> None:
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, post())
    p.client.send_data(sid, b"xyz", end_stream=True, pad_length=10)
    srv, _ = p.pump()
    data = of(srv, DataReceived)[0]
    assert data.data == b"xyz" and data.flow_len == 3 + 1 + 10 and data.end_stream


def test_receive_window_updates_are_batched() -> None:
    lim = H2Limits(initial_window_size=65535, connection_window=1 << 20)
    p = Pair(lim)
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, post())
    p.client.send_data(sid, b"x" * 16384)
    p.pump()
    p.server.acknowledge_received_data(sid, 16384)
    assert p.server.data_to_send() == b""  # below half a window: nothing yet
    p.client.send_data(sid, b"x" * 16384)
    _srv, _ = p.pump()
    p.server.acknowledge_received_data(sid, 16384)  # 32768 ≥ 65535 / 2
    _, cli = p.pump()
    updated = of(cli, ce.WindowUpdated)
    assert [u.stream_id for u in updated] == [sid]
    assert p.client.local_flow_control_window(sid) == 65535


def test_large_body_waits_for_the_client_window() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    sid = p.request()
    p.pump()
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"a" * 5000, end_stream=True)
    assert p.server.outbound_buffered(sid) == 4000
    _, cli = p.pump()
    assert sum(len(e.data) for e in of(cli, ce.DataReceived)) == 1000
    assert p.server.open_streams == 1
    got = 1000
    for _ in range(4):
        p.client.acknowledge_received_data(1000, sid)
        _, cli = p.pump()
        got += sum(len(e.data) for e in of(cli, ce.DataReceived))
    assert got == 5000 and of(cli, ce.StreamEnded)
    assert p.server.outbound_buffered(sid) == 0 and p.server.open_streams == 0


def test_window_opened_when_buffer_drains() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 100})
    sid = p.request()
    p.pump()
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"b" * 250)
    p.pump()
    p.client.acknowledge_received_data(100, sid)
    srv, _ = p.pump()
    assert not of(srv, WindowOpened) and p.server.outbound_buffered(sid) == 50
    p.client.acknowledge_received_data(100, sid)
    srv, _ = p.pump()
    assert of(srv, WindowOpened) == [WindowOpened(sid)]
    p.server.send_data(sid, b"", end_stream=True)
    _, cli = p.pump()
    assert of(cli, ce.StreamEnded)


def test_connection_window_shared_round_robin() -> None:
    p = Pair()
    sids = [p.request() for _ in range(3)]
    p.pump()
    for sid in sids:
        p.server.send_headers(sid, 200, [])
        p.server.send_data(sid, b"c" * 40000, end_stream=True)  # 120000 > 65535
    _, cli = p.pump()
    assert sum(p.server.outbound_buffered(s) for s in sids) == 120000 - 65535
    p.client.increment_flow_control_window(30000)
    _, cli = p.pump()
    # one frame per stream per round: both waiting streams got some of the 30000
    got = {e.stream_id for e in of(cli, ce.DataReceived)}
    assert got == {sids[1], sids[2]}
    p.client.increment_flow_control_window(60000)
    p.pump()
    ended = {e.stream_id for e in of(p.client_events, ce.StreamEnded)}
    assert ended == set(sids)


def test_peer_initial_window_change_applies_to_open_streams() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 100})
    sid = p.request()
    p.pump()
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"d" * 300, end_stream=True)
    p.pump()
    assert p.server.outbound_buffered(sid) == 200
    p.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 10})  # window → -90
    p.pump()
    assert p.server._streams[sid].send_window == -90
    p.client.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 400})  # → 300
    _, cli = p.pump()
    assert of(cli, ce.StreamEnded) and p.server.open_streams == 0


def test_peer_max_frame_size_bounds_data_frames() -> None:
    p = Pair(client_settings={SettingCodes.MAX_FRAME_SIZE: 20000})
    sid = p.request()
    p.pump()
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"e" * 50000, end_stream=True)
    sizes = [len(f.data) for f in frames_of(p.server.data_to_send()) if f.type == 0]
    assert sizes == [20000, 20000, 10000]


def test_large_response_headers_use_continuation() -> None:
    p = Pair()
    sid = p.request()
    p.pump()
    big = [(b"x-%d" % i, b"v" * 1000) for i in range(40)]
    p.server.send_headers(sid, 200, big, end_stream=True)
    _, cli = p.pump()
    assert of(cli, ce.ResponseReceived)[0].headers[1:] == big


def test_client_reset_is_reported_and_output_dropped() -> None:
    p = Pair(client_settings={SettingCodes.INITIAL_WINDOW_SIZE: 10})
    sid = p.request()
    p.pump()
    p.server.send_headers(sid, 200, [])
    p.server.send_data(sid, b"f" * 100)
    p.pump()
    p.client.reset_stream(sid, ErrorCode.CANCEL)
    srv, _ = p.pump()
    assert srv == [StreamReset(sid, ErrorCode.CANCEL)]
    assert p.server.open_streams == 0 and p.server.resets_received == 1
    p.server.send_data(sid, b"late")  # ignored: the stream is gone
    assert p.server.data_to_send() == b""


def test_shell_reset_stream() -> None:
    p = Pair()
    sid = p.request(post(), b"x")
    p.pump()
    p.server.reset_stream(sid, ErrorCode.INTERNAL_ERROR)
    _, cli = p.pump()
    assert of(cli, ce.StreamReset)[0].error_code == ErrorCode.INTERNAL_ERROR
    assert p.server.resets_sent == 1 and p.server.open_streams == 0


def test_ping_is_echoed() -> None:
    p = Pair()
    p.client.ping(b"12345678")
    srv, cli = p.pump()
    assert srv == [] and of(cli, ce.PingAckReceived)[0].ping_data == b"12345678"
    assert p.server.pings == 1


def test_extended_connect() -> None:
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, [(b":method", b"CONNECT"), (b":protocol", b"websocket"),
                                (b":scheme", b"https"), (b":path", b"/chat"),
                                (b":authority", b"example.com"),
                                (b"sec-websocket-version", b"13")])
    srv, _ = p.pump()
    assert srv == [RequestReceived(sid, b"CONNECT", b"https", b"example.com", b"/chat",
                                   b"websocket", [(b"sec-websocket-version", b"13")], False)]
    p.server.send_headers(sid, 200, [])
    p.client.send_data(sid, b"frame")
    srv, cli = p.pump()
    assert of(cli, ce.ResponseReceived) and of(srv, DataReceived)[0].data == b"frame"


def test_plain_connect() -> None:
    p = Pair()
    sid = p.client.get_next_available_stream_id()
    p.client.send_headers(sid, [(b":method", b"CONNECT"), (b":authority", b"db:5432")])
    srv, _ = p.pump()
    assert srv == [RequestReceived(sid, b"CONNECT", None, b"db:5432", None, None, [], False)]


def test_cookie_crumbs_are_joined() -> None:
    p = Pair()
    p.request([*GET, (b"cookie", b"a=1"), (b"accept", b"*/*"), (b"cookie", b"b=2")])
    srv, _ = p.pump()
    assert srv[0].headers == [(b"cookie", b"a=1; b=2"), (b"accept", b"*/*")]


def test_client_goaway_is_reported_and_streams_go_on() -> None:
    p = Pair()
    sid = p.request()
    p.pump()
    p.client.close_connection(last_stream_id=0)
    srv, _ = p.pump()
    assert srv[0].last_stream_id == 0 and srv[0].code == ErrorCode.NO_ERROR
    assert p.server.peer_goaway == 0
    p.server.send_headers(sid, 204, [], end_stream=True)
    assert p.server.open_streams == 0
