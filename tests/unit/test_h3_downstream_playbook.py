"""The real HTTP/3 downstream connection (``http3.downstream.H3Downstream``) and the one
connection drain manager, played with no sockets on a fake clock: aioquic's client wired to
it in memory, datagrams passed by hand, the manager's timer and QUIC's fired when due. What
the client sees is the wire: the GOAWAY identifiers on the control stream, in order, stream
resets, CONNECTION_CLOSE.

T = 12, G = 1, the drain starts at 10: the proactive window is [18, 21) (2T/3 to T - G), and
the scripted rng value 0.5 puts this connection's moment at 19.5 (as the HTTP/2 playbook).
"""

from __future__ import annotations

from typing import Any

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

from lameduck.drain import DrainEvent, Strategy
from lameduck.http3 import GOAWAY_ALL, H3_ALPN, H3_NO_ERROR, H3_REQUEST_REJECTED, H3Server
from lameduck.http3.downstream import H3Downstream
from lameduck.proxy.downstream import LINGER
from tests import playbook
from tests.drainplay import ScriptedRng
from tests.h3client import goaway_ids

START, T, G = 10.0, 12.0, 1.0
EV = DrainEvent(START, Strategy.GRADUAL, T, G)
CLIENT = ("10.0.0.1", 4433)
SERVER = ("10.0.0.2", 443)
STEP = 0.002
GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"app"),
       (b":path", b"/x")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("h3") / "server.pem"
    ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(str(path))
    return ca.cert_pem.bytes(), str(path)


class Listener(playbook.Listener):
    rng: ScriptedRng

    def __init__(self, rng: ScriptedRng) -> None:
        super().__init__(rng, G)
        self.scheme = b"https"

    def drain_starts(self, conns: list[Any]) -> None:
        self.loop.advance(START)
        self.drain.add_event(EV)
        for conn in conns:
            conn.on_drain_event(EV)


class Wire:
    """The listener's UDP socket as the connection sees it (``QuicEndpointPort``), and
    aioquic's client on the other side of it."""

    def __init__(self, ls: Listener, certs: tuple[bytes, str]) -> None:
        ca, pem = certs
        self.ls = ls
        self.out: list[bytes] = []  # datagrams the server sent, not yet delivered
        self.cids: set[bytes] = set()
        self.forgotten = False
        ccfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost",
                                 idle_timeout=1000.0)
        ccfg.load_verify_locations(cadata=ca)
        self.client = QuicConnection(configuration=ccfg)
        self.client.connect(SERVER, now=ls.loop.time())
        self.h3 = H3Connection(self.client)
        scfg = QuicConfiguration(is_client=False, alpn_protocols=H3_ALPN, idle_timeout=1000.0)
        scfg.load_cert_chain(pem, pem)
        first = self.client.datagrams_to_send(ls.loop.time())
        dcid = pull_quic_header(Buffer(data=first[0][0]), host_cid_length=8).destination_cid
        self.conn = H3Downstream(ls, self, H3Server(scfg, dcid), CLIENT)
        self.conn.start()
        for data, _ in first:
            self.conn.datagram_received(data, CLIENT)
        self.uni: dict[int, bytearray] = {}
        self.replies: dict[int, list[H3Event]] = {}
        self.resets: dict[int, int] = {}
        self.closed: qe.ConnectionTerminated | None = None
        self.pump()

    # -- QuicEndpointPort --
    def sendto(self, data: bytes, addr: Any) -> None:
        self.out.append(data)

    def cid_issued(self, cid: bytes, conn: Any) -> None:
        self.cids.add(cid)

    def cid_retired(self, cid: bytes) -> None:
        self.cids.discard(cid)

    def forget(self, conn: Any) -> None:
        self.forgotten = True

    # -- the client --
    def pump(self, rounds: int = 60) -> None:
        """Datagrams both ways until quiet, the clock a small step a round (delayed ACKs)."""
        loop = self.ls.loop
        quiet = 0
        for _ in range(rounds):
            moved = False
            for data, _ in self.client.datagrams_to_send(loop.time()):
                moved = True
                self.conn.datagram_received(data, CLIENT)
            out, self.out = self.out, []
            for data in out:
                moved = True
                self.client.receive_datagram(data, SERVER, loop.time())
            self._client_events()
            quiet = 0 if moved else quiet + 1
            if quiet >= 3:
                return
            loop.advance(loop.time() + STEP)
            t = self.client.get_timer()
            if t is not None and t <= loop.time():
                self.client.handle_timer(loop.time())
                self._client_events()

    def at(self, t: float) -> None:
        """The clock to ``t`` (the manager's timers fire on the way), then the wire."""
        self.ls.loop.advance(t)
        self.pump()

    def _client_events(self) -> None:
        while (ev := self.client.next_event()) is not None:
            if isinstance(ev, qe.StreamDataReceived) and ev.stream_id % 4 == 3:
                self.uni.setdefault(ev.stream_id, bytearray()).extend(ev.data)
            elif isinstance(ev, qe.StreamReset):
                self.resets[ev.stream_id] = ev.error_code
            elif isinstance(ev, qe.ConnectionTerminated):
                self.closed = ev
            for h in self.h3.handle_event(ev):
                if isinstance(h, (HeadersReceived, DataReceived)):
                    self.replies.setdefault(h.stream_id, []).append(h)

    @property
    def close_code(self) -> int | None:
        """The error code of the CONNECTION_CLOSE the client received (its draining period
        has begun: aioquic reports the end only after it, RFC 9000 §10.2.2)."""
        ev = self.client._close_event
        return None if ev is None else ev.error_code

    def request(self) -> int:
        sid = self.client.get_next_available_stream_id()
        self.h3.send_headers(sid, GET, end_stream=True)
        self.pump()
        return sid

    def status(self, sid: int) -> int | None:
        for h in self.replies.get(sid, []):
            if isinstance(h, HeadersReceived):
                return int(dict(h.headers)[b":status"])
        return None

    def goaways(self) -> list[int]:
        return goaway_ids(self.uni)


