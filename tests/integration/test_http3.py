"""HTTP/3 on a TLS listener (``listeners[].http3``), over real UDP sockets, against the real
process: aioquic's client (which also shows the wire: GOAWAY ids, resets, transport
parameters) and niquests over qh3 (an independent QUIC and HTTP/3 stack). Each request goes
through the same exchange as HTTP/1.1 and HTTP/2: to an HTTP/1.1 origin and to an h2c one,
bodies and trailers intact, in the same stats and access log."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lameduck.http3 import GOAWAY_ALL, H3_NO_ERROR, H3_REQUEST_REJECTED
from tests.capture import CaptureOrigin
from tests.h3client import counted_active, h3_connect
from tests.procs import H2Origin, Lameduck, base_config, wait_until

CHUNKED_WITH_TRAILERS = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n"
    b"5\r\nhello\r\n0\r\nx-checksum: abc\r\n\r\n")


def h3_listener(tls_files: tuple[Path, Path, Path], **more: Any) -> dict[str, Any]:
    _, cert, key = tls_files
    return {"tls": {"certificate": str(cert), "key": str(key)}, "http3": {}, **more}


@pytest.fixture
def started(tmp_path: Path, tls_files: tuple[Path, Path, Path]
            ) -> Iterator[Callable[..., Lameduck]]:
    made: list[Lameduck] = []

    def make(port: int, h2: bool = False, listener: dict[str, Any] | None = None,
             **over: Any) -> Lameduck:
        cfg = base_config(port, cluster={"protocol": "h2"} if h2 else {},
                          listener=h3_listener(tls_files, **(listener or {})), **over)
        cfg["workers"] = 1  # one process owns the UDP socket
        ld = Lameduck(cfg, tmp_path).start()
        made.append(ld)
        return ld

    yield make
    for ld in made:  # every process ends, whatever one of them logged
        ld.kill()
    for ld in made:
        log = ld.log()
        assert "Traceback" not in log, log
        assert " INFO quic: " not in log, log  # aioquic's per-connection lines (logfile.py)


@pytest.fixture
def h1_origin() -> Iterator[CaptureOrigin]:
    o = CaptureOrigin(lambda head: CHUNKED_WITH_TRAILERS)
    yield o
    o.close()


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_a_request_with_body_and_trailers_to_an_http1_origin(
        started: Callable[..., Lameduck], h1_origin: CaptureOrigin) -> None:
    ld = started(h1_origin.port)

    async def go() -> Any:
        async with h3_connect(ld.addr) as c:
            return await c.request("POST", "/up", headers=[(b"te", b"trailers")],
                                   body=b"xyz", trailers=[(b"x-sum", b"2")])

    reply = run(go())
    assert reply.status == 200, ld.log()
    assert reply.body == b"hello"
    assert reply.trailers == [(b"x-checksum", b"abc")]
    assert wait_until(lambda: len(h1_origin.requests) == 1, 5)
    sent = h1_origin.requests[0]
    assert sent.startswith(b"POST /up HTTP/1.1\r\n"), sent
    assert sent.endswith(b"\r\n\r\n3\r\nxyz\r\n0\r\nx-sum: 2\r\n\r\n"), sent
    assert b"\r\nx-forwarded-proto: https" in sent.lower()


def test_requests_to_an_h2c_origin_with_body_and_trailers(
        started: Callable[..., Lameduck], h2origin: Callable[..., H2Origin]) -> None:
    origin = h2origin()
    ld = started(origin.port, h2=True)
    body = bytes(i % 251 for i in range(300_000))

    async def go() -> Any:
        async with h3_connect(ld.addr) as c:
            echo, tr, big = await asyncio.gather(
                c.request("POST", "/echo", body=body),
                c.request("GET", "/trailers", headers=[(b"te", b"trailers")]),
                c.request("GET", "/bytes/200000"))
            return echo, tr, big

    echo, tr, big = run(go())
    assert echo.status == 200 and echo.body == body, ld.log()
    assert tr.status == 200 and [n for n, _ in tr.trailers] == [b"x-checksum"]
    assert len(dict(tr.trailers)[b"x-checksum"]) == 64
    assert big.status == 200 and big.body == bytes(i % 251 for i in range(200000))


def test_niquests_over_qh3(started: Callable[..., Lameduck], origin_port: int,
                           tls_files: tuple[Path, Path, Path]) -> None:
    """A second, independent HTTP/3 stack: niquests with qh3, HTTP/1.1 and HTTP/2 off."""
    import niquests

    ca = tls_files[0]
    ld = started(origin_port)
    with niquests.Session(disable_http1=True, disable_http2=True) as s:
        s.quic_cache_layer.add_domain("127.0.0.1", ld.port)
        r = s.get(f"https://127.0.0.1:{ld.port}/", verify=str(ca), timeout=30)
        assert r.status_code == 200, ld.log()
        assert r.http_version == 30
        r2 = s.post(f"https://127.0.0.1:{ld.port}/echo", data=b"ping" * 1000,
                    verify=str(ca), timeout=30)
        assert r2.status_code == 200 and r2.http_version == 30


def test_stats_and_access_log_count_http3(started: Callable[..., Lameduck], origin_port: int,
                                          tmp_path: Path) -> None:
    log_path = tmp_path / "access.log"
    ld = started(origin_port, listener={"access_log": {"path": str(log_path)}})

    async def go() -> None:
        async with h3_connect(ld.addr) as c:
            for _ in range(3):
                assert (await c.request("GET", "/")).status == 200
            s = ld.stats()
            assert s["http.ingress.downstream_cx_http3_active"] == 1
            assert s["http.ingress.downstream_cx_active"] == 1

    run(go())
    assert wait_until(lambda: ld.stat("http.ingress.downstream_cx_active") == 0, 10), ld.log()
    s = ld.stats()
    assert s["http.ingress.downstream_cx_http3_total"] == 1
    assert s["http.ingress.downstream_rq_http3_total"] == 3
    assert s["http.ingress.downstream_rq_total"] == 3
    assert s["http.ingress.downstream_rq_2xx"] == 3
    assert s["http.ingress.downstream_cx_http3_active"] == 0
    assert wait_until(lambda: log_path.exists() and log_path.read_text().count("HTTP/3") == 3,
                      10), log_path.read_text() if log_path.exists() else ld.log()


def test_limits_follow_the_listener(started: Callable[..., Lameduck], origin_port: int) -> None:
    """http2.max_concurrent_streams -> QUIC's initial max streams; the http2 windows ->
    QUIC's initial ones; max_request_headers_kb -> SETTINGS_MAX_FIELD_SECTION_SIZE, and a
    larger head is answered 431; idle_timeout -> QUIC's max_idle_timeout."""
    ld = started(origin_port, listener={
        "http2": {"max_concurrent_streams": 7, "initial_stream_window_size": 131072,
                  "initial_connection_window_size": 262144},
        "max_request_headers_kb": 2, "idle_timeout": "42s"})

    async def go() -> Any:
        async with h3_connect(ld.addr) as c:
            # the server's initial_max_stream_data_bidi_remote and initial_max_data
            # (RFC 9000 §18.2), before any request could have raised them
            windows = (c._quic._remote_max_stream_data_bidi_remote, c._quic._remote_max_data)
            assert windows == (131072, 262144)
            ok = await c.request("GET", "/")
            big = await c.request("GET", "/", headers=[(b"x-big", b"a" * 3000)])
            return c.max_streams, c.settings(), c.idle_timeout, ok, big

    max_streams, settings, idle, ok, big = run(go())
    assert max_streams == 7
    assert settings.get(0x6) == 2048  # SETTINGS_MAX_FIELD_SECTION_SIZE, RFC 9114 §7.2.4.1
    assert 0x8 not in settings  # no extended CONNECT (RFC 9220) offered
    assert idle == 42.0
    assert ok.status == 200
    assert big.status == 431, ld.log()


