"""HTTP/2 upstreams (a cluster with ``protocol: h2``, reached over h2c prior knowledge; see
docs/http2.md "HTTP/2 upstreams"): real clients through lameduck to real h2c origins
(tests/h2origin.py, built on the ``h2`` library, not on lameduck's own HTTP/2 code), over real
sockets. The origin's stdout lines (``request conn=N stream=S ...``, ``closed``, ``ignored``,
``goaway-sent``) show what lameduck did on the upstream side."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from lameduck.config import ConfigError, load_config_text
from tests.procs import H2Origin, RawConn, _env, base_config, refusing_port

CLUSTER = "cluster.h2app."


def h2cfg(*origins: H2Origin, **cluster: object) -> dict:
    """base_config with its one route going to an ``h2app`` cluster of ``origins``."""
    cfg = base_config(origins[0].port)
    cfg["clusters"] = [{"name": "h2app", "endpoints": [o.addr for o in origins],
                        "protocol": "h2", **cluster}]
    for route in cfg["listeners"][0]["routes"]:
        route["cluster"] = "h2app"
    return cfg


def cstat(ld, name: str) -> int:
    return ld.stats()[CLUSTER + name]


def pattern(n: int) -> bytes:
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def conns_of(o: H2Origin, path: str | None = None) -> list[str]:
    """The origin connection of each processed request (optionally only for ``path``)."""
    return [r["conn"] for r in o.records("request") if path is None or r["path"] == path]


async def _gather_get(url: str, n: int, limit: int | None = None) -> list[int | str]:
    """``n`` concurrent HTTP/1.1 GETs on up to ``limit`` client connections: status codes, or
    the exception's name for a request that failed."""
    limits = httpx.Limits(max_connections=limit or n, max_keepalive_connections=limit or n)
    async with httpx.AsyncClient(limits=limits, timeout=20) as c:
        async def one() -> int | str:
            try:
                return (await c.get(url)).status_code
            except httpx.HTTPError as e:
                return type(e).__name__
        return list(await asyncio.gather(*(one() for _ in range(n))))


# -- requests and responses ---------------------------------------------------------------------


def test_http1_client_get_through_h2_upstream(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/"))
    assert r.http_version == "HTTP/1.1"
    assert r.status_code == 200
    assert r.text == "hello from h2 origin\n"
    assert len(o.records("request")) == 1
    s = ld.stats()
    assert s[CLUSTER + "upstream_rq_total"] == 1
    assert s[CLUSTER + "upstream_rq_2xx"] == 1
    assert s[CLUSTER + "upstream_cx_total"] == 1


def test_request_fields_sent_upstream(lameduck, h2origin):
    """Host -> :authority, :scheme http, X-Forwarded-*, connection-specific fields dropped,
    ``te: trailers`` kept (trailers are carried back)."""
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/headers?x=1"), headers=[
            ("host", "app.example:8080"), ("x-custom", "yes"), ("connection", "keep-alive"),
            ("keep-alive", "timeout=5"), ("proxy-connection", "keep-alive"),
            ("te", "trailers")])
    assert r.status_code == 200, r.text
    pairs = r.json()
    names = [n for n, _ in pairs]
    fields = dict(pairs)
    assert [n for n in names if n.startswith(":")] == names[:4]  # pseudo-headers first
    assert sorted(names[:4]) == [":authority", ":method", ":path", ":scheme"]
    assert fields[":method"] == "GET"
    assert fields[":scheme"] == "http"
    assert fields[":authority"] == "app.example:8080"
    assert fields[":path"] == "/headers?x=1"
    assert fields["x-forwarded-for"] == "127.0.0.1"
    assert fields["x-forwarded-proto"] == "http"
    assert fields["x-custom"] == "yes"
    assert fields["te"] == "trailers"  # the one te HTTP/2 allows (gRPC needs it)
    for name in ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"):
        assert name not in names
    assert "host" not in names or fields["host"] == "app.example:8080"
    assert all(n == n.lower() for n in names)


