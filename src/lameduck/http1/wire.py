"""HTTP/1.1 wire pieces shared by both directions: status lines, hop-by-hop names, framing.

Everything here is bytes in, bytes out, precomputed where it is on the hot path.
"""

from __future__ import annotations

import re
from http import HTTPStatus

# RFC 9110 §7.6.1: connection-specific fields a proxy must not forward. Transfer-Encoding and
# Content-Length are handled by the framing code, not copied.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
    b"transfer-encoding", b"upgrade",
})

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
STATUS_LINES: dict[int, bytes] = {
    code: b"HTTP/1.1 %d %s\r\n" % (code, phrase) for code, phrase in _REASONS.items()
}


# A field whose name is hop-by-hop, or merely starts with "t" (te, trailer, transfer-encoding):
# such a head takes the parser's way.
_HOP_START = re.compile(rb"\r\n(?:connection|keep-alive|proxy-connection|t|upgrade)")


def whole_response(data: bytes) -> int:
    """The end of the head of a complete, plain 2xx/3xx/4xx/5xx response that fills ``data``
    exactly: HTTP/1.1, one Content-Length that matches the bytes after the head, CRLF line
    ends only, nothing hop-by-hop. Such a response can be forwarded as it came, without the
    parser (the common keep-alive case). Returns 0 for anything else: the caller parses it."""
    if data[:9] != b"HTTP/1.1 ":
        return 0
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return 0
    head = data[:end]
    lower = head.lower()
    i = lower.find(b"\r\ncontent-length:")
    if i < 0 or lower.find(b"\r\ncontent-length:", i + 17) >= 0:
        return 0
    j = lower.find(b"\r\n", i + 17)
    value = head[i + 17 : j if j >= 0 else end].strip()
    if not value.isdigit() or int(value) != len(data) - end - 4:
        return 0
    code = data[9:12]
    if not code.isdigit() or code < b"200" or code == b"204" or code == b"304":
        return 0
    if head.count(b"\n") != head.count(b"\r\n") or head.count(b"\r") != head.count(b"\n"):
        return 0  # a bare CR or LF: let the parser judge it
    if _HOP_START.search(lower):
        return 0
    return end


def status_line(code: int) -> bytes:
    line = STATUS_LINES.get(code)
    if line is None:
        line = b"HTTP/1.1 %d Unknown\r\n" % code
    return line


def drop_nominated(lines: list[bytes], nominated: bytes) -> list[bytes]:
    """Remove the fields a Connection header names (RFC 9110 §7.6.1) from formatted lines."""
    drop = {t.strip() for t in nominated.split(b",")} - {b"", b"close", b"keep-alive"}
    if not drop:
        return lines
    return [h for h in lines if h.split(b":", 1)[0].lower() not in drop]


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (RFC 9112 §7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


def simple_response(
    status: int, body: bytes, *, close: bool, extra: tuple[tuple[bytes, bytes], ...] = (),
    head_only: bool = False,
) -> bytes:
    """A whole locally generated response (errors, going-away, health checks)."""
    parts = [status_line(status), b"content-type: text/plain\r\n",
             b"content-length: %d\r\n" % len(body)]
    parts.extend(b"%s: %s\r\n" % kv for kv in extra)
    if close:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    if not head_only:
        parts.append(body)
    return b"".join(parts)