def udp_port_with_tcp_free() -> tuple[socket.socket, int]:
    """A UDP socket bound on a port whose TCP side is free (checked: another process on this
    machine may hold the same number over TCP)."""
    while True:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        with socket.socket() as tcp:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                tcp.bind(("127.0.0.1", port))
                return udp, port
            except OSError:
                udp.close()


def test_a_udp_port_taken_fails_the_start(tmp_path: Path, origin_port: int,
                                          tls_files: tuple[Path, Path, Path]) -> None:
    """The UDP port is in use (the TCP one is free): start-up fails and says which."""
    udp, port = udp_port_with_tcp_free()
    cfg = base_config(origin_port, listener=h3_listener(
        tls_files, address=f"127.0.0.1:{port}"))
    cfg["workers"] = 1
    ld = Lameduck(cfg, tmp_path)
    try:
        with pytest.raises(RuntimeError) as err:
            ld.start(timeout=30)
        assert f"127.0.0.1:{port}/udp" in str(err.value), str(err.value)
    finally:
        udp.close()
        ld.kill()


REPORT = re.compile(r"drain report: requests completed=(\d+) refused=(\d+) cut=(\d+) "
                    r"\(503=(\d+) reset=(\d+)\)")


def report_counts(ld: Lameduck) -> tuple[int, ...]:
    m = REPORT.search(ld.log())
    assert m is not None, ld.log()
    return tuple(map(int, m.groups()))


