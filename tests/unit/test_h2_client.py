"""H2Client against the real ``h2`` server state machine, and against hand-built frames for
what ``h2`` would never send.

``ServerPair`` pipes bytes between an H2Client and an ``h2`` server in memory (like
test_h2_connection's ``Pair``, mirrored): the strict server catches anything we put on the
wire that RFC 9113 forbids. ``RawServer`` sends exactly the frames a test builds.
"""

from __future__ import annotations

from typing import Any

import h2.events as se
import hpack
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.settings import SettingCodes, Settings
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from lameduck.http2 import (
    PREFACE,
    ConnectionError,
    DataReceived,
    ErrorCode,
    GoAwayReceived,
    H2Client,
    H2Limits,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from tests.unit.test_h2_connection import frames_of, of

GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"example.com"),
       (b":path", b"/")]
EH = ["END_HEADERS"]
EHS = ["END_HEADERS", "END_STREAM"]


def request(method: bytes = b"GET", path: bytes = b"/",
            extra: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    return [(b":method", method), (b":scheme", b"https"), (b":authority", b"example.com"),
            (b":path", path), *(extra or [])]


class ServerPair:
    """An H2Client and an ``h2`` server joined by an in-memory link."""

    def __init__(self, limits: H2Limits | None = None,
                 server_settings: dict[int, int] | None = None) -> None:
        self.server = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        if server_settings:
            self.server.local_settings = Settings(client=False, initial_values=server_settings)
        self.server.initiate_connection()
        self.client = H2Client(limits)
        self.client.initiate()
        self.now = 0.0
        self.server_events: list[Any] = []
        self.client_events: list[Any] = []
        self.up_frames: list[Frame] = []  # every frame the client wrote
        self.pump()

    def pump(self) -> tuple[list[Any], list[Any]]:
        """Move bytes both ways until quiet; the events each side saw in this call."""
        srv: list[Any] = []
        cli: list[Any] = []
        while True:
            up = self.client.data_to_send()
            if up:
                body = up[len(PREFACE):] if up.startswith(PREFACE) else up
                self.up_frames += frames_of(body)
                srv += self.server.receive_data(up)
            down = self.server.data_to_send()
            if down:
                cli += self.client.receive(down, self.now)
            if not up and not down:
                break
        self.server_events += srv
        self.client_events += cli
        return srv, cli


class RawServer:
    """A hand-driven server: its own HPACK encoder, frames exactly as the test builds them."""

    def __init__(self, limits: H2Limits | None = None,
                 settings: dict[int, int] | None = None) -> None:
        self.client = H2Client(limits)
        self.client.initiate()
        self.preface = self.client.data_to_send()
        self.enc = hpack.Encoder()
        self.now = 0.0
        self.events = self.client.receive(SettingsFrame(0, settings=settings or {}).serialize(),
                                          self.now)
        self.sent = frames_of(self.client.data_to_send())

    def send(self, *frames: Frame | bytes) -> list[Any]:
        data = b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames)
        events = self.client.receive(data, self.now)
        self.sent = frames_of(self.client.data_to_send())
        return events

    def head(self, sid: int, fields: list[tuple[bytes, bytes]], end: bool = False) -> HeadersFrame:
        return HeadersFrame(sid, self.enc.encode(fields), flags=EHS if end else EH)

    def request(self, end_stream: bool = True, head: bool = False) -> int:
        sid = self.client.send_request(request(b"HEAD" if head else b"GET"), end_stream, head)
        self.sent = frames_of(self.client.data_to_send())
        return sid

    def of_type(self, ftype: int) -> list[Any]:
        return [f for f in self.sent if f.type == ftype]

    def goaway(self) -> Any:
        found = self.of_type(0x7)
        assert found, self.sent
        return found[-1]

    def rst(self, sid: int) -> Any:
        found = [f for f in self.of_type(0x3) if f.stream_id == sid]
        assert found, self.sent
        return found[-1]


def conn_error(events: list[Any], raw: RawServer, code: ErrorCode) -> None:
    assert isinstance(events[-1], ConnectionError), events
    assert events[-1].code == code
    goaway = raw.goaway()
    assert (goaway.last_stream_id, goaway.error_code) == (0, code)
    assert raw.client.closed and not raw.client.can_open


def stream_error(events: list[Any], raw: RawServer, sid: int, code: ErrorCode) -> None:
    assert StreamReset(sid, code) in events, events
    assert raw.rst(sid).error_code == code
    assert not raw.client.closed
    assert sid not in raw.client._streams


# -- handshake -----------------------------------------------------------------------------


def test_handshake_settings_both_ways() -> None:
    p = ServerPair(H2Limits(initial_window_size=200_000, max_header_list_size=10_000))
    changed = of(p.server_events, se.RemoteSettingsChanged)[0].changed_settings
    assert changed[SettingCodes.ENABLE_PUSH].new_value == 0
    assert changed[SettingCodes.INITIAL_WINDOW_SIZE].new_value == 200_000
    assert changed[SettingCodes.MAX_HEADER_LIST_SIZE].new_value == 10_000
    assert SettingCodes.MAX_FRAME_SIZE not in changed  # the default is not sent
    assert of(p.server_events, se.SettingsAcknowledged)  # we acked the server's SETTINGS
    assert p.server.outbound_flow_control_window == 1 << 24  # our connection window
    assert p.client._settings_acked  # the server acked ours
    assert p.client.peer_max_concurrent_streams == 100  # h2's own default
    assert p.client.can_open and p.client.open_streams == 0
    assert p.client_events == []


