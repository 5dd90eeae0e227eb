"""The rules every codec shares, played through both real codecs (HTTP/1.1 bytes and HTTP/2
frames in, no socket, a fake clock) and checked in the same books: what the upstream was sent
(the prepared head), the status and flags the access log wrote, and the listener's stats.

One rule, one case: each runs through HTTP/1.1 and HTTP/2 alike (a rule HTTP/2 cannot express,
such as a field ``Connection`` nominates, runs through HTTP/1.1 only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpack
import pytest

from lameduck.http1.downstream import H1Downstream
from lameduck.proxy.accesslog import AccessLog, LogFile
from lameduck.upstream.router import Route, Router
from tests.drainplay import ScriptedRng
from tests.playbook import Listener, Transport

PEER = "127.0.0.1"  # the playbook transport's peer
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@dataclass
class Rule:
    name: str
    fields: list[tuple[bytes, bytes]] = field(default_factory=list)
    method: bytes = b"GET"
    path: bytes = b"/x"
    authority: bytes = b"app"
    upstream: bool = True  # it reaches the upstream (which answers 200)
    status: dict[str, int] = field(default_factory=lambda: {"http1": 200, "http2": 200})
    flags: str = "-"
    sent: list[tuple[bytes, bytes]] = field(default_factory=list)  # the upstream gets these
    not_sent: list[bytes] = field(default_factory=list)  # ... and none of these names
    log: dict[str, Any] = field(default_factory=dict)  # access-log keys
    head: dict[str, Any] = field(default_factory=dict)  # the prepared head's facts
    retryable: bool | None = None
    going_away: bool = False
    http1_only: bool = False


RULES = [
    Rule("X-Forwarded-For appended, -Proto replaced, a request id made",
         [(b"x-forwarded-for", b"192.0.2.1"), (b"x-forwarded-proto", b"https")],
         sent=[(b"x-forwarded-for", b"192.0.2.1, " + PEER.encode()),
               (b"x-forwarded-proto", b"http")],
         log={"x_forwarded_for": f"192.0.2.1, {PEER}", "authority": "app"}),
    Rule("x-request-id passed on", [(b"x-request-id", b"r-9")],
         sent=[(b"x-request-id", b"r-9")], log={"request_id": "r-9"}),
    Rule("an authority that could mean two things: 400, DPE, never sent", authority=b"a@b",
         upstream=False, status={"http1": 400, "http2": 400}, flags="DPE"),
    Rule("the health-check path is answered here", path=b"/healthz", upstream=False),
    Rule("no route: 404, NR", path=b"/nowhere", upstream=False,
         status={"http1": 404, "http2": 404}, flags="NR"),
    Rule("Content-Length on a GET without content is not sent", [(b"content-length", b"0")],
         not_sent=[b"content-length"]),
    Rule("TE: trailers goes on as a flag", [(b"te", b"trailers")], not_sent=[b"te"],
         head={"te_trailers": True}),
    Rule("a field Connection nominates is not sent", [(b"connection", b"x-hop"),
                                                      (b"x-hop", b"1")],
         not_sent=[b"connection", b"x-hop"], http1_only=True),
    Rule("Idempotency-Key makes a POST safe to send again",
         [(b"idempotency-key", b"k-1"), (b"content-length", b"0")], method=b"POST",
         sent=[(b"idempotency-key", b"k-1"), (b"content-length", b"0")], retryable=True),
    Rule("a POST without one is not", [(b"content-length", b"0")], method=b"POST",
         retryable=False),
    Rule("past the drain time: turned away (HTTP/1.1 503, HTTP/2 REFUSED_STREAM), GA",
         upstream=False, going_away=True, status={"http1": 503, "http2": 0}, flags="GA"),
]


def _h1(ls: Listener, rule: Rule, body: bytes | None = None) -> tuple[Any, Transport]:
    """The rule's request on a new HTTP/1.1 connection; with ``body``, the first bytes of a
    body of 10 (the rest never comes)."""
    conn = H1Downstream(ls)
    t = Transport(ls.loop)
    conn.connection_made(t)
    if rule.going_away:
        ls.process.ledger.accepting = False
    lines = [b"%s %s HTTP/1.1" % (rule.method, rule.path), b"Host: " + rule.authority]
    lines += [b"%s: %s" % f for f in rule.fields]
    if body is not None:
        lines.append(b"Content-Length: 10")
    conn.data_received(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
    return conn, t


def _h2(ls: Listener, rule: Rule, body: bytes | None = None) -> tuple[Any, Transport]:
    """The same on HTTP/2 (stream 1): ``body`` in a DATA frame without END_STREAM."""
    from lameduck.http2.downstream import H2Downstream
    conn = H2Downstream(ls)
    t = Transport(ls.loop)
    conn.connection_made(t)
    conn.data_received(H2_PREFACE)
    if rule.going_away:  # (a connection that opens after that gets the final GOAWAY at once)
        ls.process.ledger.accepting = False
    block = hpack.Encoder().encode([
        (b":method", rule.method), (b":scheme", b"http"), (b":authority", rule.authority),
        (b":path", rule.path), *rule.fields])
    # HEADERS with END_HEADERS (and END_STREAM when no body follows) on stream 1
    flags = b"\x05" if body is None else b"\x04"
    conn.data_received(len(block).to_bytes(3, "big") + b"\x01" + flags + (1).to_bytes(4, "big")
                       + block)
    if body is not None:
        conn.data_received(len(body).to_bytes(3, "big") + b"\x00\x00" + (1).to_bytes(4, "big")
                           + body)
    return conn, t


def _listener(tmp_path: Path) -> tuple[Listener, LogFile]:
    """A listener routing /x to its cluster, with a JSON access log (and a request id made)."""
    ls = Listener(ScriptedRng())
    ls.router = Router([Route("/x", ls.cluster, None, 30.0)])
    ls.generate_request_id = True
    logfile = LogFile(str(tmp_path / "access.log"), ls.loop)  # type: ignore[arg-type]
    ls.access_log = AccessLog(logfile, "json", ls.loop)  # type: ignore[arg-type, assignment]
    ls.loop.advance(5.0)  # (loop time 0 reads as "no log line" to the exchange)
    return ls, logfile


def _logged(tmp_path: Path, logfile: LogFile) -> dict[str, Any]:
    """The one access-log line written."""
    logfile.flush()
    (line,) = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
    return line  # type: ignore[no-any-return]


# HTTP/2 has no connection-specific fields (RFC 9113 §8.2.2): those rules are HTTP/1.1's.
CASES = [(r, p) for r in RULES for p in ("http1", "http2") if p == "http1" or not r.http1_only]


@pytest.mark.parametrize(("rule", "proto"), CASES, ids=[f"{r.name}-{p}" for r, p in CASES])
def test_shared_rule(rule: Rule, proto: str, tmp_path: Path) -> None:
    ls, logfile = _listener(tmp_path)
    _conn, _t = (_h1 if proto == "http1" else _h2)(ls, rule)

    if rule.upstream:
        assert len(ls.connects) == 1, "the request did not reach the upstream"
        up = ls.connects[0].succeed()
        head = up.head
        sent = [(n.lower(), v) for n, v in head.fields]
        for f in rule.sent:
            assert f in sent, (f, sent)
        for name in rule.not_sent:
            assert name not in [n for n, _ in sent], (name, sent)
        for key, value in rule.head.items():
            assert getattr(head, key) == value, key
        rid = dict(sent).get(b"x-request-id")
        assert rid is not None and len(rid) in (3, 32)  # passed on, or made (32 hex digits)
        if rule.retryable is not None:
            assert up.sink.retryable is rule.retryable
        up.sink.on_response_head(200, [(b"content-length", b"2")], 2, False)
        up.sink.on_response_body(b"ok")
        up.sink.on_response_complete()
    else:
        assert ls.connects == []

    line = _logged(tmp_path, logfile)
    assert (line["response_code"], line["response_flags"]) == (rule.status[proto], rule.flags)
    assert line["protocol"] == ("HTTP/1.1" if proto == "http1" else "HTTP/2")
    for key, value in rule.log.items():
        assert line[key] == value, key
    st = ls.stats
    counted = {2: st.downstream_rq_2xx, 4: st.downstream_rq_4xx, 5: st.downstream_rq_5xx}
    status = rule.status[proto]
    assert counted == {k: int(status // 100 == k) for k in counted}
    assert st.downstream_rq_going_away == int(rule.going_away)
    assert ls.process.ledger.active == 0


# -- rules that end a request in flight: the shutdown deadline's cut and request_body_timeout --
# The exchange decides (``deadline_cut``, ``body_timed_out``) and books; each codec only sends
# what it was told. The books below are the same through both codecs; the bytes are each
# protocol's own.

GRPC = [(b"content-type", b"application/grpc"), (b"te", b"trailers")]


@dataclass
class Ending:
    name: str
    rule: str  # "cut": the shutdown deadline; "body": request_body_timeout
    started: bool  # the upstream's response head (and 3 body bytes) went out first
    status: int
    flags: str
    counts: dict[str, int]  # see ``_counts``
    bytes_sent: int
    grpc: bool = False
    differ: dict[str, dict[str, int]] = field(default_factory=dict)  # a protocol's own counts


def _counts(ls: Listener) -> dict[str, int]:
    st, ds, ledger = ls.stats, ls.drain_stats, ls.process.ledger
    return {"2xx": st.downstream_rq_2xx, "4xx": st.downstream_rq_4xx,
            "5xx": st.downstream_rq_5xx, "completed": st.downstream_rq_completed,
            "body_timeout": st.downstream_rq_body_timeout,
            "cut_before_response": ds.cut_before_response, "cut_reset": ds.cut_reset,
            "ledger_cut": ledger.cut, "ledger_active": ledger.active}


def _books(counts: dict[str, int]) -> dict[str, int]:
    """``_counts`` as ``counts`` has them, 0 for the rest."""
    base = dict.fromkeys(("2xx", "4xx", "5xx", "completed", "body_timeout",
                          "cut_before_response", "cut_reset", "ledger_cut", "ledger_active"), 0)
    return base | counts


ENDINGS = [
    Ending("the deadline cuts a request before its response: 503 going away, CB", "cut", False,
           503, "CB", _books({"5xx": 1, "completed": 1, "cut_before_response": 1,
                              "ledger_cut": 1}), len(b"going away\n")),
    Ending("the deadline cuts a response under way: a reset, CA", "cut", True, 200, "CA",
           _books({"2xx": 1, "cut_reset": 1, "ledger_cut": 1}), 3),
    # gRPC is HTTP/2's: there the call ends with its status (a response in full, so completed);
    # an HTTP/1.1 connection can only be reset
    Ending("the deadline cuts a gRPC response under way: UNAVAILABLE, CA", "cut", True, 200,
           "CA", _books({"2xx": 1, "cut_reset": 1, "ledger_cut": 1}), 3, grpc=True,
           differ={"http2": {"completed": 1}}),
    Ending("a body that stops coming before any response byte: 408", "body", False, 408, "-",
           _books({"4xx": 1, "completed": 1, "body_timeout": 1}),
           len(b"request body timeout\n")),
    Ending("a body that stops coming once the response began: a reset", "body", True, 200, "-",
           _books({"2xx": 1, "body_timeout": 1}), 3),
]
ENDING_CASES = [(e, p) for e in ENDINGS for p in ("http1", "http2")]


def _h2_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each HTTP/2 frame in ``data``."""
    out = []
    while len(data) >= 9:
        n = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4], int.from_bytes(data[5:9], "big"), data[9:9 + n]))
        data = data[9 + n:]
    return out


