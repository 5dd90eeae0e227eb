"""The real downstream connections (HTTP/1.1 and HTTP/2) and their one drain manager, played
with no sockets on a fake clock: bytes in, bytes out, the timer fired exactly when it is due.

T = 12, G = 1, the drain starts at 10: the proactive window is [18, 21) (Envoy's drain
sequence: 2T/3 to T - G), and a scripted rng value r puts this connection's moment at 18 + 3r.
"""

from __future__ import annotations

from typing import Any

import hpack

from lameduck.config import load_config_text
from lameduck.drain import DrainEvent, Strategy
from lameduck.drain.probers import ProbeTracker
from lameduck.http1.downstream import H1Downstream
from lameduck.http2.downstream import H2Downstream
from lameduck.proxy.downstream import LINGER
from lameduck.server.build import build
from tests import playbook
from tests.drainplay import ScriptedRng
from tests.playbook import Transport

START, T, G = 10.0, 12.0, 1.0
EV = DrainEvent(START, Strategy.GRADUAL, T, G)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY = 7
RST_STREAM = 3
REFUSED_STREAM = 7
# a HEADERS frame block for GET /x: indexed and literal fields without indexing (RFC 7541)
GET_X = (b"\x82"  # :method GET (static index 2)
         b"\x86"  # :scheme http (static index 6)
         b"\x04\x02/x"  # :path /x (name index 4)
         b"\x01\x03app")  # :authority app (name index 1)


def headers(sid: int, block: bytes = GET_X) -> bytes:
    """HEADERS with END_STREAM and END_HEADERS."""
    return len(block).to_bytes(3, "big") + b"\x01\x05" + sid.to_bytes(4, "big") + block


class Listener(playbook.Listener):
    """The playbook's listener with a scripted rng and this file's G."""

    rng: ScriptedRng

    def __init__(self, rng: ScriptedRng) -> None:
        super().__init__(rng, G)

    def drain_starts(self, conns: list[Any]) -> None:
        self.loop.advance(START)
        self.drain.add_event(EV)
        for conn in conns:
            conn.on_drain_event(EV)


def accept(ls: Listener, conn: Any) -> Transport:
    t = Transport(ls.loop)
    conn.connection_made(t)
    return t


def answer(ls: Listener, body: bytes = b"ok") -> None:
    """The upstream answers the request it was sent last."""
    up = ls.connects[-1].succeed()
    up.sink.on_response_head(200, [(b"Content-Length", b"%d" % len(body))], len(body), False)
    up.sink.on_response_body(body)
    up.sink.on_response_complete()


def h2_accept(ls: Listener, opening: bytes = b"") -> tuple[H2Downstream, Transport]:
    """An HTTP/2 connection past its preface (and ``opening``), its server frames taken."""
    conn = H2Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(H2_PREFACE + opening)
    t.take()
    return conn, t


def frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """HTTP/2 frames (type, stream id, payload) in ``data``."""
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF,
                    data[9:9 + length]))
        data = data[9 + length:]
    return out


def goaways(data: bytes) -> list[int]:
    """The last-stream-ids of the GOAWAY frames in ``data``."""
    return [int.from_bytes(p[:4], "big") & 0x7FFFFFFF for t, _, p in frames(data)
            if t == GOAWAY]


# -- HTTP/1.1 --------------------------------------------------------------------------------------