def answer(ls: Listener, body: bytes = b"ok") -> None:
    """The upstream answers the request it was sent last."""
    up = ls.connects[-1].succeed()
    up.sink.on_response_head(200, [(b"Content-Length", b"%d" % len(body))], len(body), False)
    up.sink.on_response_body(body)
    up.sink.on_response_complete()


def busy_in_a_drain(certs: tuple[bytes, str]) -> tuple[Listener, Wire, int]:
    """A connection draining from 10 (its moment 19.5), with a request sent at 19.0 and not
    answered yet: the listener, the wire, the request's stream id."""
    ls = Listener(ScriptedRng(0.5))
    w = Wire(ls, certs)
    ls.drain_starts([w.conn])
    w.at(19.0)
    return ls, w, w.request()


def test_idle_connection_gets_goaway_at_its_moment_the_final_one_g_later_then_close(
        certs: tuple[bytes, str]) -> None:
    ls = Listener(ScriptedRng(0.5))
    w = Wire(ls, certs)
    assert ls.stats.downstream_cx_http3_active == 1 and ls.stats.downstream_cx_active == 1
    ls.drain_starts([w.conn])
    w.at(19.49)
    assert w.goaways() == []
    w.at(19.5)
    # every request the client may open is still served, but go elsewhere (RFC 9114 §5.2)
    assert w.goaways() == [GOAWAY_ALL]
    assert w.close_code is None
    w.at(20.5)
    assert w.goaways() == [GOAWAY_ALL, 0]  # G later: no stream was processed
    assert w.close_code == H3_NO_ERROR  # idle: closed
    assert ls.drain_stats.cx_drained_proactive == 1
    w.at(40.0)  # QUIC's closing period over: the connection is gone, off the books
    assert w.forgotten
    assert ls.stats.downstream_cx_http3_active == 0 and ls.stats.downstream_cx_active == 0
    assert ls.rng.exhausted