def _wire(e: Ending, proto: str, out: bytes, t: Transport, dec: hpack.Decoder) -> None:
    """What went to the client: each protocol's bytes for what the exchange decided."""
    answer = e.status in (408, 503)
    body = b"going away\n" if e.status == 503 else b"request body timeout\n"
    if proto == "http1":
        if answer:
            assert out.startswith(b"HTTP/1.1 %d " % e.status), out
            assert b"connection: close\r\n" in out and out.endswith(b"\r\n\r\n" + body)
            assert (b"retry-after: 1\r\n" in out) == (e.status == 503)
            assert t.eof_at is not None and not t.reset  # a FIN after the answer
        else:
            assert out == b"" and t.reset  # a response under way ends with a reset
        return
    frames = _h2_frames(out)
    # a cut ends with the final GOAWAY and a staged close; a body timeout ends one stream
    assert (7 in [typ for typ, _, _, _ in frames]) == (t.eof_at is not None) == (e.rule == "cut")
    assert t.ended is None
    got = [(typ, flags, sid, p) for typ, flags, sid, p in frames
           if typ != 8 and typ != 7]  # not WINDOW_UPDATE, GOAWAY
    if answer:
        (h, _, _, block), (d, df, _, data), *rest = got
        fields = dict(dec.decode(block))
        assert (h, d, data, df & 1) == (1, 0, body, 1)
        assert fields[":status"] == str(e.status)
        assert (fields.get("retry-after") == "1") == (e.status == 503)
        # the 408 ends a request still coming: RST_STREAM(NO_ERROR), RFC 9113 §8.1
        assert [(typ, p) for typ, _, _, p in rest] == ([] if e.status == 503 else
                                                       [(3, b"\0\0\0\0")])
    elif e.grpc:
        ((typ, flags, sid, block),) = got  # trailers that end the stream
        assert (typ, flags & 1, sid) == (1, 1, 1)
        assert dict(dec.decode(block)) == {
            "grpc-status": "14", "grpc-message": "going away: cut at the drain deadline"}
    else:
        assert [(typ, sid, p) for typ, _, sid, p in got] == [(3, 1, b"\0\0\0\x08")]  # CANCEL


