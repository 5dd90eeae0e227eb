"""The access-log formatter: Envoy's operators and flag rendering, on a plain record; Envoy's
default format on a real exchange, as the codecs leave it."""

from __future__ import annotations

import json
import os
import re
import time
from types import SimpleNamespace

from lameduck.drain import ProcessDrain
from lameduck.proxy.accesslog import (
    CB,
    DEFAULT_FORMAT,
    DPE,
    GA,
    LR,
    PD,
    RD,
    UF,
    UH,
    URX,
    compile_text,
    default_line,
    flag_bytes,
    flag_string,
    json_line,
    new_request_id,
    number_bytes,
    start_stamp,
)
from lameduck.proxy.downstream import Downstream
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.message import HTTP2, HTTP10, HTTP11
from lameduck.stats import HttpStats
from lameduck.upstream.pool import Endpoint
from tests.playbook import Loop


def record(**over: object) -> SimpleNamespace:
    ex = SimpleNamespace(
        method=b"POST", request_id=b"r-1", t0=100.0, sid=0, version=HTTP11, status=204,
        flags=0, bytes_rx=154, bytes_tx=0, resp_fields=None, cluster=SimpleNamespace(name="app"),
        endpoint=SimpleNamespace(host="10.0.2.1", port=80, address="10.0.2.1:80"),
        down=SimpleNamespace(transport=None),
        log_req=(b"/api/v1/locations", [(b"host", b"locations")],
                 [b"user-agent: nsq2http\r\n", b"x-forwarded-for: 10.0.35.28\r\n\r\n"]),
        log_host=b"locations", log_xff=b"10.0.35.28", log_agent=b"nsq2http", log_opath=None,
        svc_ms=-1)
    ex.__dict__.update(over)
    return ex


def exchange(method: bytes = b"POST", **over: object) -> Exchange:
    """A real exchange (the compiled formatter reads its fields natively) as an HTTP/1.1 codec
    with the log on leaves it at settle."""
    ex = Exchange(Downstream(SimpleNamespace(loop=Loop(), stats=HttpStats(),
                                             process=ProcessDrain(),
                                             suppress_envoy_headers=False, alt_svc=None)), method)
    ex.request_id = b"r-1"
    ex.t0 = 100.0
    ex.status = 204
    ex.bytes_rx = 154
    ex.endpoint = Endpoint("10.0.2.1", 80, 4)
    ex.log_req = (b"/api/v1/locations", [(b"host", b"locations")],
                  [b"user-agent: nsq2http\r\n", b"x-forwarded-for: 10.0.35.28\r\n\r\n"])
    ex.log_host = b"locations"
    ex.log_xff = b"10.0.35.28"
    ex.log_agent = b"nsq2http"
    for k, v in over.items():
        setattr(ex, k, v)
    return ex


def test_flags_render_as_envoy_does_in_bit_order() -> None:
    assert flag_string(0) == "-"
    assert flag_string(UH) == "UH"
    assert flag_string(URX | UF) == "UF,URX"
    assert flag_string(PD | RD | GA | CB) == "GA,CB,RD,PD"


def test_flag_bytes_are_flag_string() -> None:
    for flags in (0, UH, URX | UF, PD | RD | GA | CB, LR | DPE):
        assert flag_bytes(flags) == flag_string(flags).encode()
        assert flag_bytes(flags) == flag_string(flags).encode()  # the cached one too


def test_default_format_is_envoy_layout() -> None:
    line = compile_text(DEFAULT_FORMAT)(record(), 100.25, 1460751420.5)
    assert line == ('[2016-04-15T20:17:00.250Z] "POST /api/v1/locations HTTP/1.1" 204 - 154 0 '
                    '250 - "10.0.35.28" "nsq2http" "r-1" "locations" "10.0.2.1:80"\n')
    # the default's own formatter writes the same text, as bytes
    assert default_line(exchange(), 100.25, 1460751420.5) == line.encode()