QUIC_APPLICATION_ERROR = 0x0C  # RFC 9000 §20.1


def test_sigterm_under_http3_load(started: Callable[..., Lameduck], origin_port: int) -> None:
    """Up to 1,000 requests over a few connections, SIGTERM after the first 100: every
    request is answered 200, but those that reach a connection after T (it takes no new work
    then), which are rejected with H3_REQUEST_REJECTED: not processed, safe to retry (RFC
    9114 §4.1.1); never a 5xx, a cut or a lost response. Each connection drained is told on
    the wire as RFC 9114 §5.2 says: GOAWAY(2^62-4) first, then the final GOAWAY naming the
    first stream not processed (above every stream answered); the client then opens another
    connection (the process accepts until T). Idle drained connections are closed with
    H3_NO_ERROR; the process exits 0 with nothing cut."""
    ld = started(origin_port, drain={"time": "3s", "strategy": "gradual",
                                     "connection_grace": "300ms"},
                 shutdown={"deadline": "20s", "min_drain": "0s"},
                 hot_restart={"parent_shutdown_time": "20s"})
    total, per_conn = 1000, 4
    results: list[tuple[int, Any]] = []
    seen: list[tuple[list[int], int, int | None]] = []  # (goaways, top stream id, close code)
    state = {"sent": 0, "signalled": False}

    async def worker() -> None:
        while state["sent"] < total:
            try:
                async with asyncio.timeout(5):
                    cm = h3_connect(ld.addr)
                    c = await cm.__aenter__()
            except (TimeoutError, ConnectionError, OSError):
                return  # past T: the listener takes no new connection
            top = -1
            try:
                while state["sent"] < total and not c.goaways() and c.terminated is None:
                    batch = []
                    for _ in range(per_conn):
                        state["sent"] += 1
                        batch.append((c._quic.get_next_available_stream_id(),
                                      c.send("GET", "/")))
                    for sid, fut in batch:
                        reply = await fut
                        results.append((sid, reply))
                        if reply.status == 200:
                            top = max(top, sid)
                    done = len(results)
                    if done >= 100 and not state["signalled"]:
                        state["signalled"] = True
                        ld.signal(signal.SIGTERM)
                # drained (or done): wait for the server to close it, as a client that
                # keeps its connection would
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await c.gone.wait()
                code = c.terminated.error_code if c.terminated is not None else None
                seen.append((c.goaways(), top, code))
            finally:
                await cm.__aexit__(None, None, None)

    async def go() -> None:
        await asyncio.gather(*(worker() for _ in range(4)))

    run(go())
    assert ld.wait(30) == 0, ld.log()
    rejected = [(sid, r) for sid, r in results
                if r.status == 0 and r.reset == H3_REQUEST_REJECTED and not r.closed]
    failed = [(sid, r) for sid, r in results if r.status != 200 and (sid, r) not in rejected]
    assert not failed, failed[:5]
    assert len(results) - len(rejected) >= 100
    drained = [s for s in seen if s[0]]
    assert drained, seen
    for goaways, top, code in drained:
        assert goaways[0] == GOAWAY_ALL, seen
        if len(goaways) == 2:
            assert goaways[1] > top, seen  # no stream it answered is above the final id
            # H3_NO_ERROR; or, when the close went out while the server still held handshake
            # keys (a loaded machine), the transport's APPLICATION_ERROR that RFC 9000
            # §10.2.3 puts in a Handshake packet in its place, which the client read first
            assert code in (H3_NO_ERROR, QUIC_APPLICATION_ERROR), seen
    assert any(len(g) == 2 and c == H3_NO_ERROR for g, _, c in drained), seen
    completed, refused, cut, _, _ = report_counts(ld)
    assert 0 < completed <= len(results), ld.log()  # (those completed during the drain)
    # refused: those past T the process turned away (a stream above a final GOAWAY already
    # sent is the codec's, never handed on: not on the books)
    assert cut == 0 and refused <= len(rejected), (rejected, ld.log())
    # the drain report counts the QUIC connections drained, as it counts the others (one
    # accepted after its proactive window and idle at T: closed at the drain's end)
    m = re.search(r"connections drained by response=(\d+) proactively=(\d+) at end=(\d+)",
                  ld.log())
    assert m is not None and sum(map(int, m.groups())) >= len(drained), ld.log()


