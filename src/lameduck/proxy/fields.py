"""Header-field rules every codec applies the same way: what is hop-by-hop, what a
``Connection`` header may take away, what a valid authority is, and cookies.

One place, so HTTP/1 requests, HTTP/1 responses and HTTP/2 ↔ HTTP/1 translation cannot drift
apart on a rule that decides how a message is framed or where it goes.
"""

from __future__ import annotations

import re
from typing import Final

from lameduck.upstream.connector import Fields

# RFC 9110 §7.6.1: connection-specific fields a proxy does not forward as they came.
# Transfer-Encoding is re-framed by the codec; TE is re-stated by it ("trailers" only); the
# others are this hop's alone. Trailer (RFC 9110 §6.6.2) is end to end: trailers are forwarded.
HOP_BY_HOP: Final = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"transfer-encoding",
    b"upgrade",
})

# Fields a ``Connection`` header can never remove. RFC 9110 §7.6.1 lets a sender nominate any
# field as hop-by-hop, but lameduck frames the message it forwards with these, routes it with
# them, or decides a retry is safe by them: dropping them after using them is how a body turns
# into a smuggled second request (Content-Length), a request loses its target (Host, which
# RFC 9112 §3.2 requires on every HTTP/1.1 request), or a retried request is applied twice (the
# key the origin deduplicates by). The message is forwarded with them kept — as HAProxy and
# nginx do — which is this hop's own framing and routing, re-stated for the next one.
NEVER_NOMINATED: Final = frozenset({
    b"content-length", b"transfer-encoding", b"host", b"cookie",
    b"idempotency-key", b"resume-seq", b"x-forwarded-for", b"x-forwarded-proto",
    # Already handled by the connection's own rules, never as a nominated field.
    b"close", b"keep-alive", b"upgrade", b"",
})


# ``nominated``'s answers by the tokens as they came: an origin repeats its Connection value
# (",keep-alive") on every response, and the split and two sets cost ~4,000 instructions each
# time. Bounded: a full cache is dropped, so endless distinct values only cost their splits.
_NOMINATED: Final[dict[bytes, frozenset[bytes]]] = {}
_NOMINATED_MAX: Final = 256


def nominated(tokens: bytes) -> frozenset[bytes]:
    """The field names (lower case) that ``Connection`` values ``tokens`` (joined with commas)
    remove from a forwarded message: every listed name except those lameduck frames, routes or
    retries by."""
    drop = _NOMINATED.get(tokens)
    if drop is None:
        drop = frozenset(t.strip().lower() for t in tokens.split(b",")) - NEVER_NOMINATED
        if len(tokens) <= _NOMINATED_MAX:
            if len(_NOMINATED) >= _NOMINATED_MAX:
                _NOMINATED.clear()
            _NOMINATED[tokens] = drop
    return drop


def drop_nominated_fields(fields: list[tuple[bytes, bytes]],
                          tokens: bytes) -> list[tuple[bytes, bytes]]:
    """``fields`` without those ``tokens`` nominate."""
    drop = nominated(tokens)
    if not drop:
        return fields
    return [f for f in fields if f[0].lower() not in drop]


# RFC 9110 §4.2.3 / RFC 3986 §3.2.2: uri-host [ ":" port ]; uri-host is an IP-literal in
# brackets, or a reg-name / IPv4 address (unreserved, pct-encoded, sub-delims but the comma).
# No userinfo: RFC 9110 §4.2.4 forbids it in http(s) URIs, and it has no place in Host. Empty as
# a whole (RFC 9112 §3.2: a target without authority), but not a port without a host (RFC 9110
# §4.2.1: an http URI with an empty host is invalid).
#
# Or a list of them joined by commas (no spaces): gRPC clients with a static address list
# (grpcio's "ipv4:127.0.0.1:50051,127.0.0.1:50052") send the whole target as :authority, and
# HAProxy, nginx and Envoy (which checks only nghttp2's set of octets, nghttp2_check_authority:
# RFC 3986's unreserved, sub-delims, ":", "@", "%", "[" and "]") forward it. Every byte allowed
# here is in nghttp2's set but "@"; each element is a whole host[:port], so the first one -- the
# host a route matches (``Router.match``) -- is as valid as a lone authority.
_ELEMENT: Final = (rb"(?:\[[0-9A-Fa-f:.]+\]|(?:[A-Za-z0-9\-._~!$&'()*+;=]|%[0-9A-Fa-f]{2})+)"
                   rb"(?::[0-9]*)?")
_AUTHORITY: Final = re.compile(rb"(?:%s(?:,%s)*)?" % (_ELEMENT, _ELEMENT))


