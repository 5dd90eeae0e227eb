"""The HTTP/1.1 data plane, proxying: a real lameduck in front of the real demo origin, checked
with httpx, curl and raw sockets (raw wherever the framing on the wire is the point).

Covers bodies both ways (Content-Length, chunked, close-delimited) with flow control, HEAD,
1xx, pipelining, hop-by-hop headers, X-Forwarded-*, keep-alive on both sides, routing, the
health-check path, and the stale pooled connection retried once.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import (
    Lameduck,
    StatsDelta,
    base_config,
    listening_socket,
    raw_connect,
    read_wire_response,
    rss_kb,
    start_origin,
    start_origin_on,
    stop,
    wait_closed,
    wait_until,
)

HELLO = b"hello from the lameduck demo origin\n"
PATTERN = bytes(range(251))


def pattern(n: int) -> bytes:
    return (PATTERN * (n // 251 + 1))[:n]


def pattern_sha256(n: int) -> str:
    """The digest of the origin's /bytes?n= body, computed piecewise (no n-byte buffer)."""
    h = hashlib.sha256()
    piece = PATTERN * 261  # a whole number of periods, as the origin writes them
    left = n
    while left >= len(piece):
        h.update(piece)
        left -= len(piece)
    h.update(piece[:left])
    return h.hexdigest()


def get(path: str, host: str = "x", version: str = "1.1", extra: str = "") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: {host}\r\n{extra}\r\n".encode()


def origin_headers(resp: httpx.Response) -> dict[str, list[str]]:
    """What the origin's /headers saw: name -> values, in order."""
    seen: dict[str, list[str]] = {}
    for name, value in resp.json()["headers"]:
        seen.setdefault(name, []).append(value)
    return seen


# One lameduck serves most tests here (a process start costs most of a second); each test
# reads its stats as deltas. Listener "ingress" routes by Host and prefix to the module's
# origin ("app"), a second origin ("other"), and Host-routed clusters of their own on the same
# origin for exact pool counts ("solo": pooled connections never expire; "brief": they expire
# after 300 ms idle); listener "narrow" routes only /only.


@pytest.fixture(scope="module")
def other_origin():
    proc, port = start_origin()
    try:
        yield port
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def ld(origin, other_origin: int, tmp_path_factory: pytest.TempPathFactory):
    origin_port = origin[1]
    cfg = base_config(origin_port)
    cfg["clusters"] += [
        {"name": "other", "endpoints": [f"127.0.0.1:{other_origin}"]},
        {"name": "solo", "endpoints": [f"127.0.0.1:{origin_port}"], "idle_timeout": "0s"},
        {"name": "brief", "endpoints": [f"127.0.0.1:{origin_port}"], "idle_timeout": "300ms"},
    ]
    cfg["listeners"][0]["routes"] = [
        {"prefix": "/", "host": "other.test", "cluster": "other"},
        {"prefix": "/", "host": "solo.test", "cluster": "solo"},
        {"prefix": "/", "host": "brief.test", "cluster": "brief"},
        {"prefix": "/status/29", "cluster": "other"},
        {"prefix": "/", "cluster": "app"},
    ]
    cfg["listeners"].append({
        "name": "narrow", "address": "127.0.0.1:0",
        "health_check_path": "/hc", "routes": [{"prefix": "/only", "cluster": "app"}],
    })
    proc = Lameduck(cfg, tmp_path_factory.mktemp("http1-proxy")).start()
    try:
        yield proc
    finally:
        proc.kill()
    assert "Traceback" not in proc.log(), proc.log()


def port_of(ld: Lameduck, listener: str) -> int:
    return ld.port_of(listener)


# -- GET / HEAD -------------------------------------------------------------------------------


