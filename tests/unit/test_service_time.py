"""``x-envoy-upstream-service-time``: Envoy's router adds it to every response it proxies, the
ms from the request sent upstream to the response head (Envoy's HTTP header docs), unless
``suppress_envoy_headers``; in place of one the upstream sent. Played through the real
HTTP/1.1 upstream (its whole-response fast path and its parser's path) to HTTP/1.1 and
HTTP/2 clients on the fake clock, and read back by the access log's default line."""

from __future__ import annotations

from pathlib import Path

import hpack
import pytest

from lameduck.http1.downstream import H1Downstream
from lameduck.http2.downstream import H2Downstream
from lameduck.proxy import exchange
from lameduck.proxy.accesslog import AccessLog, LogFile
from tests.drainplay import ScriptedRng
from tests.unit.test_downstream_playbook import H2_PREFACE, Listener, accept, frames, headers
from tests.unit.test_h2_whole_response import GET_X

NGINX = (b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/plain\r\n"
         b"Content-Length: 6\r\nConnection: keep-alive\r\n%s\r\nhello\n")
OWN = b"X-Envoy-Upstream-Service-Time: 999\r\n"  # an upstream's own (another Envoy's)


def _client(ls: Listener, proto: str) -> tuple[object, object]:
    conn = (H1Downstream if proto == "http1" else H2Downstream)(ls)
    t = accept(ls, conn)
    if proto == "http1":
        conn.data_received(b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n")
    else:
        conn.data_received(H2_PREFACE + headers(1, GET_X))
    t.take()
    return conn, t


def _head(t: object, proto: str) -> dict[bytes, list[bytes]]:
    """The response head the client read: each field name (lower case) and its values."""
    out = t.take()  # type: ignore[attr-defined]
    if proto == "http1":
        head = out.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
        pairs = [tuple(x.strip() for x in line.split(b":", 1)) for line in head]
    else:
        block = b"".join(p for kind, _, p in frames(out) if kind == 1)
        pairs = hpack.Decoder().decode(block, raw=True)
    got: dict[bytes, list[bytes]] = {}
    for n, v in pairs:
        got.setdefault(n.lower(), []).append(v)
    return got


CASES = [(p, whole, own) for p in ("http1", "http2") for whole in (True, False)
         for own in (b"", OWN)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Listener:
    """A listener whose loop's fake time is also the service time's clock."""
    ls = Listener(ScriptedRng())
    monkeypatch.setattr(exchange, "service_clock", ls.loop.time)
    return ls


@pytest.mark.parametrize(("proto", "whole", "own"), CASES)
def test_a_proxied_response_carries_the_ms_the_upstream_took(
        proto: str, whole: bool, own: bytes, tmp_path: Path, clock: Listener) -> None:
    ls = clock
    ls.suppress_envoy_headers = False  # (the playbook's listener leaves it out)
    logfile = LogFile(str(tmp_path / "access.log"), ls.loop)  # type: ignore[arg-type]
    ls.access_log = AccessLog(logfile, None, ls.loop)  # type: ignore[arg-type, assignment]
    ls.loop.advance(5.0)
    _conn, t = _client(ls, proto)
    h1, _wire = ls.connects[-1].succeed_h1(ls.loop)  # the request goes upstream now
    ls.loop.advance(ls.loop.time() + 0.0375)  # the upstream takes 37.5 ms
    if not whole:
        h1.fresh = False  # as if a byte had come already: the parser's path
    h1.data_received(NGINX % own)
    assert (h1.whole_fields is not None) == (whole and not own)  # its own: the parser's path
    assert _head(t, proto)[b"x-envoy-upstream-service-time"] == [b"37"]  # one, ours
    logfile.flush()
    (line,) = (tmp_path / "access.log").read_text().splitlines()
    assert line.split()[9] == "37", line  # %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%


@pytest.mark.parametrize(("proto", "whole"), [(p, w) for p in ("http1", "http2")
                                              for w in (True, False)])
def test_suppress_envoy_headers_leaves_it_out(proto: str, whole: bool) -> None:
    ls = Listener(ScriptedRng())
    ls.suppress_envoy_headers = True
    _conn, t = _client(ls, proto)
    h1, _wire = ls.connects[-1].succeed_h1(ls.loop)
    if not whole:
        h1.fresh = False
    h1.data_received(NGINX % b"")
    assert b"x-envoy-upstream-service-time" not in _head(t, proto)
    # an upstream's own passes as it came: nothing to replace it with
    ls2 = Listener(ScriptedRng())
    ls2.suppress_envoy_headers = True
    _conn, t = _client(ls2, proto)
    h1, _wire = ls2.connects[-1].succeed_h1(ls2.loop)
    h1.data_received(NGINX % OWN)
    assert _head(t, proto)[b"x-envoy-upstream-service-time"] == [b"999"]