def test_default_line_is_the_compiled_default_format_in_every_case() -> None:
    text = compile_text(DEFAULT_FORMAT)
    cases = [
        exchange(),
        # a malformed request answered before any field was kept
        exchange(b"", endpoint=None, log_req=None, request_id=b"", log_host=None, log_xff=None,
                 log_agent=None, status=400, flags=DPE),
        # refused before routing: the authority is the first Host received
        exchange(b"GET", endpoint=None, log_host=None, log_req=(
            b"/x", [(b"x-a", b"1"), (b"host", b"h1.test"), (b"host", b"h2.test")], [])),
        exchange(log_opath=b"/original", flags=UF | URX, sid=3, version=HTTP2, log_xff=None),
        exchange(version=HTTP10, log_host=b"", log_agent=b"", request_id=b"", bytes_tx=1 << 40,
                 resp_fields=[(b"Content-Type", b"text/plain"),
                              (b"X-Envoy-Upstream-Service-Time", b"7")]),
        # bytes beyond ASCII: each a latin-1 character, the line UTF-8 (as the text is written)
        exchange(log_agent=b"caf\xe9/1", log_req=(b"/\xff", [], [])),
        exchange(endpoint=Endpoint("::1", 8080, 4), t0=100.2499),
    ]
    for i, ex in enumerate(cases):
        for now, wall in ((100.25, 1460751420.5), (101.0, 1460751421.0009)):
            assert default_line(ex, now, wall) == text(ex, now, wall).encode(), i


def test_operators_alternatives_and_missing_values() -> None:
    fmt = compile_text("%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %REQ(TRACEPARENT)% %PROTOCOL% "
                       "%RESPONSE_FLAGS% %UPSTREAM_CLUSTER% %DOWNSTREAM_REMOTE_ADDRESS% "
                       "%REQUEST_ID% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%")
    ex = record(sid=3, version=HTTP2, flags=UF, log_req=(b"/p", [(b"traceparent", b"00-ab")], None),
                resp_fields=[(b"X-Envoy-Upstream-Service-Time", b"7")])
    assert fmt(ex, 100.0, 0.0) == "/p 00-ab HTTP/2 UF app - r-1 7"


def test_json_line_keys_named_after_the_operators() -> None:
    rec = json.loads(json_line(record(flags=GA, endpoint=None), 100.5, 1_000_000.0))
    assert rec["response_flags"] == "GA" and rec["duration"] == 500
    assert rec["upstream_host"] is None and rec["x_forwarded_for"] == "10.0.35.28"
    assert (rec["method"], rec["path"], rec["authority"]) == ("POST", "/api/v1/locations",
                                                               "locations")


def _dumped(ex: object, now: float, wall: float) -> str:
    """What ``json_line`` writes, as json.dumps writes it from a dict of the same fields."""
    ops = {k: compile_text(f) for k, f in (
        ("start_time", "%START_TIME%"), ("method", "%REQ(:METHOD)%"), ("path", "%REQ(:PATH)%"),
        ("protocol", "%PROTOCOL%"), ("response_code", "%RESPONSE_CODE%"),
        ("response_flags", "%RESPONSE_FLAGS%"), ("drain_flags", "%DRAIN_FLAGS%"),
        ("bytes_received", "%BYTES_RECEIVED%"), ("bytes_sent", "%BYTES_SENT%"),
        ("duration", "%DURATION%"), ("upstream_host", "%UPSTREAM_HOST%"),
        ("upstream_cluster", "%UPSTREAM_CLUSTER%"),
        ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
        ("request_id", "%REQ(X-REQUEST-ID)%"), ("authority", "%REQ(:AUTHORITY)%"),
        ("user_agent", "%REQ(USER-AGENT)%"), ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
        ("traceparent", "%REQ(TRACEPARENT)%"))}
    rec: dict[str, object] = {}
    for k, op in ops.items():
        v = op(ex, now, wall)
        if k in ("response_code", "bytes_received", "bytes_sent", "duration"):
            rec[k] = int(v)
        elif k in ("start_time", "protocol", "response_flags", "drain_flags"):
            rec[k] = v
        else:
            rec[k] = None if v == "-" else v
    return json.dumps(rec, separators=(",", ":")) + "\n"