def test_preface_bytes_exactly() -> None:
    c = H2Client(H2Limits(initial_window_size=70_000, max_header_list_size=8192,
                          max_frame_size=32768, connection_window=1 << 20))
    c.initiate()
    c.initiate()  # once only
    out = c.data_to_send()
    assert out.startswith(PREFACE)
    settings, wu = frames_of(out[len(PREFACE):])
    assert isinstance(settings, SettingsFrame) and "ACK" not in settings.flags
    assert settings.settings == {SettingsFrame.ENABLE_PUSH: 0,
                                 SettingsFrame.INITIAL_WINDOW_SIZE: 70_000,
                                 SettingsFrame.MAX_HEADER_LIST_SIZE: 8192,
                                 SettingsFrame.MAX_FRAME_SIZE: 32768}
    assert isinstance(wu, WindowUpdateFrame)
    assert (wu.stream_id, wu.window_increment) == (0, (1 << 20) - 65535)


def test_receive_initiates_if_not_done() -> None:
    c = H2Client()
    ev = c.receive(SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 7})
                   .serialize(), 0.0)
    assert ev == []
    out = c.data_to_send()
    assert out.startswith(PREFACE)
    frames = frames_of(out[len(PREFACE):])
    assert [type(f) for f in frames] == [SettingsFrame, WindowUpdateFrame, SettingsFrame]
    assert "ACK" in frames[2].flags
    assert c.peer_max_concurrent_streams == 7


def test_send_request_initiates_if_not_done() -> None:
    c = H2Client()
    assert c.send_request(GET, True) == 1
    out = c.data_to_send()
    assert out.startswith(PREFACE)
    assert [type(f) for f in frames_of(out[len(PREFACE):])] == [
        SettingsFrame, WindowUpdateFrame, HeadersFrame]


@pytest.mark.parametrize("first", [
    PingFrame(0, b"12345678"),
    SettingsFrame(0, flags=["ACK"]),
    WindowUpdateFrame(0, window_increment=10),
    HeadersFrame(1, b"\x88", flags=EHS),
])
def test_server_must_send_settings_first(first: Frame) -> None:
    c = H2Client()
    c.initiate()
    c.data_to_send()
    ev = c.receive(first.serialize() + SettingsFrame(0).serialize(), 0.0)
    assert len(ev) == 1 and isinstance(ev[0], ConnectionError)
    assert ev[0].code == ErrorCode.PROTOCOL_ERROR
    (goaway,) = frames_of(c.data_to_send())
    assert isinstance(goaway, GoAwayFrame)
    assert (goaway.last_stream_id, goaway.error_code) == (0, ErrorCode.PROTOCOL_ERROR)
    assert c.closed and not c.can_open
    assert c.receive(SettingsFrame(0).serialize(), 0.0) == []  # nothing after the end


# -- requests and responses ----------------------------------------------------------------


def test_get_round_trip() -> None:
    p = ServerPair()
    sid = p.client.send_request(request(extra=[(b"user-agent", b"t"), (b"accept", b"*/*")]),
                                end_stream=True)
    assert sid == 1
    srv, _ = p.pump()
    req = of(srv, se.RequestReceived)[0]
    assert req.headers == [*GET, (b"user-agent", b"t"), (b"accept", b"*/*")]
    assert of(srv, se.StreamEnded)[0].stream_id == sid
    p.server.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/plain"),
                                (b"content-length", b"5")])
    p.server.send_data(sid, b"hello", end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, 200, [(b"content-type", b"text/plain"),
                                               (b"content-length", b"5")], False),
                   DataReceived(sid, b"hello", 5, True)]
    assert p.client.open_streams == 0
    assert p.client.send_request(GET, True) == 3  # the next odd id


def test_request_names_lowered_and_connection_fields_dropped() -> None:
    p = ServerPair()
    sid = p.client.send_request(request(extra=[(b"X-Up", b"1"), (b"Connection", b"close"),
                                               (b"transfer-encoding", b"chunked")]), True)
    srv, _ = p.pump()
    assert of(srv, se.RequestReceived)[0].headers == [*GET, (b"x-up", b"1")]
    assert not of(srv, se.StreamReset)
    assert sid == 1


def test_post_with_body_and_trailers_both_ways() -> None:
    p = ServerPair()
    sid = p.client.send_request(request(b"POST", b"/upload", [(b"content-length", b"10"),
                                                              (b"te", b"trailers")]), False)
    p.client.send_data(sid, b"01234")
    p.client.send_data(sid, b"56789")
    p.client.send_trailers(sid, [(b"x-sum", b"45")])
    srv, _ = p.pump()
    assert b"".join(e.data for e in of(srv, se.DataReceived)) == b"0123456789"
    assert of(srv, se.TrailersReceived)[0].headers == [(b"x-sum", b"45")]
    assert of(srv, se.StreamEnded)
    p.server.send_headers(sid, [(b":status", b"201")])
    p.server.send_data(sid, b"abc")
    p.server.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, 201, [], False), DataReceived(sid, b"abc", 3, False),
                   TrailersReceived(sid, [(b"grpc-status", b"0")])]
    assert p.client.open_streams == 0


