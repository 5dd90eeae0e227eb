"""HTTP/2 downstream over real sockets: curl (h2c prior knowledge, and TLS with ALPN), httpx
with http2, and a raw-frame client that checks the two-phase GOAWAY on the wire."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import socket
import ssl
import subprocess
import time

import httpx
import pytest

from tests.h2pool import H2Pool, Retry
from tests.h2raw import PREFACE, RawH2
from tests.procs import wait_until

MAX_ID = 2**31 - 1
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM = 0, 1, 7


def _curl(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", "--max-time", str(timeout), *args],
                          capture_output=True, timeout=timeout + 5)


def _pattern(n: int) -> bytes:
    period = bytes(range(251))
    return (period * (n // 251 + 1))[:n]


def test_curl_prior_knowledge_get(lameduck):
    ld = lameduck()
    r = _curl("--http2-prior-knowledge", "-w", "\n%{http_version} %{http_code}", ld.url("/"))
    assert r.returncode == 0, r.stderr
    body, _, meta = r.stdout.rpartition(b"\n")
    assert meta == b"2 200"
    assert body == b"hello from the lameduck demo origin\n"
    stats = ld.stats()
    assert stats["http.ingress.downstream_rq_http2_total"] == 1
    assert stats["http.ingress.downstream_cx_http2_total"] == 1
    assert stats["http.ingress.downstream_rq_2xx"] == 1


def test_curl_prior_knowledge_large_streamed_body(lameduck):
    ld = lameduck()
    n = 6 * 1024 * 1024 + 7
    r = _curl("--http2-prior-knowledge", ld.url(f"/bytes?n={n}"))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == n
    assert hashlib.sha256(r.stdout).digest() == hashlib.sha256(_pattern(n)).digest()


def test_request_body_both_ways(lameduck):
    ld = lameduck()
    body = _pattern(3 * 1024 * 1024 + 11)
    with httpx.Client(http1=False, http2=True, timeout=20) as c:
        r = c.post(ld.url("/echo"), content=body)  # content-length known
        assert r.http_version == "HTTP/2"
        assert r.status_code == 200
        assert r.content == body

        def gen():
            for i in range(0, len(body), 100_000):
                yield body[i : i + 100_000]

        r = c.post(ld.url("/echo"), content=gen())  # no length: chunked upstream
        assert r.status_code == 200
        assert r.content == body


def test_headers_forwarded_and_cookies_joined(lameduck):
    ld = lameduck()
    with httpx.Client(http1=False, http2=True, timeout=10) as c:
        r = c.get(ld.url("/headers?x=1"), headers=[("cookie", "a=1"), ("cookie", "b=2"),
                                                    ("x-custom", "yes")])
    doc = r.json()
    assert doc["path"] == "/headers"
    assert doc["query"] == "x=1"
    assert doc["http_version"] == "1.1"
    headers = dict(doc["headers"])
    assert headers["cookie"] == "a=1; b=2"
    assert headers["x-custom"] == "yes"
    assert headers["host"] == ld.addr
    assert headers["x-forwarded-proto"] == "http"


def test_many_concurrent_streams_one_connection(lameduck):
    ld = lameduck()

    async def run() -> list[int]:
        async with httpx.AsyncClient(http1=False, http2=True, timeout=20) as c:
            rs = await asyncio.gather(*(c.get(ld.url(f"/sleep?ms={i % 7 * 10}"))
                                        for i in range(60)))
            return [r.status_code for r in rs]

    assert asyncio.run(run()) == [200] * 60
    assert ld.stat("http.ingress.downstream_cx_http2_total") == 1


def test_local_answers_and_errors(lameduck):
    ld = lameduck(cluster={"endpoints": ["127.0.0.1:1"]}, listener={
        "routes": [{"prefix": "/app", "cluster": "app"}]})
    with httpx.Client(http1=False, http2=True, timeout=10) as c:
        assert c.get(ld.url("/health_check.html")).status_code == 200
        assert c.get(ld.url("/nope")).status_code == 404
        r = c.get(ld.url("/app"))
        assert r.status_code == 503  # connect refused, on the first try and both retries
    assert ld.stat("cluster.app.upstream_cx_connect_fail") == 3
    assert ld.stat("cluster.app.upstream_rq_retry") == 2


def test_protocol_error_gets_goaway_and_process_lives(lameduck):
    ld = lameduck()
    c = RawH2(ld.port)
    c.send(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00")  # WINDOW_UPDATE of 0 on 0
    assert c.wait(lambda: bool(c.goaways))
    assert c.goaways[-1][1] == PROTOCOL_ERROR
    assert c.wait(lambda: c.eof, 5)
    c.close()
    r = _curl("--http2-prior-knowledge", ld.url("/"))
    assert r.returncode == 0 and r.stdout.startswith(b"hello")
    assert ld.stat("http.ingress.downstream_cx_protocol_error") == 1


def test_two_phase_goaway_on_the_wire(lameduck):
    """GOAWAY(2^31-1) at the draining response, the final GOAWAY G later, a stream opened
    above it refused with REFUSED_STREAM, the in-flight stream completing, then the close."""
    grace = 0.4
    ld = lameduck(drain={"time": "5s", "strategy": "immediate",
                         "connection_grace": f"{int(grace * 1000)}ms"},
                  shutdown={"deadline": "10s"})
    c = RawH2(ld.port)
    c.request(1, "/sleep?ms=1500")
    time.sleep(0.1)
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    c.request(3, "/")
    assert c.wait(lambda: c.done(3) and bool(c.goaways))
    t_first = time.monotonic()
    assert c.streams[3].status == 200
    assert c.goaways[0] == (MAX_ID, NO_ERROR)
    assert c.wait(lambda: len(c.goaways) >= 2, 5)
    waited = time.monotonic() - t_first
    assert c.goaways[1] == (3, NO_ERROR)
    assert waited >= grace * 0.8, waited
    c.request(5, "/")
    assert c.wait(lambda: c.done(5))
    assert c.streams[5].reset == REFUSED_STREAM
    assert c.streams[5].status is None
    assert c.wait(lambda: c.done(1), 5)
    assert c.streams[1].status == 200 and c.streams[1].reset is None
    assert c.wait(lambda: c.eof, 5), "connection not closed after its last stream"
    c.close()
    assert ld.stat("http.ingress.http2.goaway_sent") == 2
    assert ld.stat("http.ingress.downstream_cx_drain_close") == 1


def test_proactive_drain_sends_goaway_to_idle_connection(lameduck):
    ld = lameduck(drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "5s"})
    c = RawH2(ld.port)
    c.request(1, "/")
    assert c.wait(lambda: c.done(1))
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    # moment in [1.0, 1.3) s, final GOAWAY 200 ms later, then the idle connection closes
    assert c.wait(lambda: len(c.goaways) >= 2, 4)
    assert c.goaways == [(MAX_ID, NO_ERROR), (1, NO_ERROR)]
    assert c.wait(lambda: c.eof, 4)
    c.close()
    assert ld.stat("server.drain.cx_drained_proactive") == 1


def test_idle_close_on_response_no_goaway_while_idle_then_with_the_next_response(lameduck):
    """``drain.idle_close: on_response``: no GOAWAY reaches an idle connection at its moment
    (in [4.0, 4.1) s) nor at T (6 s); the next response on it brings GOAWAY(2^31-1), the
    final one G later and the close; a connection left idle gets both and the close at T + G
    (7.9 s). The steps wait on the server's own drain clock (``drain.elapsed``), and the
    look at the idle connection is bracketed by two readings of it: seconds of room for a
    loaded machine, not a client's sleep."""
    t, g = 6.0, 1.9
    ld = lameduck(drain={"time": f"{t:g}s", "strategy": "gradual",
                         "connection_grace": f"{g:g}s", "idle_close": "on_response"},
                  shutdown={"deadline": "15s"})
    idle, used = RawH2(ld.port), RawH2(ld.port)
    for c in (idle, used):
        c.request(1, "/")
        assert c.wait(lambda c=c: c.done(1))
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    # past every connection's moment (and T/2: every response drains), before T
    assert wait_until(lambda: ld.drain_elapsed() >= 2 * t / 3 + 0.15, 30, 0.05)
    assert not used.wait(lambda: bool(used.goaways) or used.eof, 0.1)
    used.request(3, "/")
    assert used.wait(lambda: used.done(3) and bool(used.goaways), 15)
    assert used.streams[3].status == 200
    assert used.goaways[0] == (MAX_ID, NO_ERROR)
    assert used.wait(lambda: len(used.goaways) >= 2 and used.eof, 15)
    assert used.goaways[1] == (3, NO_ERROR)
    # past every moment + G (< T) and T itself, before T + G
    assert wait_until(lambda: ld.drain_elapsed() >= t + 0.05, 30, 0.05)
    assert not idle.wait(lambda: bool(idle.goaways) or idle.eof, 0.1)
    looked_by = ld.drain_elapsed()
    assert looked_by < t + g, f"the look came after T + G ({looked_by}s): proves nothing"
    assert idle.wait(lambda: idle.eof, 15)
    assert idle.goaways == [(MAX_ID, NO_ERROR), (1, NO_ERROR)]
    for c in (idle, used):
        c.close()
    assert ld.stat("server.drain.cx_closed_at_end") == 1


