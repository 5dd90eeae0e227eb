"""The downstream timeouts and limits against a real lameduck and the real demo origin, one
socket test each, with tolerant bounds (the exact times are in tests/unit/
test_downstream_playbook.py): request_body_timeout (HTTP/1.1 and HTTP/2), send_timeout,
max_connection_duration, max_requests_per_connection (docs/timeouts.md)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tests.h2raw import RawH2
from tests.procs import Lameduck, raw_connect, read_wire_response, wait_closed, wait_until

Start = Callable[..., Lameduck]
GET = b"GET / HTTP/1.1\r\nHost: app\r\n\r\n"
NO_ERROR = 0


def test_a_body_the_client_stops_sending_gets_408_and_the_connection_closes(
        lameduck: Start) -> None:
    """The origin answers / once the body is whole: no response byte went out, so a 408."""
    ld = lameduck(listener={"request_body_timeout": "300ms"})
    with raw_connect(ld.port) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: app\r\nContent-Length: 10\r\n\r\nabc")
        t0 = time.monotonic()
        resp = read_wire_response(sock.makefile("rb"))
        took = time.monotonic() - t0
        assert resp.status == 408 and resp.header("connection") == "close"
        assert 0.25 <= took < 3.0
        assert wait_closed(sock)
    assert ld.stat("http.ingress.downstream_rq_body_timeout") == 1


def test_an_h2_stream_whose_body_stops_gets_408_and_the_connection_goes_on(
        lameduck: Start) -> None:
    """The 408 ends the stream, then RST_STREAM(NO_ERROR) stops the client's body (RFC 9113
    §8.1); the connection and its other streams are not touched."""
    ld = lameduck(listener={"request_body_timeout": "300ms"})
    c = RawH2(ld.port)
    try:
        c.request(1, "/", method="POST", headers=[("content-length", "10")], end=False)
        c.data(1, b"abc")
        t0 = time.monotonic()
        assert c.wait(lambda: c.streams[1].reset is not None)
        took = time.monotonic() - t0
        s = c.streams[1]
        assert s.status == 408 and s.ended and s.reset == NO_ERROR
        assert 0.25 <= took < 3.0
        c.request(3, "/")
        assert c.wait(lambda: c.done(3))
        assert c.streams[3].status == 200 and not c.goaways
    finally:
        c.close()
    assert ld.stat("http.ingress.downstream_rq_body_timeout") == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)


def test_a_client_that_stops_reading_is_reset_after_send_timeout(lameduck: Start) -> None:
    ld = lameduck(listener={"send_timeout": "300ms"})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing
    with sock:
        sock.connect(("127.0.0.1", ld.port))
        sock.sendall(b"GET /bytes?n=100000000 HTTP/1.1\r\nHost: app\r\n\r\n")
        assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_send_timeout") == 1,
                          timeout=10.0)
        assert wait_closed(sock, timeout=10.0)  # what was buffered, then the reset
    assert ld.stat("http.ingress.downstream_rq_active") == 0


def test_max_connection_duration_closes_an_idle_keepalive_connection(lameduck: Start) -> None:
    """Drained at 500 ms, closed once the connection grace (200 ms) is over: not reset."""
    ld = lameduck(listener={"max_connection_duration": "500ms"})
    with raw_connect(ld.port) as sock:
        t0 = time.monotonic()
        sock.sendall(GET)
        resp = read_wire_response(sock.makefile("rb"))
        assert resp.status == 200 and not resp.has("connection")
        assert wait_closed(sock)
        took = time.monotonic() - t0
        assert 0.6 <= took < 4.0
    assert ld.stat("http.ingress.downstream_cx_max_duration_reached") == 1


def test_the_response_to_the_last_request_says_connection_close(lameduck: Start) -> None:
    ld = lameduck(listener={"max_requests_per_connection": 2})
    with raw_connect(ld.port) as sock:
        f = sock.makefile("rb")
        sock.sendall(GET)
        first = read_wire_response(f)
        sock.sendall(GET)
        second = read_wire_response(f)
        assert first.status == second.status == 200
        assert not first.has("connection")
        assert second.header("connection") == "close"
        assert wait_closed(sock)
    assert ld.stat("http.ingress.downstream_cx_max_requests_reached") == 1
