"""HTTP/1.1 wire pieces shared by both directions: status lines, hop-by-hop names, framing.

Everything here is bytes in, bytes out, precomputed where it is on the hot path.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

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


# Byte values: ``13 in line`` finds a byte with memchr, where ``b"\r" in line`` first tries the
# needle as an int and formats (then drops) a TypeError in CPython 3.11: ten times dearer.
CR: Final = 13
LF: Final = 10
SP: Final = 32
LOWER: Final = 32  # or'ed into an ASCII letter, makes it lower case
ZERO: Final = 48


def whole_response(data: bytes) -> int:
    """The end of the head of a complete, plain 2xx/3xx/4xx/5xx response that fills ``data``
    exactly: HTTP/1.1, one Content-Length that matches the bytes after the head, CRLF line
    ends only, nothing hop-by-hop. Such a response can be forwarded as it came, without the
    parser (the common keep-alive case). Returns 0 for anything else: the caller parses it.

    One pass over the lines, a handful of C calls: this runs once per proxied response.
    """
    if data[:9] != b"HTTP/1.1 ":
        return 0
    end = data.find(b"\r\n\r\n")
    if end < 13 or data[12] != SP:
        return 0
    code = status_code(data)
    if code < 200 or code > 599 or code == 204 or code == 304:
        return 0
    length = -1
    for line in data[:end].split(b"\r\n"):
        if CR in line or LF in line:
            return 0  # a bare CR or LF: let the parser judge it
        # Field names compared lower-cased; only the first letter is looked at for most lines.
        # A name that merely starts with a hop-by-hop one (or with "t": te, trailer,
        # transfer-encoding) takes the parser's way too.
        c = line[0] | LOWER if line else 0
        if c == 99:  # c
            if line[:15].lower() == b"content-length:":
                value = line[15:].strip()
                if length >= 0 or not value.isdigit():
                    return 0  # repeated, or not a plain decimal
                length = int(value)
            elif line[:10].lower() == b"connection":
                return 0
        elif c == 116:  # t
            return 0
        elif c == 107:  # k
            if line[:10].lower() == b"keep-alive":
                return 0
        elif c == 112:  # p
            if line[:16].lower() == b"proxy-connection":
                return 0
        elif c == 117 and line[:7].lower() == b"upgrade":  # u
            return 0
    if length != len(data) - end - 4:
        return 0
    return end


def status_code(data: bytes) -> int:
    """The three-digit status of a response starting "HTTP/1.1 NNN" (-1 if not digits), without
    a slice and an ``int()`` call."""
    a = data[9] - ZERO
    b = data[10] - ZERO
    c = data[11] - ZERO
    if not (0 <= a <= 9 and 0 <= b <= 9 and 0 <= c <= 9):
        return -1
    return a * 100 + b * 10 + c


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