def test_interim_responses_then_final() -> None:
    p = ServerPair()
    sid = p.client.send_request(request(b"POST", b"/", [(b"expect", b"100-continue")]), False)
    p.pump()
    p.server.send_headers(sid, [(b":status", b"100")])
    p.server.send_headers(sid, [(b":status", b"103"), (b"link", b"</s.css>; rel=preload")])
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, 100, [], False),
                   ResponseReceived(sid, 103, [(b"link", b"</s.css>; rel=preload")], False)]
    p.client.send_data(sid, b"body", end_stream=True)
    p.pump()
    p.server.send_headers(sid, [(b":status", b"200")], end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, 200, [], True)]
    assert p.client.open_streams == 0


def test_head_response_with_content_length_and_no_data() -> None:
    p = ServerPair()
    sid = p.client.send_request(request(b"HEAD"), True, head=True)
    p.pump()
    p.server.send_headers(sid, [(b":status", b"200"), (b"content-length", b"1234")],
                          end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, 200, [(b"content-length", b"1234")], True)]
    assert p.client.open_streams == 0 and not of(p.server_events, se.StreamReset)


def test_head_flag_is_what_excuses_the_missing_body() -> None:
    raw = RawServer()
    sid = raw.request(head=False)
    ev = raw.send(raw.head(sid, [(b":status", b"200"), (b"content-length", b"1234")], True))
    stream_error(ev, raw, sid, ErrorCode.PROTOCOL_ERROR)
    sid = raw.request(head=True)
    ev = raw.send(raw.head(sid, [(b":status", b"200"), (b"content-length", b"1234")]))
    assert ev == [ResponseReceived(sid, 200, [(b"content-length", b"1234")], False)]
    ev = raw.send(DataFrame(sid, b"", flags=["END_STREAM"]))  # an empty end is fine
    assert ev == [DataReceived(sid, b"", 0, True)] and raw.client.open_streams == 0


@pytest.mark.parametrize("status", [204, 304])
def test_no_content_statuses(status: int) -> None:
    p = ServerPair()
    sid = p.client.send_request(GET, True)
    p.pump()
    fields = [(b":status", b"%d" % status)]
    if status == 304:
        fields.append((b"content-length", b"500"))  # describes the full representation
    p.server.send_headers(sid, fields, end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid, status, fields[1:], True)]
    assert p.client.open_streams == 0


@pytest.mark.parametrize("status", [204, 304])
def test_no_content_statuses_reject_data(status: int) -> None:
    raw = RawServer()
    sid = raw.request()
    ev = raw.send(raw.head(sid, [(b":status", b"%d" % status), (b"content-length", b"3")]))
    assert ev == [ResponseReceived(sid, status, [(b"content-length", b"3")], False)]
    stream_error(raw.send(DataFrame(sid, b"abc", flags=["END_STREAM"])), raw, sid,
                 ErrorCode.PROTOCOL_ERROR)


def test_head_response_rejects_data() -> None:
    raw = RawServer()
    sid = raw.request(head=True)
    raw.send(raw.head(sid, [(b":status", b"200"), (b"content-length", b"3")]))
    stream_error(raw.send(DataFrame(sid, b"abc")), raw, sid, ErrorCode.PROTOCOL_ERROR)


def test_content_length_matches_exactly() -> None:
    raw = RawServer()
    sid = raw.request()
    raw.send(raw.head(sid, [(b":status", b"200"), (b"content-length", b"5"),
                            (b"content-length", b"5")]))  # equal repeats are fine
    assert raw.send(DataFrame(sid, b"hel")) == [DataReceived(sid, b"hel", 3, False)]
    assert raw.send(DataFrame(sid, b"lo", flags=["END_STREAM"])) == [
        DataReceived(sid, b"lo", 2, True)]
    assert raw.client.open_streams == 0 and not raw.of_type(0x3)


def test_content_length_exceeded_is_an_error_at_once() -> None:
    raw = RawServer()
    sid = raw.request()
    raw.send(raw.head(sid, [(b":status", b"200"), (b"content-length", b"5")]))
    assert raw.send(DataFrame(sid, b"abc")) == [DataReceived(sid, b"abc", 3, False)]
    ev = raw.send(DataFrame(sid, b"def"))  # 6 > 5, no END_STREAM yet
    stream_error(ev, raw, sid, ErrorCode.PROTOCOL_ERROR)
    assert not of(ev, DataReceived)


@pytest.mark.parametrize("ending", ["data", "trailers", "headers"])
def test_content_length_short_at_end_stream(ending: str) -> None:
    raw = RawServer()
    sid = raw.request()
    fields = [(b":status", b"200"), (b"content-length", b"5")]
    if ending == "headers":
        ev = raw.send(raw.head(sid, fields, end=True))
    else:
        raw.send(raw.head(sid, fields), DataFrame(sid, b"abc"))
        if ending == "data":
            ev = raw.send(DataFrame(sid, b"d", flags=["END_STREAM"]))
        else:
            ev = raw.send(raw.head(sid, [(b"x-t", b"1")], end=True))
    stream_error(ev, raw, sid, ErrorCode.PROTOCOL_ERROR)
    assert not of(ev, TrailersReceived) and not of(ev, ResponseReceived)


