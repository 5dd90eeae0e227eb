"""The HTTP/1.1 data plane, failing: upstream errors mapped to 503/502/504 with their stats,
timeouts, and bad input (400, 431, 501, 403, no request smuggling), against a real lameduck
and the real demo origin. Raw sockets wherever the bytes on the wire are the point.

No Traceback may appear in lameduck's log: the shared instance is checked at module end, the
per-test ones by the ``lameduck`` fixture.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import httpx
import pytest

from tests.procs import (
    Lameduck,
    StatsDelta,
    base_config,
    raw_connect,
    read_wire_response,
    refusing_port,
    wait_closed,
    wait_until,
)

HELLO = b"hello from the lameduck demo origin\n"


# One lameduck serves most tests (a process start costs most of a second); each test reads
# its stats as deltas. Listener "ingress": /hang has a 300 ms route timeout, /dead goes to a
# cluster where nothing listens, the rest to the origin. Listener "short": 300 ms header and
# idle timeouts, a 4 KiB header limit, health check path /hc.


@pytest.fixture(scope="module")
def ld(origin, tmp_path_factory: pytest.TempPathFactory):
    cfg = base_config(origin[1])
    cfg["clusters"].append({"name": "dead", "endpoints": [f"127.0.0.1:{refusing_port()}"]})
    cfg["listeners"][0]["routes"] = [
        {"prefix": "/hang", "cluster": "app", "timeout": "300ms"},
        {"prefix": "/dead", "cluster": "dead"},
        {"prefix": "/", "cluster": "app", "timeout": "30s"},
    ]
    cfg["listeners"].append({
        "name": "short", "address": "127.0.0.1:0",
        "request_headers_timeout": "300ms", "idle_timeout": "300ms",
        "max_request_headers_kb": 4, "health_check_path": "/hc",
        "routes": [{"prefix": "/", "cluster": "app"}],
    })
    proc = Lameduck(cfg, tmp_path_factory.mktemp("http1-errors")).start()
    try:
        yield proc
    finally:
        proc.kill()
    assert "Traceback" not in proc.log(), proc.log()


def short_port(ld: Lameduck) -> int:
    return ld.port_of("short")


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


def origin_requests(origin_port: int) -> int:
    """How many requests the origin has served (its /info counts itself too)."""
    return httpx.get(f"http://127.0.0.1:{origin_port}/info").json()["requests"]


def exchange(port: int, data: bytes, *, wait: float = 5.0) -> tuple[list, bool]:
    """Send raw bytes, read every response until the connection ends; returns the responses
    and whether the server closed the connection within ``wait`` seconds."""
    responses = []
    with raw_connect(port, timeout=wait) as sock, sock.makefile("rb") as f:
        sock.sendall(data)
        while True:
            try:
                responses.append(read_wire_response(f))
            except (EOFError, ConnectionResetError):
                return responses, True
            except TimeoutError:
                return responses, False


def reset_close(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer sees a TCP RST."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# -- upstream errors --------------------------------------------------------------------------


def test_connect_refused_503(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with httpx.Client(timeout=5) as c:
        for _ in range(2):
            r = c.get(ld.url("/dead"))
            assert r.status_code == 503
            assert r.text == "upstream connect error\n"
            assert "connection" not in r.headers  # the client connection is kept
    # a HEAD gets the status without a body, and the connection stays in sync
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"HEAD /dead HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_wire_response(f, head=True).status == 503
        sock.sendall(get("/"))
        assert read_wire_response(f).body == HELLO
    s = d.refresh()
    # never sent, each is retried on the only endpoint (num_retries: 2) before the 503
    assert s["cluster.dead.upstream_cx_connect_fail"] == 3 * 3
    assert s["cluster.dead.upstream_rq_retry"] == 3 * 2
    assert s["cluster.dead.upstream_cx_total"] == 0
    assert s["http.ingress.downstream_rq_5xx"] == 3
    assert s["http.ingress.downstream_cx_total"] == 2
    assert ld.stat("cluster.dead.upstream_rq_active") == 0


def test_connect_timeout_503(lameduck) -> None:
    """An upstream whose accept queue is full drops SYNs: the connect times out."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    fillers = []
    try:
        port = lsock.getsockname()[1]
        # Fill the accept queue (never accepted); later SYNs are dropped by the kernel.
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.1)
        probe = socket.socket()
        probe.settimeout(0.3)
        try:
            probe.connect(("127.0.0.1", port))
            pytest.skip("the kernel accepted a connection past the full backlog")
        except OSError:
            pass
        finally:
            probe.close()
        ld = lameduck(base_config(port, cluster={"connect_timeout": "250ms"}))
        t0 = time.monotonic()
        r = httpx.get(ld.url("/"), timeout=10)
        assert r.status_code == 503
        assert time.monotonic() - t0 < 5
        s = ld.stats()
        # the first try and its two retries (num_retries: 2) each time out
        assert s["cluster.app.upstream_cx_connect_timeout"] == 3
        assert s["cluster.app.upstream_cx_connect_fail"] == 3
        assert s["http.ingress.downstream_rq_5xx"] == 1
    finally:
        for s in fillers:
            s.close()
        lsock.close()