def test_a_request_in_flight_at_the_deadline_is_cut_and_counted(
        started: Callable[..., Lameduck], origin_port: int) -> None:
    """The process waits for a QUIC request in flight (no exit before the deadline), then
    cuts it: the client gets a reset (its response had begun) or 503, the drain report
    counts it, exit 3."""
    ld = started(origin_port, drain={"time": "1s", "connection_grace": "100ms"},
                 shutdown={"deadline": "3s", "min_drain": "0s"},
                 hot_restart={"parent_shutdown_time": "3s"})

    async def go() -> Any:
        async with h3_connect(ld.addr) as c:
            fut = c.send("GET", "/hang")
            assert await counted_active(ld, 10)
            ld.signal(signal.SIGTERM)
            reply = await fut
            return reply, c.goaways()

    reply, goaways = run(go())
    assert ld.wait(30) == 3, ld.log()
    assert reply.status == 503 or reply.reset is not None, reply
    assert goaways[:1] == [GOAWAY_ALL]
    _, _, cut, _, _ = report_counts(ld)
    assert cut == 1, ld.log()


def test_after_t_a_new_quic_client_is_refused_at_once(started: Callable[..., Lameduck],
                                                     origin_port: int) -> None:
    """Past T the listener takes no new connection. Over TCP a connect is refused; over
    QUIC the first Initial is answered with CONNECTION_CLOSE(CONNECTION_REFUSED) (RFC 9000
    §5.2.2), so the client gives up at once and tries elsewhere, rather than resending until
    its own timeout (60 s here, beyond the test's 30 s bound) as a silent drop would make it."""
    from tests.procs import refused

    ld = started(origin_port, drain={"time": "3s", "strategy": "immediate"},
                 shutdown={"deadline": "60s", "min_drain": "0s"},
                 hot_restart={"parent_shutdown_time": "60s"})

    async def go() -> None:
        async with h3_connect(ld.addr) as c:
            c.send("GET", "/sleep?ms=60000")  # keeps the process past T until we go
            assert await counted_active(ld, 10)
            ld.signal(signal.SIGTERM)
            assert await asyncio.to_thread(wait_until, lambda: refused(ld.addr), 30)
            with pytest.raises(ConnectionError):
                async with asyncio.timeout(30):
                    async with h3_connect(ld.addr):
                        pass
            assert ld.stat("http.ingress.http3.connections_refused") >= 1

    run(go())
    assert ld.wait(30) == 0, ld.log()