def test_h1_traffic_is_tracked_only_while_watched_probes_always() -> None:
    """The health-check path's tracker (``leave: confirm``): a probe is always recorded; a new
    connection and a request that is no probe only while the lifecycle watches (``traffic``
    set): an unwatched connection does no per-request tracking work."""
    ls = Listener(ScriptedRng())
    ls.probes = tracker = ProbeTracker()
    peer = "127.0.0.1"  # the playbook's transport's peer
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(b"GET /healthz HTTP/1.1\r\nHost: app\r\n\r\n")
    assert t.take().startswith(b"HTTP/1.1 200 OK\r\n")
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")

    answered: dict[int, int] = {}  # per upstream connection, the requests answered on it

    def reply() -> None:
        """The upstream answers the request not yet answered (on a new connection, or on a
        pooled one reused for it)."""
        for c in ls.connects:
            if not c.done():
                c.succeed()
        up = next(c.conn for c in ls.connects if c.conn is not None
                  and c.conn.sent.count(b"GET ") > answered.get(id(c.conn), 0))
        answered[id(up)] = answered.get(id(up), 0) + 1
        sink = up.sink
        sink.on_response_head(200, [(b"Content-Length", b"2")], 2, False)
        sink.on_response_body(b"ok")
        sink.on_response_complete()

    reply()
    assert t.take().endswith(b"ok")
    assert tracker.probers[peer].probes == 1
    assert tracker.talkers == {}  # not watched: neither the connection nor the request
    ls.traffic = tracker  # the watch begins
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    reply()
    assert t.take().endswith(b"ok")
    watched = H1Downstream(ls)
    t2 = accept(ls, watched)
    watched.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    reply()
    assert t2.take().endswith(b"ok")
    talker = tracker.talkers[peer]
    assert (talker.connections, talker.requests) == (1, 2)
    assert tracker.probers[peer].probes == 1


def test_h1_idle_keepalive_drains_at_its_moment_and_closes_g_later_then_lingers() -> None:
    """As Envoy's connection manager: from its moment (18 + 3 * 0.5) the connection drains,
    and one still idle after the grace G closes: a FIN, then reads for LINGER."""
    ls = Listener(ScriptedRng(0.5))
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    ls.drain_starts([conn])
    ls.loop.advance(19.5)
    assert ls.drain_stats.cx_drained_proactive == 1
    assert ls.stats.downstream_cx_drain_close == 1
    assert t.out == b"" and t.eof_at is None  # HTTP/1.1 has nothing to say outside a response
    ls.loop.advance(20.49)
    assert t.eof_at is None
    ls.loop.advance(20.5)
    assert t.eof_at == 20.5
    ls.loop.advance(20.5 + LINGER - 0.01)
    assert t.closed_at is None
    ls.loop.advance(30.0)
    assert t.closed_at == 20.5 + LINGER
    assert ls.rng.exhausted


def test_h1_response_after_the_moment_carries_connection_close() -> None:
    """Busy at its moment, the connection drains (no close mid-request); the response that
    follows says ``Connection: close`` (RFC 9112 §9.6) and the close is staged after it."""
    ls = Listener(ScriptedRng(0.5))
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    ls.drain_starts([conn])
    ls.loop.advance(19.0)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    ls.loop.advance(20.0)
    assert t.eof_at is None  # its moment passed with a request in flight
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"
    assert t.eof_at == 20.0
    assert ls.process.ledger.active == 0


def test_h1_close_at_end_closes_an_idle_connection_and_counts_it() -> None:
    ls = Listener(ScriptedRng())
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    ls.loop.advance(5.0)
    conn.close_at_end()
    assert t.eof_at == 5.0
    assert ls.drain_stats.cx_closed_at_end == 1


# -- HTTP/2 ----------------------------------------------------------------------------------------


def test_h2_idle_connection_gets_goaway_at_its_moment_and_the_final_one_g_later() -> None:
    ls = Listener(ScriptedRng(0.5))
    conn, t = h2_accept(ls)
    ls.drain_starts([conn])
    ls.loop.advance(19.49)
    assert goaways(t.out) == []
    ls.loop.advance(19.5)
    # GOAWAY(2^31-1) first: it refuses no stream the client may have in flight (RFC 9113 §6.8)
    assert goaways(t.take()) == [2**31 - 1]
    assert t.eof_at is None
    ls.loop.advance(20.5)
    assert goaways(t.take()) == [0]  # the final one: no stream was processed
    assert t.eof_at == 20.5
    assert ls.h2stats.goaway_sent == 2
    assert ls.drain_stats.cx_drained_proactive == 1