@pytest.mark.parametrize(("e", "proto"), ENDING_CASES,
                         ids=[f"{e.name}-{p}" for e, p in ENDING_CASES])
def test_ending_rule(e: Ending, proto: str, tmp_path: Path) -> None:
    ls, logfile = _listener(tmp_path)
    rule = Rule(e.name, GRPC if e.grpc else [], b"POST" if e.rule == "body" else b"GET")
    conn, t = (_h1 if proto == "http1" else _h2)(ls, rule,
                                                 b"abc" if e.rule == "body" else None)
    up = ls.connects[0].succeed()
    dec = hpack.Decoder()
    if e.started:
        fields = [(b"content-type", b"application/grpc")] if e.grpc else [
            (b"content-length", b"9")]
        up.sink.cork()  # as a real upstream reports a read
        up.sink.on_response_head(200, fields, None if e.grpc else 9, False)
        up.sink.on_response_body(b"par")
        up.sink.uncork()
    if proto == "http2":  # the response's HEADERS so far: the decoder's table follows them
        for typ, _, sid, block in _h2_frames(t.take()):
            if typ == 1 and sid == 1:
                dec.decode(block)
    else:
        t.take()
    if e.rule == "cut":
        conn.cut()
    else:
        ls.loop.advance(19.99)
        assert ls.stats.downstream_rq_body_timeout == 0
        ls.loop.advance(20.0)  # 15 s after the body's last byte
    _wire(e, proto, t.take(), t, dec)
    assert up.closed  # the upstream let go
    conn.connection_lost(None)  # (asyncio's, once the socket is closed)

    line = _logged(tmp_path, logfile)
    assert (line["response_code"], line["response_flags"]) == (e.status, e.flags)
    assert (line["bytes_received"], line["bytes_sent"]) == (3 if e.rule == "body" else 0,
                                                            e.bytes_sent)
    assert _counts(ls) == e.counts | e.differ.get(proto, {})