def test_alt_svc_advertises_h3_then_clear_during_a_drain(
        started: Callable[..., Lameduck], origin_port: int,
        tls_files: tuple[Path, Path, Path]) -> None:
    """TCP responses (HTTP/1.1 and HTTP/2) advertise h3 on the same port with the configured
    max-age (RFC 7838 §3); once the listener drains, ``clear``: new clients stay on TCP. The
    answers lameduck makes itself (here the health-check path's) too."""
    import httpx

    ca = ssl.create_default_context(cafile=str(tls_files[0]))
    ld = started(origin_port, listener={"http3": {"alt_svc_max_age": "1h"}})
    url = f"https://127.0.0.1:{ld.port}/"
    offer = f'h3=":{ld.port}"; ma=3600'
    with httpx.Client(verify=ca, http2=False) as h1, httpx.Client(verify=ca, http2=True) as h2:
        hc = url + "health_check.html"
        for u, status in ((url, 200), (hc, 200)):
            r1, r2 = h1.get(u), h2.get(u)
            assert r2.http_version == "HTTP/2"
            assert r1.status_code == r2.status_code == status, (u, r1, r2)
            assert r1.headers.get("alt-svc") == offer, (u, r1.headers)
            assert r2.headers.get("alt-svc") == offer, (u, r2.headers)

        async def over_h3() -> list[Any]:
            async with h3_connect(ld.addr) as c:
                return [await c.request("GET", p) for p in ("/", "/health_check.html")]

        for r in run(over_h3()):  # not over HTTP/3 itself, proxied or not
            assert r.status == 200 and r.header(b"alt-svc") is None, r.headers
        assert ld.admin("POST", "/drain_listeners?graceful&skip_exit").status_code == 200
        for u, status in ((url, 200), (hc, 200)):  # (the health check fails in a shutdown)
            r1, r2 = h1.get(u), h2.get(u)
            assert r1.status_code == r2.status_code == status, (u, r1, r2)
            assert r1.headers.get("alt-svc") == "clear", (u, r1.headers)
            assert r2.headers.get("alt-svc") == "clear", (u, r2.headers)


def test_no_alt_svc_without_http3(tmp_path: Path, origin_port: int,
                                  tls_files: tuple[Path, Path, Path]) -> None:
    import httpx

    _, cert, key = tls_files
    cfg = base_config(origin_port, listener={"tls": {"certificate": str(cert), "key": str(key)}})
    ld = Lameduck(cfg, tmp_path).start()
    try:
        r = httpx.get(f"https://127.0.0.1:{ld.port}/",
                      verify=ssl.create_default_context(cafile=str(tls_files[0])))
        assert r.status_code == 200 and "alt-svc" not in r.headers
    finally:
        ld.kill()


