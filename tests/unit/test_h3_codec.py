"""The HTTP/3 codec against a real client: aioquic's client ``QuicConnection`` and
``H3Connection``, wired to ``H3Server`` in memory (datagrams passed by hand, a fake clock),
both sides checked at once."""

from __future__ import annotations

import pytest
import trustme

pytest.importorskip("aioquic")

from aioquic.buffer import Buffer
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import DataReceived, H3Event, HeadersReceived
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import pull_quic_header

from lameduck.http3 import (
    GOAWAY_ALL,
    H3_ALPN,
    H3_MESSAGE_ERROR,
    H3_NO_ERROR,
    H3_REQUEST_CANCELLED,
    H3_REQUEST_REJECTED,
    BodyReceived,
    ConnectionClosed,
    H3Server,
    RequestReceived,
    StreamRefused,
    StreamReset,
    TrailersReceived,
)
from lameduck.proxy.message import HTTP3
from tests.h3client import goaway_ids

CLIENT_ADDR = ("10.0.0.1", 4433)
SERVER_ADDR = ("10.0.0.2", 443)
STEP = 0.005  # the fake clock's step between rounds: past the ACK delay, far from any timeout


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    """A CA's certificate (for the client) and a server certificate with its key, in PEM."""
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("h3") / "server.pem"
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(path))
    return ca.cert_pem.bytes(), str(path)


class Link:
    """A client and the codec, and what each has received: the server's events, the client's
    HTTP/3 events, QUIC stream resets, and the frames on the server's control stream."""

    def __init__(self, certs: tuple[bytes, str], drain_first: bool = False,
                 cid_prefix: bytes = b"") -> None:
        ca, server_pem = certs
        self.now = 1000.0
        ccfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
        ccfg.load_verify_locations(cadata=ca)
        self.client = QuicConnection(configuration=ccfg)
        self.client.connect(SERVER_ADDR, now=self.now)
        self.h3 = H3Connection(self.client)
        scfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN)
        scfg.load_cert_chain(server_pem, server_pem)
        first = self.client.datagrams_to_send(self.now)
        header = pull_quic_header(Buffer(data=first[0][0]), host_cid_length=8)
        self.server = H3Server(scfg, header.destination_cid, cid_prefix=cid_prefix)
        self.events: list[object] = []  # the codec's
        self.client_events: list[H3Event] = []
        self.resets: dict[int, int] = {}  # stream id -> error code the client got
        self.stops: dict[int, int] = {}  # stream id -> STOP_SENDING code the client got
        self.closed: qe.ConnectionTerminated | None = None
        self._uni: dict[int, bytearray] = {}  # the server's unidirectional streams
        if drain_first:
            self.server.drain_start()  # before the client's first packet is read
        for data, _ in first:
            self.events += self.server.receive_datagram(data, CLIENT_ADDR, self.now)
        self.pump()

    def pump(self, rounds: int = 40) -> None:
        """Pass datagrams both ways until neither side has any, moving the clock a step a
        round (so delayed ACKs leave: streams are only done once their data is acked)."""
        quiet = 0
        for _ in range(rounds):
            moved = False
            for data, _ in self.client.datagrams_to_send(self.now):
                moved = True
                self.events += self.server.receive_datagram(data, CLIENT_ADDR, self.now)
            for data, _ in self.server.datagrams_to_send(self.now):
                moved = True
                self.client.receive_datagram(data, SERVER_ADDR, self.now)
                self._client_events()
            quiet = 0 if moved else quiet + 1
            if quiet >= 3:
                return
            self.now += STEP
            for side in (self.client, self.server):
                t = side.get_timer()
                if t is not None and t <= self.now:
                    side.handle_timer(self.now)
            self._client_events()

    def _client_events(self) -> None:
        while (ev := self.client.next_event()) is not None:
            if isinstance(ev, qe.StreamDataReceived) and ev.stream_id % 4 == 3:
                self._uni.setdefault(ev.stream_id, bytearray()).extend(ev.data)
            elif isinstance(ev, qe.StreamReset):
                self.resets[ev.stream_id] = ev.error_code
            elif isinstance(ev, qe.StopSendingReceived):
                self.stops[ev.stream_id] = ev.error_code
            elif isinstance(ev, qe.ConnectionTerminated):
                self.closed = ev
            self.client_events += self.h3.handle_event(ev)

    def goaways(self) -> list[int]:
        """The GOAWAY identifiers on the server's control stream (aioquic's client parses
        GOAWAY but reports nothing of it)."""
        return goaway_ids(self._uni)

    def request(self, headers: list[tuple[bytes, bytes]], body: bytes = b"",
                trailers: list[tuple[bytes, bytes]] | None = None, end: bool = True) -> int:
        sid = self.client.get_next_available_stream_id()
        self.h3.send_headers(sid, headers, end_stream=end and not body and not trailers)
        if body:
            self.h3.send_data(sid, body, end_stream=end and not trailers)
        if trailers:
            self.h3.send_headers(sid, trailers, end_stream=True)
        self.pump()
        return sid

    def of(self, kind: type, sid: int) -> list:
        return [e for e in self.events if isinstance(e, kind) and e.stream_id == sid]

    def answer(self, sid: int) -> None:
        self.server.send_head(sid, 200, [(b"Content-Length", b"2")])
        self.server.send_body(sid, b"ok", end_stream=True)
        self.pump()

    def max_streams(self) -> int:
        """The client's view of MAX_STREAMS for its bidirectional streams."""
        return self.client._remote_max_streams_bidi


GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"example.com"),
       (b":path", b"/")]


def test_a_request_with_body_and_trailers_in_a_response_with_body_and_trailers_out(certs):
    link = Link(certs)
    sid = link.request([(b":method", b"POST"), (b":scheme", b"https"),
                        (b":authority", b"example.com"), (b":path", b"/upload?x=1"),
                        (b"content-type", b"text/plain"), (b"cookie", b"a=1"),
                        (b"cookie", b"b=2")],
                       body=b"hello", trailers=[(b"x-checksum", b"abc")])
    [req] = link.of(RequestReceived, sid)
    head = req.head
    assert (head.method, head.authority, head.path, head.version, head.has_body) == (
        b"POST", b"example.com", b"/upload?x=1", HTTP3, True)
    assert req.scheme == b"https"
    assert not req.end_stream
    # regular fields only, cookie crumbs joined (RFC 9114 §4.2.1)
    assert head.fields == [(b"content-type", b"text/plain"), (b"cookie", b"a=1; b=2")]
    body = b"".join(e.data for e in link.of(BodyReceived, sid))
    assert body == b"hello"
    assert link.of(TrailersReceived, sid) == [TrailersReceived(sid, [(b"x-checksum", b"abc")])]

    link.server.send_head(sid, 200, [(b"Content-Type", b"text/plain"),
                                     (b"Connection", b"keep-alive"), (b"X-Up", b"1 ")])
    link.server.send_body(sid, b"wor")
    link.server.send_body(sid, b"ld")
    link.server.send_trailers(sid, [(b"Grpc-Status", b"0")])
    link.pump()
    got = [e for e in link.client_events if getattr(e, "stream_id", None) == sid]
    heads = [e for e in got if isinstance(e, HeadersReceived)]
    # lower-cased, the connection-specific field dropped, no edge whitespace (RFC 9114 §4.2)
    assert heads[0].headers == [(b":status", b"200"), (b"content-type", b"text/plain"),
                                (b"x-up", b"1")]
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == b"world"
    assert heads[1].headers == [(b"grpc-status", b"0")]
    assert heads[1].stream_ended
    assert sid not in link.server.streams  # both halves ended


def test_every_connection_id_issued_begins_with_the_prefix(certs):
    """The id of the server's first Initial and each one NEW_CONNECTION_ID offers name the
    process generation (the listener routes by it after a hot restart): as the client got
    them, and as it addresses its packets after the handshake."""
    link = Link(certs, cid_prefix=b"\x07")
    got = [link.client._peer_cid.cid] + [c.cid for c in link.client._peer_cid_available]
    assert len(got) >= 2  # aioquic offers more than one id after the handshake
    assert all(cid[:1] == b"\x07" and len(cid) == 8 for cid in got), got
    assert len({cid[1:] for cid in got}) == len(got)  # the rest stays random
    sid = link.request([(b":method", b"GET"), (b":scheme", b"https"),
                        (b":authority", b"localhost"), (b":path", b"/")])
    assert link.of(RequestReceived, sid)
    link.h3.send_headers(link.client.get_next_available_stream_id(),
                         [(b":method", b"GET"), (b":scheme", b"https"),
                          (b":authority", b"localhost"), (b":path", b"/")], end_stream=True)
    data = link.client.datagrams_to_send(link.now)[0][0]
    header = pull_quic_header(Buffer(data=data), host_cid_length=8)
    assert header.destination_cid[:1] == b"\x07"


def test_an_interim_head_before_the_final_one(certs):
    link = Link(certs)
    sid = link.request(GET)
    link.server.send_head(sid, 103, [(b"link", b"</s.css>; rel=preload")])
    link.server.send_head(sid, 204, [], end_stream=True)
    link.pump()
    heads = [e.headers[0] for e in link.client_events
             if isinstance(e, HeadersReceived) and e.stream_id == sid]
    assert heads == [(b":status", b"103"), (b":status", b"204")]
    with pytest.raises(ValueError):
        link.server.send_head(sid, 101, [])


