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


def _h1(ls: Listener, rule: Rule) -> tuple[Any, Transport]:
    conn = H1Downstream(ls)
    t = Transport(ls.loop)
    conn.connection_made(t)
    if rule.going_away:
        ls.process.ledger.accepting = False
    lines = [b"%s %s HTTP/1.1" % (rule.method, rule.path), b"Host: " + rule.authority]
    lines += [b"%s: %s" % f for f in rule.fields]
    conn.data_received(b"\r\n".join(lines) + b"\r\n\r\n")
    return conn, t


def _h2(ls: Listener, rule: Rule) -> tuple[Any, Transport]:
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
    # HEADERS with END_STREAM and END_HEADERS on stream 1
    conn.data_received(len(block).to_bytes(3, "big") + b"\x01\x05" + (1).to_bytes(4, "big")
                       + block)
    return conn, t


# HTTP/2 has no connection-specific fields (RFC 9113 §8.2.2): those rules are HTTP/1.1's.
CASES = [(r, p) for r in RULES for p in ("http1", "http2") if p == "http1" or not r.http1_only]


@pytest.mark.parametrize(("rule", "proto"), CASES, ids=[f"{r.name}-{p}" for r, p in CASES])
def test_shared_rule(rule: Rule, proto: str, tmp_path: Path) -> None:
    ls = Listener(ScriptedRng())
    ls.router = Router([Route("/x", ls.cluster, None, 30.0)])
    ls.generate_request_id = True
    logfile = LogFile(str(tmp_path / "access.log"), ls.loop)  # type: ignore[arg-type]
    ls.access_log = AccessLog(logfile, "json", ls.loop)  # type: ignore[arg-type, assignment]
    ls.loop.advance(5.0)  # (loop time 0 reads as "no log line" to the exchange)
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

    logfile.flush()
    (line,) = [json.loads(x) for x in (tmp_path / "access.log").read_text().splitlines()]
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
