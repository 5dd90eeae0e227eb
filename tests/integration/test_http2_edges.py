"""HTTP/2 downstream edge cases over real sockets: resets both ways, upstream errors mapped onto
a stream, flow control and memory, concurrency limits, bodyless responses, trailers, malformed
lengths, idle timeout, SIGTERM, TLS, and CONNECT streams (tests/h2raw.py's raw-frame client)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from hyperframe.frame import DataFrame, HeadersFrame, RstStreamFrame, WindowUpdateFrame

from tests.h2raw import RawH2, StreamResult
from tests.peers import ThreadedServer, answer
from tests.procs import rss_kb, wait_until

MAX_ID = 2**31 - 1
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, REFUSED_STREAM, CANCEL = 0, 1, 2, 7, 8
CONNECT_ERROR = 10
FRAME = 16384


def _pattern(n: int) -> bytes:
    period = bytes(range(251))
    return (period * (n // 251 + 1))[:n]


class H2(RawH2):
    """RawH2 that can stop giving credit back (a slow reader) and counts the connection credit
    the server grants (stream 0 WINDOW_UPDATEs), to see request bytes it never gives back."""

    def __init__(self, port: int, window: int = 1 << 30, auto_ack: bool = True,
                 timeout: float = 5.0) -> None:
        self.auto_ack = auto_ack
        self.conn_credit = 65535  # what we may still send on the connection
        super().__init__(port, timeout=timeout, window=window)

    def _handle(self, f) -> None:  # type: ignore[no-untyped-def]
        if isinstance(f, WindowUpdateFrame) and f.stream_id == 0:
            self.conn_credit += f.window_increment
        if isinstance(f, DataFrame) and not self.auto_ack:
            self.frames.append(f)
            s = self.streams.setdefault(f.stream_id, StreamResult())
            s.body += f.data
            if "END_STREAM" in f.flags:
                s.ended = True
            return
        super()._handle(f)

    def headers(self, sid: int, fields: list[tuple[str, str]], end: bool) -> None:
        hf = HeadersFrame(sid, self.enc.encode(fields))
        hf.flags.add("END_HEADERS")
        if end:
            hf.flags.add("END_STREAM")
        self.sock.sendall(hf.serialize())

    def open(self, sid: int, path: str, method: str = "POST",
             extra: list[tuple[str, str]] | None = None, end: bool = False) -> None:
        self.streams[sid] = StreamResult()
        self.headers(sid, [(":method", method), (":scheme", "http"),
                           (":authority", self.authority), (":path", path), *(extra or [])], end)

    def body(self, sid: int, data: bytes, end: bool = True) -> None:
        out = bytearray()
        for i in range(0, max(len(data), 1), FRAME):
            piece = data[i:i + FRAME]
            df = DataFrame(sid, piece)
            if end and i + FRAME >= len(data):
                df.flags.add("END_STREAM")
            out += df.serialize()
        self.conn_credit -= len(data)
        self.sock.sendall(bytes(out))

    def rst(self, sid: int, code: int = CANCEL) -> None:
        self.sock.sendall(RstStreamFrame(sid, error_code=code).serialize())

    def credit(self, sid: int, n: int) -> None:
        self.sock.sendall(WindowUpdateFrame(0, window_increment=n).serialize()
                          + WindowUpdateFrame(sid, window_increment=n).serialize())


def _settled(ld, cluster_cx: int | None = 0) -> bool:  # type: ignore[no-untyped-def]
    s = ld.stats()
    ok = (s["http.ingress.downstream_rq_active"] == 0
          and s["cluster.app.upstream_rq_active"] == 0)
    if cluster_cx is not None:
        ok = ok and s["cluster.app.upstream_cx_active"] == cluster_cx
    return ok


# -- resets and upstream errors --------------------------------------------------------------


def test_client_cancel_mid_response_closes_upstream_not_pooled(lameduck):
    ld = lameduck()
    c = H2(ld.port)
    c.request(1, "/stream?chunks=100&size=1000&interval_ms=30")
    assert c.wait(lambda: len(c.streams[1].body) >= 2000)
    c.rst(1, CANCEL)
    # the upstream connection was mid-body: it must be closed, never handed to the pool
    assert wait_until(lambda: _settled(ld, cluster_cx=0), 3), ld.stats()
    stats = ld.stats()
    assert stats["http.ingress.http2.rx_reset"] == 1
    assert stats["http.ingress.downstream_rq_rx_reset"] == 1
    # the connection serves on, on a fresh upstream connection
    c.request(3, "/")
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200
    assert c.streams[3].body == b"hello from the lameduck demo origin\n"
    assert ld.stat("cluster.app.upstream_cx_total") == 2
    c.close()


def test_upstream_reset_before_head_is_502_and_mid_body_is_rst(lameduck):
    ld = lameduck()
    c = H2(ld.port)
    c.request(1, "/reset")
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].status == 502 and c.streams[1].ended
    c.request(3, "/partial?n=100000")
    assert c.wait(lambda: c.done(3))
    s3 = c.streams[3]
    assert s3.status == 200
    assert s3.reset == INTERNAL_ERROR and not s3.ended
    assert len(s3.body) <= 100000
    assert bytes(s3.body) == _pattern(len(s3.body))
    c.request(5, "/")
    assert c.wait(lambda: c.done(5))
    assert c.streams[5].status == 200
    assert not c.goaways
    assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)
    assert ld.stat("cluster.app.upstream_rq_rx_reset") == 2
    c.close()


def test_upstream_timeout_is_504_on_the_stream(lameduck):
    ld = lameduck(route={"timeout": "300ms"})
    c = H2(ld.port)
    t0 = time.monotonic()
    c.request(1, "/hang")
    c.request(3, "/")  # a sibling stream is not held up by the hanging one
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200
    assert c.wait(lambda: c.done(1), 10)
    took = time.monotonic() - t0
    assert c.streams[1].status == 504, c.streams[1]
    assert 0.25 <= took < 8.0, took  # the route's 300 ms, not a hang (a loaded machine: slack)
    assert ld.stat("cluster.app.upstream_rq_timeout") == 1
    assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)
    c.close()


# -- flow control and memory -----------------------------------------------------------------


def test_slow_reader_small_window_big_body_bounded_and_intact(lameduck):
    """A client that gives no credit back: the proxy holds a bounded amount and pauses its
    upstream; once credit comes, the whole body arrives intact."""
    ld = lameduck()
    n = 48 * 1024 * 1024
    c = H2(ld.port, window=65536, auto_ack=False, timeout=10)
    c.request(1, f"/bytes?n={n}")
    assert c.wait(lambda: len(c.streams[1].body) >= 65536 - FRAME)
    base = rss_kb(ld.pid)
    time.sleep(1.0)  # nothing read: the upstream must be paused, not buffered here
    grown = rss_kb(ld.pid) - base
    assert grown < 16 * 1024, f"lameduck grew by {grown} KiB while the client read nothing"
    # now read it all, giving credit back as it comes
    end = time.monotonic() + 30
    s = c.streams[1]
    seen = len(s.body)
    c.credit(1, 8 * 1024 * 1024)
    while not (s.ended or s.reset is not None) and time.monotonic() < end:
        if c.pump(end) is None and c.eof:
            break
        if len(s.body) - seen >= 4 * 1024 * 1024:
            c.credit(1, len(s.body) - seen)
            seen = len(s.body)
    assert s.ended and s.reset is None
    assert len(s.body) == n
    assert hashlib.sha256(s.body).digest() == hashlib.sha256(_pattern(n)).digest()
    c.close()


def test_client_not_reading_socket_bounded_memory(lameduck):
    """Huge windows, but the client does not read its socket: the transport's write buffer
    pauses the upstream (pause_writing), memory stays bounded."""
    ld = lameduck()
    n = 256 * 1024 * 1024
    c = H2(ld.port, window=2**31 - 1, timeout=10)
    c.request(1, f"/bytes?n={n}")
    assert c.wait(lambda: len(c.streams[1].body) > 0)
    base = rss_kb(ld.pid)
    time.sleep(1.0)
    grown = rss_kb(ld.pid) - base
    assert grown < 32 * 1024, f"lameduck grew by {grown} KiB while the client read nothing"
    c.close()
    assert wait_until(lambda: _settled(ld), 5)


def test_refused_streams_above_max_concurrent(lameduck):
    ld = lameduck(listener={"http2": {"max_concurrent_streams": 4}})
    c = H2(ld.port)
    c.wait(lambda: False, 0.2)  # read the server's SETTINGS first
    out = b""
    for i in range(8):
        sid = 2 * i + 1
        c.streams[sid] = StreamResult()
        hf = HeadersFrame(sid, c.enc.encode([(":method", "GET"), (":scheme", "http"),
                                             (":authority", c.authority),
                                             (":path", "/sleep?ms=300")]))
        hf.flags.add("END_HEADERS")
        hf.flags.add("END_STREAM")
        out += hf.serialize()
    c.send(out)
    assert c.wait(lambda: all(c.done(2 * i + 1) for i in range(8)), 5)
    refused = [sid for sid, s in c.streams.items() if s.reset == REFUSED_STREAM]
    ok = [sid for sid, s in c.streams.items() if s.status == 200 and s.ended]
    assert refused == [9, 11, 13, 15]
    assert ok == [1, 3, 5, 7]
    assert not c.goaways
    assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)
    c.close()


def test_head_204_304_have_no_body_and_keep_the_pool_in_step(lameduck):
    ld = lameduck()
    c = H2(ld.port)
    c.request(1, "/bytes?n=1000", method="HEAD")
    assert c.wait(lambda: c.done(1))
    s = c.streams[1]
    assert s.status == 200 and s.ended and s.body == b""
    assert dict(s.headers).get("content-length") == "1000"
    for sid, code in ((3, 204), (5, 304)):
        c.request(sid, f"/status/{code}")
        assert c.wait(lambda sid=sid: c.done(sid))
        assert c.streams[sid].status == code and c.streams[sid].ended
        assert c.streams[sid].body == b""
    # sequential streams reuse one pooled upstream connection, still in step
    for sid in (7, 9):
        c.request(sid, "/bytes?n=5000")
        assert c.wait(lambda sid=sid: c.done(sid))
        assert c.streams[sid].body == _pattern(5000)
    c.request(11, "/", method="HEAD")
    assert c.wait(lambda: c.done(11))
    assert c.streams[11].status == 200 and c.streams[11].body == b""
    c.request(13, "/")
    assert c.wait(lambda: c.done(13))
    assert c.streams[13].body == b"hello from the lameduck demo origin\n"
    assert ld.stat("cluster.app.upstream_cx_total") == 1
    assert wait_until(lambda: _settled(ld, cluster_cx=1), 3)
    c.close()


def test_request_trailers_end_the_body(lameduck):
    ld = lameduck()
    c = H2(ld.port)
    body = _pattern(100_000)
    # no content-length: goes upstream chunked; the trailers end it
    c.open(1, "/echo")
    c.body(1, body, end=False)
    c.headers(1, [("x-checksum", "abc")], end=True)
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].status == 200 and c.streams[1].ended
    assert bytes(c.streams[1].body) == body
    # with a content-length
    c.open(3, "/echo", extra=[("content-length", str(len(body)))])
    c.body(3, body, end=False)
    c.headers(3, [("x-checksum", "abc")], end=True)
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200 and c.streams[3].ended
    assert bytes(c.streams[3].body) == body
    c.request(5, "/")
    assert c.wait(lambda: c.done(5))
    assert c.streams[5].status == 200
    assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)
    c.close()


@pytest.mark.parametrize("declared, sent", [(10, 5), (5, 10)])
def test_content_length_mismatch_resets_the_stream(lameduck, declared, sent):
    ld = lameduck()
    c = H2(ld.port)
    c.open(1, "/echo", extra=[("content-length", str(declared))])
    time.sleep(0.1)  # the head has gone upstream already
    c.body(1, b"x" * sent, end=True)
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].reset == PROTOCOL_ERROR
    assert not c.goaways
    # the upstream got half a request: its connection must not be pooled
    assert wait_until(lambda: _settled(ld, cluster_cx=0), 3), ld.stats()
    c.request(3, "/")
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200
    assert c.streams[3].body == b"hello from the lameduck demo origin\n"
    c.close()


def test_client_gone_with_streams_in_flight(lameduck):
    ld = lameduck()
    c = H2(ld.port)
    c.request(1, "/stream?chunks=100&size=1000&interval_ms=30")
    c.request(3, "/sleep?ms=2000")
    c.open(5, "/echo")  # a request body still coming
    c.body(5, b"y" * 1000, end=False)
    assert c.wait(lambda: len(c.streams[1].body) > 0)
    time.sleep(0.1)
    assert ld.stat("http.ingress.downstream_rq_active") == 3
    c.close()
    assert wait_until(lambda: _settled(ld, cluster_cx=0), 3), ld.stats()
    stats = ld.stats()
    assert stats["http.ingress.downstream_cx_destroy_remote_active_rq"] == 1
    assert stats["http.ingress.downstream_cx_active"] == 0
    assert stats["http.ingress.downstream_cx_http2_active"] == 0


def test_idle_timeout_sends_goaway_then_closes(lameduck):
    ld = lameduck(listener={"idle_timeout": "300ms"})
    c = H2(ld.port)
    c.request(1, "/")
    assert c.wait(lambda: c.done(1))
    t0 = time.monotonic()
    assert c.wait(lambda: bool(c.goaways), 3)
    assert c.goaways[-1] == (1, NO_ERROR)
    assert c.wait(lambda: c.eof, 3)
    assert 0.2 <= time.monotonic() - t0 < 2.0
    c.close()
    assert ld.stat("http.ingress.downstream_cx_idle_timeout") == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0)


def test_busy_stream_is_not_idle(lameduck):
    """The idle timer must not close a connection whose stream is slow (not idle)."""
    ld = lameduck(listener={"idle_timeout": "300ms"})
    c = H2(ld.port)
    c.request(1, "/sleep?ms=900")
    assert c.wait(lambda: c.done(1), 3)
    assert c.streams[1].status == 200
    assert not c.goaways
    c.close()


# -- SIGTERM ---------------------------------------------------------------------------------


def test_sigterm_idle_h2_connection_two_goaways_exit_0(lameduck):
    ld = lameduck(drain={"time": "600ms", "strategy": "gradual", "connection_grace": "100ms"},
                  shutdown={"deadline": "3s"})
    c = H2(ld.port)
    c.request(1, "/")
    assert c.wait(lambda: c.done(1))
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.eof, 4)
    assert c.goaways[0] == (MAX_ID, NO_ERROR)
    assert c.goaways[-1] == (1, NO_ERROR)
    assert ld.wait(5) == 0
    c.close()
    assert "cut=0" in ld.log()


def test_sigterm_busy_h2_stream_finishes_exit_0(lameduck):
    ld = lameduck(drain={"time": "300ms", "strategy": "immediate", "connection_grace": "100ms"},
                  shutdown={"deadline": "3s"})
    c = H2(ld.port)
    c.request(1, "/sleep?ms=900")
    time.sleep(0.1)
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.done(1), 4)
    assert c.streams[1].status == 200 and c.streams[1].ended
    assert c.wait(lambda: c.eof, 4)
    assert c.goaways and c.goaways[-1] == (1, NO_ERROR)
    assert ld.wait(5) == 0
    c.close()


# -- TLS -------------------------------------------------------------------------------------


def test_tls_h2_large_upload(lameduck, tls_files):
    ca, cert, key = tls_files
    ld = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}})
    body = _pattern(5 * 1024 * 1024 + 3)
    with httpx.Client(http1=False, http2=True, timeout=20,
                      verify=ssl.create_default_context(cafile=str(ca))) as c:
        r = c.post(f"https://{ld.addr}/echo", content=body)
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200
        assert r.content == body
    assert ld.stat("http.ingress.downstream_cx_ssl_total") == 1
    assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)


def test_tls_alpn_http11_keep_alive(lameduck, tls_files):
    ca, cert, key = tls_files
    ld = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}})
    with httpx.Client(http1=True, http2=False, timeout=10,
                      verify=ssl.create_default_context(cafile=str(ca))) as c:
        for i in range(5):
            r = c.get(f"https://{ld.addr}/bytes?n={1000 + i}")
            assert r.http_version == "HTTP/1.1"
            assert r.content == _pattern(1000 + i)
        r = c.post(f"https://{ld.addr}/echo", content=b"z" * 200_000)
        assert r.content == b"z" * 200_000
    stats = ld.stats()
    assert stats["http.ingress.downstream_cx_ssl_total"] == 1
    assert stats["http.ingress.downstream_cx_total"] == 1
    assert stats["http.ingress.downstream_rq_total"] == 6


# -- flow-control credit of request bodies that never reach an upstream -------------------------


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port whose accept queue is full: a connect to it hangs (SYNs dropped) until timeout."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    port = s.getsockname()[1]
    fill = []
    for _ in range(3):
        f = socket.socket()
        f.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            f.connect(("127.0.0.1", port))
        fill.append(f)
    time.sleep(0.05)
    try:
        yield port
    finally:
        for f in fill:
            f.close()
        s.close()


def test_request_body_credit_returned_when_upstream_connect_fails(lameduck, blackhole):
    """Request DATA held for an upstream that never connects (503) must still give its
    connection-level credit back, or a few such streams stall the whole connection."""
    ld = lameduck(cluster={"endpoints": [f"127.0.0.1:{blackhole}"], "connect_timeout": "150ms"},
                  listener={"http2": {"initial_stream_window_size": 262144,
                                      "initial_connection_window_size": 1048576}})
    c = H2(ld.port, timeout=5)
    assert c.wait(lambda: c.conn_credit >= 1048576, 2)
    body = b"q" * 262144
    for i in range(6):  # 1.5 MiB in all: more than the connection window
        sid = 2 * i + 1
        assert c.conn_credit >= len(body), (i, c.conn_credit)
        c.open(sid, "/echo", extra=[("content-length", str(len(body)))])
        c.body(sid, body)
        assert c.wait(lambda sid=sid: c.done(sid), 3)
        assert c.streams[sid].status == 503, c.streams[sid]
        c.wait(lambda: False, 0.05)  # collect any WINDOW_UPDATE that follows
    assert not c.goaways
    c.close()


def test_request_body_credit_returned_when_client_resets_before_upstream(lameduck, blackhole):
    ld = lameduck(cluster={"endpoints": [f"127.0.0.1:{blackhole}"], "connect_timeout": "2s"},
                  listener={"http2": {"initial_stream_window_size": 262144,
                                      "initial_connection_window_size": 1048576}})
    c = H2(ld.port, timeout=5)
    assert c.wait(lambda: c.conn_credit >= 1048576, 2)
    body = b"q" * 262144
    for i in range(6):
        sid = 2 * i + 1
        assert c.conn_credit >= len(body), (i, c.conn_credit)
        c.open(sid, "/echo", extra=[("content-length", str(len(body)))])
        c.body(sid, body)
        c.wait(lambda: False, 0.05)
        c.rst(sid, CANCEL)
        c.wait(lambda: False, 0.05)
    assert not c.goaways
    c.close()


# -- CONNECT streams ---------------------------------------------------------------------------


def test_h2_connect_early_data_and_half_close(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}})
    c = H2(ld.port)
    payload = _pattern(300_000)
    # CONNECT, its DATA and END_STREAM in one write, before the 200
    hf = HeadersFrame(1, c.enc.encode([(":method", "CONNECT"),
                                       (":authority", f"127.0.0.1:{destination.port}")]))
    hf.flags.add("END_HEADERS")
    out = hf.serialize()
    for i in range(0, len(payload), FRAME):
        df = DataFrame(1, payload[i:i + FRAME])
        if i + FRAME >= len(payload):
            df.flags.add("END_STREAM")
        out += df.serialize()
    c.streams[1] = StreamResult()
    c.send(out)
    assert c.wait(lambda: c.done(1), 5)
    s = c.streams[1]
    assert s.status == 200 and s.ended and s.reset is None
    assert bytes(s.body) == b"got %d %s" % (len(payload),
                                            hashlib.sha256(payload).hexdigest().encode())
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert ld.stat("http.ingress.downstream_rq_active") == 0
    c.close()


def test_h2_connect_client_not_reading_bounded_memory(lameduck, origin_port):
    """A CONNECT stream whose client has big windows but does not read its socket: the
    destination must be paused (like an upstream on pause_writing), not buffered here."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    c = H2(ld.port, window=2**31 - 1, timeout=10)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    n = 256 * 1024 * 1024
    c.data(1, f"GET /bytes?n={n} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    assert c.wait(lambda: len(c.streams[1].body) > 0)
    base = rss_kb(ld.pid)
    time.sleep(1.5)  # not reading
    grown = rss_kb(ld.pid) - base
    c.close()
    assert grown < 64 * 1024, f"lameduck grew by {grown} KiB while the client read nothing"
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)