def valid_authority(value: bytes) -> bool:
    """``value`` may stand as a Host field or an ``:authority``: what lameduck forwards, whose
    first host[:port] it routes by, so one that could mean two things (spaces, ``@``, a second
    colon, an empty element) is refused rather than guessed at.

    Two implementations of the one grammar (``_AUTHORITY``; a test holds them to the same
    answers): compiled, a scan over byte tables (the regex's per-byte alternation cost 6,000
    instructions for ``127.0.0.1:8080``, an eighth of a keep-alive GET); interpreted, the regex.
    """
    if COMPILED:
        return _scan_authority(value)
    return _AUTHORITY.fullmatch(value) is not None


# True when this module runs compiled by mypyc (its file is then the extension module).
COMPILED: Final = not __file__.endswith(".py")
# 1 at a byte's index where ``_AUTHORITY`` allows it: a reg-name's unreserved and sub-delims
# but the comma (RFC 3986 §3.2.2), an IP literal's hex digits, colons and dots, and hex digits.
_REG_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+;="
_REG_NAME: Final = bytes(1 if bytes([c]) in _REG_CHARS else 0 for c in range(256))
_IP_LITERAL: Final = bytes(1 if bytes([c]) in b"0123456789ABCDEFabcdef:." else 0
                           for c in range(256))
_HEX: Final = bytes(1 if bytes([c]) in b"0123456789ABCDEFabcdef" else 0 for c in range(256))


def _scan_authority(value: bytes) -> bool:
    """``_AUTHORITY.fullmatch`` as one pass over the bytes: empty, or host[:port] elements
    joined by commas, each a host (an IP literal in brackets, or a reg-name of allowed bytes
    and %XX escapes) and an optional ``:`` port of digits."""
    n = len(value)
    if n == 0:
        return True
    i = 0
    while True:
        start = i
        if value[i] == 91:  # "[": an IP literal
            i += 1
            while i < n and _IP_LITERAL[value[i]]:
                i += 1
            if i == start + 1 or i >= n or value[i] != 93:  # "]"
                return False
            i += 1
        else:
            while i < n:
                c = value[i]
                if _REG_NAME[c]:
                    i += 1
                elif c == 37:  # "%": two hex digits follow
                    if i + 2 < n and _HEX[value[i + 1]] and _HEX[value[i + 2]]:
                        i += 3
                    else:
                        return False
                else:
                    break
            if i == start:
                return False  # a port with no host, or an empty element
        if i < n and value[i] == 58:  # ":" and a port
            i += 1
            while i < n and 48 <= value[i] <= 57:
                i += 1
        if i == n:
            return True
        if value[i] != 44 or i + 1 == n:  # "," and another element
            return False
        i += 1


def cookie_value(header: bytes, name: bytes) -> str | None:
    """The value of cookie ``name`` in one Cookie field value (RFC 6265 §5.4: ``a=1; b=2``),
    as text (None if absent or not ASCII)."""
    for pair in header.split(b";"):
        key, eq, value = pair.strip().partition(b"=")
        if eq and key == name:
            try:
                return value.strip().strip(b'"').decode("ascii")
            except UnicodeDecodeError:
                return None
    return None


# RFC 9110 §6.5.1: a trailer section must not carry what frames or routes the message, nor the
# connection's own fields; such a field is dropped, never merged into the head. RFC 9113
# §8.1: in HTTP/2 a pseudo-header in trailers makes the message malformed.
NOT_IN_TRAILERS: Final = HOP_BY_HOP | {
    b"content-length", b"host", b"content-encoding", b"content-type", b"content-range",
    b"authorization", b"set-cookie", b"cookie", b"cache-control", b"expect", b"max-forwards",
    b"pragma", b"range", b"www-authenticate", b"proxy-authenticate", b"proxy-authorization",
    b"location", b"retry-after", b"vary", b"age", b"expires", b"date", b"trailer",
}


def trailer_fields(fields: Fields) -> Fields:
    """``fields`` as a trailer section to forward: names lower-cased (HTTP/2 wants them so,
    HTTP/1.1 does not mind), those a trailer may not carry left out."""
    out = []
    for name, value in fields:
        n = name.lower()
        if n not in NOT_IN_TRAILERS and n[:1] != b":":
            out.append((n, value))
    return out


def accepts_trailers(te: bytes) -> bool:
    """A ``TE`` value (RFC 9110 §10.1.4) that says the client takes a trailer section."""
    return any(t.split(b";", 1)[0].strip().lower() == b"trailers" for t in te.split(b","))


def trailer_block(fields: Fields) -> bytes:
    """The end of a chunked body with ``fields`` as its trailer section (RFC 9112 §7.1.2)."""
    return b"0\r\n" + b"".join(b"%s: %s\r\n" % f for f in fields) + b"\r\n"