def test_busy_connection_gets_the_final_goaway_g_later_then_closes_when_idle(
        certs: tuple[bytes, str]) -> None:
    ls, w, sid = busy_in_a_drain(certs)
    w.at(19.5)
    assert w.goaways() == [GOAWAY_ALL]
    granted = w.client._remote_max_streams_bidi
    w.at(20.5)
    assert w.goaways() == [GOAWAY_ALL, sid + 4]  # the first stream id not processed
    assert w.close_code is None  # a request in flight
    answer(ls)
    w.pump()
    assert w.status(sid) == 200
    assert w.client._remote_max_streams_bidi == granted  # no stream granted since the notice
    assert w.close_code == H3_NO_ERROR
    assert ls.process.ledger.active == 0


def test_a_request_past_t_gets_the_final_goaway_and_is_rejected(
        certs: tuple[bytes, str]) -> None:
    """Past T the process takes no new work: the stream is rejected, H3_REQUEST_REJECTED
    (not processed, safe to retry, RFC 9114 §4.1.1), and the final GOAWAY names it as the
    first stream not processed."""
    ls = Listener(ScriptedRng())
    w = Wire(ls, certs)
    first = w.request()
    answer(ls)
    w.pump()
    assert w.status(first) == 200
    ls.process.ledger.accepting = False  # T has passed
    sid = w.request()
    assert w.resets.get(sid) == H3_REQUEST_REJECTED
    assert w.goaways() == [GOAWAY_ALL, sid]  # the first stream not processed: this one
    assert ls.stats.downstream_rq_going_away == 1


def test_the_deadline_answers_a_request_not_begun_and_closes(certs: tuple[bytes, str]) -> None:
    ls = Listener(ScriptedRng())
    w = Wire(ls, certs)
    sid = w.request()
    w.conn.cut()
    w.pump()
    assert w.status(sid) == 503  # no response byte had gone out: going away, retry after
    assert ls.drain_stats.cut_before_response == 1
    assert w.goaways() == [GOAWAY_ALL, sid + 4]
    assert w.close_code == H3_NO_ERROR


def test_a_request_body_no_upstream_takes_yet_is_held_at_its_window(
        certs: tuple[bytes, str]) -> None:
    """No upstream attached yet: the exchange keeps what comes up to its buffer limit, then
    the stream's window stays where it is (the client waits, as on HTTP/2) instead of growing
    as aioquic's would; once the upstream is attached the whole body goes through."""
    ls = Listener(ScriptedRng())
    w = Wire(ls, certs)
    sid = w.client.get_next_available_stream_id()
    w.h3.send_headers(sid, [(b":method", b"POST"), *GET[1:]], end_stream=False)
    body = bytes(i % 251 for i in range(6 << 20))
    w.h3.send_data(sid, body, end_stream=True)
    w.pump(rounds=3000)
    ex = w.conn.streams[sid]
    assert ex.held
    window = w.conn.h3.quic._streams[sid].max_stream_data_local
    assert ex.buffered_size <= window < len(body)
    up = ls.connects[-1].succeed()
    w.pump(rounds=20000)
    assert up.sent.endswith(body) and up.ended


def test_a_drained_connection_closes_only_once_its_last_response_is_acknowledged(
        certs: tuple[bytes, str]) -> None:
    """The datagrams carrying the last response of a drained connection are lost: its close
    waits (aioquic resends no stream data once CONNECTION_CLOSE is queued), QUIC's loss
    recovery sends the response again, and CONNECTION_CLOSE comes once it is acknowledged."""
    ls, w, sid = busy_in_a_drain(certs)
    w.at(20.5)
    assert w.goaways() == [GOAWAY_ALL, sid + 4]
    answer(ls, b"the end of the last response")
    assert w.out  # the response, on its way
    w.out.clear()  # ... and lost
    assert w.conn.transport.get_write_buffer_size() > 0  # the exit flush waits for it
    assert not w.conn.h3.closing  # the close waits for the ACK
    w.at(ls.loop.time() + 1.0)  # QUIC's probe timeout resends it
    assert w.status(sid) == 200
    assert b"".join(h.data for h in w.replies[sid] if isinstance(h, DataReceived)) \
        == b"the end of the last response"
    assert w.close_code == H3_NO_ERROR
    assert w.conn.transport.get_write_buffer_size() == 0