def test_h2_busy_connection_gets_the_final_goaway_g_later_then_closes_when_idle() -> None:
    ls = Listener(ScriptedRng(0.5))
    conn, t = h2_accept(ls)
    ls.drain_starts([conn])
    ls.loop.advance(19.0)
    conn.data_received(headers(1))
    t.take()
    ls.loop.advance(19.5)
    assert goaways(t.take()) == [2**31 - 1]  # its moment: the first notice
    assert t.eof_at is None  # a stream in flight
    ls.loop.advance(20.5)
    assert goaways(t.take()) == [1]  # G later: the final one names the last stream processed
    answer(ls)
    assert t.eof_at == 20.5  # its last stream ended: closed (staged)
    assert ls.h2stats.goaway_sent == 2
    assert ls.process.ledger.active == 0


def test_h2_stream_after_t_gets_the_final_goaway_before_its_refusal() -> None:
    """Past T the process takes no new work: the stream is refused (REFUSED_STREAM, safe to
    retry, RFC 9113 §8.7) and the final GOAWAY goes out first, naming the stream before it,
    so a client that retries a refused stream once (gRPC) does not retry on this connection."""
    ls = Listener(ScriptedRng(0.5))
    conn, t = h2_accept(ls, headers(1))
    answer(ls)
    t.take()
    ls.process.ledger.accepting = False  # T has passed
    conn.data_received(headers(3))
    got = [(typ, sid, p) for typ, sid, p in frames(t.take()) if typ in (GOAWAY, RST_STREAM)]
    # no notice had gone out yet: both GOAWAYs now, the final one naming stream 1, then the
    # refusal of stream 3
    assert [(typ, sid) for typ, sid, _ in got] == [(GOAWAY, 0), (GOAWAY, 0), (RST_STREAM, 3)]
    assert [int.from_bytes(p[:4], "big") for typ, _, p in got if typ == GOAWAY] == [
        2**31 - 1, 1]
    assert int.from_bytes(got[2][2], "big") == REFUSED_STREAM
    assert ls.stats.downstream_rq_going_away == 1
    assert len(ls.connects) == 1  # the refused stream never went upstream


# -- a connection's own limits (Envoy's common_http_protocol_options) ----------------------------


def test_h1_max_connection_duration_drains_and_the_idle_connection_closes_g_later() -> None:
    """max_connection_duration drains, it does not reset: the response in flight at expiry
    carries ``Connection: close``; an idle one closes once the grace G is over."""
    ls = Listener(ScriptedRng())
    ls.max_connection_duration = 30.0
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    ls.loop.advance(29.0)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    ls.loop.advance(30.0)
    assert ls.stats.downstream_cx_max_duration_reached == 1
    assert ls.stats.downstream_cx_drain_close == 1
    assert ls.drain_stats.cx_drained_proactive == 0
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"
    assert t.eof_at == 30.0 and not t.reset
    ls = Listener(ScriptedRng())
    ls.max_connection_duration = 30.0
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    ls.loop.advance(30.0 + G - 0.01)
    assert t.eof_at is None and ls.stats.downstream_cx_max_duration_reached == 1
    ls.loop.advance(30.0 + G)
    assert t.eof_at == 30.0 + G and t.out == b""


def test_h1_max_requests_per_connection_the_nth_response_says_connection_close() -> None:
    ls = Listener(ScriptedRng())
    ls.max_requests_per_connection = 2
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    answer(ls)
    assert b"connection: close" not in t.take()
    assert ls.stats.downstream_cx_max_requests_reached == 0
    # the second one, with a third pipelined behind it: the third is not read
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\nGET /y HTTP/1.1\r\nHost: app\r\n\r\n")
    assert ls.stats.downstream_cx_max_requests_reached == 1
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"
    assert t.eof_at == 0.0
    assert len(ls.connects) == 2 and ls.stats.downstream_rq_total == 2