class _Peer:
    """A transport that counts how often its peer is asked for."""

    def __init__(self, peer: object) -> None:
        self.peer = peer
        self.asked = 0

    def get_extra_info(self, name: str) -> object:
        assert name == "peername"
        self.asked += 1
        return self.peer


def test_json_line_is_what_json_dumps_writes() -> None:
    cases = [
        record(),
        record(flags=GA | RD, endpoint=None, cluster=None, request_id=b"", log_host=None,
               log_req=None, log_xff=None, log_agent=None, method=b"", status=0),
        # quotes, backslashes, control bytes and bytes beyond ASCII: escaped as json escapes
        record(log_agent=b'say "hi"\\ \x01\t caf\xe9', request_id=b"\xff\x7f",
               log_req=(b"/\xe9?q=\"x\"", [(b"traceparent", b"00-ab")], None),
               down=SimpleNamespace(transport=_Peer(("::1", 8080, 0, 0)))),
        record(down=SimpleNamespace(transport=_Peer(("10.0.0.9", 4711)))),
        record(down=SimpleNamespace(transport=_Peer(None)), bytes_tx=1 << 40, t0=99.0),
    ]
    for i, ex in enumerate(cases):
        for now, wall in ((100.25, 1460751420.5), (101.0, 1460751421.0009)):
            assert json_line(ex, now, wall) == _dumped(ex, now, wall), i


def test_the_client_address_is_read_once_per_connection() -> None:
    peer = _Peer(("10.0.0.9", 4711))
    down = SimpleNamespace(transport=peer)
    fmt = compile_text("%DOWNSTREAM_REMOTE_ADDRESS%")
    assert [fmt(record(down=down), 100.0, 0.0) for _ in range(3)] == ["10.0.0.9:4711"] * 3
    assert json.loads(json_line(record(down=down), 100.0, 0.0))["downstream_remote_address"] \
        == "10.0.0.9:4711"
    assert peer.asked == 1
    # a real connection keeps it too
    conn = exchange().down
    conn.transport = _Peer(("::1", 8080, 0, 0))  # type: ignore[assignment]
    assert fmt(exchange(down=conn), 100.0, 0.0) == "[::1]:8080"
    assert fmt(exchange(down=conn), 100.0, 0.0) == "[::1]:8080"
    assert conn.transport.asked == 1  # type: ignore[attr-defined]


def test_start_stamp_and_numbers_as_formatted() -> None:
    for ms in (0, 999, 1000, 1460751420250, 1460751420999, 1460751421000, 1460751421001):
        sec, frac = divmod(ms, 1000)
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{frac:03d}Z"
        assert start_stamp(ms) == text.encode(), ms
    for n in (0, 1, 9, 10, 200, 1023, 1024, 1 << 40, -1):
        assert number_bytes(n) == str(n).encode()


def test_unknown_operator_is_refused() -> None:
    try:
        compile_text("%NOPE%")
    except ValueError as e:
        assert "NOPE" in str(e)
    else:
        raise AssertionError("an unknown operator was accepted")


def test_request_ids_are_128_random_bits_each_and_a_forked_child_draws_its_own() -> None:
    """Made in batches (one draw, one format): each id is still 32 lower-case hex digits of
    its own, across batch boundaries, and a forked worker does not repeat its parent's."""
    ids = [new_request_id() for _ in range(200)]  # more than three batches
    assert all(len(i) == 32 and re.fullmatch(rb"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, to the parent
        try:
            os.write(write, new_request_id())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child != new_request_id()