def test_get_and_head_keep_alive(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        r = read_wire_response(f, head=True)
        assert r.status == 200
        assert r.header("content-length") == str(len(HELLO))
        # A HEAD of a large body: no body bytes may follow, and the pooled upstream
        # connection must not wait for them either.
        sock.sendall(b"HEAD /bytes?n=123456 HTTP/1.1\r\nHost: x\r\n\r\n")
        r = read_wire_response(f, head=True)
        assert r.status == 200
        assert r.header("content-length") == "123456"
        # Any stray body byte would be read as the next status line.
        sock.sendall(get("/status/201"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (201, b"status 201\n")
        sock.sendall(get("/"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, HELLO)
        assert r.header("connection") is None
    with httpx.Client(timeout=5) as c:
        assert c.head(ld.url("/")).status_code == 200
        assert c.get(ld.url("/")).content == HELLO
    s = d.refresh()
    assert s["http.ingress.downstream_cx_total"] == 2
    assert s["http.ingress.downstream_rq_2xx"] == 6
    assert s["cluster.app.upstream_rq_2xx"] == 6
    assert s["cluster.app.upstream_cx_total"] <= 1  # one pooled connection served all six
    assert s["cluster.app.upstream_rq_rx_reset"] == 0


# -- request bodies ---------------------------------------------------------------------------


def test_post_echo_content_length_5mb(ld: Lameduck) -> None:
    body = os.urandom(5 * 1024 * 1024)
    r = httpx.post(ld.url("/echo"), content=body, timeout=20)
    assert r.status_code == 200
    assert r.headers["content-length"] == str(len(body))
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(body).digest()


def test_post_echo_chunked_httpx_generator(ld: Lameduck) -> None:
    parts = [os.urandom(n) for n in (1, 1000, 300_000, 70_000, 5)]
    r = httpx.post(ld.url("/echo"), content=iter(parts), timeout=20)
    assert r.status_code == 200
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.content == b"".join(parts)


def test_post_echo_chunked_curl(ld: Lameduck, tmp_path: Path) -> None:
    data = os.urandom(2 * 1024 * 1024 + 17)
    src = tmp_path / "body.bin"
    src.write_bytes(data)
    out = tmp_path / "echo.bin"
    p = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-o", str(out), "-w", "%{http_code}",
         "-H", "Transfer-Encoding: chunked", "-H", "Expect:",
         "--data-binary", f"@{src}", ld.url("/echo")],
        capture_output=True, text=True, timeout=30,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == "200"
    assert hashlib.sha256(out.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_expect_100_continue(ld: Lameduck, tmp_path: Path) -> None:
    d = StatsDelta(ld)
    data = os.urandom(300_000)
    src = tmp_path / "body.bin"
    src.write_bytes(data)
    out = tmp_path / "echo.bin"
    # A long expect timeout: if the 100 were not relayed, curl would hold the body back for
    # 10 s, and its trace would lack the 100 line.
    p = subprocess.run(
        ["curl", "-sS", "-v", "--max-time", "20", "--expect100-timeout", "10",
         "-o", str(out), "-H", "Expect: 100-continue", "--data-binary", f"@{src}",
         ld.url("/echo")],
        capture_output=True, text=True, timeout=30,
    )
    assert p.returncode == 0, p.stderr
    assert "< HTTP/1.1 100 Continue" in p.stderr
    assert "< HTTP/1.1 200 OK" in p.stderr
    assert out.read_bytes() == data
    # On a raw socket: the 100 arrives before any body byte is sent, then the final answer.
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"POST /continue HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        r = read_wire_response(f)
        assert r.status == 100
        sock.sendall(b"hello")
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, b"received 5 bytes\n")
    s = d.refresh()
    assert s["http.ingress.downstream_rq_5xx"] == 0
    assert s["http.ingress.downstream_rq_2xx"] == 2


# -- response bodies --------------------------------------------------------------------------


def test_large_download_integrity_and_bounded_memory(ld: Lameduck) -> None:
    n = 50_000_000
    before = rss_kb(ld.pid)
    peak = before
    h = hashlib.sha256()
    got = 0
    with httpx.Client(timeout=30) as c, c.stream("GET", ld.url(f"/bytes?n={n}")) as r:
        assert r.status_code == 200
        assert r.headers["content-length"] == str(n)
        it = r.iter_raw(65536)
        for data in it:
            h.update(data)
            got += len(data)
            if got >= 1_000_000:
                break
        # A slow reader: without flow control the proxy would now take in the whole body.
        time.sleep(1.0)
        peak = max(peak, rss_kb(ld.pid))
        next_check = got + (4 << 20)
        for data in it:
            h.update(data)
            got += len(data)
            if got >= next_check:
                peak = max(peak, rss_kb(ld.pid))
                next_check += 4 << 20
    peak = max(peak, rss_kb(ld.pid))
    assert got == n
    assert h.hexdigest() == pattern_sha256(n)
    growth_mb = (peak - before) / 1024
    assert growth_mb < 25, f"lameduck RSS grew {growth_mb:.1f} MB for a {n / 1e6:.0f} MB body"


def test_slow_reader_then_reuse(ld: Lameduck) -> None:
    """A slow reader makes the proxy pause reading the upstream connection. When the response
    ends during such a pause, the connection goes back to the pool: it must not stay paused
    (the next request on it would never be read) and the pause must not carry over."""
    d = StatsDelta(ld)
    n = 2_000_000
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", ld.port))
    with sock, sock.makefile("rb") as f:
        for _ in range(3):
            sock.sendall(get(f"/bytes?n={n}"))
            status = f.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            while f.readline() != b"\r\n":
                pass
            got = 0
            while got < n:
                data = f.read1(min(16384, n - got))
                assert data
                got += len(data)
                time.sleep(0.001)
            sock.sendall(get("/"))
            r = read_wire_response(f)
            assert (r.status, r.body) == (200, HELLO)
    s = d.refresh()
    assert s["cluster.app.upstream_rq_timeout"] == 0
    assert s["http.ingress.downstream_rq_2xx"] == 6


def test_stream_relayed_as_chunks(ld: Lameduck) -> None:
    with raw_connect(ld.port, timeout=10) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/stream?chunks=5&size=100&interval_ms=200"))
        status = f.readline()
        assert status.startswith(b"HTTP/1.1 200")
        headers = []
        while (line := f.readline()) != b"\r\n":
            headers.append(line.lower())
        assert b"transfer-encoding: chunked\r\n" in headers
        assert not any(h.startswith(b"content-length") for h in headers)
        arrivals = []
        while True:
            size = int(f.readline().split(b";")[0], 16)
            if size == 0:
                assert f.readline() == b"\r\n"
                break
            assert f.read(size) == b"x" * size
            assert f.read(2) == b"\r\n"
            arrivals.append(time.monotonic())
        # Each chunk goes out when the origin sends it, not when the body is complete.
        assert len(arrivals) == 5
        assert arrivals[-1] - arrivals[0] > 0.4
        # and the connection is still good
        sock.sendall(get("/"))
        assert read_wire_response(f).body == HELLO


def test_close_delimited_rechunked_for_http11(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/close-delimited?n=300000"))
        r = read_wire_response(f)
        assert r.status == 200
        assert r.framing == "chunked"
        assert r.complete
        assert r.body == pattern(300_000)
        assert r.header("connection") is None
        # The client connection outlives the upstream one that delimited the body.
        sock.sendall(get("/"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, HELLO)
    s = d.refresh()
    assert s["cluster.app.upstream_rq_rx_reset"] == 0
    assert s["http.ingress.downstream_cx_total"] == 1


def test_close_delimited_for_http10(ld: Lameduck) -> None:
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/close-delimited?n=200000", version="1.0",
                         extra="Connection: keep-alive\r\n"))
        r = read_wire_response(f)
        assert r.status == 200
        assert r.framing == "close"  # no chunked coding for an HTTP/1.0 client
        assert r.header("connection") == "close"
        assert r.body == pattern(200_000)
    # A chunked upstream body goes to an HTTP/1.0 client close-delimited too.
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/stream?chunks=3&size=10&interval_ms=0", version="1.0"))
        r = read_wire_response(f)
        assert r.status == 200
        assert r.framing == "close"
        assert r.body == b"x" * 30


def test_http10_without_keep_alive_gets_close(ld: Lameduck) -> None:
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, HELLO)
        assert r.header("connection") == "close"
        assert wait_closed(sock, 3)
    # HTTP/1.0 asking for keep-alive: kept, and said so.
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        for _ in range(2):
            sock.sendall(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            r = read_wire_response(f)
            assert (r.status, r.body) == (200, HELLO)
            assert r.header("connection") == "keep-alive"
    # HTTP/1.1 asking for close
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/", extra="Connection: close\r\n"))
        r = read_wire_response(f)
        assert r.header("connection") == "close"
        assert wait_closed(sock, 3)


# -- pipelining -------------------------------------------------------------------------------


def test_pipelined_requests_answered_in_order(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        # The slow one first: the later, faster answers must wait their turn.
        sock.sendall(
            get("/sleep?ms=200")
            + get("/status/201")
            + b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        )
        r1, r2, r3 = (read_wire_response(f) for _ in range(3))
        assert (r1.status, r1.body) == (200, b"slept 200 ms\n")
        assert (r2.status, r2.body) == (201, b"status 201\n")
        assert (r3.status, r3.body) == (200, b"hello")
        sock.sendall(get("/"))
        assert read_wire_response(f).body == HELLO
    s = d.refresh()
    assert s["http.ingress.downstream_rq_total"] == 4
    assert s["http.ingress.downstream_cx_total"] == 1


def test_pipelined_behind_connection_close_not_answered(ld: Lameduck) -> None:
    """A request pipelined behind one that closes the connection is dropped: not answered,
    not sent upstream, and not left counted as in flight."""
    d = StatsDelta(ld)
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/sleep?ms=100", extra="Connection: close\r\n") + get("/status/202"))
        r = read_wire_response(f)
        assert (r.status, r.header("connection")) == (200, "close")
        assert f.read() == b""
    assert d.refresh()["cluster.app.upstream_rq_total"] == 1
    assert wait_until(lambda: ld.stat("http.ingress.downstream_rq_active") == 0, 1)


# -- headers ----------------------------------------------------------------------------------


def test_hop_by_hop_request_headers_removed(ld: Lameduck) -> None:
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"GET /headers HTTP/1.1\r\nHost: example\r\n"
            b"Connection: foo, keep-alive\r\nFoo: bar\r\nKeep-Alive: timeout=5\r\n"
            b"TE: trailers\r\nProxy-Connection: keep-alive\r\nTrailer: X-Sum\r\n"
            b"Connection: Bar\r\nBar: baz\r\nX-Kept: yes\r\n\r\n"
        )
        r = read_wire_response(f)
        assert r.status == 200
    fields = json.loads(r.body)["headers"]
    seen = {n for n, _ in fields}
    for name in ("foo", "bar", "keep-alive", "proxy-connection", "transfer-encoding",
                 "upgrade"):
        assert name not in seen, name
    # TE: trailers is re-stated for this hop (lameduck carries trailers back), so the only
    # Connection option upstream is te; Trailer is end to end (RFC 9110 §6.6.2).
    assert [v for n, v in fields if n == "connection"] == ["te"]
    assert [v for n, v in fields if n == "te"] == ["trailers"]
    assert {"x-kept", "host", "trailer"} <= seen


def test_hop_by_hop_response_headers_removed(ld: Lameduck) -> None:
    # The origin's /close answers "Connection: close": that is about the upstream connection;
    # the client's keep-alive connection is not closed by it.
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/close"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, b"closing\n")
        assert r.header("connection") is None
        sock.sendall(get("/"))
        assert read_wire_response(f).body == HELLO


def test_x_forwarded_for_appended_and_proto_set(ld: Lameduck) -> None:
    r = httpx.get(ld.url("/headers"), headers=[
        ("X-Forwarded-For", "203.0.113.7"), ("X-Forwarded-For", "198.51.100.2"),
        ("X-Forwarded-Proto", "https"),
    ])
    seen = origin_headers(r)
    assert seen["x-forwarded-for"] == ["203.0.113.7, 198.51.100.2, 127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]
    seen = origin_headers(httpx.get(ld.url("/headers")))
    assert seen["x-forwarded-for"] == ["127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]


def test_absolute_form_target(ld: Lameduck) -> None:
    with raw_connect(ld.port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET http://example.test/headers?a=1 HTTP/1.1\r\n"
                     b"Host: example.test\r\n\r\n")
        r = read_wire_response(f)
        assert r.status == 200
        doc = json.loads(r.body)
        assert (doc["path"], doc["query"]) == ("/headers", "a=1")


# -- keep-alive and the pool ------------------------------------------------------------------


def test_keep_alive_reuse_downstream_and_upstream(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with httpx.Client(timeout=5) as c:
        for i in range(200):
            r = c.get(ld.url("/") if i % 2 else ld.url("/status/204"))
            assert r.status_code == (200 if i % 2 else 204)
    s = d.refresh()
    assert s["http.ingress.downstream_cx_total"] == 1
    assert s["http.ingress.downstream_rq_total"] == 200
    assert s["cluster.app.upstream_rq_total"] == 200
    assert s["cluster.app.upstream_cx_total"] <= 2
    assert ld.stat("cluster.app.upstream_rq_active") == 0


def test_upstream_close_not_reused(ld: Lameduck) -> None:
    """/close ends the upstream connection after its response: the pool must not hand it out
    again (that would cost a retry or a 502). Cluster "solo" is this test's own pool."""
    d = StatsDelta(ld)
    with httpx.Client(timeout=5, headers={"Host": "solo.test"}) as c:
        for _ in range(5):
            assert c.get(ld.url("/close")).status_code == 200
            assert c.get(ld.url("/")).content == HELLO
    s = d.refresh()
    # every /close ends the connection it used, so each / after it needs a new one
    assert s["cluster.solo.upstream_cx_total"] == 6
    assert s["cluster.solo.upstream_rq_total"] == 10
    assert s["cluster.solo.upstream_rq_retry"] == 0
    assert s["cluster.solo.upstream_rq_rx_reset"] == 0
    assert s["http.ingress.downstream_rq_5xx"] == 0


def test_pool_idle_timeout(ld: Lameduck) -> None:
    """Pooled upstream connections expire after the cluster's idle_timeout; 0 keeps them."""
    d = StatsDelta(ld)
    with httpx.Client(timeout=5) as c:
        for host in ("solo.test", "brief.test"):
            assert c.get(ld.url("/"), headers={"Host": host}).content == HELLO
        assert ld.stat("cluster.brief.upstream_cx_active") == 1
        # the pool is swept once a second
        assert wait_until(lambda: ld.stat("cluster.brief.upstream_cx_active") == 0, 3)
        time.sleep(0.3)
        for host in ("solo.test", "brief.test"):
            assert c.get(ld.url("/"), headers={"Host": host}).content == HELLO
    s = d.refresh()
    assert s["cluster.brief.upstream_cx_idle_timeout"] == 1
    assert s["cluster.brief.upstream_cx_total"] == 2
    assert s["cluster.solo.upstream_cx_total"] <= 1  # kept through the sweeps
    assert s["cluster.solo.upstream_cx_idle_timeout"] == 0


# -- routes -----------------------------------------------------------------------------------


def test_routes_by_prefix_and_host(ld: Lameduck, origin_port: int, other_origin: int) -> None:
    d = StatsDelta(ld)

    def origin_of(path: str, host: str | None = None) -> int:
        headers = {"Host": host} if host else {}
        r = httpx.get(ld.url(path), headers=headers)
        return int(r.headers["x-origin-port"])

    assert origin_of("/") == origin_port
    assert origin_of("/status/299") == other_origin
    assert origin_of("/status/500") == origin_port
    assert origin_of("/", "other.test") == other_origin
    assert origin_of("/", "OTHER.test:8080") == other_origin
    assert origin_of("/", "another.test") == origin_port
    s = d.refresh()
    assert s["cluster.other.upstream_rq_total"] == 3
    assert s["cluster.app.upstream_rq_total"] == 3


def test_no_route_404_and_health_check(ld: Lameduck) -> None:
    d = StatsDelta(ld)
    with raw_connect(port_of(ld, "narrow")) as sock, sock.makefile("rb") as f:
        sock.sendall(get("/"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (404, b"no route\n")
        # a local answer keeps the connection
        sock.sendall(get("/hc"))
        r = read_wire_response(f)
        assert (r.status, r.body) == (200, b"OK\n")
        sock.sendall(b"HEAD /hc HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_wire_response(f, head=True).status == 200
        # a body sent with a request answered locally is read and dropped, in sync
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        assert read_wire_response(f).status == 404
        sock.sendall(get("/only/nothing"))
        assert read_wire_response(f).status == 404  # the origin's 404, proxied
    # A client waiting for "100 Continue" will not send its body after a local answer: the
    # answer closes the connection instead of waiting for a body that never comes.
    with raw_connect(port_of(ld, "narrow")) as sock, sock.makefile("rb") as f:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        r = read_wire_response(f)
        assert (r.status, r.header("connection")) == (404, "close")
        assert wait_closed(sock, 3)
    r = httpx.get(ld.url("/health_check.html"))
    assert (r.status_code, r.text) == (200, "OK\n")
    s = d.refresh()
    assert s["cluster.app.upstream_rq_total"] == 1  # only /only/nothing went upstream
    assert s["http.narrow.downstream_rq_4xx"] == 4
    assert s["http.narrow.downstream_rq_2xx"] == 2
    assert s["http.narrow.downstream_cx_total"] == 2
    assert s["http.ingress.downstream_rq_2xx"] == 1


# -- stale pooled connections -----------------------------------------------------------------


def test_origin_restart_between_requests(lameduck) -> None:
    sock = listening_socket()  # the origin's port, held here across its restart
    proc = start_origin_on(sock)
    try:
        ld = lameduck(base_config(sock.getsockname()[1]))
        with httpx.Client(timeout=5) as c:
            assert c.get(ld.url("/")).content == HELLO
            stop(proc)  # the pooled upstream connection dies with it
            proc = start_origin_on(sock)
            for _ in range(3):
                r = c.get(ld.url("/"))
                assert (r.status_code, r.content) == (200, HELLO)
        s = ld.stats()
        assert s["http.ingress.downstream_rq_5xx"] == 0
        assert s["cluster.app.upstream_cx_total"] == 2
    finally:
        stop(proc)
        sock.close()


class StaleUpstream:
    """A scripted origin. Its first connection answers one request with keep-alive, then
    closes (FIN, or RST with ``reset``) when the next request arrives, without answering: a
    pooled connection the upstream closed just as it was reused. Later connections answer
    every request."""

    def __init__(self, reset: bool) -> None:
        self.reset = reset
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self.connections = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.serve, args=(conn, self.connections == 1),
                             daemon=True).start()

    def serve(self, conn: socket.socket, stale: bool) -> None:
        with conn:
            buf = b""
            answered = 0
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    lines = head.split(b"\r\n")
                    length = 0
                    for line in lines[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    while len(buf) < length:
                        more = conn.recv(65536)
                        if not more:
                            return
                        buf += more
                    body, buf = buf[:length], buf[length:]
                    self.requests.append(lines[0] + (b" " + body if body else b""))
                    if stale and answered == 1:
                        if self.reset:
                            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                            struct.pack("ii", 1, 0))
                        return
                    answered += 1
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_stale_pooled_connection_retried_once(lameduck, reset: bool) -> None:
    up = StaleUpstream(reset)
    try:
        ld = lameduck(base_config(up.port))
        with httpx.Client(timeout=5) as c:
            assert c.get(ld.url("/a")).content == b"ok\n"
            r = c.get(ld.url("/b"))  # reuses the pooled connection, which dies unanswered
            assert (r.status_code, r.content) == (200, b"ok\n")
            assert c.get(ld.url("/c")).content == b"ok\n"  # the fresh one is pooled
        assert up.requests == [b"GET /a HTTP/1.1", b"GET /b HTTP/1.1", b"GET /b HTTP/1.1",
                               b"GET /c HTTP/1.1"]
        s = ld.stats()
        assert s["cluster.app.upstream_rq_retry"] == 1
        assert s["cluster.app.upstream_cx_total"] == 2
        assert s["http.ingress.downstream_rq_5xx"] == 0
    finally:
        up.close()


def test_stale_pooled_connection_post(lameduck) -> None:
    """A POST may have been processed: it is not replayed and the client gets a 502 — unless
    it carries an Idempotency-Key, which makes the replay (body included) safe."""
    up = StaleUpstream(reset=False)
    try:
        ld = lameduck(base_config(up.port))
        with httpx.Client(timeout=5) as c:
            assert c.get(ld.url("/a")).content == b"ok\n"
            assert c.post(ld.url("/b"), content=b"data").status_code == 502
            # the upstream's second connection answers everything
            assert c.get(ld.url("/c")).content == b"ok\n"
            assert c.get(ld.url("/d")).content == b"ok\n"
        assert ld.stat("cluster.app.upstream_rq_retry") == 0
        assert ld.stat("http.ingress.downstream_rq_5xx") == 1
    finally:
        up.close()
    up = StaleUpstream(reset=False)
    try:
        ld = lameduck(base_config(up.port))
        with httpx.Client(timeout=5) as c:
            assert c.get(ld.url("/a")).content == b"ok\n"
            r = c.post(ld.url("/b"), content=b"data", headers={"Idempotency-Key": "k1"})
            assert (r.status_code, r.content) == (200, b"ok\n")
        assert up.requests == [b"GET /a HTTP/1.1", b"POST /b HTTP/1.1 data",
                               b"POST /b HTTP/1.1 data"]
        assert ld.stat("cluster.app.upstream_rq_retry") == 1
    finally:
        up.close()