def test_h2_max_connection_duration_sends_goaway_then_the_final_one_g_later() -> None:
    ls = Listener(ScriptedRng())
    ls.max_connection_duration = 30.0
    _, t = h2_accept(ls)
    ls.loop.advance(29.99)
    assert goaways(t.out) == []
    ls.loop.advance(30.0)
    assert goaways(t.take()) == [2**31 - 1]
    assert ls.stats.downstream_cx_max_duration_reached == 1
    assert t.eof_at is None
    ls.loop.advance(30.0 + G)
    assert goaways(t.take()) == [0]
    assert t.eof_at == 30.0 + G and not t.reset


def test_h2_max_requests_per_connection_goaway_at_the_nth_stream() -> None:
    ls = Listener(ScriptedRng())
    ls.max_requests_per_connection = 2
    conn, t = h2_accept(ls, headers(1))
    answer(ls)
    assert goaways(t.take()) == []
    conn.data_received(headers(3))
    assert goaways(t.take()) == [2**31 - 1]  # before its response: the client goes elsewhere
    assert ls.stats.downstream_cx_max_requests_reached == 1
    answer(ls)
    ls.loop.advance(G)
    assert goaways(t.take()) == [3]
    assert t.eof_at == G


# -- a client that does not read (send_timeout) ----------------------------------------------------


def test_h1_send_timeout_resets_a_client_that_takes_nothing_and_resume_starts_it_again() -> None:
    ls = Listener(ScriptedRng())
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    up = ls.connects[-1].succeed()
    up.sink.on_response_head(200, [(b"Content-Length", b"9")], 9, False)
    up.sink.on_response_body(b"some")
    ls.loop.advance(5.0)
    conn.pause_writing()  # the socket buffer is full
    ls.loop.advance(24.0)
    conn.resume_writing()  # it took some: progress
    conn.pause_writing()
    ls.loop.advance(43.99)
    assert t.ended is None and ls.stats.downstream_cx_send_timeout == 0
    ls.loop.advance(44.0)
    assert t.ended == ("rst", 44.0)
    assert ls.stats.downstream_cx_send_timeout == 1
    conn.connection_lost(None)  # asyncio's, after the abort
    assert ls.process.ledger.active == 0


def test_h2_send_timeout_resets_the_connection() -> None:
    ls = Listener(ScriptedRng())
    conn, t = h2_accept(ls, headers(1))
    ls.loop.advance(3.0)
    conn.pause_writing()
    ls.loop.advance(22.99)
    assert t.ended is None
    ls.loop.advance(23.0)
    assert t.ended == ("rst", 23.0)
    assert ls.stats.downstream_cx_send_timeout == 1
    conn.connection_lost(None)  # asyncio's, after the abort
    assert ls.process.ledger.active == 0


# -- a client that stops sending its request body (request_body_timeout) -------------------------

POST = b"POST /x HTTP/1.1\r\nHost: app\r\nContent-Length: 10\r\n\r\n"


def test_h1_body_timeout_408_when_no_response_byte_was_sent() -> None:
    ls = Listener(ScriptedRng())
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(POST + b"abc")
    ls.connects[-1].succeed()
    ls.loop.advance(4.0)
    conn.data_received(b"de")  # progress: the clock starts again
    ls.loop.advance(18.99)
    assert t.out == b"" and ls.stats.downstream_rq_body_timeout == 0
    ls.loop.advance(19.0)
    out = t.take()
    assert out.startswith(b"HTTP/1.1 408 ") and b"connection: close" in out
    assert ls.stats.downstream_rq_body_timeout == 1
    assert t.eof_at == 19.0 and not t.reset
    assert ls.process.ledger.active == 0


def test_h1_body_timeout_resets_once_the_response_began() -> None:
    ls = Listener(ScriptedRng())
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(POST + b"abc")
    up = ls.connects[-1].succeed()
    up.sink.on_response_head(200, [(b"Content-Length", b"9")], 9, False)
    ls.loop.advance(15.0)
    assert t.ended == ("rst", 15.0)
    assert ls.stats.downstream_rq_body_timeout == 1