def test_h2_connect_destination_closes_first(lameduck, origin_port):
    """The destination's FIN becomes END_STREAM; the client's END_STREAM then ends the tunnel
    as a completed request."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    c.data(1, b"GET /close HTTP/1.1\r\nHost: t\r\n\r\n")  # the origin answers, then closes
    assert c.wait(lambda: c.streams[1].ended, 5)
    assert b"closing" in c.streams[1].body
    assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 1  # our half is open
    c.data(1, b"", end=True)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert ld.stat("http.ingress.downstream_rq_completed") == 1
    c.close()


def test_h2_connect_client_reset_drops_destination(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{destination.port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    c.data(1, b"partial")
    c.rst(1, CANCEL)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    # the destination saw the connection end (not our FIN after a clean END_STREAM: a reset)
    assert wait_until(lambda: len(destination.received) == 1, 3)
    c.request(3, "/")
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200
    c.close()


def test_h2_client_reset_of_a_tunnel_stream_is_a_reset_stream(lameduck, destination, wsecho):
    """A client's RST_STREAM ends a tunnel stream (a CONNECT, an RFC 8441 WebSocket) as it ends
    any stream: counted in downstream_rq_rx_reset, no completed request, and the relay lets go
    of the other side (the destination, the upstream, see their connections end)."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}},
                  cluster={"endpoints": [f"127.0.0.1:{wsecho.port}"]})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{destination.port}")
    c.open(3, "/chat", method="CONNECT",
           extra=[(":protocol", "websocket"), ("sec-websocket-version", "13")])
    assert c.wait(lambda: c.streams[1].status == 200 and c.streams[3].status == 200)
    assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 2
    c.data(1, b"partial")
    c.rst(1, CANCEL)
    c.rst(3, CANCEL)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert ld.stat("http.ingress.downstream_rq_rx_reset") == 2
    assert ld.stat("http.ingress.downstream_rq_completed") == 0
    assert ld.stat("http.ingress.downstream_cx_upgrades_total") == 2
    assert wait_until(lambda: destination.received == [b"partial"], 3)
    assert wsecho.closes(1) == ["closed none"]  # its connection ended, no close frame came
    c.request(5, "/")  # the connection goes on (the WebSocket server answers a plain GET 426)
    assert c.wait(lambda: c.done(5))
    assert c.streams[5].status == 426
    c.close()


