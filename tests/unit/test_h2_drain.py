"""The two-phase GOAWAY of RFC 9113 §6.8, seen by the strict ``h2`` client."""

from __future__ import annotations

import h2.events as ce
from hyperframe.frame import DataFrame, HeadersFrame

from lameduck.http2.connection import MAX_STREAM_ID, ErrorCode, RequestReceived
from tests.unit.test_h2_connection import GET, Pair, Raw, frames_of, of


def test_two_phase_goaway() -> None:
    p = Pair()
    first = p.request()
    p.pump()
    p.server.start_drain()
    p.server.start_drain()  # once only
    second = p.request()  # crosses the GOAWAY on the wire: still accepted
    srv, cli = p.pump()
    [ga] = of(cli, ce.ConnectionTerminated)  # (h2 stops at the first GOAWAY: python-hyper/h2#1181)
    assert (ga.last_stream_id, ga.error_code) == (MAX_STREAM_ID, ErrorCode.NO_ERROR)
    assert p.server.goaway_sent == 1
    assert [e.stream_id for e in of(srv, RequestReceived)] == [second]
    p.server.final_goaway()
    out = frames_of(p.server.data_to_send())
    assert [(f.type, f.last_stream_id, f.error_code) for f in out] == [(7, second, 0)]
    assert p.server.goaway_sent == 2
    # Streams at or below the id complete.
    for sid in (first, second):
        p.server.send_headers(sid, 200, [], end_stream=True)
    assert p.server.open_streams == 0
    assert not p.server.closed


def test_stream_above_final_goaway_is_refused_and_hpack_kept() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    raw.server.start_drain()
    raw.server.final_goaway()
    assert raw.server.data_to_send()  # both GOAWAYs
    # A block that adds to the HPACK table, on a stream above the final id.
    ev = raw.send(HeadersFrame(3, raw.block([*GET, (b"x-new", b"1")]),
                               flags=["END_HEADERS", "END_STREAM"]))
    assert ev == []
    rst = raw.rst(3)
    assert rst.error_code == ErrorCode.REFUSED_STREAM
    assert raw.server.last_processed == 1 and raw.server.open_streams == 1
    # The table is still in step: the client's encoder now indexes x-new; no COMPRESSION_ERROR.
    ev = raw.send(HeadersFrame(5, raw.block([*GET, (b"x-new", b"1")]),
                               flags=["END_HEADERS", "END_STREAM"]))
    assert ev == [] and raw.rst(5).error_code == ErrorCode.REFUSED_STREAM
    assert not raw.server.closed
    # Stream 1 finishes normally.
    raw.server.send_headers(1, 200, [], end_stream=True)
    assert raw.server.open_streams == 0


def test_refused_stream_data_is_ignored_and_credited() -> None:
    raw = Raw()
    raw.server.final_goaway()
    raw.server.data_to_send()
    ev = raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS"]),
                  DataFrame(1, b"x" * 100))
    assert ev == [] and raw.rst(1).error_code == ErrorCode.REFUSED_STREAM
    assert not raw.server.closed


def test_final_goaway_before_any_stream_refuses_all() -> None:
    raw = Raw()
    raw.server.final_goaway()
    raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    assert raw.rst(1).error_code == ErrorCode.REFUSED_STREAM
    assert raw.server.resets_sent == 1 and raw.server.open_streams == 0


def test_close_sends_final_goaway_and_stops_input() -> None:
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    raw.server.close(ErrorCode.NO_ERROR, b"bye")
    ga = frames_of(raw.server.data_to_send())[-1]
    assert (ga.last_stream_id, ga.error_code, ga.additional_data) == (1, 0, b"bye")
    assert raw.server.closed
    assert raw.send(HeadersFrame(3, raw.block(GET), flags=["END_HEADERS"])) == []


def test_a_stream_turned_away_untouched_is_above_the_final_goaway() -> None:
    """Past T the shell refuses a new stream at once: the final GOAWAY then names the stream
    before it, so the client reads either frame as "not processed" (RFC 9113 §6.8)."""
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    [ev] = raw.send(HeadersFrame(3, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    assert isinstance(ev, RequestReceived) and raw.server.last_processed == 3
    raw.server.unprocess(3)
    raw.server.reset_stream(3, ErrorCode.REFUSED_STREAM)
    raw.server.start_drain()
    raw.server.final_goaway()
    goaways = [f for f in frames_of(raw.server.data_to_send()) if f.type == 7]
    assert [g.last_stream_id for g in goaways] == [MAX_STREAM_ID, 1]
    raw.server.unprocess(1)  # not the newest: a processed stream stays processed
    assert raw.server.last_processed == 1


def test_streams_turned_away_in_one_read_are_left_out_of_the_final_goaway() -> None:
    """HEADERS for 3 and 5 arrive in one read; the shell processes neither (past the drain
    time): the final GOAWAY names 1, the last stream processed, not 5, the last one parsed."""
    raw = Raw()
    raw.send(HeadersFrame(1, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]))
    both = (HeadersFrame(3, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]).serialize()
            + HeadersFrame(5, raw.block(GET), flags=["END_HEADERS", "END_STREAM"]).serialize())
    ev = raw.server.receive(both, 0.0)
    assert [e.stream_id for e in ev if isinstance(e, RequestReceived)] == [3, 5]
    raw.server.data_to_send()
    raw.server.unprocess(3)
    raw.server.final_goaway()  # as the shell does on turning 3 away
    raw.server.unprocess(5)
    out = frames_of(raw.server.data_to_send())
    assert [(f.type, f.last_stream_id) for f in out if f.type == 7] == [(7, 1)]
    assert raw.server.last_processed == 1