# Each case: the frames after the request, as ("h", fields, end_stream) or ("d", data, end);
# the last one makes the response malformed, the ones before it are fine.
STATUS = (b":status", b"200")
MALFORMED: dict[str, list[tuple[str, Any, bool]]] = {
    "no :status": [("h", [(b"x", b"1")], False)],
    "two :status": [("h", [STATUS, STATUS], False)],
    "two different :status": [("h", [STATUS, (b":status", b"204")], False)],
    ":status empty": [("h", [(b":status", b"")], False)],
    ":status two digits": [("h", [(b":status", b"20")], False)],
    ":status four digits": [("h", [(b":status", b"2000")], False)],
    ":status not digits": [("h", [(b":status", b"2x0")], False)],
    ":status below 100": [("h", [(b":status", b"099")], False)],
    ":status above 599": [("h", [(b":status", b"600")], False)],
    ":status 101": [("h", [(b":status", b"101")], False)],
    ":status with space": [("h", [(b":status", b" 200")], False)],
    "request pseudo-field": [("h", [STATUS, (b":path", b"/")], False)],
    ":method": [("h", [STATUS, (b":method", b"GET")], False)],
    "unknown pseudo-field": [("h", [STATUS, (b":foo", b"1")], False)],
    "pseudo after regular": [("h", [(b"x", b"1"), STATUS], False)],
    "upper-case name": [("h", [STATUS, (b"X-Up", b"1")], False)],
    "colon in name": [("h", [STATUS, (b"x:y", b"1")], False)],
    "space in name": [("h", [STATUS, (b"x y", b"1")], False)],
    "empty name": [("h", [STATUS, (b"", b"1")], False)],
    "NUL in value": [("h", [STATUS, (b"x", b"a\x00b")], False)],
    "CR in value": [("h", [STATUS, (b"x", b"a\rb")], False)],
    "LF in value": [("h", [STATUS, (b"x", b"a\nb")], False)],
    "leading space": [("h", [STATUS, (b"x", b" a")], False)],
    "trailing tab": [("h", [STATUS, (b"x", b"a\t")], False)],
    "connection": [("h", [STATUS, (b"connection", b"close")], False)],
    "keep-alive": [("h", [STATUS, (b"keep-alive", b"5")], False)],
    "proxy-connection": [("h", [STATUS, (b"proxy-connection", b"x")], False)],
    "transfer-encoding": [("h", [STATUS, (b"transfer-encoding", b"chunked")], False)],
    "upgrade": [("h", [STATUS, (b"upgrade", b"h2c")], False)],
    "te not trailers": [("h", [STATUS, (b"te", b"gzip")], False)],
    "content-length not digits": [("h", [STATUS, (b"content-length", b"1x")], False)],
    "content-length negative": [("h", [STATUS, (b"content-length", b"-1")], False)],
    "content-length repeats differ": [
        ("h", [STATUS, (b"content-length", b"5"), (b"content-length", b"6")], False)],
    "1xx with END_STREAM": [("h", [(b":status", b"100")], True)],
    "1xx after the final": [("h", [STATUS], False), ("h", [(b":status", b"103")], False)],
    "1xx after the final, ending": [("h", [STATUS], False), ("h", [(b":status", b"100")], True)],
    "DATA before any head": [("d", b"x", False)],
    "DATA after a 1xx only": [("h", [(b":status", b"100")], False), ("d", b"x", False)],
    "empty DATA ending after a 1xx": [("h", [(b":status", b"100")], False), ("d", b"", True)],
    "trailers without END_STREAM": [("h", [STATUS], False), ("d", b"x", False),
                                    ("h", [(b"x-t", b"1")], False)],
    "trailers with a pseudo-field": [("h", [STATUS], False),
                                     ("h", [STATUS, (b"x-t", b"1")], True)],
    "trailers with a bad field": [("h", [STATUS], False), ("h", [(b"X-T", b"1")], True)],
    "trailers with connection": [("h", [STATUS], False),
                                 ("h", [(b"connection", b"close")], True)],
}