def test_h2_connect_with_end_stream_on_headers(lameduck, destination):
    """END_STREAM on the CONNECT's HEADERS: the client has nothing to send (half-closed from the
    start). The destination must get its FIN at once, and the tunnel end once it answers."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}})
    c = H2(ld.port)
    c.streams[1] = StreamResult()
    hf = HeadersFrame(1, c.enc.encode([(":method", "CONNECT"),
                                       (":authority", f"127.0.0.1:{destination.port}")]))
    hf.flags.add("END_HEADERS")
    hf.flags.add("END_STREAM")
    c.send(hf.serialize())
    assert c.wait(lambda: c.done(1), 4)
    s = c.streams[1]
    assert s.status == 200 and s.ended
    assert bytes(s.body) == answer(b"")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0, 3)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 3)
    c.close()


def test_h2_connect_sigterm_deadline_resets_stream_exit_3(lameduck, destination):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{destination.port}"]}},
                  drain={"time": "300ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "800ms"})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{destination.port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.done(1), 4)
    assert c.streams[1].reset == CANCEL
    assert ld.wait(5) == 3
    c.close()
    assert "cut=1 (503=0 reset=1)" in ld.log(), ld.log()


def test_sigterm_deadline_resets_a_started_response_exit_3(lameduck):
    ld = lameduck(drain={"time": "0s", "strategy": "immediate", "connection_grace": "5s"},
                  shutdown={"deadline": "500ms"})
    c = H2(ld.port)
    c.request(1, "/stream?chunks=100&size=100&interval_ms=50")
    c.request(3, "/hang")
    assert c.wait(lambda: len(c.streams[1].body) > 0)
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.done(1) and c.done(3), 4)
    assert c.streams[1].reset == CANCEL
    assert c.streams[3].status == 503
    assert dict(c.streams[3].headers).get("retry-after") == "1"
    assert ld.wait(5) == 3
    c.close()
    assert "cut=2 (503=1 reset=1)" in ld.log(), ld.log()


class SlowReader:
    """An HTTP/1.1 upstream (in a thread) that reads a request body slowly, then answers with
    its length and sha256."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(10)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.settimeout(10)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
            n = int(fields[b"content-length"])
            h = hashlib.sha256(body)
            got = len(body)
            while got < n:
                time.sleep(0.005)
                chunk = conn.recv(32768)
                if not chunk:
                    break
                h.update(chunk)
                got += len(chunk)
            answer = b"%d %s" % (got, h.hexdigest().encode())
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer),
                                                                                answer))

    def close(self) -> None:
        self.sock.close()