def test_refused_stream_after_drain_time(lameduck):
    """T = 0: new work is refused at once; on HTTP/2 that is REFUSED_STREAM, never a drop."""
    ld = lameduck(drain={"time": "0s", "strategy": "immediate", "connection_grace": "5s"},
                  shutdown={"deadline": "3s"})
    c = RawH2(ld.port)
    c.request(1, "/sleep?ms=1000")
    time.sleep(0.2)
    ld.signal(signal.SIGTERM)
    time.sleep(0.2)
    c.request(3, "/")
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].reset == REFUSED_STREAM
    assert c.wait(lambda: c.done(1), 5)
    assert c.streams[1].status == 200
    assert ld.wait(5) == 0
    c.close()


def test_cut_at_deadline_gives_503_on_stream(lameduck):
    ld = lameduck(drain={"time": "0s", "strategy": "immediate", "connection_grace": "5s"},
                  shutdown={"deadline": "300ms"})
    c = RawH2(ld.port)
    c.request(1, "/sleep?ms=5000")
    time.sleep(0.2)
    ld.signal(signal.SIGTERM)
    assert c.wait(lambda: c.done(1), 5)
    assert c.streams[1].status == 503
    assert ld.wait(5) == 3  # something was cut
    c.close()


def test_graceful_drain_zero_failures_with_reconnecting_client(lameduck):
    """Many concurrent streams through a drain: the client moves to new connections on GOAWAY
    and no request fails (tests/h2pool.py: a client that honours GOAWAY as RFC 9113 says)."""
    ld = lameduck(drain={"time": "1200ms", "strategy": "gradual", "connection_grace": "200ms"},
                  shutdown={"deadline": "5s"})

    async def run() -> tuple[int, list[str], H2Pool]:
        ok = 0
        failures: list[str] = []
        stop = time.monotonic() + 2.5
        pool = H2Pool(ld.port)

        async def worker(i: int) -> None:
            nonlocal ok
            n = 0
            while time.monotonic() < stop and n < 400:
                n += 1
                try:
                    status, _ = await asyncio.wait_for(pool.get(f"/sleep?ms={i % 5 * 5}"), 10)
                    if status == 200:
                        ok += 1
                    else:
                        failures.append(f"status {status}")
                except (OSError, Retry, TimeoutError) as e:
                    failures.append(repr(e))

        async def drain() -> None:
            await asyncio.sleep(0.3)
            async with httpx.AsyncClient() as admin:
                r = await admin.post(ld.admin_url("/drain_listeners?graceful&skip_exit"))
                assert r.status_code == 200

        await asyncio.gather(drain(), *(worker(i) for i in range(20)))
        await pool.close()
        return ok, failures, pool

    ok, failures, pool = asyncio.run(run())
    assert not failures, failures[:5]
    assert ok > 100
    assert pool.goaways >= 2
    assert pool.connections >= 2  # it moved to a new connection
    assert ld.stat("http.ingress.http2.goaway_sent") >= 2
    assert ld.stat("http.ingress.downstream_cx_http2_total") >= 2


