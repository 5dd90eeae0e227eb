"""Admission, once for both codecs: a neutral request head in, the head sent upstream (or a
local answer) out; then each upstream codec formats it once, from fields."""

from __future__ import annotations

from typing import Any

import pytest

from lameduck.http1.upstream import request_head
from lameduck.http2.upstream import head_fields
from lameduck.proxy import admission
from lameduck.proxy.admission import (
    CLIENTS_KEPT,
    Client,
    client_for,
    persistence_key,
    prepare,
    route_path,
)
from lameduck.proxy.message import HTTP2, HTTP10, HTTP11, RequestHead

PEER = b"10.0.0.7"
CLIENT = Client(PEER.decode(), b"http", False)


def head(fields: list[tuple[bytes, bytes]], method: bytes = b"GET", authority: bytes | None
         = None, path: bytes = b"/a?b=1", version: int = HTTP11,
         has_body: bool = False) -> RequestHead:
    h = RequestHead(method, authority, path, fields, version)
    h.has_body = has_body
    return h


def names(h: RequestHead) -> list[bytes]:
    return [n.lower() for n, _ in h.fields]


# (what, the head, what the prepared head must be), run through HTTP/1.1's names (as received,
# mixed case) and HTTP/2's (lower case): one rule, both codecs.
CASES: list[tuple[str, list[tuple[bytes, bytes]], dict[str, Any]]] = [
    ("host names the authority; X-Forwarded-* appended",
     [(b"Host", b"app:8080"), (b"Accept", b"*/*")],
     {"authority": b"app:8080", "names": [b"accept", b"x-forwarded-for", b"x-forwarded-proto"],
      "forwarded_for": PEER}),
    ("every hop-by-hop field is this hop's",
     [(b"Host", b"h"), (b"Connection", b"keep-alive"), (b"Keep-Alive", b"timeout=5"),
      (b"Proxy-Connection", b"close"), (b"Upgrade", b"h2c"), (b"TE", b"gzip"),
      (b"Transfer-Encoding", b"chunked")],
     {"names": [b"x-forwarded-for", b"x-forwarded-proto"], "te_trailers": False,
      "websocket": False}),
    ("a field Connection nominates is dropped, one lameduck frames or routes by is not",
     [(b"Host", b"h"), (b"Connection", b"x-secret, Host, Cookie"), (b"X-Secret", b"1"),
      (b"Cookie", b"a=1")],
     {"names": [b"cookie", b"x-forwarded-for", b"x-forwarded-proto"], "authority": b"h"}),
    ("TE: trailers is carried as a flag (both upstreams restate it)",
     [(b"Host", b"h"), (b"TE", b"trailers"), (b"Connection", b"TE")],
     {"te_trailers": True, "names": [b"x-forwarded-for", b"x-forwarded-proto"]}),
    ("X-Forwarded-For fields are one list, the client appended; Proto replaced",
     [(b"Host", b"h"), (b"X-Forwarded-For", b"1.1.1.1"), (b"x-forwarded-for", b"2.2.2.2"),
      (b"X-Forwarded-Proto", b"https")],
     {"forwarded_for": b"1.1.1.1, 2.2.2.2, " + PEER,
      "tail": [(b"x-forwarded-for", b"1.1.1.1, 2.2.2.2, " + PEER),
               (b"x-forwarded-proto", b"http")]}),
    ("an Idempotency-Key makes a POST safe to send again",
     [(b"Host", b"h"), (b"Idempotency-Key", b"k")],
     {"retryable": True, "method": b"POST"}),
    ("a POST without one is not",
     [(b"Host", b"h")], {"retryable": False, "method": b"POST"}),
    ("x-request-id is passed on",
     [(b"Host", b"h"), (b"X-Request-Id", b"r-1")], {"request_id": b"r-1"}),
    ("gRPC, Expect",
     [(b"Host", b"h"), (b"Content-Type", b"application/grpc+proto"),
      (b"Expect", b"100-continue")], {"grpc": True, "expect": True}),
    ("Content-Length stays where there is content",
     [(b"Host", b"h"), (b"Content-Length", b"5")],
     {"method": b"POST", "has_body": True, "chunked": False,
      "names": [b"content-length", b"x-forwarded-for", b"x-forwarded-proto"]}),
    ("and on a POST without any (the method defines content)",
     [(b"Host", b"h"), (b"Content-Length", b"0")],
     {"method": b"POST", "chunked": False,
      "names": [b"content-length", b"x-forwarded-for", b"x-forwarded-proto"]}),
    ("not on a GET without content (RFC 9110 §8.6)",
     [(b"Host", b"h"), (b"Content-Length", b"0")],
     {"names": [b"x-forwarded-for", b"x-forwarded-proto"]}),
    ("content of unknown length goes chunked to HTTP/1.1",
     [(b"Host", b"h")], {"method": b"POST", "has_body": True, "chunked": True}),
    ("a WebSocket upgrade (RFC 6455 §4.1) is relayed, never retried",
     [(b"Host", b"h"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket"),
      (b"Sec-WebSocket-Key", b"k==")],
     {"websocket": True, "retryable": False,
      "names": [b"sec-websocket-key", b"x-forwarded-for", b"x-forwarded-proto"]}),
    ("an Upgrade the Connection field does not name is not one",
     [(b"Host", b"h"), (b"Upgrade", b"websocket")], {"websocket": False}),
    ("two Host fields: 400, malformed",
     [(b"Host", b"a"), (b"Host", b"b")], {"refused": (400, True)}),
    ("an authority that could mean two things: 400",
     [(b"Host", b"a@b")], {"refused": (400, True)}),
    ("no authority at all: 400",
     [(b"Accept", b"*/*")], {"refused": (400, True)}),
]


@pytest.mark.parametrize("version", [HTTP11, HTTP2], ids=["http1", "http2"])
@pytest.mark.parametrize(("what", "fields", "want"), CASES, ids=[c[0] for c in CASES])
def test_prepare(what: str, fields: list[tuple[bytes, bytes]], want: dict[str, Any],
                 version: int) -> None:
    if version == HTTP2:
        fields = [(n.lower(), v) for n, v in fields]
    h = head(fields, method=want.get("method", b"GET"), version=version,
             has_body=want.get("has_body", False))
    up = prepare(h, CLIENT)
    refused = want.get("refused")
    if refused is not None:
        assert up.refused is not None
        assert (up.refused.status, up.refused.malformed) == refused
        return
    assert up.refused is None
    for key, value in want.items():
        if key == "names":
            assert names(up) == value
        elif key == "tail":
            assert up.fields[-len(value):] == value
        elif key not in ("method", "has_body"):
            assert getattr(up, key) == value, key
    if "retryable" not in want:
        assert up.retryable is (up.method in (b"GET", b"HEAD"))


def test_request_line_authority_wins_over_host_and_http10_needs_none() -> None:
    up = prepare(head([(b"Host", b"other")], authority=b"target:81"), CLIENT)
    assert up.authority == b"target:81" and b"host" not in names(up)
    up = prepare(head([], version=HTTP10), CLIENT)
    assert up.refused is None and up.authority == b""


def test_generated_request_id_is_sent_and_booked() -> None:
    up = prepare(head([(b"host", b"h")]), Client(PEER.decode(), b"https", True))
    assert len(up.request_id) == 32 and (b"x-request-id", up.request_id) in up.fields
    assert up.fields[-1] == (b"x-forwarded-proto", b"https")


def test_extended_connect_is_a_websocket() -> None:
    h = head([(b"sec-websocket-version", b"13")], authority=b"h", version=HTTP2)
    h.protocol = b"websocket"
    up = prepare(h, CLIENT)
    assert up.websocket and up.protocol == b"websocket"


def test_route_path_and_persistence_key() -> None:
    assert route_path(b"/a/b?x=1") == b"/a/b" and route_path(b"/a") == b"/a"
    fields = [(b"Cookie", b"x=1; lameduck=abc"), (b"cookie", b"y=2")]
    assert persistence_key(fields, PEER, True, b"lameduck") == "abc"
    assert persistence_key(fields[1:], PEER, True, b"lameduck") is None
    assert persistence_key(fields, PEER, False, b"lameduck") == "10.0.0.7"


def _h1_text(up: RequestHead) -> bytes:
    """What an HTTP/1.1 upstream connection writes for ``up``."""
    return request_head(up)


def _h2_fields(up: RequestHead) -> tuple[list[tuple[bytes, bytes]], bool]:
    """The header list an HTTP/2 upstream stream sends for ``up``, and whether DATA follow."""
    return head_fields(up), up.has_body


def test_each_upstream_formats_the_prepared_head_once() -> None:
    h = head([(b"Host", b"app"), (b"Accept", b"*/*"), (b"TE", b"trailers")],
             method=b"POST", has_body=True)
    up = prepare(h, CLIENT)
    assert _h1_text(up) == (
        b"POST /a?b=1 HTTP/1.1\r\nhost: app\r\n"
        b"te: trailers\r\nconnection: te\r\ntransfer-encoding: chunked\r\n"
        b"Accept: */*\r\nx-forwarded-for: 10.0.0.7\r\nx-forwarded-proto: http\r\n\r\n")
    fields, body = _h2_fields(up)
    assert fields == [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"app"),
                      (b":path", b"/a?b=1"), (b"Accept", b"*/*"),
                      (b"x-forwarded-for", PEER), (b"x-forwarded-proto", b"http"),
                      (b"te", b"trailers")]
    assert body is True