def test_h2_upload_larger_than_windows_to_a_slow_upstream(lameduck):
    up = SlowReader()
    try:
        ld = lameduck(cluster={"endpoints": [f"127.0.0.1:{up.port}"]})
        body = os.urandom(6 * 1024 * 1024)
        base = rss_kb(ld.pid)
        with httpx.Client(http1=False, http2=True, timeout=30) as c:
            r = c.post(ld.url("/upload"), content=body)
        assert r.status_code == 200
        assert r.content == b"%d %s" % (len(body), hashlib.sha256(body).hexdigest().encode())
        grown = rss_kb(ld.pid) - base
        assert grown < 24 * 1024, grown
        assert wait_until(lambda: _settled(ld, cluster_cx=None), 3)
    finally:
        up.close()


def test_extended_connect_other_protocol_is_501(lameduck):
    """RFC 8441's :protocol is relayed for websocket only (test_websocket.py)."""
    ld = lameduck()
    c = H2(ld.port)
    c.open(1, "/chat", method="CONNECT", extra=[(":protocol", "bytestream")], end=False)
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].status == 501
    c.close()


class Banner(ThreadedServer):
    """A destination (in a thread) that speaks first: a banner at once, then its FIN, as an
    SMTP/SSH-style server (or one refusing the client) does."""

    def __init__(self) -> None:
        super().__init__(backlog=128)

    def serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(b"HELLO banner\r\n")
            conn.shutdown(socket.SHUT_WR)
        threading.Timer(2.0, conn.close).start()