@pytest.mark.parametrize("proto", ["http1", "http2"])
def test_idle_timeout_closes_the_connection(proto: str, tmp_path: Path) -> None:
    """The listener's idle_timeout (Envoy's), from the last response's end: the connection
    closes, counted as downstream_cx_idle_timeout on both (HTTP/2 says GOAWAY(NO_ERROR)
    first)."""
    ls, _ = _listener(tmp_path)
    _conn, t = (_h1 if proto == "http1" else _h2)(ls, Rule("idle"))
    up = ls.connects[0].succeed()
    up.sink.on_response_head(200, [(b"content-length", b"2")], 2, False)
    up.sink.on_response_body(b"ok")
    up.sink.on_response_complete()
    t.take()
    ls.loop.advance(104.99)  # idle from 5.0, for the listener's 100 s
    assert t.eof_at is None and ls.stats.downstream_cx_idle_timeout == 0
    ls.loop.advance(105.0)
    assert t.eof_at == 105.0 and ls.stats.downstream_cx_idle_timeout == 1
    goaways = [p for typ, _, _, p in _h2_frames(t.take()) if typ == 7]
    # GOAWAY: last stream 1, NO_ERROR
    assert goaways == ([] if proto == "http1" else [b"\0\0\0\x01\0\0\0\0"])


