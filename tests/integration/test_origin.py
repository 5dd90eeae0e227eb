"""The demo origin, run as a real process, checked with httpx and raw sockets.

Raw sockets are used wherever framing matters (pipelining, HEAD, close-delimited bodies),
since httpx would hide exactly what these tests need to see.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.procs import SRC, Origin, start_named_origin, start_origin, stop, wait_until

PATTERN = bytes(range(251))


def pattern(n: int) -> bytes:
    return (PATTERN * (n // 251 + 1))[:n]


@pytest.fixture
def port(origin: tuple[subprocess.Popen, int]) -> int:
    return origin[1]


@pytest.fixture
def base(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(f: IO[bytes], head: bool = False) -> tuple[int, list[tuple[str, str]], bytes]:
    """Read one response off a socket file: status, headers (lower-cased names), body."""
    status_line = f.readline()
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    status = int(status_line.split()[1])
    headers: list[tuple[str, str]] = []
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip().lower(), value.strip()))
    h = dict(headers)
    if head or status in (204, 304) or 100 <= status < 200:
        return status, headers, b""
    if h.get("transfer-encoding") == "chunked":
        body = b""
        while (size := int(f.readline().split(b";")[0], 16)) != 0:
            body += f.read(size)
            assert f.read(2) == b"\r\n"
        assert f.readline() == b"\r\n"
        return status, headers, body
    if "content-length" in h:
        return status, headers, f.read(int(h["content-length"]))
    return status, headers, f.read()


def read_response_head(f: IO[bytes]) -> tuple[int, list[tuple[str, str]], None]:
    status = int(f.readline().split()[1])
    headers = []
    while (line := f.readline()) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip().lower(), value.strip()))
    return status, headers, None


def test_root(base: str, port: int) -> None:
    r = httpx.get(base + "/")
    assert r.status_code == 200
    assert r.text == "hello from the lameduck demo origin\n"
    assert r.headers["content-type"].startswith("text/plain")
    assert r.headers["content-length"] == "36"
    assert r.headers["server"] == "lameduck-demo"
    assert r.headers["x-origin-port"] == str(port)


def test_keep_alive_reuses_connection(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        for path in ("/", "/status/404", "/"):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            status, headers, _ = read_response(f)
            assert status == (404 if "404" in path else 200)
            assert ("connection", "close") not in headers


def test_pipelined_requests_answered_in_order(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        # The slow one goes first: later, faster answers must wait their turn.
        sock.sendall(
            b"GET /sleep?ms=100 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        )
        assert read_response(f)[::2] == (200, b"slept 100 ms\n")
        assert read_response(f)[::2] == (200, b"hello from the lameduck demo origin\n")
        assert read_response(f)[::2] == (200, b"hello")


def test_head_has_get_length_but_no_body(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(f, head=True)
        assert status == 200
        assert dict(headers)["content-length"] == "36"
        sock.sendall(b"HEAD /bytes?n=123456 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(f, head=True)
        assert dict(headers)["content-length"] == "123456"
        # Any stray body bytes would be misread as this response's status line.
        sock.sendall(b"GET /status/503 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(f)[0] == 503


def test_chunked_echo(base: str) -> None:
    parts = [b"a" * 1000, b"b" * 70000, b"c"]
    r = httpx.post(base + "/echo", content=iter(parts))
    assert r.status_code == 200
    assert r.headers["transfer-encoding"] == "chunked"
    assert r.content == b"".join(parts)


def test_content_length_echo_5mb(base: str) -> None:
    body = os.urandom(5 * 1024 * 1024)
    r = httpx.put(base + "/echo", content=body, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-length"] == str(len(body))
    assert r.content == body


def test_large_echo_with_concurrent_reader(port: int) -> None:
    size = 40 * 1024 * 1024
    got = hashlib.sha256()
    received = 0

    with connect(port, timeout=10) as sock, sock.makefile("rb") as f:

        def reader() -> None:
            nonlocal received
            status, headers, _ = read_response_head(f)
            assert status == 200 and dict(headers)["content-length"] == str(size)
            while received < size:
                chunk = f.read1(1 << 20)
                assert chunk
                got.update(chunk)
                received += len(chunk)

        t = threading.Thread(target=reader)
        t.start()
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        block = pattern(1 << 20)
        for _ in range(size // len(block)):
            sock.sendall(block)
        t.join(10)
    assert received == size
    assert got.hexdigest() == hashlib.sha256(block * (size // len(block))).hexdigest()


def test_echo_stops_reading_when_client_does_not_read(port: int) -> None:
    """A client that uploads without reading gets stalled instead of buffered whole."""
    size = 256 * 1024 * 1024
    sent = 0
    with connect(port, timeout=0.5) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        block = bytes(1 << 20)
        with pytest.raises(TimeoutError):
            while sent < size:
                sent += sock.send(block)
    assert sent < 128 * 1024 * 1024


def test_stream(base: str) -> None:
    t0 = time.monotonic()
    with httpx.stream("GET", base + "/stream?chunks=5&size=100&interval_ms=20") as r:
        assert r.headers["transfer-encoding"] == "chunked"
        body = r.read()
    assert body == b"x" * 500
    assert time.monotonic() - t0 >= 0.08


def test_stream_defaults_framing(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /stream?interval_ms=0 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_response(f)
        assert status == 200 and len(body) == 10 * 1024


def test_bytes_10mb_integrity(base: str) -> None:
    n = 10_000_000
    digest = hashlib.sha256()
    with httpx.stream("GET", base + f"/bytes?n={n}", timeout=10) as r:
        assert r.headers["content-length"] == str(n)
        for chunk in r.iter_raw():
            digest.update(chunk)
    assert digest.hexdigest() == hashlib.sha256(pattern(n)).hexdigest()


def test_close_delimited(port: int) -> None:
    n = 300_000
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /close-delimited?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
        status, headers, body = read_response(f)  # reads to EOF
    names = dict(headers)
    assert status == 200
    assert "content-length" not in names and "transfer-encoding" not in names
    assert body == pattern(n)


def test_status(base: str) -> None:
    r = httpx.get(base + "/status/503")
    assert r.status_code == 503 and r.text == "status 503\n"
    r = httpx.get(base + "/status/204")
    assert r.status_code == 204 and r.content == b""
    assert httpx.get(base + "/nope").status_code == 404


def test_headers_reports_request(base: str) -> None:
    r = httpx.get(
        base + "/headers?a=1", headers={"X-Forwarded-For": "1.2.3.4", "X-Mixed-Case": "Yes"}
    )
    doc = r.json()
    assert doc["method"] == "GET"
    assert doc["path"] == "/headers"
    assert doc["query"] == "a=1"
    assert doc["http_version"] == "1.1"
    assert ["x-forwarded-for", "1.2.3.4"] in doc["headers"]
    assert ["x-mixed-case", "Yes"] in doc["headers"]


def test_info(origin: tuple[subprocess.Popen, int], base: str) -> None:
    proc, port = origin
    first = httpx.get(base + "/info").json()
    second = httpx.get(base + "/info").json()
    assert first["pid"] == proc.pid and first["port"] == port
    assert second["requests"] > first["requests"]


def test_sleep_does_not_block_other_connections(base: str) -> None:
    async def run() -> float:
        async with httpx.AsyncClient() as client:
            t0 = time.monotonic()
            rs = await asyncio.gather(
                client.get(base + "/sleep?ms=3000"), client.get(base + "/sleep?ms=3000")
            )
            elapsed = time.monotonic() - t0
        assert [r.text for r in rs] == ["slept 3000 ms\n"] * 2
        return elapsed

    elapsed = asyncio.run(run())
    # side by side (3 s), not one after the other (6 s): a margin of 2.5 s for a loaded machine
    assert 3.0 <= elapsed < 5.5


def test_reset_is_a_connection_error(base: str) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(base + "/reset")


def test_partial_body_is_cut(base: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(base + "/partial?n=1000")


def test_hang_never_answers(base: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(base + "/hang", timeout=0.2)


def test_close_endpoint_and_http10(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(f)
        assert status == 200 and ("connection", "close") in headers
        assert f.read() == b""
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert read_response(f)[0] == 200
        assert f.read() == b""


def test_expect_100_continue(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"
        )
        assert f.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert f.readline() == b"\r\n"
        sock.sendall(b"abc")
        assert read_response(f)[::2] == (200, b"abc")


def test_garbage_gets_400_and_close(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"\x00\x01 this is not http\r\n\r\n")
        status, headers, _ = read_response(f)
        assert status == 400 and ("connection", "close") in headers
        assert f.read() == b""


def test_sigterm_exits_zero() -> None:
    proc, port = start_origin()
    try:
        # An idle keep-alive connection must not hold up the exit.
        with connect(port) as sock, sock.makefile("rb") as f:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(f)[0] == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
    finally:
        stop(proc)


def test_info_json_is_valid_over_http10(port: int) -> None:
    with connect(port) as sock, sock.makefile("rb") as f:
        sock.sendall(b"GET /info HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = read_response(f)
        assert status == 200
        assert ("connection", "keep-alive") in headers
        assert json.loads(body)["port"] == port


def test_serve_in_process_on_plain_asyncio() -> None:
    """`lameduck run` embeds the origin via serve()/shutdown(); also covers the non-uvloop path."""
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))
    from lameduck.demo import origin as demo

    async def run() -> None:
        server = await demo.serve("127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            r = await client.get("/")
            assert r.headers["x-origin-port"] == str(port)
            r = await client.post("/echo", content=b"z" * 300_000)
            assert r.content == b"z" * 300_000
            slow = asyncio.ensure_future(client.get("/sleep?ms=100"))
            # shut down once the origin has the request (not after a guessed 30 ms, which a
            # loaded machine outlives before the request is even sent)
            state = demo._STATES[server]
            for _ in range(2000):
                if any(c._active is not None for c in state.connections):
                    break
                await asyncio.sleep(0.005)
            await demo.shutdown(server, grace=2.0)
            r = await slow  # in flight at shutdown: still answered, then closed
            assert r.text == "slept 100 ms\n" and r.headers["connection"] == "close"

    asyncio.run(run())


# -- options for load-balancing tests: --name, /health, --log, --agent-port ---------------------

Origins = Callable[..., list[Origin]]


def agent_raw(port: int, send: bytes = b"") -> bytes:
    """Everything the agent port sends before it closes (after sending ``send`` first)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        if send:
            sock.sendall(send)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    return data