def test_h2_connect_destination_that_speaks_first_gets_headers_first(lameduck):
    """Bytes (and a FIN) the destination sends at once must not reach the stream before its
    200 HEADERS: DATA before HEADERS is a malformed response (RFC 9113 §8.1)."""
    b = Banner()
    try:
        ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{b.port}"]}})
        c = H2(ld.port)
        bad = []
        for i in range(60):
            sid = 2 * i + 1
            c.connect(sid, f"127.0.0.1:{b.port}")
            assert c.wait(lambda sid=sid: c.done(sid), 3), (sid, c.streams[sid])
            first = next(f for f in c.frames if f.stream_id == sid)
            if not isinstance(first, HeadersFrame) or c.streams[sid].status != 200:
                bad.append((sid, type(first).__name__, c.streams[sid].status))
            c.data(sid, b"", end=True)
        assert not bad, f"{len(bad)} of 60 streams got DATA before their HEADERS: {bad[:3]}"
        c.close()
    finally:
        b.close()


class Resetter(ThreadedServer):
    """A destination (in a thread) that reads the first bytes it gets, then resets the
    connection (SO_LINGER 0: a TCP RST, not a FIN)."""

    def serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.settimeout(10)
            conn.recv(65536)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()


def test_h2_connect_destination_reset_is_connect_error(lameduck):
    """RFC 9113 §8.5: a TCP error on the destination (a RST) resets the stream with
    CONNECT_ERROR, never a clean END_STREAM; the tunnel is off the books, not completed."""
    r = Resetter()
    try:
        ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{r.port}"]}})
        c = H2(ld.port)
        c.connect(1, f"127.0.0.1:{r.port}")
        assert c.wait(lambda: c.streams[1].status == 200)
        c.data(1, b"hello")
        assert c.wait(lambda: c.done(1), 5)
        assert c.streams[1].reset == CONNECT_ERROR and not c.streams[1].ended
        assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
        assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
        assert ld.stat("http.ingress.downstream_rq_completed") == 0
        assert ld.stat("http.ingress.http2.tx_reset") == 1
        c.request(3, "/")  # the connection goes on
        assert c.wait(lambda: c.done(3))
        assert c.streams[3].status == 200
        c.close()
    finally:
        r.close()



