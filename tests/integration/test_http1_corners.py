"""HTTP/1.1 request lines at the edge of the grammar (RFC 9112 §3), over real sockets."""

from __future__ import annotations

import socket
import time

from tests.procs import until_closed


def _answer(addr: str, data: bytes, pieces: int = 1) -> tuple[bytes, float]:
    """Send ``data`` (in ``pieces`` writes), read to EOF; the answer and how long it took."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=8) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        step = max(1, len(data) // pieces)
        for i in range(0, len(data), step):
            s.sendall(data[i:i + step])
            time.sleep(0.02)  # separate reads on the other side, so the head spans them
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except TimeoutError:
            pass
        return answer, time.monotonic() - started


def test_http09_request_line_is_answered_at_once(lameduck) -> None:
    # HTTP/0.9 (`GET /` without a version) is not HTTP/1.x (RFC 9112 §3 requires the version):
    # answered 400 at once, as a complete 0.9 head already was; held, it would wait for the
    # header timeout.
    ld = lameduck(listener={"request_headers_timeout": "30s"})
    for request, pieces in ((b"GET /\r\n", 1), (b"GET /\n", 1), (b"GET /index\r\n", 3)):
        answer, took = _answer(ld.addr, request, pieces)
        assert answer.startswith(b"HTTP/1.1 400 "), (request, answer)
        assert took < 5, (request, took)
    # a request line that is merely slow to arrive is still served
    answer, _ = _answer(ld.addr, b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 4)
    assert answer.startswith(b"HTTP/1.1 200 "), answer


def test_a_local_answer_to_a_client_that_asked_to_close_closes(lameduck) -> None:
    # RFC 9112 §9.6: the answer says `connection: close`, so the connection closes after it
    # (it stayed open to the idle timeout: a client reading to EOF hung).
    ld = lameduck(listener={"health_check_path": "/healthz", "idle_timeout": "300s"})
    for request in (b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
                    b"GET /healthz HTTP/1.0\r\n\r\n",
                    b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET / HTTP/1.1"
                    b"\r\nHost: a\r\n\r\n"):
        answer = until_closed(ld.addr, request, timeout=30)
        assert answer.startswith((b"HTTP/1.1 200 ", b"HTTP/1.0 200 ")), answer
        assert b"connection: close" in answer.lower() and answer.count(b"HTTP/1.") == 1, answer