def test_post_3mb_echo_sized_and_chunked(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    body = pattern(3 * 1024 * 1024 + 13)[::-1]
    with httpx.Client(timeout=30) as c:
        r = c.post(ld.url("/echo"), content=body)  # content-length
        assert r.status_code == 200
        assert len(r.content) == len(body)
        assert r.content == body

        def gen():
            for i in range(0, len(body), 100_000):
                yield body[i:i + 100_000]

        r = c.post(ld.url("/echo"), content=gen())  # chunked from the client: DATA frames
        assert r.status_code == 200
        assert r.content == body
    assert o.wait_line("request ", 2)  # its stdout is read by a thread: wait for it
    assert [r["path"] for r in o.records("request")] == ["/echo", "/echo"]


def test_h2_client_to_h2_upstream_8mb(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    n = 8_000_000
    r = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", "30",
                        "-w", "%{stderr}%{http_version} %{http_code}", ld.url(f"/bytes/{n}")],
                       capture_output=True, timeout=40, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stderr.endswith(b"2 200")
    assert len(r.stdout) == n
    assert hashlib.sha256(r.stdout).digest() == hashlib.sha256(pattern(n)).digest()
    body = pattern(1024 * 1024 + 5)
    with httpx.Client(http1=False, http2=True, timeout=20) as c:
        r2 = c.post(ld.url("/echo"), content=body)
        assert r2.http_version == "HTTP/2"
        assert r2.content == body


def test_concurrent_requests_are_multiplexed(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:  # warm: one upstream connection, its SETTINGS known
        assert c.get(ld.url("/")).status_code == 200
    t0 = time.monotonic()
    statuses = asyncio.run(_gather_get(ld.url("/slow/300"), 50))
    elapsed = time.monotonic() - t0
    assert statuses == [200] * 50
    assert elapsed < 5  # concurrent, not one after another (50 x 0.3 s)
    conns = conns_of(o, "/slow/300")
    assert len(conns) == 50
    assert len(set(conns)) < 50
    assert max(Counter(conns).values()) >= 10  # many streams on one connection
    assert cstat(ld, "upstream_cx_total") < 50


def test_cluster_stream_limit_opens_more_connections(lameduck, h2origin):
    """The cluster's own ``http2.max_concurrent_streams`` caps streams per connection."""
    o = h2origin()
    ld = lameduck(h2cfg(o, http2={"max_concurrent_streams": 3}))
    # long enough that all 12 overlap even when the client is slow to send them (1.5 s was not
    # always enough on a loaded 2-core machine: 3 connections once)
    statuses = asyncio.run(_gather_get(ld.url("/slow/3000"), 12))
    assert statuses == [200] * 12
    conns = conns_of(o, "/slow/3000")
    assert len(set(conns)) >= 4
    # none overfilled: a request that came while a new connection's waiters were being given
    # their streams once took a fourth stream on it, and waited behind the other three
    assert max(Counter(conns).values()) <= 3
    assert o.lines("refused") == []


def test_upstream_settings_stream_limit_respected(lameduck, h2origin):
    """The origin's SETTINGS_MAX_CONCURRENT_STREAMS (3): the requests spread over more
    connections (the endpoint's limit, as learned, sizes new ones) and all succeed."""
    o = h2origin(max_streams=3)
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        assert c.get(ld.url("/")).status_code == 200
    statuses = asyncio.run(_gather_get(ld.url("/slow/1500"), 12))
    assert statuses == [200] * 12
    assert len(set(conns_of(o, "/slow/1500"))) >= 4
    assert o.lines("refused") == []  # one stream at a time until its SETTINGS were known


def test_204_trailers_interim_and_head(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/status/204"))
        assert r.status_code == 204 and r.content == b""
        r = c.get(ld.url("/status/503"))
        assert r.status_code == 503 and r.text == "status 503\n"
        r = c.get(ld.url("/trailers"))
        assert r.status_code == 200
        assert r.content == b"".join(f"line {i} of a body with trailers\n".encode()
                                     for i in range(100))
    conn = RawConn(ld.addr)
    try:
        interim = conn.request("/interim")
        assert interim.status == 103
        assert interim.header("link") == "</a>; rel=preload"
        final = conn.read_response()
        assert final.status == 200 and final.body == b"interim done\n"
        head = conn.request("/bytes/1000", method="HEAD")
        assert head.status == 200
        assert head.header("content-length") == "1000"
        after = conn.request("/")  # no stray body bytes after the HEAD response
        assert after.status == 200 and after.body == b"hello from h2 origin\n"
    finally:
        conn.close()


# -- upstream errors ----------------------------------------------------------------------------


def test_rst_stream_gives_502_and_is_counted(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/reset"))
        assert r.status_code == 502
        assert cstat(ld, "upstream_rq_rx_reset") == 1
        assert c.get(ld.url("/")).status_code == 200  # the connection and lameduck live on
    assert cstat(ld, "upstream_rq_retry") == 0  # INTERNAL_ERROR is not a safe retry
    assert len(conns_of(o, "/reset")) == 1
    # After the head went out the client can only see the response cut short.
    conn = RawConn(ld.addr)
    try:
        resp = conn.request("/reset-after-head")
        assert resp.status == 200
        assert not resp.complete
        assert len(resp.body) < 100_000
    finally:
        conn.close()
    assert cstat(ld, "upstream_rq_rx_reset") == 2


def test_malformed_response_gives_502(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/malformed"))
        assert r.status_code == 502
        assert c.get(ld.url("/")).status_code == 200
    assert cstat(ld, "upstream_rq_rx_reset") == 1
    assert cstat(ld, "upstream_rq_2xx") == 1


def test_refused_stream_is_retried_once_then_503(lameduck, h2origin):
    """REFUSED_STREAM proves the request unprocessed (RFC 9113 §8.7): sent again once, whatever
    the method; a second refusal answers 503 (docs/http2.md)."""
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/refuse"))
        assert r.status_code == 503
        assert cstat(ld, "upstream_rq_retry") == 1
        r = c.post(ld.url("/refuse"), content=b"x" * 1000)  # the body is replayed
        assert r.status_code == 503
        assert cstat(ld, "upstream_rq_retry") == 2
        assert c.get(ld.url("/")).status_code == 200
    refuse = [r for r in o.records("request") if r["path"] == "/refuse"]
    assert [r["method"] for r in refuse] == ["GET", "GET", "POST", "POST"]


def test_goaway_finishes_earlier_streams_and_retries_the_rest(lameduck, h2origin):
    """/goaway on a connection with three slow streams in flight: GOAWAY(last = its id - 2), so
    the slow ones (lower ids) are answered on it, the /goaway stream is unprocessed and retried
    once on a fresh connection, where /goaway refuses it again (GOAWAY(0)): 503. Later requests
    use yet another connection."""
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        assert c.get(ld.url("/")).status_code == 200  # one warm upstream connection
    first = conns_of(o)[0]

    async def run() -> tuple[list[int], int]:
        async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=8)) as c:
            slow = [asyncio.create_task(c.get(ld.url("/slow/500"))) for _ in range(3)]
            for _ in range(200):  # all three are on the origin before /goaway goes out
                if len(conns_of(o, "/slow/500")) == 3:
                    break
                await asyncio.sleep(0.01)
            goaway = await c.get(ld.url("/goaway"))
            return [(await t).status_code for t in slow], goaway.status_code

    slow_statuses, goaway_status = asyncio.run(run())
    assert conns_of(o, "/slow/500") == [first] * 3  # multiplexed on the warm connection
    assert slow_statuses == [200, 200, 200]
    assert goaway_status == 503
    goaway_conns = conns_of(o, "/goaway")
    assert len(goaway_conns) == 2 and goaway_conns[0] == first != goaway_conns[1]
    assert cstat(ld, "upstream_rq_retry") == 1
    with httpx.Client(timeout=10) as c:
        assert [c.get(ld.url("/")).status_code for _ in range(3)] == [200] * 3
    later = conns_of(o, "/")[1:]
    assert later and not set(later) & set(goaway_conns)  # a third connection
    assert o.wait_line(f"closed conn={first} ")  # closed once its streams were done
    assert o.lines("ignored") == []
    assert cstat(ld, "upstream_cx_close_notify") >= 1


def test_upstream_drain_loses_no_request(lameduck, h2origin):
    """Two origins behind one h2 cluster; one drains (two GOAWAYs, then closes) while 20
    clients keep requesting: no request fails, lameduck stops opening streams on the draining
    connection after the first GOAWAY (none is left above the final last-stream-id), and that
    connection closes."""
    a, b = h2origin(), h2origin()
    ld = lameduck(h2cfg(a, b))
    results: list[int | str] = []
    after_drain = 0  # requests answered after the origin began to drain
    drained_at: list[float] = []

    async def worker(c: httpx.AsyncClient, until: float) -> None:
        """Until a second after the drain began (400 requests and 20 s at most)."""
        nonlocal after_drain
        for _ in range(400):
            now = time.monotonic()
            if now >= until or (drained_at and now >= drained_at[0] + 1.0):
                return
            try:
                results.append((await c.get(ld.url("/slow/50"))).status_code)
            except httpx.HTTPError as e:
                results.append(type(e).__name__)
            if drained_at:
                after_drain += 1

    async def run() -> None:
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(timeout=10, limits=limits) as c:
            until = time.monotonic() + 20.0
            workers = [asyncio.create_task(worker(c, until)) for _ in range(20)]
            for _ in range(300):  # until lameduck has traffic on the origin to drain
                if len(a.records("request")) >= 5:
                    break
                await asyncio.sleep(0.01)
            proc = await asyncio.create_subprocess_exec(
                "curl", "-sS", "--http2-prior-knowledge", "--max-time", "5", a.url("/drain"),
                stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            assert out == b"draining\n"
            drained_at.append(time.monotonic())
            await asyncio.gather(*workers)

    asyncio.run(run())
    assert results and all(r == 200 for r in results), Counter(results)
    assert after_drain >= 20, (after_drain, len(results))  # traffic flowed through the drain
    drain_conn = conns_of(a, "/drain")[0]
    old = {r["conn"] for r in a.records("request")
           if r["conn"] != drain_conn and int(r["conn"]) < int(drain_conn)}
    assert old, a.lines()
    for conn in old:
        assert a.wait_line(f"closed conn={conn} ", timeout=2), a.lines()
        assert a.lines(f"ignored conn={conn} ") == []
    assert cstat(ld, "upstream_cx_close_notify") >= len(old)
    assert len(b.records("request")) > 0


def test_lost_connection_gives_502_then_serves(lameduck, h2origin):
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/close"))
        assert r.status_code == 502
        assert cstat(ld, "upstream_rq_rx_reset") == 1
        assert c.get(ld.url("/")).status_code == 200
    assert o.wait_line("closed ", 1)
    assert len(set(conns_of(o))) == 2  # a new connection after the lost one
    assert len(conns_of(o, "/close")) == 1  # not retried: it may have been processed


# -- config -------------------------------------------------------------------------------------


def h2cfg_static(protocol: str) -> dict:
    cfg = base_config(refusing_port())
    cfg["clusters"][0]["protocol"] = protocol
    return cfg


def test_config_protocol_h2_and_unknown_protocol() -> None:
    good = h2cfg_static("h2")
    assert load_config_text(yaml.safe_dump(good), "lameduck.yaml").clusters[0].protocol == "h2"
    with pytest.raises(ConfigError) as info:
        load_config_text(yaml.safe_dump(h2cfg_static("h3")), "lameduck.yaml")
    assert "lameduck.yaml: clusters[0].protocol:" in str(info.value)
    assert [p for p, _ in info.value.problems] == ["clusters[0].protocol"]


def test_run_refuses_unknown_protocol(tmp_path: Path) -> None:
    path = tmp_path / "h3.yaml"
    path.write_text(yaml.safe_dump(h2cfg_static("h3")))
    out = subprocess.run([sys.executable, "-m", "lameduck", "run", "-c", str(path)],
                         capture_output=True, text=True, timeout=30, env=_env(), check=False)
    assert out.returncode == 2
    assert f"{path}: clusters[0].protocol:" in out.stderr
    assert "Traceback" not in out.stderr


# -- what an HTTP/2 cluster does not carry, timeouts, idle connections ---------------------------

def test_websocket_to_an_h2_cluster_is_answered_501(lameduck, h2origin):
    """A WebSocket needs RFC 8441 towards an HTTP/2 upstream, which lameduck does not speak:
    answered 501 before anything goes upstream, over HTTP/1.1 Upgrade and over RFC 8441."""
    from tests.h2raw import RawH2

    o = h2origin()
    ld = lameduck(h2cfg(o))
    c = RawConn(f"127.0.0.1:{ld.port}")
    c.send("/chat", headers={"Connection": "Upgrade", "Upgrade": "websocket",
                             "Sec-WebSocket-Version": "13",
                             "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    r = c.read_response()
    assert r.status == 501, r
    assert b"websocket" in r.body
    h = RawH2(ld.port)
    h.request(1, "/chat", method="CONNECT", end=False,
              headers=[(":protocol", "websocket"), ("sec-websocket-version", "13")])
    assert h.wait(lambda: h.streams[1].status is not None)
    assert h.streams[1].status == 501
    h.close()
    assert o.records("request") == []


def test_route_timeout_cancels_the_stream(lameduck, h2origin):
    """No response within the route timeout: 504 to the client, the stream cancelled upstream
    (RST_STREAM CANCEL, ``upstream_rq_tx_reset``) while the connection carries on."""
    o = h2origin()
    cfg = h2cfg(o)
    cfg["listeners"][0]["routes"][0]["timeout"] = "300ms"
    ld = lameduck(cfg)
    with httpx.Client(timeout=10) as c:
        r = c.get(ld.url("/slow/3000"))
        assert r.status_code == 504
        assert c.get(ld.url("/")).status_code == 200
    assert cstat(ld, "upstream_rq_timeout") == 1
    assert cstat(ld, "upstream_rq_tx_reset") == 1
    assert cstat(ld, "upstream_cx_total") == 1  # the same connection served the next one


def test_idle_connection_closed_with_goaway(lameduck, h2origin):
    """A connection with no stream for the cluster's idle_timeout is closed, GOAWAY first."""
    o = h2origin()
    ld = lameduck(h2cfg(o, idle_timeout="300ms"))
    with httpx.Client(timeout=10) as c:
        assert c.get(ld.url("/")).status_code == 200
    assert o.wait_line("goaway-received conn=1 ", timeout=5), o.lines()
    assert o.wait_line("closed conn=1 ", timeout=5), o.lines()
    deadline = time.monotonic() + 3
    while cstat(ld, "upstream_cx_active") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cstat(ld, "upstream_cx_active") == 0
    assert cstat(ld, "upstream_cx_idle_timeout") == 1


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_slow_client_holds_the_upstream_back(lameduck, h2origin):
    """A client that does not read a 60 MB response: lameduck stops acknowledging the stream's
    DATA, so the upstream's window closes and lameduck's memory stays bounded (it would grow by
    the whole body if it buffered); then the client reads it all, intact."""
    import socket

    n = 60_000_000
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        assert c.get(ld.url("/")).status_code == 200
    before = _rss_kb(ld.proc.pid)
    s = socket.create_connection(("127.0.0.1", ld.port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(f"GET /bytes/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    time.sleep(2.0)  # not reading
    grown = _rss_kb(ld.proc.pid) - before
    assert grown < 20_000, f"lameduck grew by {grown} kB while the client did not read"
    h = hashlib.sha256()
    got = b""
    while b"\r\n\r\n" not in got:
        got += s.recv(65536)
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert f"content-length: {n}".encode() in head.lower()
    h.update(rest)
    size = len(rest)
    while size < n:
        chunk = s.recv(1 << 20)
        assert chunk, f"EOF after {size} bytes"
        h.update(chunk)
        size += len(chunk)
    s.close()
    assert size == n
    assert h.hexdigest() == hashlib.sha256(pattern(n)).hexdigest()


@pytest.mark.parametrize("client", ["http1", "h2"])
def test_refused_request_body_is_replayed(lameduck, h2origin, client: str):
    """A POST refused unprocessed is sent again with the body it had sent (kept up to 64 KiB),
    from an HTTP/1.1 client and from an HTTP/2 client alike: the retry's body is whole."""
    o = h2origin()
    ld = lameduck(h2cfg(o))
    body = pattern(40_000)
    want = f"{len(body)} {hashlib.sha256(body).hexdigest()}\n"
    with httpx.Client(timeout=10, http1=client == "http1", http2=client == "h2") as c:
        r = c.post(ld.url(f"/refuse-once/{client}"), content=body)
        assert r.http_version == ("HTTP/1.1" if client == "http1" else "HTTP/2")
    assert r.status_code == 200, r.text
    assert r.text == want
    assert cstat(ld, "upstream_rq_retry") == 1
    assert o.wait_line("request ", 2)  # its stdout is read by a thread: wait for it
    assert [r["method"] for r in o.records("request")] == ["POST", "POST"]


def test_refused_body_too_large_to_keep_is_answered_503(lameduck, h2origin):
    """Past the replay limit the body is not kept: the refusal is answered, never replayed
    with a hole in it."""
    o = h2origin()
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        # Refused once 100,000 bytes went up: past the 64 KiB lameduck keeps to send again.
        r = c.post(ld.url("/refuse-once/big?after=100000"), content=pattern(200_000))
    assert r.status_code == 503
    assert cstat(ld, "upstream_rq_retry") == 0
    assert len(o.records("request")) == 1


# -- found in review: flushing to HTTP/2 clients, early answers, a zero stream limit -------------

def _h2_client_read(sock, conn, seconds: float) -> list:  # type: ignore[no-untyped-def]
    """Events an ``h2`` client connection receives within ``seconds`` (acknowledging DATA
    at once, as a client with the default 64 KiB windows does)."""

    import h2.events

    sock.settimeout(0.1)
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        if not data:
            break
        for ev in conn.receive_data(data):
            got.append(ev)
            if isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
        if any(isinstance(e, h2.events.StreamEnded) for e in got):
            break
    return got


def _h2_client(port: int):  # type: ignore[no-untyped-def]
    import socket as socket_mod

    import h2.config
    import h2.connection

    sock = socket_mod.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    return sock, conn


def test_h2_client_with_default_windows_gets_a_large_body(lameduck, h2origin):
    """The response reaches an HTTP/2 client as it comes (not held until complete): with the
    default 64 KiB windows a 2 MB body would otherwise never flow."""
    import h2.events

    o = h2origin()
    ld = lameduck(h2cfg(o))
    sock, conn = _h2_client(ld.port)
    conn.send_headers(1, [(":method", "GET"), (":scheme", "http"), (":authority", "x"),
                          (":path", "/bytes/2000000")], end_stream=True)
    sock.sendall(conn.data_to_send())
    got = _h2_client_read(sock, conn, 10.0)
    sock.close()
    body = b"".join(e.data for e in got if isinstance(e, h2.events.DataReceived))
    assert body == pattern(2_000_000)


def test_h2_client_sees_a_streamed_response_while_its_request_is_open(lameduck, h2origin):
    import h2.events

    o = h2origin()
    ld = lameduck(h2cfg(o))
    sock, conn = _h2_client(ld.port)
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                          (":path", "/echo")])
    conn.send_data(1, b"hello")
    sock.sendall(conn.data_to_send())
    got = _h2_client_read(sock, conn, 2.0)
    sock.close()
    assert any(isinstance(e, h2.events.ResponseReceived) for e in got)
    assert b"".join(e.data for e in got if isinstance(e, h2.events.DataReceived)) == b"hello"


def test_an_answer_before_the_request_body_ends_frees_the_stream(lameduck, h2origin):
    """The origin answers 413 while the body is still coming: lameduck stops sending it
    (RST_STREAM CANCEL), so the stream does not hold one of the connection's 2 slots."""
    import socket as socket_mod

    o = h2origin(max_streams=2)
    ld = lameduck(h2cfg(o))
    socks = []
    try:
        for _ in range(4):
            s = socket_mod.create_connection(("127.0.0.1", ld.port), timeout=10)
            s.sendall(b"POST /status/413 HTTP/1.1\r\nHost: x\r\ncontent-length: 100000\r\n\r\n"
                      + b"z" * 10)
            got = b""
            while b"\r\n\r\n" not in got:
                got += s.recv(65536)
            assert got.startswith(b"HTTP/1.1 413"), got
            socks.append(s)
        with httpx.Client(timeout=10) as c:
            assert c.get(ld.url("/")).status_code == 200
    finally:
        for s in socks:
            s.close()
    assert cstat(ld, "upstream_cx_total") == 1


def test_an_upstream_that_allows_no_stream_does_not_cause_a_connection_storm(
        lameduck, h2origin):
    o = h2origin(max_streams=0)
    ld = lameduck(h2cfg(o))
    with httpx.Client(timeout=10) as c:
        codes = [c.get(ld.url("/")).status_code for _ in range(5)]
    assert all(code == 503 for code in codes), codes
    assert cstat(ld, "upstream_cx_total") <= 2