def test_name_on_every_response_and_in_info(origins: Origins) -> None:
    o1, o2 = origins(2)
    assert (o1.name, o2.name) == ("o1", "o2")
    for o in (o1, o2):
        r = o.get("/")
        assert r.status_code == 200 and r.text == "hello from the lameduck demo origin\n"
        assert r.headers["x-origin"] == o.name
        assert r.headers["x-origin-port"] == str(o.port)
        info = o.get("/info").json()
        assert info["name"] == o.name and info["pid"] == o.pid and info["port"] == o.port
    # Every kind of answer carries it: sized, chunked, errors, bodiless, HEAD, pipelined.
    with connect(o1.port) as sock, sock.makefile("rb") as f:
        sock.sendall(
            b"GET /stream?chunks=2&size=3&interval_ms=0 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /status/503 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /status/204 HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
            b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        )
        for want in (200, 503, 204, 404, 200, 200):
            status, headers, _ = read_response(f)
            assert status == want
            assert headers.count(("x-origin", "o1")) == 1, headers
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(f, head=True)
        assert ("x-origin", "o1") in headers


def test_no_name_no_x_origin(base: str) -> None:
    r = httpx.get(base + "/")
    assert "x-origin" not in r.headers
    assert "name" not in httpx.get(base + "/info").json()