def test_a_close_waits_for_acks_no_longer_than_linger(certs: tuple[bytes, str]) -> None:
    """A client that acknowledges nothing more does not hold the connection open: LINGER
    after the close was asked for, CONNECTION_CLOSE goes anyway."""
    ls, w, sid = busy_in_a_drain(certs)
    w.at(20.5)
    answer(ls)
    asked = ls.loop.time()
    w.out.clear()
    ls.loop.advance(asked + LINGER - 0.01)  # the client hears nothing (its datagrams unsent)
    assert not w.conn.h3.closing
    ls.loop.advance(asked + LINGER)
    assert w.conn.h3.closing
    assert w.status(sid) is None


def test_two_requests_past_t_in_one_datagram_the_final_goaway_names_the_first(
        certs: tuple[bytes, str]) -> None:
    """Both arrive in one batch of events (the codec has handed on both before the first is
    turned away): the final GOAWAY names the first as the first stream not processed, and
    both are rejected."""
    ls = Listener(ScriptedRng())
    w = Wire(ls, certs)
    ls.process.ledger.accepting = False  # T has passed
    first = w.client.get_next_available_stream_id()
    w.h3.send_headers(first, GET, end_stream=True)
    second = w.client.get_next_available_stream_id()
    w.h3.send_headers(second, GET, end_stream=True)
    sent = w.client.datagrams_to_send(ls.loop.time())
    assert len(sent) == 1  # both heads in one datagram
    w.conn.datagram_received(sent[0][0], CLIENT)
    w.pump()
    assert w.resets.get(first) == H3_REQUEST_REJECTED
    assert w.resets.get(second) == H3_REQUEST_REJECTED
    assert w.goaways() == [GOAWAY_ALL, first]
    assert ls.stats.downstream_rq_going_away == 2


def test_a_client_that_resets_its_request_is_counted_and_its_upstream_request_ends(
        certs: tuple[bytes, str]) -> None:
    """A client that gives up a request whose head it has sent whole stops the response
    (STOP_SENDING with H3_REQUEST_CANCELLED, RFC 9114 §4.1.1): the exchange ends (its upstream
    request is let go, as Envoy resets the upstream stream), counted in
    downstream_rq_rx_reset and the codec's rx_reset; the connection goes on."""
    ls = Listener(ScriptedRng(0.5))
    w = Wire(ls, certs)
    sid = w.request()
    assert ls.stats.downstream_rq_active == 1
    w.client.stop_stream(sid, 0x10C)
    w.pump()
    assert ls.stats.downstream_rq_active == 0
    assert ls.stats.downstream_rq_rx_reset == 1
    assert ls.h3stats.rx_reset == 1 and ls.h3stats.tx_reset == 0
    assert w.close_code is None
    again = w.request()
    answer(ls)
    w.pump()
    assert w.status(again) == 200


def test_a_connection_accepted_after_its_window_is_closed_at_t_and_counted(
        certs: tuple[bytes, str]) -> None:
    """Accepted after 2T/3 it has no proactive moment; at T (the process takes no new work)
    it gets both GOAWAYs and, idle, the close. The drain report counts it (closed at the
    drain's end), as it counts every connection the drain closed."""
    ls = Listener(ScriptedRng(0.5))
    ls.drain_starts([])
    ls.loop.advance(19.0)
    w = Wire(ls, certs)
    w.at(21.9)
    assert w.goaways() == [] and w.close_code is None
    w.at(22.0)
    w.conn.no_new_work()  # T: the shell's word to every connection
    w.pump()
    assert w.goaways() == [GOAWAY_ALL, 0]
    assert w.close_code == H3_NO_ERROR
    ds = ls.drain_stats
    assert (ds.cx_drained_by_response, ds.cx_drained_proactive, ds.cx_closed_at_end) == (0, 0, 1)
