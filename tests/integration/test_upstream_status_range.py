"""An upstream status outside 100-599 (RFC 9110 §15: a status code is three digits, 100 to 599)
is no HTTP response: as Envoy, an upstream protocol error — 502 to the client, flagged UPE in
the access log, counted as the cluster's upstream_cx_protocol_error and upstream_rq_5xx —
for an HTTP/1.1 client and an HTTP/2 one alike, never the status relayed (or mapped to another
one: HTTP/2's ``:status`` came from a table indexed by status - 100).

The origin is a raw socket that answers each request with the status line its path names.
llhttp (the HTTP/1 upstream's parser) passes any three digits: 099 and 000 as interim
responses, 600 and 999 as final ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture import CaptureOrigin, echo_request_line
from tests.procs import Lameduck, base_config, wait_until

STATUSES = ["099", "000", "600", "999"]


def respond(head: bytes) -> bytes:
    """``/status/NNN``: ``HTTP/1.1 NNN X`` with a short body; anything else: a 200."""
    path = head.split(b" ", 2)[1]
    if path.startswith(b"/status/"):
        return b"HTTP/1.1 %s X\r\ncontent-length: 2\r\n\r\nhi" % path[8:11]
    return echo_request_line(head)


@pytest.fixture(scope="module")
def origin() -> Iterator[CaptureOrigin]:
    o = CaptureOrigin(respond)
    try:
        yield o
    finally:
        o.sock.close()


@pytest.fixture(scope="module")
def proxy(origin: CaptureOrigin, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Lameduck, Path]]:
    tmp = tmp_path_factory.mktemp("status-range")
    log = tmp / "access.jsonl"
    cfg = base_config(origin.port, listener={"access_log": {"path": str(log), "format": "json"}})
    ld = Lameduck(cfg, tmp).start()
    try:
        yield ld, log
    finally:
        ld.kill()
    assert "Traceback" not in ld.log(), ld.log()


def line_for(log: Path, path: str) -> dict[str, Any] | None:
    if not log.exists():
        return None
    for raw in log.read_text().splitlines():
        line = json.loads(raw)
        if line.get("path") == path:
            return line
    return None


@pytest.mark.parametrize("version", ["http1", "http2"])
@pytest.mark.parametrize("status", STATUSES)
def test_a_status_outside_100_599_is_a_502_upe(proxy: tuple[Lameduck, Path], status: str,
                                              version: str) -> None:
    ld, log = proxy
    path = f"/status/{status}?{version}"
    before = ld.stats()
    h2 = version == "http2"
    with httpx.Client(http1=not h2, http2=h2, timeout=10) as client:
        r = client.get(f"http://{ld.addr}{path}")
        assert r.http_version == ("HTTP/2" if h2 else "HTTP/1.1")
        assert r.status_code == 502, (r.status_code, r.content, ld.log())
        assert r.content != b"hi"
        # the proxy still serves: the next request gets the origin's answer
        assert client.get(f"http://{ld.addr}/ok").status_code == 200
    assert wait_until(lambda: line_for(log, path) is not None, timeout=10), ld.log()
    line = line_for(log, path)
    assert line is not None
    assert (line["response_code"], line["response_flags"]) == (502, "UPE"), line
    after = ld.stats()
    for name in ("cluster.app.upstream_cx_protocol_error", "cluster.app.upstream_rq_5xx"):
        assert after.get(name, 0) - before.get(name, 0) == 1, (name, after.get(name))
