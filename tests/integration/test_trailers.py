"""Trailers end to end, through every client/origin protocol pair, as curl sees them.

Response trailers: HTTP/1.1 chunked → HTTP/1.1 (to a client that sent ``TE: trailers``) and
→ HTTP/2; HTTP/2 → HTTP/2, and → HTTP/1.1 as chunked trailers. Request trailers likewise, and
``te: trailers`` reaches an HTTP/2 upstream (gRPC servers refuse a request without it).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.capture import CaptureOrigin
from tests.h2raw import RawH2
from tests.procs import H2Origin, Lameduck, RawConn, base_config, wait_until

CHUNKED_WITH_TRAILERS = (
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum, grpc-status\r\n\r\n"
    b"5\r\nhello\r\n0\r\nx-checksum: abc\r\ngrpc-status: 0\r\n\r\n")


def curl(*args: str) -> str:
    """curl's header dump: the head, then the trailers after the blank line."""
    r = subprocess.run(["curl", "-sS", "--max-time", "10", "-D", "-", "-o", "/dev/null", *args],
                       capture_output=True, text=True, check=True)
    return r.stdout.replace("\r\n", "\n")


def trailers_of(dump: str) -> dict[str, str]:
    after = dump.split("\n\n", 1)[1] if "\n\n" in dump else ""
    return {n.strip().lower(): v.strip()
            for n, _, v in (ln.partition(":") for ln in after.splitlines() if ":" in ln)}


@pytest.fixture
def h1_origin() -> Iterator[CaptureOrigin]:
    o = CaptureOrigin(lambda head: CHUNKED_WITH_TRAILERS)
    yield o
    o.close()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[[int, bool], Lameduck]]:
    made: list[Lameduck] = []

    def make(port: int, h2: bool) -> Lameduck:
        cfg = base_config(port, cluster={"protocol": "h2"} if h2 else {})
        ld = Lameduck(cfg, tmp_path).start()
        made.append(ld)
        return ld

    yield make
    for ld in made:
        ld.kill()
        assert "Traceback" not in ld.log(), ld.log()


@pytest.mark.parametrize("client", ["http1.1+te", "http1.1", "h2"])
def test_trailers_from_an_http1_origin(
    h1_origin: CaptureOrigin, started: Callable[[int, bool], Lameduck], client: str,
) -> None:
    ld = started(h1_origin.port, False)
    args = {"http1.1+te": ["--http1.1", "-H", "TE: trailers"], "http1.1": ["--http1.1"],
            "h2": ["--http2-prior-knowledge"]}[client]
    got = trailers_of(curl(*args, ld.url("/t")))
    if client == "http1.1":
        assert got == {}  # it did not say it takes them (RFC 9110 §6.5.1)
    else:
        assert got == {"x-checksum": "abc", "grpc-status": "0"}


@pytest.mark.parametrize("client", ["http1.1+te", "http1.1", "h2"])
def test_trailers_from_an_h2_origin(
    h2origin: Callable[..., H2Origin], started: Callable[[int, bool], Lameduck], client: str,
) -> None:
    origin = h2origin()
    ld = started(origin.port, True)
    args = {"http1.1+te": ["--http1.1", "-H", "TE: trailers"], "http1.1": ["--http1.1"],
            "h2": ["--http2-prior-knowledge"]}[client]
    got = trailers_of(curl(*args, ld.url("/trailers")))
    if client == "http1.1":
        assert got == {}
    else:
        assert set(got) == {"x-checksum"} and len(got["x-checksum"]) == 64


def test_request_trailers_reach_an_http1_origin_byte_for_byte(
    h1_origin: CaptureOrigin, started: Callable[[int, bool], Lameduck],
) -> None:
    """From an HTTP/1.1 chunked body and from HTTP/2 trailers alike; a field a trailer may not
    carry (Content-Type) is dropped, not merged."""
    ld = started(h1_origin.port, False)
    conn = RawConn(ld.addr)
    conn.sock.sendall(b"POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"3\r\nabc\r\n0\r\nX-Sum: 1\r\nContent-Type: x\r\n\r\n")
    assert conn.read_response().status == 200
    conn.close()
    c = RawH2(ld.port)
    c.request(1, "/up2", method="POST", end=False)
    c.data(1, b"xyz")
    c.send_trailers(1, [("x-sum", "2")])
    assert c.wait(lambda: c.done(1)) and c.streams[1].status == 200
    c.close()
    assert wait_until(lambda: len(h1_origin.requests) == 2, 5)
    h1, h2 = h1_origin.requests
    assert h1.endswith(b"\r\n\r\n3\r\nabc\r\n0\r\nx-sum: 1\r\n\r\n")
    assert h2.startswith(b"POST /up2 HTTP/1.1\r\n") and b"transfer-encoding: chunked" in h2
    assert h2.endswith(b"\r\n\r\n3\r\nxyz\r\n0\r\nx-sum: 2\r\n\r\n")


def test_te_trailers_reaches_an_h2_origin(
    h2origin: Callable[..., H2Origin], started: Callable[[int, bool], Lameduck],
) -> None:
    origin = h2origin()
    ld = started(origin.port, True)
    for args in (["--http2-prior-knowledge", "-H", "te: trailers"],
                 ["--http1.1", "-H", "TE: trailers"]):
        r = subprocess.run(["curl", "-sS", "--max-time", "10", *args, ld.url("/headers")],
                           capture_output=True, check=True)
        fields = [tuple(f) for f in json.loads(r.stdout)]
        assert ("te", "trailers") in fields
        assert all(n != "connection" for n, _ in fields)