def test_bad_name_is_refused() -> None:
    for bad in ("a b", "", "caf\u00e9"):
        r = subprocess.run(
            [sys.executable, "-m", "lameduck.demo", "--port", "0", "--name", bad],
            env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True, timeout=10,
        )
        assert r.returncode == 2 and b"--name" in r.stderr, r


def test_health_toggles(origins: Origins) -> None:
    o1, o2 = origins(2)
    r = o1.get("/health")
    assert (r.status_code, r.text) == (200, "ok\n")
    assert "x-envoy-immediate-health-check-fail" not in r.headers

    r = o1.post("/health/fail")
    assert r.status_code == 200
    r = o1.get("/health")
    assert (r.status_code, r.text) == (503, "failing\n")
    assert r.headers["x-origin"] == "o1"
    assert "x-envoy-immediate-health-check-fail" not in r.headers
    assert o2.get("/health").status_code == 200  # the state is per process

    assert o1.post("/health/fail?immediate=1").status_code == 200
    r = o1.get("/health")
    assert (r.status_code, r.text) == (503, "failing\n")
    assert r.headers["x-envoy-immediate-health-check-fail"] == "true"
    with connect(o1.port) as sock, sock.makefile("rb") as f:  # HEAD: same head, no body
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(f, head=True)
        assert status == 503
        assert ("x-envoy-immediate-health-check-fail", "true") in headers
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(f)[::2] == (503, b"failing\n")

    assert o1.post("/health/fail?immediate=0").status_code == 200
    r = o1.get("/health")
    assert r.status_code == 503 and "x-envoy-immediate-health-check-fail" not in r.headers

    assert o1.post("/health/ok").status_code == 200
    r = o1.get("/health")
    assert (r.status_code, r.text) == (200, "ok\n")
    assert "x-envoy-immediate-health-check-fail" not in r.headers

    # Only POST changes it; other routes are untouched by it.
    r = o1.get("/health/fail")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert o1.get("/health").status_code == 200
    o1.post("/health/fail")
    assert o1.get("/").status_code == 200
    o1.post("/health/ok")