def test_h1_body_timeout_waits_while_lameduck_paused_the_reading() -> None:
    """Reading paused for a slow upstream is not the client's silence."""
    ls = Listener(ScriptedRng())
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(POST + b"abc")
    ls.connects[-1].succeed()
    ex = conn.queue[0]
    conn.hold_request(ex)  # what the exchange asks when the upstream takes no more
    ls.loop.advance(40.0)
    assert t.out == b"" and ls.stats.downstream_rq_body_timeout == 0
    conn.resume_request(ex)  # the body flows again: 15 s from now
    ls.loop.advance(54.99)
    assert ls.stats.downstream_rq_body_timeout == 0
    ls.loop.advance(55.0)
    assert ls.stats.downstream_rq_body_timeout == 1


# HTTP/2: a stream whose client stops sending its body (RFC 9113 §8.1: the server may answer
# before the request ends, then RST_STREAM(NO_ERROR) tells the client to stop sending)
HEADERS, DATA = 1, 0
NO_ERROR, CANCEL = 0, 8
POST_X = b"\x83" + GET_X[1:]  # :method POST (static index 3), the rest as GET_X


def post(sid: int) -> bytes:
    """HEADERS for POST /x with END_HEADERS only: a body follows."""
    return len(POST_X).to_bytes(3, "big") + b"\x01\x04" + sid.to_bytes(4, "big") + POST_X


def data(sid: int, payload: bytes, end: bool = False) -> bytes:
    return (len(payload).to_bytes(3, "big") + b"\x00" + (b"\x01" if end else b"\x00")
            + sid.to_bytes(4, "big") + payload)


def h2_status(block: bytes) -> int:
    """The :status of a response HEADERS block lameduck wrote."""
    return int(dict(hpack.Decoder().decode(block))[":status"])


def test_h2_body_timeout_408_then_rst_no_error_and_other_streams_go_on() -> None:
    ls = Listener(ScriptedRng())
    conn, t = h2_accept(ls, post(1) + data(1, b"abc"))
    up = ls.connects[-1].succeed()
    assert up.sent.endswith(b"abc")
    ls.loop.advance(4.0)
    conn.data_received(data(1, b"de"))  # progress: the clock starts again
    ls.loop.advance(10.0)
    conn.data_received(headers(3))  # a GET in flight: no body to wait for
    ls.loop.advance(18.99)
    assert [f for f in frames(t.take()) if f[1] == 1 and f[0] != 8] == []
    assert ls.stats.downstream_rq_body_timeout == 0
    ls.loop.advance(19.0)
    got = [(typ, sid, p) for typ, sid, p in frames(t.take()) if typ != 8]  # no WINDOW_UPDATE
    assert [(typ, sid) for typ, sid, _ in got] == [(HEADERS, 1), (DATA, 1), (RST_STREAM, 1)]
    assert h2_status(got[0][2]) == 408
    assert got[1][2] == b"request body timeout\n"
    assert int.from_bytes(got[2][2], "big") == NO_ERROR
    assert ls.stats.downstream_rq_body_timeout == 1
    assert up.closed  # the upstream side is aborted, as for a client reset
    assert t.ended is None and t.eof_at is None  # the connection goes on
    ls.loop.advance(60.0)  # stream 3 ended its request: never timed out
    assert 3 in conn.streams and ls.stats.downstream_rq_body_timeout == 1
    answer(ls)
    assert (HEADERS, 3) in [(typ, sid) for typ, sid, _ in frames(t.take())]
    assert ls.process.ledger.active == 0 and not conn.streams


def test_h2_body_timeout_rst_cancel_once_the_response_began() -> None:
    ls = Listener(ScriptedRng())
    conn, t = h2_accept(ls, post(1) + data(1, b"abc"))
    up = ls.connects[-1].succeed()
    up.sink.cork()  # as a real upstream reports a read: corked, one write at the end
    up.sink.on_response_head(200, [(b"Content-Length", b"9")], 9, False)
    up.sink.uncork()
    assert (HEADERS, 1) in [(typ, sid) for typ, sid, _ in frames(t.take())]
    ls.loop.advance(14.99)
    assert ls.stats.downstream_rq_body_timeout == 0
    ls.loop.advance(15.0)
    got = [(typ, sid, p) for typ, sid, p in frames(t.take()) if typ != 8]
    assert [(typ, sid) for typ, sid, _ in got] == [(RST_STREAM, 1)]
    assert int.from_bytes(got[0][2], "big") == CANCEL
    assert ls.stats.downstream_rq_body_timeout == 1
    assert up.closed and not conn.streams and ls.process.ledger.active == 0
    assert t.ended is None