def test_a_connection_in_flight_at_a_hot_restart_goes_on_in_the_old_process(
        tmp_path: Path, origin_port: int, tls_files: tuple[Path, Path, Path]) -> None:
    """The new process takes the UDP socket over and reads it alone; the packets of the old
    process's connection (their connection ids name its generation) are forwarded to it, so
    that connection still gets answers after the handover, until the old process has drained
    it (GOAWAY) and exited. New connections are the new process's."""
    import yaml

    cfg = base_config(origin_port, listener=h3_listener(tls_files))
    cfg["workers"] = 1
    cfg["drain"] = {"time": "3s", "strategy": "gradual", "connection_grace": "1s"}
    cfg["shutdown"] = {"deadline": "20s", "min_drain": "0s"}
    cfg["hot_restart"] = {"socket": str(tmp_path / "restart.sock"),
                          "parent_shutdown_time": "20s"}
    old = Lameduck(cfg, tmp_path).start()
    new = Lameduck(cfg, tmp_path)
    new.path.unlink()
    new.path = old.path
    old.path.write_text(yaml.safe_dump(new.cfg))
    try:
        async def go() -> Any:
            async with h3_connect(old.addr) as c:
                assert (await c.request("GET", "/")).status == 200
                await asyncio.to_thread(new.start, 30.0, None, None, (), "run",
                                        ("--hot-restart",))
                # the old process answers on its connection after the handover: a request
                # and a response body of 256 KiB, whose ACKs come back through the new one
                after = await c.request("GET", "/bytes?n=262144")
                async with h3_connect(new.addr) as c2:
                    fresh = await c2.request("GET", "/")
                code = await asyncio.to_thread(old.wait, 30)
            return after, fresh, code

        after, fresh, code = run(go())
        assert after.status == 200 and len(after.body) == 262144, old.log()
        assert fresh.status == 200, new.log()
        assert code == 0, old.log()
        forwarded = new.stat("http.ingress.http3.packets_forwarded")
        assert forwarded > 10, new.log()  # every ACK of that body went through the new one
        assert new.stat("http.ingress.http3.packets_forward_dropped") == 0
        assert "Traceback" not in old.log(), old.log()
    finally:
        new.kill()
        old.kill()
    assert "Traceback" not in new.log(), new.log()


def test_top_counts_a_quic_connection_and_its_request(
        started: Callable[..., Lameduck], origin_port: int) -> None:
    """``lameduck top`` (its plain-text snapshot) shows the QUIC connection and its request
    in flight in the listener's row, as it shows TCP ones."""
    import subprocess
    import sys

    from tests.procs import _env

    ld = started(origin_port)

    async def go() -> str:
        async with h3_connect(ld.addr) as c:
            # in flight until the client goes (after top's snapshot, however long top takes
            # to start on a loaded machine)
            c.send("GET", "/sleep?ms=60000")
            assert await counted_active(ld, 10)
            r = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "lameduck", "top",
                                 "--admin-address-path", str(ld.admin_path)],
                capture_output=True, text=True, env=_env(), timeout=60)
            return r.stdout

    out = run(go())
    assert "in flight: requests 1, connections 1" in out, out
    row = re.search(rf"^ingress\s+{re.escape(ld.addr)}\s+OPEN\s+(\d+)\s+(\d+)\s", out, re.M)
    assert row is not None and row.groups() == ("1", "1"), out


def test_local_answers_over_http3(started: Callable[..., Lameduck], origin_port: int) -> None:
    """What lameduck answers itself (the health-check path, a CONNECT, which HTTP/3 does not
    relay here) goes out as on HTTP/2: a plain-text body of known length. (Not a HEAD:
    aioquic's client takes a content-length without DATA as malformed, not knowing the
    request was a HEAD.)"""
    ld = started(origin_port)

    async def go() -> Any:
        async with h3_connect(ld.addr) as c:
            return await asyncio.gather(
                c.request("GET", "/health_check.html"),
                c.request("CONNECT", "example.com:443"))

    get, connect = run(go())
    assert get.status == 200 and get.body, ld.log()
    assert get.header(b"content-length") == str(len(get.body)).encode()
    assert get.header(b"content-type") == b"text/plain; charset=utf-8"
    assert connect.status == 501 and connect.body == b"CONNECT is not served over HTTP/3\n"