def test_request_log(origins: Origins) -> None:
    (o1,) = origins(1, log=True)
    assert o1.log_path is not None and o1.log_path.name == "o1.log"
    o1.get("/")
    httpx.get(o1.url("/sleep?ms=1"), headers={"X-Request-Id": "abc-123"}, timeout=5)
    httpx.post(o1.url("/echo"), content=b"body", headers={"x-request-id": "r2"}, timeout=5)
    with connect(o1.port) as sock, sock.makefile("rb") as f:  # absolute-form: logged origin-form
        sock.sendall(b"GET http://x/status/404?q=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(f)[0] == 404
    assert o1.log_lines() == [
        "GET / -",
        "GET /sleep?ms=1 abc-123",
        "POST /echo r2",
        "GET /status/404?q=1 -",
    ]


def test_request_log_written_before_answer_and_survives_sigkill(origins: Origins) -> None:
    o1, o2 = origins(2, log=True)
    with connect(o1.port) as a, connect(o1.port) as b:
        # Neither is ever answered: one hangs, the other's body never comes.
        a.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\nX-Request-ID: hung-1\r\n\r\n")
        b.sendall(b"POST /continue HTTP/1.1\r\nHost: x\r\nx-request-id: slow-2\r\n"
                  b"Content-Length: 10\r\n\r\n12")
        assert wait_until(lambda: len(o1.log_lines()) == 2, timeout=5)
        o1.kill()
        assert not o1.alive
    assert sorted(o1.log_lines()) == ["GET /hang hung-1", "POST /continue slow-2"]
    assert o1.log_path is not None and o1.log_path.read_bytes().endswith(b"\n")
    assert o2.alive and o2.log_lines() == []  # each origin has its own log


def test_request_log_appends(tmp_path: Path) -> None:
    log = tmp_path / "shared.log"
    log.write_text("earlier\n")
    proc, port = start_origin(args=("--log", str(log)))
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert log.read_text() == "earlier\nGET / -\nGET /health -\n"
    finally:
        stop(proc)


def test_agent_port(origins: Origins) -> None:
    o1, o2 = origins(2, agent=True)
    assert o1.agent_port is not None and o1.agent_port not in (o1.port, o2.agent_port)
    assert agent_raw(o1.agent_port) == b"ready up 100%\n"
    # An agent-send string from the checker is read and ignored.
    assert agent_raw(o1.agent_port, send=b"hello\n") == b"ready up 100%\n"
    assert o1.get("/agent").text == "ready up 100%\n"
    for say, quoted in [
        ("drain", "drain"),
        ("maint", "maint"),
        ("down#bad disk", "down%23bad%20disk"),
        ("up 50%", "up+50%25"),
        ("50%", "50%25"),
        ("maxconn:10", "maxconn%3A10"),
        ("ready up 100%", "ready%20up%20100%25"),
    ]:
        r = o1.post(f"/agent?say={quoted}")
        assert (r.status_code, r.text) == (200, say + "\n")
        assert o1.agent() == say
        assert o1.get("/agent").text == say + "\n"
    o1.post("/agent?say=drain")
    assert o2.agent() == "ready up 100%"  # per process
    # Bad requests leave the text as it was.
    for bad in ("/agent", "/agent?other=1", "/agent?say=a%0Ab", "/agent?say=" + "x" * 600):
        assert o1.post(bad).status_code == 400, bad
    assert httpx.put(o1.url("/agent?say=x"), timeout=5).status_code == 405
    assert o1.agent() == "drain"
    # Many checkers at once each get the whole line.
    async def many() -> list[bytes]:
        async def one() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", o1.agent_port)
            data = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return data

        return await asyncio.gather(*(one() for _ in range(50)))

    assert asyncio.run(many()) == [b"drain\n"] * 50


def test_agent_say_option_and_sigterm() -> None:
    o = start_named_origin("x", agent=True, args=("--agent-say", "maint"))
    try:
        assert o.agent() == "maint"
        assert o.get("/").headers["x-origin"] == "x"
        o.signal(signal.SIGTERM)
        assert o.proc.wait(timeout=5) == 0
        assert "Traceback" not in o.stderr()
    finally:
        o.close()


def test_no_agent_port_without_option(origins: Origins) -> None:
    (o1,) = origins(1)
    assert o1.agent_port is None
    assert o1.get("/agent").text == "ready up 100%\n"  # the text exists, nobody serves it