@pytest.mark.parametrize("headers", [
    pytest.param([(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"a"),
                  (b":path", b"no-slash")], id="path-not-origin-form"),
    pytest.param([(b":method", b"GET"), (b":authority", b"a"), (b":path", b"/")],
                 id="no-scheme"),
    pytest.param([*GET, (b":path", b"/again")], id="path-twice"),
    pytest.param([GET[0], (b"accept", b"*/*"), *GET[1:]], id="pseudo-after-regular"),
    pytest.param([(b":method", b"CONNECT"), (b":authority", b"a:443"), (b":path", b"/")],
                 id="connect-with-path"),
    pytest.param([*GET, (b"te", b"gzip")], id="te-not-trailers"),
    pytest.param([*GET, (b"X-Upper", b"1")], id="upper-case-name"),  # aioquic finds this one
    pytest.param([*GET, (b"connection", b"close")], id="connection-specific"),
    pytest.param([*GET[:3], (b":path", b"/"), (b":status", b"200")], id="status-in-request"),
])
def test_a_malformed_request_is_a_stream_error_and_the_connection_goes_on(certs, headers):
    link = Link(certs)
    sid = link.request(headers)
    assert link.of(RequestReceived, sid) == []
    assert link.of(StreamRefused, sid) == [StreamRefused(sid, H3_MESSAGE_ERROR)]
    assert link.resets[sid] == H3_MESSAGE_ERROR  # RFC 9114 §4.1.2
    assert link.closed is None
    ok = link.request(GET)
    assert len(link.of(RequestReceived, ok)) == 1
    link.answer(ok)
    assert any(isinstance(e, HeadersReceived) and e.stream_id == ok for e in link.client_events)


def test_malformed_trailers_and_a_body_longer_than_content_length_are_stream_errors(certs):
    link = Link(certs)
    sid = link.request([*GET[:1], (b":scheme", b"https"), GET[2], (b":path", b"/t")],
                       body=b"x", trailers=[(b":path", b"/")])
    assert link.resets[sid] == H3_MESSAGE_ERROR
    post = [(b":method", b"POST"), *GET[1:], (b"content-length", b"2")]
    sid2 = link.request(post, body=b"xyz")
    assert link.resets[sid2] == H3_MESSAGE_ERROR
    assert link.closed is None


def serve(link: Link, n: int) -> list[int]:
    """``n`` GET requests at once, each answered: their stream ids."""
    sids = []
    for _ in range(n):
        sid = link.client.get_next_available_stream_id()
        link.h3.send_headers(sid, GET, end_stream=True)
        sids.append(sid)
    link.pump()
    for sid in sids:
        assert len(link.of(RequestReceived, sid)) == 1
        link.server.send_head(sid, 204, [], end_stream=True)
    link.pump()
    return sids