def test_h2_body_timeout_waits_while_lameduck_holds_the_credit() -> None:
    """Credit not returned (no upstream yet, or one that takes no more) is lameduck holding
    the client back, not the client's silence: the clock starts again once it is returned."""
    ls = Listener(ScriptedRng())
    conn, t = h2_accept(ls, post(1) + data(1, b"abc"))
    ls.loop.advance(40.0)  # still connecting: "abc" held, its credit with it
    assert ls.stats.downstream_rq_body_timeout == 0
    up = ls.connects[-1].succeed()  # handed on, credit returned: 15 s from now
    ls.loop.advance(50.0)
    conn.data_received(data(1, b"de"))
    up.sink.pause_request_body()  # the upstream takes no more
    conn.data_received(data(1, b"fg"))  # read, its credit kept
    ls.loop.advance(90.0)
    assert ls.stats.downstream_rq_body_timeout == 0
    up.sink.resume_request_body()  # the credit goes back: 15 s from now
    ls.loop.advance(104.99)
    assert ls.stats.downstream_rq_body_timeout == 0
    ls.loop.advance(105.0)
    assert ls.stats.downstream_rq_body_timeout == 1
    assert RST_STREAM in [typ for typ, _, _ in frames(t.take())]


# -- in flight for the client: what a worker that dies loses ---------------------------------


def test_h1_and_h2_a_connection_is_fresh_until_its_first_request_begins() -> None:
    """Accepted, nothing read yet: the ledger counts it ``fresh`` (its client is sending a
    request); the first request moves it to ``active``; one closed unheard counts out."""
    ls = Listener(ScriptedRng())
    ledger = ls.process.ledger
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    assert (ledger.fresh, ledger.active) == (1, 0)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    assert (ledger.fresh, ledger.active) == (0, 1)
    answer(ls)
    assert t.take().startswith(b"HTTP/1.1 200 OK\r\n")
    assert (ledger.fresh, ledger.active) == (0, 0)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")  # a second: active only
    assert (ledger.fresh, ledger.active) == (0, 1)
    answer(ls)
    conn.connection_lost(None)
    unheard = H1Downstream(ls)
    accept(ls, unheard)
    unheard.connection_lost(None)  # its client went away before sending
    assert ledger.fresh == 0
    h2, _ = h2_accept(ls)  # the preface and SETTINGS are no request
    assert (ledger.fresh, ledger.active) == (1, 0)
    h2.data_received(headers(1))
    assert (ledger.fresh, ledger.active) == (0, 1)
    h2.connection_lost(None)  # the stream's request is abandoned with it
    assert (ledger.fresh, ledger.active) == (0, 0)


# -- drain.idle_close: on_response (HAProxy's option idle-close-on-response) -------------------
# The same rule, from the one drain manager, through both codecs: an idle connection is never
# closed (nor, on HTTP/2, sent a GOAWAY) while idle; its next response carries the close; what
# no request reaches is closed at the drain's end, T + G (23).


def deferred_listener(*rng: float) -> Listener:
    ls = Listener(ScriptedRng(*rng))
    ls.drain.idle_close_on_response = True
    return ls


def h1_answered(ls: Listener) -> tuple[H1Downstream, Transport]:
    """An HTTP/1.1 keep-alive connection with one request answered: idle."""
    conn = H1Downstream(ls)
    t = accept(ls, conn)
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    return conn, t