def test_http10_without_host_has_no_authority_upstream() -> None:
    up = prepare(head([], path=b"*", method=b"OPTIONS", version=HTTP10), CLIENT)
    assert _h1_text(up).startswith(b"OPTIONS * HTTP/1.1\r\nhost: \r\n")
    fields, body = _h2_fields(up)
    assert [n for n, _ in fields[:3]] == [b":method", b":scheme", b":path"] and body is False


def test_a_websocket_from_http2_gets_a_key_of_its_own_upstream() -> None:
    h = head([(b"sec-websocket-version", b"13")], authority=b"h", version=HTTP2)
    h.protocol = b"websocket"
    text = _h1_text(prepare(h, CLIENT))
    assert b"connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-key: " in text
    h1 = head([(b"Host", b"h"), (b"Connection", b"upgrade"), (b"Upgrade", b"websocket"),
               (b"Sec-WebSocket-Key", b"k==")])
    text = _h1_text(prepare(h1, CLIENT))
    assert text.count(b"ec-WebSocket-Key") + text.count(b"ec-websocket-key") == 1


def test_connections_from_one_address_share_one_client() -> None:
    """Every connection from one peer address to listeners with one scheme and request-id
    setting has the same facts: they share one Client (not one per idle connection)."""
    a = client_for("192.0.2.7", b"http", False)
    assert client_for("192.0.2.7", b"http", False) is a
    assert a.peer == b"192.0.2.7" and a.for_field == (b"x-forwarded-for", b"192.0.2.7")
    assert client_for("192.0.2.8", b"http", False) is not a
    other = client_for("192.0.2.7", b"https", False)  # another listener's scheme
    assert other is not a and other.proto_field == (b"x-forwarded-proto", b"https")
    assert client_for("192.0.2.7", b"https", True).generate_request_id


def test_the_client_cache_is_bounded() -> None:
    for i in range(CLIENTS_KEPT + 5):
        client_for(f"10.1.{i // 256}.{i % 256}", b"http", False)
    assert len(admission._CLIENTS) <= CLIENTS_KEPT
