"""A SIGTERM with HTTP/1.1 connections that have sent no whole request head, over real sockets.

No bytes yet: its request may be on the way, so the exit waits for it until G after its
accept; past that it is idle, and the exit closes it (RFC 9112 §9.6 lets a server close an idle
connection). A request that comes after T is answered 503 going away and counted as refused,
never met by a close its client cannot tell from a failure.
Part of a head: a request in flight for its client, so it holds the exit like one, and the
deadline counts it as cut — never a connection closed under it, uncounted.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket

import pytest

from tests.procs import Lameduck, wait_until

pytestmark = pytest.mark.usefixtures("workers")

REPORT = re.compile(r"drain report: requests completed=(\d+) refused=(\d+) cut=(\d+) "
                    r"\(503=(\d+) reset=(\d+)\)")


def report_counts(ld: Lameduck) -> tuple[int, ...]:
    m = REPORT.search(ld.log())
    assert m is not None, ld.log()
    return tuple(map(int, m.groups()))


def connected(ld: Lameduck) -> bool:
    """The process holds a downstream connection (accepted: not in the accept queue)."""
    return ld.stat("server.total_connections") >= 1


def closed(sock: socket.socket) -> bool:
    """The peer closed (a FIN or a reset), with nothing sent first."""
    with contextlib.suppress(ConnectionResetError):
        return sock.recv(65536) == b""
    return True


def read_all(sock: socket.socket) -> bytes:
    """What the peer sent up to its close."""
    got = b""
    with contextlib.suppress(ConnectionResetError):
        while data := sock.recv(65536):
            got += data
    return got


def test_a_connection_that_sent_nothing_is_closed_by_the_exit(lameduck) -> None:
    """Nothing sent: the exit waits for it until G (5 s) after its accept, then closes it,
    exit 0, nothing cut; before the deadline (20 s), which ``ld.wait(15)`` tells apart."""
    ld: Lameduck = lameduck(drain={"time": "1s"},
                            shutdown={"deadline": "20s", "min_drain": "0s"},
                            hot_restart={"parent_shutdown_time": "20s"})
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert wait_until(lambda: connected(ld), timeout=10), ld.log()
        ld.signal(signal.SIGTERM)
        assert ld.wait(15) == 0, ld.log()
        assert closed(sock), ld.log()
    assert report_counts(ld)[:3] == (0, 0, 0), ld.log()


def test_a_request_on_a_connection_accepted_before_t_gets_an_answer_after_it(lameduck) -> None:
    """Accepted before T, its request sent once the main process has reached T: the exit
    waited for it (G after the accept), so it is answered and counted, where an exit at T
    closed the connection under it. The answer is 503 going away (from T no new work),
    counted as refused; or, with workers whose own T timer a loaded machine ran a moment
    after the main process's, 200 with ``Connection: close``, counted as completed."""
    ld: Lameduck = lameduck(drain={"time": "1s", "connection_grace": "20s"},
                            shutdown={"deadline": "30s", "min_drain": "0s"},
                            hot_restart={"parent_shutdown_time": "30s"})
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        assert wait_until(lambda: connected(ld), timeout=10), ld.log()
        ld.signal(signal.SIGTERM)
        assert wait_until(lambda: "drain time reached" in ld.log(), timeout=15), ld.log()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        response = read_all(sock)
        code = ld.wait(30)
    assert response.startswith((b"HTTP/1.1 503 ", b"HTTP/1.1 200 ")), (response, ld.log())
    assert b"connection: close" in response.lower(), response
    assert code == 0, ld.log()
    served = response.startswith(b"HTTP/1.1 200 ")
    assert report_counts(ld)[:3] == ((1, 0, 0) if served else (0, 1, 0)), ld.log()


def test_part_of_a_request_head_holds_the_exit_and_is_cut_at_the_deadline(lameduck) -> None:
    """A head begun but not ended across T: the process waits for it (exit at the deadline,
    not at T), then answers it 503 going away (RFC 9110 §15.6.4: nothing of a response was
    sent) and counts it: cut=1 (503=1), exit 3."""
    # T well after the head's bytes are in (an exit at T would not have waited for it)
    ld: Lameduck = lameduck(drain={"time": "4s", "connection_grace": "100ms"},
                            shutdown={"deadline": "5s", "min_drain": "0s"},
                            hot_restart={"parent_shutdown_time": "5s"})
    host, port = ld.addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: the head goes on
        assert wait_until(lambda: connected(ld), timeout=10), ld.log()
        ld.signal(signal.SIGTERM)
        code = ld.wait(30)
        response = read_all(sock)
    assert code == 3, ld.log()
    assert response.startswith(b"HTTP/1.1 503 "), (response, ld.log())
    assert b"going away" in response, (response, ld.log())
    _, _, cut, answered, reset = report_counts(ld)
    assert (cut, answered, reset) == (1, 1, 0), ld.log()