@pytest.mark.parametrize("steps", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_responses_are_reset(steps: list[tuple[str, Any, bool]]) -> None:
    raw = RawServer()
    sid = raw.request()
    for i, (kind, payload, end) in enumerate(steps):
        if kind == "h":
            ev = raw.send(raw.head(sid, payload, end))
        else:
            ev = raw.send(DataFrame(sid, payload, flags=["END_STREAM"] if end else []))
        if i < len(steps) - 1:
            assert not of(ev, StreamReset) and not raw.of_type(0x3), (i, ev)
    stream_error(ev, raw, sid, ErrorCode.PROTOCOL_ERROR)
    assert not of(ev, ResponseReceived) and not of(ev, TrailersReceived)
    assert raw.client.open_streams == 0
    # Only the stream was lost: the HPACK table is in step and the next stream works.
    sid2 = raw.request()
    ev = raw.send(raw.head(sid2, [STATUS, (b"x", b"ok")], end=True))
    assert ev == [ResponseReceived(sid2, 200, [(b"x", b"ok")], True)]


def test_well_formed_edge_cases_pass() -> None:
    raw = RawServer()
    for status in (b"100", b"199", b"200", b"599"):
        sid = raw.request()
        fields = [(b":status", status), (b"te", b"trailers"), (b"x", b"a b\x7f\x80"),
                  (b"cookie", b"a=1"), (b"cookie", b"b=2"), (b"set-cookie", b"c=3")]
        ev = raw.send(raw.head(sid, fields, end=status >= b"200"))
        assert ev == [ResponseReceived(sid, int(status), fields[1:], status >= b"200")], ev
        if status < b"200":
            raw.client.reset_stream(sid)


def test_response_head_depending_on_itself_is_a_stream_error() -> None:
    raw = RawServer()
    sid = raw.request()
    hf = HeadersFrame(sid, raw.enc.encode([STATUS]), flags=["END_HEADERS", "PRIORITY"],
                      depends_on=sid, stream_weight=15)
    stream_error(raw.send(hf), raw, sid, ErrorCode.PROTOCOL_ERROR)
    sid = raw.request()  # another dependency is fine (and ignored)
    hf = HeadersFrame(sid, raw.enc.encode([STATUS]), flags=["END_HEADERS", "PRIORITY"],
                      depends_on=1, stream_weight=15)
    assert raw.send(hf) == [ResponseReceived(sid, 200, [], False)]


def test_response_head_too_large_is_cancelled() -> None:
    raw = RawServer(H2Limits(max_header_list_size=1000))
    sid = raw.request()
    ev = raw.send(raw.head(sid, [STATUS, (b"x-big", b"v" * 2000)]))
    stream_error(ev, raw, sid, ErrorCode.CANCEL)
    sid = raw.request()
    assert raw.send(raw.head(sid, [STATUS, (b"x-ok", b"v" * 500)], end=True))[0].status == 200


# -- flow control --------------------------------------------------------------------------


def test_response_body_waits_for_acknowledgement() -> None:
    limits = H2Limits(initial_window_size=32768, connection_window=65535)
    p = ServerPair(limits)
    sid = p.client.send_request(GET, True)
    p.pump()
    total = 200_000
    p.server.send_headers(sid, [(b":status", b"200"), (b"content-length", b"%d" % total)])
    sent = 0
    got = bytearray()
    acked = 0
    rounds = 0
    while sent < total or acked < total:
        room = min(p.server.local_flow_control_window(sid), total - sent)
        while room > 0:
            n = min(room, p.server.max_outbound_frame_size)
            p.server.send_data(sid, b"x" * n, end_stream=sent + n == total)
            sent += n
            room -= n
        before = len(p.up_frames)
        _, cli = p.pump()
        datas = of(cli, DataReceived)
        got += b"".join(d.data for d in datas)
        # Nothing acknowledged: the client wrote no WINDOW_UPDATE and the server is stuck.
        assert not [f for f in p.up_frames[before:] if isinstance(f, WindowUpdateFrame)]
        if sent < total:
            assert p.server.local_flow_control_window(sid) == 0
            assert len(got) - acked <= 32768
        # Acknowledge in two parts: the first (under half a window) reopens nothing.
        unacked = sum(d.flow_len for d in datas)
        first = min(unacked, 16383)
        p.client.acknowledge_received_data(sid, first)
        assert p.client.data_to_send() == b""
        p.client.acknowledge_received_data(sid, unacked - first)
        acked += unacked
        p.pump()  # the WINDOW_UPDATEs reach the server
        rounds += 1
        assert rounds < 100
    assert bytes(got) == b"x" * total
    assert p.client.open_streams == 0
    assert of(p.client_events, DataReceived)[-1].end_stream
    assert rounds >= total // 32768


def test_window_updates_batched_at_half_a_window() -> None:
    raw = RawServer(H2Limits(initial_window_size=40_000, connection_window=60_000))
    sid = raw.request()
    raw.send(raw.head(sid, [STATUS]), DataFrame(sid, b"a" * 16_000),
             DataFrame(sid, b"b" * 16_000))
    assert raw.sent == []  # unacknowledged: no WINDOW_UPDATE at all
    raw.client.acknowledge_received_data(sid, 16_000)
    assert raw.client.data_to_send() == b""  # 16000 < 20000 (stream), < 30000 (connection)
    raw.client.acknowledge_received_data(sid, 16_000)
    wus = frames_of(raw.client.data_to_send())
    assert {(f.stream_id, f.window_increment) for f in wus} == {(0, 32_000), (sid, 32_000)}
    raw.send(DataFrame(sid, b"c" * 16_000))
    raw.client.acknowledge_received_data(sid, 16_000)
    assert raw.client.data_to_send() == b""
    raw.send(DataFrame(sid, b"d" * 16_000, flags=["END_STREAM"]))
    raw.client.acknowledge_received_data(sid, 16_000)
    (wu,) = frames_of(raw.client.data_to_send())  # the stream has ended: connection only
    assert (wu.stream_id, wu.window_increment) == (0, 32_000)


def test_receive_window_is_enforced() -> None:
    raw = RawServer(H2Limits(initial_window_size=65535, connection_window=1 << 20))
    sid = raw.request()
    raw.send(raw.head(sid, [STATUS]))
    raw.send(*(DataFrame(sid, b"x" * 16383) for _ in range(4)))  # 65532: fits
    ev = raw.send(DataFrame(sid, b"x" * 10))
    stream_error(ev, raw, sid, ErrorCode.FLOW_CONTROL_ERROR)


def test_request_body_waits_for_server_window() -> None:
    p = ServerPair(server_settings={SettingCodes.INITIAL_WINDOW_SIZE: 16384})
    body = bytes(range(256)) * 400  # 102400 bytes
    sid = p.client.send_request(request(b"POST", b"/up", [(b"content-length", b"102400")]),
                                False)
    p.client.send_data(sid, body)
    assert p.client.outbound_buffered(sid) == len(body) - 16384
    srv, cli = p.pump()
    got = bytearray(b"".join(d.data for d in of(srv, se.DataReceived)))
    assert len(got) == 16384 and cli == []  # held: the server has not acknowledged
    opened: list[Any] = []
    for _ in range(50):
        for d in of(srv, se.DataReceived):
            p.server.acknowledge_received_data(d.flow_controlled_length, sid)
        srv, cli = p.pump()
        opened += of(cli, WindowOpened)
        datas = of(srv, se.DataReceived)
        got += b"".join(d.data for d in datas)
        if not datas:
            break
    assert bytes(got) == body
    assert opened == [WindowOpened(sid)] and p.client.outbound_buffered(sid) == 0
    assert not of(p.server_events, se.StreamEnded)
    p.client.send_data(sid, b"", end_stream=True)
    srv, _ = p.pump()
    assert of(srv, se.StreamEnded)


def test_request_body_held_until_window_update() -> None:
    raw = RawServer(settings={SettingsFrame.INITIAL_WINDOW_SIZE: 10})
    sid = raw.request(end_stream=False)
    raw.client.send_data(sid, b"0123456789abcdef", end_stream=True)
    (data,) = frames_of(raw.client.data_to_send())
    assert data.data == b"0123456789" and "END_STREAM" not in data.flags
    assert raw.client.outbound_buffered(sid) == 6
    ev = raw.send(WindowUpdateFrame(sid, window_increment=4))
    assert [f.data for f in raw.sent] == [b"abcd"] and ev == []
    ev = raw.send(WindowUpdateFrame(sid, window_increment=100))
    assert [f.data for f in raw.sent] == [b"ef"] and "END_STREAM" in raw.sent[0].flags
    assert ev == []  # the body ended: nothing to resume
    assert raw.client.outbound_buffered(sid) == 0


# -- resets, GOAWAY, concurrency -----------------------------------------------------------


def test_refused_stream_from_server() -> None:
    p = ServerPair()
    sid = p.client.send_request(GET, True)
    p.pump()
    p.server.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
    _, cli = p.pump()
    assert cli == [StreamReset(sid, ErrorCode.REFUSED_STREAM)]
    assert p.client.open_streams == 0 and p.client.resets_received == 1
    sid2 = p.client.send_request(GET, True)  # a retry on the same connection
    p.pump()
    p.server.send_headers(sid2, [(b":status", b"200")], end_stream=True)
    _, cli = p.pump()
    assert cli == [ResponseReceived(sid2, 200, [], True)]


def test_frames_on_a_stream_we_reset_are_ignored() -> None:
    raw = RawServer(H2Limits(connection_window=65535))
    sid = raw.request(end_stream=False)
    raw.client.reset_stream(sid, ErrorCode.CANCEL)
    (rst,) = frames_of(raw.client.data_to_send())
    assert (rst.stream_id, rst.error_code) == (sid, ErrorCode.CANCEL)
    ev = raw.send(raw.head(sid, [STATUS]), *(DataFrame(sid, b"x" * 13_000) for _ in range(3)),
                  WindowUpdateFrame(sid, window_increment=5), RstStreamFrame(sid, 0))
    assert ev == [] and not raw.client.closed
    # The DATA was given back to the connection window (nobody will acknowledge it).
    assert [(f.stream_id, f.window_increment) for f in raw.sent] == [(0, 39_000)]
    sid2 = raw.request()  # the HPACK table is still in step
    assert raw.send(raw.head(sid2, [STATUS, (b"x", b"1")], end=True)) == [
        ResponseReceived(sid2, 200, [(b"x", b"1")], True)]


def test_frames_on_a_finished_stream() -> None:
    raw = RawServer()
    sid = raw.request()
    raw.send(raw.head(sid, [STATUS], end=True))
    assert raw.client.open_streams == 0
    assert raw.send(WindowUpdateFrame(sid, window_increment=1)) == []  # may be in flight
    assert raw.send(DataFrame(sid, b"x")) == []  # the shell has forgotten it: not reported
    assert raw.rst(sid).error_code == ErrorCode.STREAM_CLOSED and not raw.client.closed
    sid = raw.request()
    raw.send(raw.head(sid, [STATUS], end=True))
    conn_error(raw.send(raw.head(sid, [STATUS])), raw, ErrorCode.STREAM_CLOSED)


def test_server_rst_no_error_after_response_stops_our_body() -> None:
    raw = RawServer()
    sid = raw.request(end_stream=False)
    raw.client.send_data(sid, b"partial")
    raw.client.data_to_send()
    ev = raw.send(raw.head(sid, [STATUS], end=True), RstStreamFrame(sid, 0))
    assert ev == [ResponseReceived(sid, 200, [], True), StreamReset(sid, ErrorCode.NO_ERROR)]
    raw.client.send_data(sid, b"more", end_stream=True)  # ignored: the stream is gone
    assert raw.client.data_to_send() == b"" and raw.client.open_streams == 0


def test_goaway_refuses_streams_above_last() -> None:
    raw = RawServer()
    sids = [raw.request() for _ in range(4)]
    assert sids == [1, 3, 5, 7]
    ev = raw.send(GoAwayFrame(0, last_stream_id=3, error_code=0))
    assert ev == [GoAwayReceived(3, ErrorCode.NO_ERROR),
                  StreamReset(5, ErrorCode.REFUSED_STREAM),
                  StreamReset(7, ErrorCode.REFUSED_STREAM)]
    assert raw.sent == []  # nothing to tell the server: it will not process them
    assert raw.client.peer_goaway == 3 and not raw.client.can_open
    assert raw.client.open_streams == 2
    with pytest.raises(RuntimeError):
        raw.client.send_request(GET, True)
    # The streams at or below last complete; anything still in flight for 5 is ignored.
    ev = raw.send(raw.head(1, [STATUS], end=True), raw.head(5, [STATUS], end=True),
                  raw.head(3, [STATUS]), DataFrame(3, b"ok", flags=["END_STREAM"]))
    assert ev == [ResponseReceived(1, 200, [], True), ResponseReceived(3, 200, [], False),
                  DataReceived(3, b"ok", 2, True)]
    assert raw.client.open_streams == 0 and not raw.client.closed
    # A later, lower GOAWAY refuses nothing more (nothing is open), and is reported.
    assert raw.send(GoAwayFrame(0, last_stream_id=1, error_code=0)) == [
        GoAwayReceived(1, ErrorCode.NO_ERROR)]


def test_goaway_from_h2_server() -> None:
    p = ServerPair()
    sids = [p.client.send_request(GET, True) for _ in range(3)]
    p.pump()
    p.server.close_connection(error_code=ErrorCodes.NO_ERROR, last_stream_id=sids[0])
    _, cli = p.pump()
    assert cli == [GoAwayReceived(1, ErrorCode.NO_ERROR),
                   StreamReset(3, ErrorCode.REFUSED_STREAM),
                   StreamReset(5, ErrorCode.REFUSED_STREAM)]
    assert p.client.open_streams == 1 and not p.client.can_open


def test_can_open_follows_max_concurrent_streams() -> None:
    p = ServerPair(server_settings={SettingCodes.MAX_CONCURRENT_STREAMS: 2})
    assert p.client.peer_max_concurrent_streams == 2
    a = p.client.send_request(GET, True)
    assert p.client.can_open
    b = p.client.send_request(request(b"POST"), False)  # still sending: counts too
    assert not p.client.can_open
    with pytest.raises(RuntimeError):
        p.client.send_request(GET, True)
    p.pump()
    p.server.send_headers(b, [(b":status", b"200")], end_stream=True)
    p.pump()
    assert not p.client.can_open  # b's response ended, but our half is open
    p.client.send_data(b, b"", end_stream=True)
    p.pump()
    assert p.client.can_open and p.client.open_streams == 1
    c = p.client.send_request(GET, True)
    assert not p.client.can_open
    p.server.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 3})
    p.pump()
    assert p.client.peer_max_concurrent_streams == 3 and p.client.can_open
    p.server.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 1})
    p.pump()
    assert not p.client.can_open
    for sid in (a, c):
        p.server.send_headers(sid, [(b":status", b"204")], end_stream=True)
    p.pump()
    assert p.client.can_open and p.client.open_streams == 0