# -- a response that goes through whole (no parser) still has its fields for the log ----------

ORIGIN = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 11 May 2026 02:00:00 GMT\r\n"
          b"X-Envoy-Upstream-Service-Time: 7\r\nContent-Length: 2\r\n"
          b"Connection: keep-alive\r\n\r\nok")


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "parsed"])
@pytest.mark.parametrize("proto", ["http1", "http2"])
def test_resp_field_is_logged_whichever_path_the_response_took(proto: str, whole: bool,
                                                              tmp_path: Path) -> None:
    """Envoy's default format logs %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%: the real HTTP/1.1
    upstream forwards an nginx response whole or through its parser, and the line reads the
    same either way."""
    ls, logfile = _listener(tmp_path)
    ls.access_log = AccessLog(logfile, None, ls.loop)  # type: ignore[arg-type, assignment]
    (_h1 if proto == "http1" else _h2)(ls, RULES[0])
    h1, _wire = ls.connects[0].succeed_h1(ls.loop)
    if not whole:
        h1.fresh = False  # as if a byte of it had come: the parser reads the response
    h1.data_received(ORIGIN)
    assert (h1.whole_size == len(ORIGIN)) == whole
    logfile.flush()
    (line,) = (tmp_path / "access.log").read_text().splitlines()
    assert ' 200 - 0 2 0 7 "' in line, line


# -- a client that goes away with its request in flight: one rule (``Exchange.client_gone``) --
# Its upstream request is cut (the connection closed, never pooled; an HTTP/2 upstream stream
# cancelled) and it ends unanswered: Envoy's DC (the connection ended, or an HTTP/1.1 client
# half-closed: Envoy's connection manager takes the FIN for the end) or DR (the client reset
# its HTTP/2 stream), with the status already sent, or 0.

@dataclass
class Gone:
    name: str
    proto: str
    how: str  # "fin": the client half-closes; "rst": the socket ends; "stream": RST_STREAM
    started: bool  # the response head (and 3 body bytes) went out first
    flags: str
    destroyed: int  # downstream_cx_destroy_remote_active_rq
    rx_reset: int = 0  # downstream_rq_rx_reset


GONE = [
    Gone("HTTP/1.1 FIN before the response", "http1", "fin", False, "DC", 1),
    Gone("HTTP/1.1 FIN once the response began", "http1", "fin", True, "DC", 1),
    Gone("HTTP/1.1 connection reset before the response", "http1", "rst", False, "DC", 1),
    Gone("HTTP/2 RST_STREAM before the response", "http2", "stream", False, "DR", 0, 1),
    Gone("HTTP/2 RST_STREAM once the response began", "http2", "stream", True, "DR", 0, 1),
    Gone("HTTP/2 FIN before the response", "http2", "fin", False, "DC", 1),
    Gone("HTTP/2 connection reset once the response began", "http2", "rst", True, "DC", 1),
]