# -- CONNECT --------------------------------------------------------------------------------


def test_connect_tunnel_relays_and_off_list_gets_403(lameduck, origin_port):
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}})
    c = RawH2(ld.port)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.streams[1].status is not None)
    assert c.streams[1].status == 200 and not c.streams[1].ended
    c.data(1, b"GET / HTTP/1.1\r\nHost: tunnel\r\n\r\n")
    assert c.wait(lambda: b"hello from the lameduck demo origin" in c.streams[1].body)
    assert c.streams[1].body.startswith(b"HTTP/1.1 200 OK")
    c.data(1, b"", end=True)  # END_STREAM -> FIN: the origin closes, its FIN -> END_STREAM
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].ended and c.streams[1].reset is None
    c.connect(3, "127.0.0.1:1")  # not on the list
    assert c.wait(lambda: c.done(3))
    assert c.streams[3].status == 403
    c.close()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_upgrades_active") == 0)
    assert ld.stat("http.ingress.downstream_cx_upgrades_total") == 1
    assert ld.stat("http.ingress.downstream_rq_active") == 0


def test_connect_default_is_403(lameduck, origin_port):
    ld = lameduck()
    c = RawH2(ld.port)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.done(1))
    assert c.streams[1].status == 403
    c.close()


def test_connect_tunnel_reset_g_after_proactive_moment(lameduck, origin_port):
    """Envoy's draining docs: on HTTP/2 a CONNECT stream drained proactively is reset once G
    elapsed."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}},
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    c = RawH2(ld.port)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    assert c.wait(lambda: bool(c.goaways), 3)  # the proactive moment: in [1.0, 1.2) s
    t_moment = time.monotonic()
    assert c.wait(lambda: c.done(1), 3)
    t_reset = time.monotonic()
    assert c.streams[1].reset == 8  # CANCEL
    assert 0.8 <= t_moment - t0 <= 1.6, t_moment - t0
    assert t_reset - t_moment >= 0.2, t_reset - t_moment
    assert c.wait(lambda: c.eof, 3)
    c.close()
    assert ld.stat("server.drain.cut_reset") == 1
    assert ld.stat("http.ingress.downstream_cx_upgrades_active") == 0


def test_response_drained_connection_keeps_its_tunnel_until_the_moment(lameduck, origin_port):
    """Envoy's draining docs: a connection drained by a response keeps its tunnels until it is
    drained proactively as well; then (HTTP/2) they are reset G later."""
    ld = lameduck(listener={"connect": {"allow": [f"127.0.0.1:{origin_port}"]}},
                  drain={"time": "1500ms", "strategy": "gradual", "connection_grace": "300ms"},
                  shutdown={"deadline": "5s"})
    c = RawH2(ld.port)
    c.connect(1, f"127.0.0.1:{origin_port}")
    assert c.wait(lambda: c.streams[1].status == 200)
    t0 = time.monotonic()
    assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
    time.sleep(0.8)  # past T/2: every response drains
    c.request(3, "/")
    assert c.wait(lambda: c.done(3) and bool(c.goaways))
    # drained by that response: GOAWAY sent, and the tunnel still running (no moment yet)
    assert ld.stat("server.drain.cx_drained_by_response") == 1
    assert not c.done(1)
    assert c.wait(lambda: c.done(1), 3)
    waited = time.monotonic() - t0
    assert c.streams[1].reset == 8  # CANCEL, G after the moment in [1.0, 1.2)
    assert waited >= 1.2, waited
    assert c.goaways[:2] == [(MAX_ID, NO_ERROR), (3, NO_ERROR)]
    c.close()
    assert ld.stat("server.drain.cx_drained_by_response") == 1
    assert ld.stat("server.drain.cut_reset") == 1


# -- TLS ------------------------------------------------------------------------------------------


def test_tls_alpn_h2_and_http11(lameduck, tls_files):
    ca, cert, key = tls_files
    ld = lameduck(listener={"tls": {"certificate": str(cert), "key": str(key)}})
    url = f"https://{ld.addr}/bytes?n=300000"
    r = _curl("--http2", "--cacert", str(ca), "-w", "\n%{http_version}", url)
    assert r.returncode == 0, r.stderr
    body, _, version = r.stdout.rpartition(b"\n")
    assert version == b"2"
    assert body == _pattern(300000)
    r = _curl("--http1.1", "--cacert", str(ca), "-w", "\n%{http_version}", url)
    assert r.returncode == 0, r.stderr
    body, _, version = r.stdout.rpartition(b"\n")
    assert version == b"1.1"
    assert body == _pattern(300000)
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=str(ca)),
                      timeout=10) as c:
        r = c.get(f"https://{ld.addr}/headers")
        assert r.http_version == "HTTP/2"
        assert dict(r.json()["headers"])["x-forwarded-proto"] == "https"


def test_tls_config_errors_name_the_field(tmp_path, tls_files):
    from lameduck.config import ConfigError, load_config_text

    _, cert, _ = tls_files
    text = (f"listeners: [{{name: a, address: 127.0.0.1:1, tls: {{certificate: {cert}, "
            f"key: {tmp_path}/missing.pem}}, routes: [{{cluster: c}}]}}]\n"
            "clusters: [{name: c, endpoints: ['127.0.0.1:2']}]\n")
    with pytest.raises(ConfigError) as e:
        load_config_text(text)
    assert "listeners[0].tls.key" in str(e.value)
    assert "cannot read" in str(e.value)


def test_prior_knowledge_preface_split_across_reads(lameduck):
    """The first bytes decide HTTP/1 or HTTP/2 even when the preface arrives in pieces."""
    ld = lameduck()
    sock = socket.create_connection(("127.0.0.1", ld.port), timeout=5)
    sock.sendall(PREFACE[:5])
    time.sleep(0.05)
    sock.sendall(PREFACE[5:14])
    time.sleep(0.05)
    sock.sendall(PREFACE[14:] + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    data = b""
    end = time.monotonic() + 5
    while len(data) < 9 and time.monotonic() < end:
        data += sock.recv(4096)
    assert data[3] == 0x04  # the server's SETTINGS frame: it speaks HTTP/2
    sock.close()
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_http2_total") == 1)