def test_max_concurrent_before_and_without_the_setting() -> None:
    c = H2Client()
    c.initiate()
    for _ in range(100):  # before the server's SETTINGS: 100 (RFC 9113 §6.5.2)
        c.send_request(GET, True)
    assert not c.can_open and c.peer_max_concurrent_streams == 100
    c.receive(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 1000}).serialize(),
              0.0)
    assert c.can_open and c.peer_max_concurrent_streams >= 2**32  # none named: no limit
    c.send_request(GET, True)
    c.receive(SettingsFrame(0, settings={SettingsFrame.MAX_CONCURRENT_STREAMS: 0}).serialize(),
              0.0)
    assert not c.can_open
    c.receive(SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 5}).serialize(),
              0.0)
    assert not c.can_open  # a later SETTINGS without it leaves the limit as it was


def test_can_open_ends_with_the_stream_ids() -> None:
    c = H2Client()
    c._next_id = 2**31 - 1
    assert c.can_open
    assert c.send_request(GET, True) == 2**31 - 1
    assert not c.can_open


# -- connection errors ---------------------------------------------------------------------


def test_push_promise_is_a_connection_error() -> None:
    raw = RawServer()
    sid = raw.request()
    ev = raw.send(PushPromiseFrame(sid, promised_stream_id=2,
                                   data=raw.enc.encode(GET), flags=["END_HEADERS"]))
    conn_error(ev, raw, ErrorCode.PROTOCOL_ERROR)