def test_h1_on_response_idle_connection_is_left_open_then_its_next_response_closes_it() -> None:
    ls = deferred_listener(0.5)
    conn, t = h1_answered(ls)
    ls.drain_starts([conn])
    ls.loop.advance(22.9)  # past its moment (19.5), its G, and T
    assert t.out == b"" and t.eof_at is None
    assert ls.drain_stats.cx_drained_proactive == 0
    conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    answer(ls)
    assert t.take() == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: close\r\n\r\nok"
    assert t.eof_at == 22.9  # closed after it, staged
    assert ls.drain_stats.cx_drained_by_response == 1


def test_h2_on_response_idle_connection_gets_no_goaway_then_one_with_its_next_response() -> None:
    ls = deferred_listener(0.5)
    conn, t = h2_accept(ls, headers(1))
    answer(ls)
    t.take()
    ls.drain_starts([conn])
    ls.loop.advance(21.0)  # past its moment (19.5) and T - G
    assert goaways(t.out) == [] and t.eof_at is None
    conn.data_received(headers(3))
    answer(ls)
    out = t.take()
    assert goaways(out) == [2**31 - 1]  # as the response starts: the drain's notice
    assert [typ for typ, sid, _ in frames(out) if sid == 3][:2] == [1, 0]  # HEADERS, DATA
    assert t.eof_at is None
    ls.loop.advance(22.0)  # G after it: the final GOAWAY names stream 3, and the close
    assert goaways(t.take()) == [3]
    assert t.eof_at == 22.0
    assert ls.drain_stats.cx_drained_by_response == 1


def test_h1_on_response_untold_idle_connection_is_closed_at_t_plus_g() -> None:
    ls = deferred_listener(0.5)
    conn, t = h1_answered(ls)
    ls.drain_starts([conn])
    conn.no_new_work()  # (as at T: the shell's word to every connection; nothing changes)
    ls.loop.advance(22.99)
    assert t.eof_at is None
    ls.loop.advance(23.0)
    assert t.out == b"" and t.eof_at == 23.0
    assert ls.drain_stats.cx_closed_at_end == 1


def test_h2_on_response_untold_idle_connection_is_closed_at_t_plus_g() -> None:
    ls = deferred_listener(0.5)
    conn, t = h2_accept(ls, headers(1))
    answer(ls)
    t.take()
    ls.drain_starts([conn])
    ls.loop.advance(22.0)
    conn.no_new_work()  # T: no final GOAWAY to an idle connection nobody told
    ls.loop.advance(22.99)
    assert goaways(t.out) == [] and t.eof_at is None
    ls.loop.advance(23.0)
    assert goaways(t.take()) == [2**31 - 1, 1]  # both notices, then the close
    assert t.eof_at == 23.0
    assert ls.drain_stats.cx_closed_at_end == 1


def test_h2c_prior_knowledge_taken_over_is_one_connection_accepted_once() -> None:
    """The real HTTP listener: a connection that opens with the HTTP/2 preface is taken over
    from HTTP/1 by HTTP/2, and stays one connection accepted: once unheard in the ledger (until
    its first request), once a new connection for the health-check path's watch."""
    cfg = load_config_text("""
listeners:
  - {name: a, address: 127.0.0.1:0, health_check_path: /hc, routes: [{cluster: c}]}
clusters: [{name: c, endpoints: [127.0.0.1:9]}]
""")
    loop = playbook.Loop()
    built = build(cfg, loop, lambda: 0.5, lambda: None)
    ls, ledger = built.listeners[0], built.process.ledger
    ls.watch(True)
    conn = H1Downstream(ls)  # type: ignore[arg-type]
    t = Transport(loop)
    t.set_protocol(conn)
    conn.connection_made(t)
    conn.data_received(H2_PREFACE)
    assert isinstance(t.protocol, H2Downstream)
    assert ledger.fresh == 1
    assert ls.probes is not None and ls.probes.talkers["127.0.0.1"].connections == 1
    block = hpack.Encoder().encode([(":method", "GET"), (":scheme", "http"),
                                    (":path", "/hc"), (":authority", "app")])
    t.protocol.data_received(headers(1, block))
    assert ledger.fresh == 0  # heard: its first request
    assert ls.probes.probers["127.0.0.1"].probes == 1