@pytest.mark.parametrize("g", GONE, ids=[g.name for g in GONE])
def test_client_gone_rule(g: Gone, tmp_path: Path) -> None:
    ls, logfile = _listener(tmp_path)
    conn, t = (_h1 if g.proto == "http1" else _h2)(ls, Rule(g.name))
    up = ls.connects[0].succeed()
    if g.started:
        up.sink.cork()
        up.sink.on_response_head(200, [(b"content-length", b"9")], 9, False)
        up.sink.on_response_body(b"par")
        up.sink.uncork()
    t.take()
    if g.how == "stream":  # RST_STREAM(CANCEL) on stream 1
        conn.data_received(b"\x00\x00\x04\x03\x00" + (1).to_bytes(4, "big")
                           + (8).to_bytes(4, "big"))
    elif g.how == "fin":
        if not conn.eof_received():  # False: asyncio closes the transport, then reports it
            conn.connection_lost(None)
    else:
        conn.connection_lost(ConnectionResetError())

    assert up.closed and not ls.eps[0].idle  # the upstream request cut, its connection not pooled
    line = _logged(tmp_path, logfile)
    assert (line["response_code"], line["response_flags"]) == (200 if g.started else 0, g.flags)
    assert line["bytes_sent"] == (3 if g.started else 0)
    st = ls.stats
    assert (st.downstream_cx_destroy_remote_active_rq, st.downstream_rq_rx_reset) == (
        g.destroyed, g.rx_reset)
    assert _counts(ls) == _books({"2xx": 1} if g.started else {})  # never completed
    assert ls.cluster.stats.upstream_rq_active == 0


# -- which authorities go on, and which host routes them: HTTP/1.1 Host and HTTP/2 :authority
# alike. The listener's one route names host 127.0.0.1 (a virtual host match), so a value is
# routed by its first host; one lameduck refuses never reaches a routing decision.

AUTHORITIES = [
    (b"127.0.0.1:8080", 200),
    (b"127.0.0.1", 200),
    (b"127.0.0.1:50051,127.0.0.1:50052", 200),  # grpcio's static address list
    (b"127.0.0.1,10.0.0.1", 200),
    (b"10.0.0.1:50051,127.0.0.1:50052", 404),  # routed by its first host, which no route has
    (b"127.0.0.1:1:2", 400),  # a second colon: which port?
    (b"u@127.0.0.1:1", 400),  # userinfo (RFC 9110 §4.2.4)
    (b"127.0.0.1:1,u@10.0.0.1", 400),
    (b"127.0.0.1:1, 10.0.0.1:2", 400),  # whitespace
    (b"127.0.0.1:1,", 400),  # an empty element
    (b",127.0.0.1", 400),
    (b"127.0.0.1/x", 400),  # outside nghttp2's set of octets (nghttp2_check_authority)
]
AUTHORITY_CASES = [(v, s, p) for v, s in AUTHORITIES for p in ("http1", "http2")]


@pytest.mark.parametrize(("value", "status", "proto"), AUTHORITY_CASES,
                         ids=[f"{v.decode()}-{p}" for v, _, p in AUTHORITY_CASES])
def test_authority_is_forwarded_whole_and_routed_by_its_first_host(
        value: bytes, status: int, proto: str, tmp_path: Path) -> None:
    ls, logfile = _listener(tmp_path)
    ls.router = Router([Route("/x", ls.cluster, "127.0.0.1", 30.0)])
    _conn, t = (_h1 if proto == "http1" else _h2)(ls, Rule("authority", authority=value))
    if proto == "http2" and b" " in value:
        # not even a field value HTTP/2 takes there (RFC 9113 §8.3.1): the stream is reset
        # PROTOCOL_ERROR before any exchange begins
        assert (3, 1, b"\0\0\0\x01") in [(typ, sid, p) for typ, _, sid, p in _h2_frames(t.take())]
        assert ls.connects == []
        return
    if status == 200:
        (connecting,) = ls.connects
        up = connecting.succeed()
        assert up.head.authority == value  # forwarded as it came (HAProxy, nginx, Envoy)
        up.sink.on_response_head(200, [(b"content-length", b"2")], 2, False)
        up.sink.on_response_body(b"ok")
        up.sink.on_response_complete()
    else:
        assert ls.connects == []
    line = _logged(tmp_path, logfile)
    flags = {200: "-", 404: "NR", 400: "DPE"}[status]
    assert (line["response_code"], line["response_flags"]) == (status, flags)
    assert line["authority"] == value.decode()