@pytest.mark.parametrize(("value", "ok"), [(0, True), (1, False)])
def test_server_may_not_enable_push(value: int, ok: bool) -> None:
    raw = RawServer()
    ev = raw.send(SettingsFrame(0, settings={SettingsFrame.ENABLE_PUSH: value}))
    if ok:
        assert ev == [] and [f.flags for f in raw.sent] == [{"ACK"}]
    else:
        conn_error(ev, raw, ErrorCode.PROTOCOL_ERROR)


def test_enable_push_in_the_first_settings() -> None:
    c = H2Client()
    ev = c.receive(SettingsFrame(0, settings={SettingsFrame.ENABLE_PUSH: 1}).serialize(), 0.0)
    assert ev[-1] == ConnectionError(ErrorCode.PROTOCOL_ERROR, ev[-1].reason)
    assert c.closed


@pytest.mark.parametrize("frame", [
    "headers odd", "headers even", "data odd", "data even", "window_update", "rst_stream",
])
def test_frames_on_streams_never_opened(frame: str) -> None:
    raw = RawServer()
    raw.request()  # stream 1 only
    make = {
        "headers odd": lambda: raw.head(3, [STATUS], end=True),
        "headers even": lambda: raw.head(2, [STATUS], end=True),
        "data odd": lambda: DataFrame(5, b"x"),
        "data even": lambda: DataFrame(2, b"x"),
        "window_update": lambda: WindowUpdateFrame(3, window_increment=1),
        "rst_stream": lambda: RstStreamFrame(3, 0),
    }
    conn_error(raw.send(make[frame]()), raw, ErrorCode.PROTOCOL_ERROR)