def test_upstream_reset_before_response_502(lameduck) -> None:
    ld = lameduck()  # its own: a fresh pool, so /reset goes out on a new connection
    with httpx.Client(timeout=5) as c:
        r = c.get(ld.url("/reset"))
        assert r.status_code == 502
        assert r.text == "upstream reset before response\n"
        assert c.get(ld.url("/")).content == HELLO  # the client connection survives
        # on a pooled connection a reset GET is retried once (it may have been stale), then
        # answered 502
        assert c.get(ld.url("/reset")).status_code == 502
    s = ld.stats()
    assert s["cluster.app.upstream_rq_rx_reset"] == 3
    assert s["cluster.app.upstream_rq_retry"] == 1
    assert s["http.ingress.downstream_rq_5xx"] == 2
    assert s["http.ingress.downstream_rq_2xx"] == 1
    assert s["cluster.app.upstream_rq_active"] == 0


def test_route_timeout_504(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    t0 = time.monotonic()
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/hang"))
        elapsed = time.monotonic() - t0
        assert r.status_code == 504
        assert r.text == "upstream request timeout\n"
        assert 0.25 < elapsed < 5
        assert c.get(ld.url("/sleep?ms=50")).status_code == 200  # other routes: 30 s
    s = d.refresh()
    assert s["cluster.app.upstream_rq_timeout"] == 1
    assert s["http.ingress.downstream_rq_5xx"] == 1
    assert ld.stat("cluster.app.upstream_rq_active") == 0


def test_partial_response_is_not_a_fake_success(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/partial?n=100000"))
        r = read_wire_response(f)
        assert r.status == 200
        assert r.header("content-length") == "200000"
        assert not r.complete
        assert len(r.body) <= 100_000
        assert wait_closed(sock, 3)
    # lameduck resets the connection (SO_LINGER 0): httpx sees a reset or a short body
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        httpx.get(ld.url("/partial?n=100000"))
    assert httpx.get(ld.url("/")).content == HELLO
    s = d.refresh()
    assert s["cluster.app.upstream_rq_rx_reset"] == 2
    assert s["http.ingress.downstream_cx_destroy_local_active_rq"] == 2
    assert s["http.ingress.downstream_cx_destroy_remote_active_rq"] == 0
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)


def scripted_upstream(reply: bytes, then_reset: bool) -> tuple[socket.socket, int]:
    """A one-shot origin: reads one request head, sends ``reply``, waits a moment, then closes
    with a RST (``then_reset``) or a FIN."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = lsock.accept()
            with conn:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                conn.sendall(reply)
                time.sleep(0.2)
                if then_reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    threading.Thread(target=serve, daemon=True).start()
    return lsock, lsock.getsockname()[1]


def test_close_delimited_cut_by_reset_is_not_a_clean_end(lameduck) -> None:
    """A FIN ends a close-delimited body; a reset cuts it. Re-chunked for the client, a cut
    body must lack its last chunk, not end cleanly."""
    lsock, port = scripted_upstream(b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 10_000, True)
    try:
        ld = lameduck(base_config(port))
        with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
            sock.sendall(get("/"))
            r = read_wire_response(f)
            assert r.status == 200
            assert r.framing == "chunked"
            assert not r.complete
        assert ld.stat("cluster.app.upstream_rq_rx_reset") == 1
    finally:
        lsock.close()


# -- timeouts ---------------------------------------------------------------------------------


def test_request_headers_timeout_408(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(short_port(ld)) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /sl")
        t0 = time.monotonic()
        r = read_wire_response(f)
        assert r.status == 408
        assert r.header("connection") == "close"
        assert 0.2 < time.monotonic() - t0 < 5
        assert wait_closed(sock, 3)
    # a head that trickles in but ends in time is fine
    with raw_connect(short_port(ld)) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.1)
        sock.sendall(b"Host: x\r\n\r\n")
        assert read_wire_response(f).status == 200
    s = d.refresh()
    assert s["http.short.downstream_rq_header_timeout"] == 1
    assert s["http.short.downstream_rq_4xx"] == 1
    assert s["http.short.downstream_rq_2xx"] == 1


def test_idle_keep_alive_timeout(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(short_port(ld)) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/"))
        assert read_wire_response(f).status == 200
        t0 = time.monotonic()
        assert wait_closed(sock, 5)
        assert 0.2 < time.monotonic() - t0 < 5
    # a connection that never sends a byte is idle too
    with raw_connect(short_port(ld)) as sock:
        assert wait_closed(sock, 5)
    # answered locally before its body came, and the body never comes: that is idle too
    with raw_connect(short_port(ld)) as sock, sock.makefile("rb") as f:
        sock.sendall(b"POST /hc HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        assert read_wire_response(f).status == 200
        assert wait_closed(sock, 5)
    # a request slower than the idle timeout is not cut by it
    r = httpx.get(f"http://127.0.0.1:{short_port(ld)}/sleep?ms=600", timeout=5)
    assert r.status_code == 200
    s = d.refresh()
    assert s["http.short.downstream_cx_idle_timeout"] >= 3
    assert wait_until(lambda: ld.stat("http.short.downstream_cx_active") == 0, 5)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /\r\n\r\n",  # HTTP/0.9
    b"GET / HTTP/1.1\nHost: x\n\n",
    b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
    b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET http://[::1 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n",  # obs-fold
], ids=["garbage", "version", "http09", "bare-lf", "space-name", "space-target", "bad-url",
        "no-host", "two-hosts", "obs-fold"])
def test_malformed_request_400_and_close(ld: Lameduck, data: bytes) -> None:
    d = StatsDelta(ld)
    responses, closed = exchange(ld.port, data)
    assert [r.status for r in responses] == [400]
    assert responses[0].header("connection") == "close"
    assert closed
    s = d.refresh()
    assert s["cluster.app.upstream_rq_total"] == 0
    assert s["http.ingress.downstream_rq_4xx"] == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)


def test_http2_request_line_505(ld: Lameduck) -> None:
    responses, closed = exchange(ld.port, b"GET / HTTP/2.0\r\nHost: x\r\n\r\n")
    assert [r.status for r in responses] == [505]
    assert closed


def test_headers_over_limit_431(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    port = short_port(ld)  # 4 KiB
    # one big header, and many small ones
    for extra in ("X-Big: " + "a" * 6000 + "\r\n",
                  "".join(f"X-{i}: {'b' * 40}\r\n" for i in range(200))):
        responses, closed = exchange(port, get("/", extra))
        assert [r.status for r in responses] == [431]
        assert responses[0].header("connection") == "close"
        assert closed
    # under the limit is fine
    r = httpx.get(f"http://127.0.0.1:{port}/", headers={"X-Ok": "c" * 3000})
    assert r.status_code == 200
    # a header that never ends is cut near the limit, not buffered without bound
    with raw_connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET / HTTP/1.1\r\nX-Endless: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(64):
                sock.sendall(b"d" * 65536)
        assert read_wire_response(f).status == 431
    s = d.refresh()
    assert s["http.short.downstream_rq_4xx"] == 3
    assert s["cluster.app.upstream_rq_total"] == 1


SMUGGLED = b"GET /status/299 HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("head", [
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 44\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 44\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
], ids=["cl-te", "te-cl", "two-cl", "cl-list", "te-not-last-chunked"])
def test_ambiguous_framing_400_no_smuggling(ld: Lameduck, origin_port: int,
                                            head: bytes) -> None:
    d = StatsDelta(ld)
    before = origin_requests(origin_port)
    # Read one way, the body is "0\r\n\r\n" and a second request follows; read the other way,
    # the second request is part of the body. Either way the origin must see neither.
    responses, closed = exchange(ld.port, head + b"0\r\n\r\n" + SMUGGLED)
    assert [r.status for r in responses] == [400]
    assert closed
    assert origin_requests(origin_port) == before + 1  # only the /info just made
    s = d.refresh()
    assert s["cluster.app.upstream_rq_total"] == 0
    assert s["http.ingress.downstream_rq_2xx"] == 0


@pytest.mark.parametrize("te", [b"gzip", b"gzip, chunked", b"deflate"])
def test_unknown_transfer_coding_501(ld: Lameduck, origin_port: int, te: bytes) -> None:
    d = StatsDelta(ld)
    before = origin_requests(origin_port)
    body = b"5\r\nhello\r\n0\r\n\r\n" if te.endswith(b"chunked") else b"hello"
    responses, closed = exchange(
        ld.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + te
        + b"\r\n\r\n" + body + SMUGGLED)
    assert [r.status for r in responses] == [501]
    assert responses[0].header("connection") == "close"
    assert closed
    assert origin_requests(origin_port) == before + 1
    s = d.refresh()
    assert s["http.ingress.downstream_rq_5xx"] == 1
    assert s["cluster.app.upstream_rq_total"] == 0


def test_split_transfer_encoding_fields_501(ld: Lameduck, origin_port: int) -> None:
    """Two Transfer-Encoding fields are one list (RFC 9110 §5.3): gzip, then chunked."""
    before = origin_requests(origin_port)
    responses, closed = exchange(
        ld.port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert [r.status for r in responses] == [501]
    assert closed
    assert origin_requests(origin_port) == before + 1


def test_bad_chunked_body_400(ld: Lameduck) -> None:
    """Broken chunk framing in a body being proxied: 400 if the upstream has not answered
    yet, and the upstream request is abandoned, not left waiting."""
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"POST /sleep?ms=300 HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        time.sleep(0.05)
        sock.sendall(b"zz\r\n")
        r = read_wire_response(f)
        assert r.status == 400
        assert r.header("connection") == "close"
        assert wait_closed(sock, 3)
    s = d.refresh()
    assert s["http.ingress.downstream_rq_4xx"] == 1
    assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 0, 2)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)


def test_bad_request_pipelined_behind_good_one(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    responses, closed = exchange(ld.port, get("/sleep?ms=200") + b"GARBAGE\r\n\r\n" + get("/"))
    assert [r.status for r in responses] == [200, 400]
    assert responses[0].body == b"slept 200 ms\n"
    assert responses[1].header("connection") == "close"
    assert closed
    # the same with the bad one in a second packet, while the first is in flight
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/sleep?ms=200"))
        time.sleep(0.05)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: x\r\n\r\n")
        assert read_wire_response(f).body == b"slept 200 ms\n"
        assert read_wire_response(f).status == 400
        assert wait_closed(sock, 3)
    s = d.refresh()
    assert s["cluster.app.upstream_rq_total"] == 2
    assert s["http.ingress.downstream_rq_4xx"] == 2
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)


def test_connect_method_403(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    responses, closed = exchange(
        ld.port, b"CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n"
        b"\x16\x03\x01 not http")
    assert [r.status for r in responses] == [403]
    assert closed
    # CONNECT pipelined behind a good request; what follows it is not read
    responses, closed = exchange(
        ld.port, get("/") + b"CONNECT example.test:443 HTTP/1.1\r\nHost: e\r\n\r\n" + get("/"))
    assert [r.status for r in responses] == [200, 403]
    assert closed
    s = d.refresh()
    assert s["http.ingress.downstream_rq_4xx"] == 2
    assert s["cluster.app.upstream_rq_total"] == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)


def test_non_websocket_upgrade_is_served_as_plain_http(ld: Lameduck) -> None:
    """Only WebSocket is relayed (tests/integration/test_websocket.py): another Upgrade (h2c
    here) is stripped and the request answered plainly; the connection stays usable."""
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/headers", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                         "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n") + get("/"))
        r = read_wire_response(f)
        assert r.status == 200
        assert b"upgrade" not in r.body.lower()
        assert read_wire_response(f).body == HELLO


# -- clients that go away ---------------------------------------------------------------------


def test_client_gone_mid_request_body(ld: Lameduck) -> None:
    for rst in (False, True):
        sock = raw_connect(ld.port)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
                     + b"a" * 100_000)
        time.sleep(0.1)
        if rst:
            reset_close(sock)
        else:
            sock.close()
        assert httpx.get(ld.url("/")).status_code == 200
    # a chunked upload cut off too
    sock = raw_connect(ld.port)
    sock.sendall(b"PUT /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"10000\r\n" + b"b" * 30000)
    time.sleep(0.1)
    sock.close()
    assert httpx.get(ld.url("/")).status_code == 200
    # nothing is left waiting for the bodies that will never come
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 2)
    assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 0, 2)
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0, 2)


def test_client_gone_mid_response(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    for rst in (False, True):
        sock = raw_connect(ld.port)
        sock.sendall(get("/bytes?n=50000000"))
        got = 0
        while got < 200_000:
            got += len(sock.recv(65536))
        if rst:
            reset_close(sock)
        else:
            sock.close()  # unread data: the kernel resets too
        assert httpx.get(ld.url("/")).status_code == 200
    # gone while the answer is still awaited: its late answer meets a closed client
    sock = raw_connect(ld.port)
    sock.sendall(get("/sleep?ms=300"))
    time.sleep(0.05)
    sock.close()
    assert httpx.get(ld.url("/")).status_code == 200
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 3)
    assert wait_until(lambda: ld.stat("cluster.app.upstream_rq_active") == 0, 3)
    assert d.refresh()["http.ingress.downstream_cx_destroy_remote_active_rq"] >= 2
    assert httpx.get(ld.url("/")).status_code == 200


@pytest.mark.parametrize("chunks", [[b"PRI * HTTP/2.0\r\n\r\nXY\r\n\r\n"],
                                    [b"PRI * HT", b"TP/2.0\r\n\r\nS", b"X\r\n\r\n"]],
                         ids=["one-read", "split"])
def test_almost_http2_preface_is_http1_400(ld: Lameduck, chunks: list[bytes]) -> None:
    """Only the exact HTTP/2 preface switches codecs (tests/integration/test_http2.py); bytes
    that merely start like it are read as HTTP/1: llhttp rejects "PRI * HTTP/2.0" (a 400)."""
    with raw_connect(ld.port, timeout=5) as sock, sock.makefile("rb") as f:
        for piece in chunks:
            sock.sendall(piece)
            time.sleep(0.05)  # separate reads
        assert read_wire_response(f).status == 400
        assert f.read() == b""  # then closed