def test_goaway_sequence_as_the_client_sees_it(certs):
    link = Link(certs)
    initial = link.max_streams()
    # aioquic raises MAX_STREAMS in batches (once the client has fewer streams left than
    # an update would grant): enough streams for one
    serve(link, initial // 2 + 6)
    granted = link.max_streams()
    assert granted > initial  # before the drain, each closed stream is replaced
    assert link.goaways() == []

    link.server.drain_start()
    link.pump()
    assert link.goaways() == [GOAWAY_ALL]  # RFC 9114 §5.2: every request may still come
    # still served: below the GOAWAY id; enough to raise MAX_STREAMS again, but it stays
    last = serve(link, initial // 2 + 6)[-1]
    assert link.max_streams() == granted  # no stream granted any more (RFC 9000 §4.6)

    link.server.drain_final()
    link.pump()
    assert link.goaways() == [GOAWAY_ALL, last + 4]  # the first id not processed
    assert link.server.goaway_id == last + 4
    link.server.drain_final()  # once only: the identifier never grows back
    link.server.drain_start()
    link.pump()
    assert link.goaways() == [GOAWAY_ALL, last + 4]
    assert link.closed is None
    assert link.server.stats.goaway_sent == 2  # the frames written, not the calls


def test_a_stream_above_the_final_goaway_is_rejected(certs):
    link = Link(certs)
    held = link.request([(b":method", b"POST"), *GET[1:]], body=b"partial", end=False)
    link.server.drain_final()
    link.pump()
    assert link.goaways() == [GOAWAY_ALL, held + 4]
    late = link.request(GET)
    assert late >= held + 4
    assert link.of(RequestReceived, late) == []
    assert link.of(StreamRefused, late) == [StreamRefused(late, H3_REQUEST_REJECTED)]
    assert link.resets[late] == H3_REQUEST_REJECTED  # RFC 9114 §4.1.1: safe to retry
    assert link.stops[late] == H3_REQUEST_REJECTED
    assert link.server.stats.tx_reset == 1
    # the request below the GOAWAY id goes on
    link.h3.send_data(held, b" end", end_stream=True)
    link.pump()
    assert b"".join(e.data for e in link.of(BodyReceived, held)) == b"partial end"
    link.answer(held)
    assert link.closed is None


def test_the_deadline_cancels_streams_then_closes_with_no_error(certs):
    """The deadline as the connection carries it out: the open stream cancelled, the final
    GOAWAY, and once the client has acknowledged them, CONNECTION_CLOSE."""
    link = Link(certs)
    sid = link.request([(b":method", b"POST"), *GET[1:]], body=b"a", end=False)
    link.server.cancel(sid)
    link.server.drain_final()
    link.pump()
    assert link.resets[sid] == H3_REQUEST_CANCELLED
    assert link.server.stats.tx_reset == 1
    assert link.server.unacked() == 0
    link.server.close()
    link.pump()
    # the client reports the close once its draining period (3 PTO, RFC 9000 §10.2) is over
    for _ in range(10):
        if link.closed is not None:
            break
        t = link.client.get_timer()
        assert t is not None
        link.now = max(link.now, t)
        link.client.handle_timer(link.now)
        link._client_events()
    assert link.closed is not None
    assert link.closed.error_code == H3_NO_ERROR
    assert link.server.closing
    link.server.send_body(sid, b"late")  # a write after the cut is dropped, not an error
    t = link.server.get_timer()
    assert t is not None
    assert link.server.handle_timer(max(link.now, t)) == [ConnectionClosed(H3_NO_ERROR, "")]
    assert link.server.closed


def test_a_drain_begun_before_the_handshake_goes_out_after_settings(certs):
    link = Link(certs, drain_first=True)
    assert link.goaways() == [GOAWAY_ALL]
    sid = link.request(GET)  # served: every request may still come
    assert len(link.of(RequestReceived, sid)) == 1


def test_a_response_that_ends_before_the_request_stops_it_with_no_error(certs):
    link = Link(certs)
    sid = link.request([(b":method", b"POST"), *GET[1:]], body=b"a", end=False)
    link.answer(sid)
    assert link.stops[sid] == H3_NO_ERROR  # RFC 9114 §4.1.1: stop sending, not an error
    assert sid not in link.server.streams
    assert link.resets.get(sid) is None  # the response itself went out whole
    assert any(isinstance(e, DataReceived) and e.stream_id == sid and e.stream_ended
               for e in link.client_events)
    ok = link.request(GET)
    link.answer(ok)
    assert link.closed is None


def test_a_request_the_client_gives_up_is_reported_and_later_writes_are_dropped(certs):
    link = Link(certs)
    sid = link.request([(b":method", b"POST"), *GET[1:]], body=b"a", end=False)
    link.server.send_head(sid, 200, [])
    link.pump()
    link.client.reset_stream(sid, H3_REQUEST_CANCELLED)
    link.client.stop_stream(sid, H3_REQUEST_CANCELLED)
    link.pump()
    assert link.of(StreamReset, sid) == [StreamReset(sid, H3_REQUEST_CANCELLED)]
    assert sid not in link.server.streams
    link.server.send_body(sid, b"late", end_stream=True)  # dropped: QUIC reset our side
    link.pump()
    assert link.closed is None
    ok = link.request(GET)
    link.answer(ok)
    assert any(isinstance(e, HeadersReceived) and e.stream_id == ok for e in link.client_events)


def test_the_codec_is_sans_io() -> None:
    """Datagrams and the clock come from the caller: no socket, loop, timer or thread."""
    import ast
    from pathlib import Path

    import lameduck.http3.codec as codec

    found: set[str] = set()
    for node in ast.walk(ast.parse(Path(codec.__file__).read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    assert not found & {"asyncio", "socket", "time", "selectors", "threading", "uvloop"}
    assert "aioquic.asyncio" not in ast.unparse(ast.parse(Path(codec.__file__).read_text()))


def test_a_held_request_body_gets_no_more_window_until_released(certs):
    """aioquic alone doubles a stream's receive window as data arrive, read or not: held,
    the window stays and the client waits (RFC 9000 §4.1); released, the rest comes."""
    link = Link(certs)
    sid = link.request([(b":method", b"POST"), *GET[1:]], end=False)
    window = link.server.quic._streams[sid].max_stream_data_local
    link.server.hold(sid)
    body = bytes(4 * window)
    link.h3.send_data(sid, body, end_stream=True)
    link.pump(rounds=400)
    got = sum(len(e.data) for e in link.of(BodyReceived, sid))
    assert 0 < got <= window
    assert link.server.quic._streams[sid].max_stream_data_local == window
    link.server.release(sid)
    link.pump(rounds=4000)
    assert sum(len(e.data) for e in link.of(BodyReceived, sid)) == len(body)
    assert link.of(BodyReceived, sid)[-1].end_stream