def test_server_errors_use_the_base_rules() -> None:
    raw = RawServer()
    sid = raw.request()
    ev = raw.send(HeadersFrame(sid, raw.enc.encode([STATUS]), flags=[]),  # no END_HEADERS
                  PingFrame(0, b"12345678"))
    conn_error(ev, raw, ErrorCode.PROTOCOL_ERROR)  # CONTINUATION expected


def test_ping_flood_limit_applies() -> None:
    raw = RawServer(H2Limits(max_pings_per_window=3))
    for i in range(3):
        assert raw.send(PingFrame(0, b"%08d" % i)) == []
        assert [(f.type, f.flags, f.opaque_data) for f in raw.sent] == [
            (0x6, {"ACK"}, b"%08d" % i)]
    conn_error(raw.send(PingFrame(0, b"99999999")), raw, ErrorCode.ENHANCE_YOUR_CALM)
    assert raw.client.flood == 1


def test_reset_flood_limit_applies() -> None:
    raw = RawServer(H2Limits(max_resets_per_window=2))
    for _ in range(2):
        sid = raw.request()
        assert raw.send(RstStreamFrame(sid, ErrorCode.REFUSED_STREAM)) == [
            StreamReset(sid, ErrorCode.REFUSED_STREAM)]
    sid = raw.request()
    ev = raw.send(RstStreamFrame(sid, ErrorCode.REFUSED_STREAM))
    conn_error(ev, raw, ErrorCode.ENHANCE_YOUR_CALM)


# -- header blocks across frames -----------------------------------------------------------


def test_large_response_head_in_continuation_from_h2() -> None:
    p = ServerPair()
    sid = p.client.send_request(GET, True)
    p.pump()
    big = [(b"x-%d" % i, b"v" * 1000) for i in range(40)]  # ~40 KB: three frames or more
    p.server.send_headers(sid, [(b":status", b"200"), *big], end_stream=True)
    down = p.server.data_to_send()
    kinds = [f.type for f in frames_of(down)]
    assert kinds.count(0x9) >= 2 and kinds[0] == 0x1
    ev = p.client.receive(down, 0.0)
    assert ev == [ResponseReceived(sid, 200, big, True)]


def test_response_head_split_by_hand() -> None:
    raw = RawServer()
    sid = raw.request()
    block = raw.enc.encode([STATUS, (b"x-a", b"1"), (b"x-b", b"2")])
    parts = [block[:2], block[2:5], block[5:]]
    assert raw.send(HeadersFrame(sid, parts[0])) == []
    assert raw.send(ContinuationFrame(sid, parts[1])) == []
    ev = raw.send(ContinuationFrame(sid, parts[2], flags=EHS[:1]))
    assert ev == [ResponseReceived(sid, 200, [(b"x-a", b"1"), (b"x-b", b"2")], False)]


@pytest.mark.parametrize("peer_max", [None, 20_000])
def test_large_request_head_split_by_peer_max_frame_size(peer_max: int | None) -> None:
    p = ServerPair()
    if peer_max:
        p.server.update_settings({SettingCodes.MAX_FRAME_SIZE: peer_max})
        p.pump()
    mf = peer_max or 16384
    extra = [(b"x-%d" % i, b"%d" % i * 500) for i in range(40)]  # well over 16 KB encoded
    before = len(p.up_frames)
    sid = p.client.send_request(request(extra=extra), True)
    srv, _ = p.pump()
    frames = p.up_frames[before:]
    assert isinstance(frames[0], HeadersFrame) and "END_HEADERS" not in frames[0].flags
    assert "END_STREAM" in frames[0].flags
    assert all(isinstance(f, ContinuationFrame) for f in frames[1:])
    assert "END_HEADERS" in frames[-1].flags
    assert all(len(f.data) <= mf for f in frames) and len(frames[0].data) == mf
    assert len(frames) == -(-sum(len(f.data) for f in frames) // mf)
    assert of(srv, se.RequestReceived)[0].headers == request(extra=extra)
    assert of(srv, se.StreamEnded)[0].stream_id == sid


# -- closing -------------------------------------------------------------------------------


def test_close_sends_goaway_zero() -> None:
    p = ServerPair()
    p.client.send_request(GET, True)
    p.pump()
    p.client.close()
    srv, _ = p.pump()
    (ga,) = of(srv, se.ConnectionTerminated)
    assert (ga.last_stream_id, ga.error_code) == (0, ErrorCodes.NO_ERROR)
    assert p.client.closed and not p.client.can_open
    with pytest.raises(RuntimeError):
        p.client.send_request(GET, True)
    p.client.close()  # once only
    assert p.client.data_to_send() == b""


def test_close_with_a_code() -> None:
    raw = RawServer()
    raw.client.close(ErrorCode.INTERNAL_ERROR)
    (ga,) = frames_of(raw.client.data_to_send())
    assert (ga.last_stream_id, ga.error_code) == (0, ErrorCode.INTERNAL_ERROR)
    assert raw.send(raw.head(1, [STATUS], end=True)) == []  # input is no longer read