def test_h2_connect_reset_while_connecting(lameduck, blackhole):
    """Reset by its client before the destination answered: off the books at once, and
    nothing is sent on the stream when the connect gives up later."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{blackhole}"],
                                        "connect_timeout": "1s"}})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{blackhole}")
    c.data(1, b"held until connected")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 1)
    c.rst(1, CANCEL)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert ld.stat("http.ingress.downstream_rq_rx_reset") == 1
    time.sleep(1.3)  # past connect_timeout
    c.request(3, "/")
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 200
    assert c.streams[1].status is None
    c.close()


def test_h2_connect_timeout_is_503_and_gives_held_credit_back(lameduck, blackhole):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{blackhole}"],
                                        "connect_timeout": "500ms"}})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{blackhole}")
    c.data(1, b"x" * 1000)  # held for the destination, its credit with it
    assert c.wait(lambda: c.done(1), 3)
    assert c.streams[1].status == 503
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0)
    assert c.wait(lambda: c.conn_credit >= 65535)  # the held bytes' credit came back
    c.close()


def test_h2_connect_still_connecting_at_the_deadline_gets_503(lameduck, blackhole):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{blackhole}"],
                                        "connect_timeout": "5s"}},
                  drain={"time": "300ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "800ms"})
    c = H2(ld.port)
    c.connect(1, f"127.0.0.1:{blackhole}")
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 1)
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.done(1), 4)
    assert c.streams[1].status == 503 and c.streams[1].body == b"going away\n"
    assert ld.wait(5) == 3
    c.close()
    assert "cut=1 (503=1 reset=0)" in ld.log(), ld.log()
