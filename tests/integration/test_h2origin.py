"""The h2c test origin (tests/h2origin.py) checked on its own with real clients: curl with
--http2-prior-knowledge, httpx over HTTP/2, and the raw-frame client for GOAWAY, drain,
refusals and flow control, so the HTTP/2 upstream tests can trust what it does."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import time

import httpx
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, SettingsFrame, WindowUpdateFrame

from tests.h2pool import H2Pool
from tests.h2raw import RawH2

MAX_ID = 2**31 - 1
NO_ERROR, INTERNAL_ERROR, REFUSED_STREAM = 0, 2, 7


def _curl(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "--max-time", str(timeout),
                           *args], capture_output=True, timeout=timeout + 5, check=False)


def _pattern(n: int) -> bytes:
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def _h2() -> httpx.Client:
    return httpx.Client(http1=False, http2=True, timeout=20)


def test_root_with_curl_and_the_stdout_lines(h2origin):
    o = h2origin()
    r = _curl("-w", "\n%{http_version} %{http_code} %{content_type}", o.url("/"))
    assert r.returncode == 0, r.stderr
    body, _, meta = r.stdout.rpartition(b"\n")
    assert body == b"hello from h2 origin\n"
    assert meta == b"2 200 text/plain"
    assert o.wait_line("closed ")
    assert o.records("request") == [{"conn": "1", "stream": "1", "method": "GET", "path": "/"}]
    assert o.records("closed") == [{"conn": "1", "streams": "1"}]
    assert o.lines("open ") == ["open conn=1"]


def test_8mb_of_bytes_hash_checked(h2origin):
    o = h2origin()
    n = 8_000_000
    r = _curl(o.url(f"/bytes/{n}"))
    assert r.returncode == 0, r.stderr
    assert len(r.stdout) == n
    assert hashlib.sha256(r.stdout).digest() == hashlib.sha256(_pattern(n)).digest()
    with _h2() as c:
        r = c.get(o.url("/bytes/100000"))
        assert r.http_version == "HTTP/2"
        assert r.headers["content-length"] == "100000"
        assert r.content == _pattern(100_000)
        r = c.head(o.url("/bytes/1000"))
        assert r.headers["content-length"] == "1000"
        assert r.content == b""


def test_echo_3mb_sized_and_streamed(h2origin):
    o = h2origin()
    body = _pattern(3 * 1024 * 1024 + 11)[::-1]
    with _h2() as c:
        r = c.post(o.url("/echo"), content=body)
        assert r.status_code == 200
        assert "content-length" not in r.headers
        assert r.content == body

        def gen():
            for i in range(0, len(body), 100_000):
                yield body[i:i + 100_000]

        r = c.post(o.url("/echo"), content=gen())
        assert r.content == body
    # both on the one connection httpx kept
    assert [(d["conn"], d["stream"]) for d in o.records("request")] == [("1", "1"), ("1", "3")]


def test_echo_acknowledges_only_what_it_echoed(h2origin):
    """Backpressure: with the client's receive window full, the origin stops echoing and so
    stops granting the client send window (WINDOW_UPDATE) for what it has not echoed."""
    o = h2origin()
    c = RawH2(o.port, window=65536)  # stream and connection receive windows of 64 KiB
    try:
        c.request(1, "/echo", end=False)
        echoed = 0
        granted = {0: 0, 1: 0}  # WINDOW_UPDATE increments from the origin: connection, stream

        def read(seconds: float) -> None:  # frames without RawH2's automatic WINDOW_UPDATEs
            nonlocal echoed
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                c.sock.settimeout(left)
                try:
                    data = c.sock.recv(65536)
                except TimeoutError:
                    return
                assert data, "the origin closed the connection"
                c.buf += data
                while (f := c._frame()) is not None:
                    if isinstance(f, DataFrame) and f.stream_id == 1:
                        echoed += len(f.data)
                    elif isinstance(f, WindowUpdateFrame) and f.stream_id in granted:
                        granted[f.stream_id] += f.window_increment

        def send(data: bytes) -> None:  # in frames of at most 16 KiB (SETTINGS_MAX_FRAME_SIZE)
            for i in range(0, len(data), 16384):
                c.data(1, data[i:i + 16384])

        send(b"a" * 60_000)
        read(0.5)
        assert echoed == 60_000
        assert 0 < granted[1] <= echoed and 0 < granted[0] <= echoed
        # As much as the origin's windows allow now; only 5536 more fit our receive window.
        more = 65535 - 60_000 + min(granted.values())
        assert more > 5536
        send(b"b" * more)
        read(0.5)
        assert echoed == 65_536
        assert granted[1] <= echoed and granted[0] <= echoed
        before = dict(granted)
        read(0.3)
        assert granted == before  # nothing more granted while the echo is stuck
        c.send(WindowUpdateFrame(0, window_increment=1 << 20).serialize()
               + WindowUpdateFrame(1, window_increment=1 << 20).serialize())
        c.data(1, b"", end=True)
        read(0.5)
        assert echoed == 60_000 + more
        assert granted[0] > before[0]  # acknowledged once echoed
    finally:
        c.close()


def test_trailers_interim_and_statuses(h2origin):
    o = h2origin()
    r = _curl("-D", "-", "-o", "/dev/null", "-w", "%{size_download}", o.url("/trailers"))
    assert r.returncode == 0, r.stderr
    assert b"trailer: x-checksum" in r.stdout
    assert b"x-checksum: " in r.stdout  # the trailer, after the body
    r2 = _curl(o.url("/trailers"))
    digest = hashlib.sha256(r2.stdout).hexdigest()
    assert f"x-checksum: {digest}".encode() in r.stdout

    r = _curl("-i", o.url("/interim"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(b"HTTP/2 103")
    assert b"link: </a>; rel=preload" in r.stdout
    assert b"HTTP/2 200" in r.stdout and r.stdout.endswith(b"interim done\n")

    with _h2() as c:
        r = c.get(o.url("/status/204"))
        assert r.status_code == 204 and r.content == b""
        r = c.get(o.url("/status/503"))
        assert r.status_code == 503 and r.content == b"status 503\n"
        assert c.get(o.url("/slow/50")).text == "slow\n"
        assert c.get(o.url("/no/such/thing")).text == "hello from h2 origin\n"


def test_headers_echoes_the_request_fields(h2origin):
    o = h2origin()
    with _h2() as c:
        r = c.get(o.url("/headers?q=1"), headers={"x-custom": "yes"})
    pairs = r.json()
    assert [n for n, _ in pairs[:4]] == [":method", ":authority", ":scheme", ":path"]
    doc = dict(pairs)
    assert doc[":method"] == "GET"
    assert doc[":path"] == "/headers?q=1"
    assert doc[":authority"] == o.addr
    assert doc[":scheme"] == "http"
    assert doc["x-custom"] == "yes"


@pytest.mark.parametrize(("path", "code"), [("/refuse", REFUSED_STREAM),
                                            ("/reset", INTERNAL_ERROR)])
def test_refuse_and_reset_are_stream_errors(h2origin, path, code):
    o = h2origin()
    with _h2() as c:
        with pytest.raises(httpx.RemoteProtocolError, match=f"error_code:{code}"):
            c.get(o.url(path))
        assert c.get(o.url("/")).status_code == 200  # the connection lives on
    r = _curl(o.url(path))
    assert r.returncode != 0


def test_reset_after_head_close_and_malformed(h2origin):
    o = h2origin()
    c = RawH2(o.port)
    try:
        c.request(1, "/reset-after-head")
        assert c.wait(lambda: c.done(1))
        s = c.streams[1]
        assert s.status == 200 and len(s.body) == 1000 and s.reset == INTERNAL_ERROR
        c.request(3, "/malformed")
        assert c.wait(lambda: c.done(3))
        assert ("connection", "close") in c.streams[3].headers
        c.request(5, "/close")
        assert c.wait(lambda: c.eof)
        assert not c.done(5)
    finally:
        c.close()
    assert _curl(o.url("/malformed")).returncode != 0  # curl rejects the field
    assert o.wait_line("closed conn=1 streams=3")


def test_goaway_path_finishes_earlier_streams_only(h2origin):
    o = h2origin()
    c = RawH2(o.port)
    try:
        c.request(1, "/slow/300")
        c.request(3, "/slow/300")
        c.request(5, "/goaway")
        assert c.wait(lambda: bool(c.goaways))
        assert c.goaways == [(3, NO_ERROR)]
        c.request(7, "/")  # above the last id: ignored
        assert c.wait(lambda: c.eof, 3)
        assert c.streams[1].status == 200 and c.streams[3].status == 200
        assert c.streams[5].status is None and c.streams[7].status is None
    finally:
        c.close()
    assert o.wait_line("closed conn=1 streams=4")
    assert o.lines("goaway-sent") == ["goaway-sent conn=1 last=3 code=0"]
    assert o.records("ignored") == [{"conn": "1", "stream": "7", "method": "GET", "path": "/"}]


def test_drain_path_two_goaways_on_every_connection(h2origin):
    o = h2origin()
    busy, trigger = RawH2(o.port), RawH2(o.port)
    try:
        busy.request(1, "/slow/500")
        assert o.wait_line("request conn=1 stream=1")
        trigger.request(1, "/drain")
        assert trigger.wait(lambda: trigger.done(1))
        assert bytes(trigger.streams[1].body) == b"draining\n"
        assert busy.wait(lambda: len(busy.goaways) >= 1)
        busy.request(3, "/slow/50")  # after the first GOAWAY: still served
        assert busy.wait(lambda: busy.eof, 3)
        assert busy.goaways == [(MAX_ID, NO_ERROR), (3, NO_ERROR)]
        assert busy.streams[1].status == 200 and busy.streams[3].status == 200
        assert trigger.wait(lambda: trigger.eof, 3)
        assert trigger.goaways == [(MAX_ID, NO_ERROR), (1, NO_ERROR)]
    finally:
        busy.close()
        trigger.close()
    assert o.wait_line("closed ", 2)
    with _h2() as c:  # new connections are still served
        assert c.get(o.url("/")).status_code == 200


def test_drain_under_load_with_a_goaway_aware_client(h2origin):
    """What lameduck's upstream pool must do, done by tests/h2pool.py: 20 workers on one
    multiplexed connection, the origin drains, and not one request fails; the client opened no
    stream after the first GOAWAY late enough to be left above the final last-stream-id."""
    o = h2origin()

    async def run() -> tuple[list[int], H2Pool]:
        pool = H2Pool(o.port)
        statuses: list[int] = []
        until = time.monotonic() + 1.5

        async def worker() -> None:
            for _ in range(60):
                if time.monotonic() >= until:
                    return
                statuses.append((await pool.get("/slow/30", attempts=1))[0])

        workers = [asyncio.create_task(worker()) for _ in range(20)]
        await asyncio.sleep(0.4)
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--http2-prior-knowledge", "--max-time", "5", o.url("/drain"),
            stdout=asyncio.subprocess.PIPE)
        assert (await proc.communicate())[0] == b"draining\n"
        await asyncio.gather(*workers)
        await pool.close()
        return statuses, pool

    statuses, pool = asyncio.run(run())
    assert len(statuses) >= 200 and set(statuses) == {200}
    assert pool.connections == 2 and pool.retries == 0
    assert o.wait_line("closed conn=1 ")  # the pool's first connection, drained
    assert o.lines("ignored") == []
    # the first GOAWAY; the pool lets go of the connection once idle, maybe before the second
    assert o.lines("goaway-sent conn=1 ")[0] == f"goaway-sent conn=1 last={MAX_ID} code=0"


def test_client_goaway_logged_and_in_flight_finished(h2origin):
    o = h2origin()
    c = RawH2(o.port)
    try:
        c.request(1, "/slow/200")
        assert o.wait_line("request ")
        c.send(GoAwayFrame(0, last_stream_id=0, error_code=NO_ERROR).serialize())
        assert c.wait(lambda: c.eof, 3)
        assert c.streams[1].status == 200 and bytes(c.streams[1].body) == b"slow\n"
    finally:
        c.close()
    assert o.wait_line("closed ")
    assert o.lines("goaway-received") == ["goaway-received conn=1 last=0 code=0"]


def test_settings_flags_and_max_streams_refusal(h2origin):
    o = h2origin(max_streams=2, window=1_000_000)
    c = RawH2(o.port)
    try:
        for sid in (1, 3, 5):
            c.request(sid, "/slow/300")
        assert c.wait(lambda: all(c.done(s) for s in (1, 3, 5)))
        assert c.streams[5].reset == REFUSED_STREAM
        assert c.streams[1].status == 200 and c.streams[3].status == 200
        settings = next(f for f in c.frames if isinstance(f, SettingsFrame)
                        and "ACK" not in f.flags)
        assert settings.settings[SettingsFrame.MAX_CONCURRENT_STREAMS] == 2
        assert settings.settings[SettingsFrame.INITIAL_WINDOW_SIZE] == 1_000_000
        conn_updates = [f.window_increment for f in c.frames
                        if isinstance(f, WindowUpdateFrame) and f.stream_id == 0]
        assert conn_updates[:1] == [1_000_000 - 65535]
    finally:
        c.close()
    assert [d["stream"] for d in o.records("refused")] == ["5"]


def test_sigterm_drains_then_exits(h2origin):
    o = h2origin()
    c = RawH2(o.port)
    try:
        c.request(1, "/slow/300")
        assert o.wait_line("request ")
        o.signal(signal.SIGTERM)
        assert c.wait(lambda: c.eof, 3)
        assert c.goaways == [(MAX_ID, NO_ERROR), (1, NO_ERROR)]
        assert c.streams[1].status == 200
    finally:
        c.close()
    assert o.proc.wait(timeout=6) == 0
    assert o.wait_line("exit")
