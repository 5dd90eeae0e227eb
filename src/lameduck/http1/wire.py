"""HTTP/1.1 wire pieces shared by both directions: status lines, hop-by-hop names, framing.

Everything here is bytes in, bytes out, precomputed where it is on the hot path.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Final

import httptools

from lameduck.proxy.fields import valid_authority

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


# What ``whole_response`` answers: the end of the head (0: not a whole response), then the
# byte spans of up to two lines to leave out of what is forwarded, in order ([0, 0): none).
Whole = tuple[int, int, int, int, int]
NOT_WHOLE: Final = (0, 0, 0, 0, 0)


def response_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """The fields of an HTTP/1.1 response head that ``whole_response`` passed (the
    status line and the field lines, CRLF between them, without the blank line), as llhttp
    reports them: the name as it came, the value from its first byte that is not SP or HTAB
    (RFC 9112 §5: OWS before a value is not part of it; llhttp keeps the trailing one)."""
    fields: list[tuple[bytes, bytes]] = []
    start = head.find(b"\r\n") + 2
    if start < 2:
        return fields
    n = len(head)
    while start < n:
        stop = head.find(b"\r\n", start)
        if stop < 0:
            stop = n
        colon = head.find(b":", start, stop)
        fields.append((head[start:colon], head[colon + 1:stop].lstrip(b" \t")))
        start = stop + 2
    return fields


def whole_response(data: bytes) -> Whole:
    """The end of the head of a complete, plain 2xx/3xx/4xx/5xx response that fills ``data``
    exactly: HTTP/1.1, one Content-Length that matches the bytes after the head, CRLF line
    ends only, and every byte of the head one the parser takes (token names, no control byte,
    no obs-fold). Such a response can be forwarded as it came, without the parser (the common
    keep-alive case). ``(0, ...)`` for anything else: the parser judges it, so an upstream head
    gets the same validation whichever path carries it.

    No ``x-envoy-upstream-service-time``: the proxy sends its own in its place, which the
    parser's path does (Envoy's router overwrites the upstream's). Nothing hop-by-hop but what
    every keep-alive origin sends (nginx, Apache, Node, gunicorn):
    one ``Connection`` field whose value is the token ``keep-alive`` alone (any case, optional
    whitespace) and one ``Keep-Alive`` field. Those lines are the spans returned after the end
    (``[start, stop)``, CR LF included, the earlier first): the forwarded bytes leave them out,
    as the parser's path leaves out every hop-by-hop field (RFC 9110 §7.6.1). A ``Connection``
    naming anything else (close, a field, a list), a second one, or any other hop-by-hop field
    takes the parser's path.

    Two implementations with the same answer (a test holds them to it): the one that is
    cheaper where this module runs, compiled or interpreted.
    """
    if COMPILED:
        return _scan_whole_response(data)
    return _split_whole_response(data)


def _spans(end: int, a: int, a_to: int, b: int, b_to: int) -> Whole:
    """``whole_response``'s answer with the two spans (either may be empty) in order."""
    if b and (not a or b < a):
        return end, b, b_to, a, a_to
    return end, a, a_to, b, b_to


# True when this module runs compiled by mypyc (its file is then the extension module).
COMPILED: Final = not __file__.endswith(".py")

# RFC 9110 §5.6.2 tchar, and the bytes a field value or reason phrase may hold (RFC 9110 §5.5:
# HTAB, SP, VCHAR, obs-text): 1 at a byte's index where it is allowed.
_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
TOKEN: Final = bytes(1 if bytes([c]) in _TCHAR else 0 for c in range(256))
VALUE: Final = bytes(1 if c == 9 or 32 <= c <= 126 or c >= 128 else 0 for c in range(256))
# The same two rules for ``_split_whole_response``: a head the parser would take, as one match.
_PLAIN_HEAD: Final = re.compile(
    rb"HTTP/1\.1 [0-9]{3} [\t -~\x80-\xff]*\r\n"
    rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t -~\x80-\xff]*\r\n)*\r\n")


def _split_whole_response(data: bytes) -> Whole:
    """``whole_response`` for the interpreter: one ``split`` and a few C calls a line beat a
    bytes loop there (3 µs against 17 µs a response)."""
    if data[:9] != b"HTTP/1.1 ":
        return NOT_WHOLE
    end = data.find(b"\r\n\r\n")
    if end < 13 or data[12] != SP:
        return NOT_WHOLE
    code = status_code(data)
    if code < 200 or code > 599 or code == 204 or code == 304:
        return NOT_WHOLE
    if _PLAIN_HEAD.fullmatch(data, 0, end + 4) is None:
        return NOT_WHOLE  # a byte the parser refuses, or a line it would read otherwise
    length = -1
    connection = b""  # the Connection line, and the Keep-Alive line, to leave out
    keep_alive = b""
    for line in data[:end].split(b"\r\n"):
        # Field names compared lower-cased; only the first letter is looked at for most lines.
        # A name that merely starts with a hop-by-hop one (or with "t": te, trailer,
        # transfer-encoding) takes the parser's way too.
        c = line[0] | LOWER if line else 0
        if c == 99:  # c
            if line[:15].lower() == b"content-length:":
                value = line[15:].strip()
                if length >= 0 or not value.isdigit():
                    return NOT_WHOLE  # repeated, or not a plain decimal
                length = int(value)
            elif line[:10].lower() == b"connection":
                if (connection or line[10:11] != b":"
                        or line[11:].strip(b" \t").lower() != b"keep-alive"):
                    return NOT_WHOLE  # a second one, or more than keep-alive
                connection = line
        elif c == 116:  # t
            return NOT_WHOLE
        elif c == 107:  # k
            if line[:10].lower() == b"keep-alive":
                if keep_alive or line[10:11] != b":":
                    return NOT_WHOLE
                keep_alive = line
        elif c == 112:  # p
            if line[:16].lower() == b"proxy-connection":
                return NOT_WHOLE
        elif c == 117 and line[:7].lower() == b"upgrade":  # u
            return NOT_WHOLE
        elif c == 120 and line[:30].lower() == b"x-envoy-upstream-service-time:":  # x
            return NOT_WHOLE  # replaced by the proxy's own (send_head)
    if length != len(data) - end - 4:
        return NOT_WHOLE
    if not connection and not keep_alive:
        return end, 0, 0, 0, 0
    # Each line where it stands: after a CR LF (the status line is never one of them), and
    # only once (a second one was refused above).
    a = a_to = b = b_to = 0
    if connection:
        a = data.find(b"\r\n%s\r\n" % connection, 0, end + 4) + 2
        a_to = a + len(connection) + 2
    if keep_alive:
        b = data.find(b"\r\n%s\r\n" % keep_alive, 0, end + 4) + 2
        b_to = b + len(keep_alive) + 2
    return _spans(end, a, a_to, b, b_to)


def _scan_whole_response(data: bytes) -> Whole:
    """``whole_response`` compiled: one pass over the head's bytes with no
    method call (compiled, a bytes loop is a few instructions a byte; each ``find``, ``split``
    or ``lower`` it replaced cost hundreds).
    """
    if not data.startswith(b"HTTP/1.1 ") or len(data) < 17 or data[12] != SP:
        return NOT_WHOLE
    code = status_code(data)
    if code < 200 or code > 599 or code == 204 or code == 304:
        return NOT_WHOLE
    length = -1
    # The Connection and Keep-Alive lines to leave out: [start, stop), 0 while none was seen.
    connection = connection_to = keep_alive = keep_alive_to = 0
    state = _IN_VALUE  # the reason phrase takes what a field value takes
    size = len(data)
    i = 13  # "HTTP/1.1 NNN " checked above
    while i < size:
        c = data[i]
        if state == _IN_VALUE:
            if c == CR:
                state = _CR
            elif not VALUE[c]:
                return NOT_WHOLE  # a bare LF, NUL or another control byte: the parser's
        elif state == _IN_NAME:
            if c == 58:  # ":"
                state = _IN_VALUE
            elif not TOKEN[c]:
                return NOT_WHOLE  # a space before the colon, or a byte no name holds
        elif state == _CR:
            if c != LF:
                return NOT_WHOLE  # a bare CR
            state = _LINE_START
        elif state == _LINE_START:
            if c == CR:
                state = _BLANK_CR
            elif not TOKEN[c]:
                return NOT_WHOLE  # obs-fold (SP or HT), a bare LF, an empty name
            else:
                state = _IN_NAME
                # Field names compared lower-cased; only the first letter is looked at for
                # most lines. A name that merely starts with a hop-by-hop one (or with "t": te,
                # trailer, transfer-encoding) takes the parser's way too.
                c |= LOWER
                if c == 99:  # c
                    if _named(data, i, b"content-length:"):
                        if length >= 0:
                            return NOT_WHOLE  # repeated
                        length = _decimal(data, i + 15)
                        if length < 0:
                            return NOT_WHOLE  # not a plain decimal
                    elif _named(data, i, b"connection"):
                        if connection or not _named(data, i, b"connection:"):
                            return NOT_WHOLE  # a second one, or a longer name
                        cr = _keep_alive_value(data, i + 11)
                        if cr < 0:
                            return NOT_WHOLE  # close, a field name, a list: the parser's to read
                        connection = i
                        connection_to = cr + 2  # the scan checks the LF
                elif c == 116:  # t
                    return NOT_WHOLE
                elif c == 107:  # k
                    if _named(data, i, b"keep-alive"):
                        if keep_alive or not _named(data, i, b"keep-alive:"):
                            return NOT_WHOLE
                        cr = _line_end(data, i + 11)
                        if cr < 0:
                            return NOT_WHOLE
                        keep_alive = i
                        keep_alive_to = cr + 2
                elif c == 112:  # p
                    if _named(data, i, b"proxy-connection"):
                        return NOT_WHOLE
                elif c == 117 and _named(data, i, b"upgrade"):  # u
                    return NOT_WHOLE
                elif c == 120 and _named(data, i, b"x-envoy-upstream-service-time:"):  # x
                    return NOT_WHOLE  # replaced by the proxy's own (send_head)
        else:  # _BLANK_CR: the head ends at CR LF CR LF
            if c != LF or length != size - i - 1:
                return NOT_WHOLE
            if connection or keep_alive:
                return _spans(i - 3, connection, connection_to, keep_alive, keep_alive_to)
            return i - 3, 0, 0, 0, 0
        i += 1
    return NOT_WHOLE  # no blank line: the head is not all here


# States of the scan in ``whole_response``.
_IN_VALUE: Final = 0  # in a field value or the reason phrase
_CR: Final = 1  # after a CR
_LINE_START: Final = 2  # after a CR LF
_BLANK_CR: Final = 3  # after CR LF CR
_IN_NAME: Final = 4  # in a field name


def _named(data: bytes, at: int, name: bytes) -> bool:
    """``data`` holds ``name`` (lower case) at ``at``, in any ASCII case, as ``bytes.lower``
    folds it. Never matches across a line end: no name holds CR or LF."""
    if at + len(name) > len(data):
        return False
    k = 0
    while k < len(name):
        c = data[at + k]
        if 65 <= c <= 90:
            c += LOWER
        if c != name[k]:
            return False
        k += 1
    return True


def _keep_alive_value(data: bytes, at: int) -> int:
    """The index of the CR ending a field value at ``at`` that is the one token
    ``keep-alive`` (any ASCII case) between optional whitespace (SP, HT), else -1."""
    size = len(data)
    i = at
    while i < size and (data[i] == SP or data[i] == 9):
        i += 1
    if not _named(data, i, b"keep-alive"):
        return -1
    i += 10
    while i < size and (data[i] == SP or data[i] == 9):
        i += 1
    if i >= size or data[i] != CR:
        return -1
    return i


def _line_end(data: bytes, at: int) -> int:
    """The index of the first CR at or after ``at``, -1 if none."""
    size = len(data)
    i = at
    while i < size:
        if data[i] == CR:
            return i
        i += 1
    return -1


def _blank(c: int) -> bool:
    """What ``bytes.strip()`` strips inside a line: space, HT, VT, FF."""
    return c == SP or c == 9 or c == 11 or c == 12


def _decimal(data: bytes, at: int) -> int:
    """The Content-Length value at ``at``: what ``int(value.strip())`` gives when the value
    (up to the line's CR) is plain ASCII digits between blanks, else -1."""
    size = len(data)
    i = at
    while i < size and _blank(data[i]):
        i += 1
    value = 0
    digits = 0
    while i < size:
        c = data[i]
        if c < ZERO or c > ZERO + 9:
            break
        value = value * 10 + c - ZERO
        digits += 1
        i += 1
    while i < size and _blank(data[i]):
        i += 1
    if digits == 0 or i >= size or data[i] != CR:
        return -1  # empty, or something else than digits (a bare LF included)
    return value


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


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (RFC 9112 §7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK: Final = b"0\r\n\r\n"


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


# RFC 9112 §3.2.2 absolute-form for the http and https schemes (RFC 9110 §4.2): scheme "://"
# authority, then path-abempty and an optional query. Anything in the authority is checked by
# ``valid_authority`` afterwards; a fragment or a space never reaches here (llhttp refuses it).
_ABSOLUTE: Final = re.compile(rb"(?i:https?)://([^/?#]*)([^?#]*)(\?[^#]*)?")


def absolute_form(target: bytes) -> tuple[bytes, bytes] | None:
    """``(authority, origin-form target)`` of an absolute-form request target, or None if it
    is not one lameduck can forward. The authority replaces Host (RFC 9112 §3.2.2); an empty
    path is sent as ``/`` (RFC 9112 §3.2.1)."""
    m = _ABSOLUTE.fullmatch(target)
    if m is None:
        return None
    authority, path, query = m.group(1), m.group(2), m.group(3)
    if not authority or not valid_authority(authority):
        return None  # no host, userinfo (RFC 9110 §4.2.4), or not a host[:port]
    return authority, (path or b"/") + (query or b"")


class _Quiet:
    """Callbacks for a parser that only checks a method."""


# llhttp knows only registered methods; an extension method (any token, RFC 9110 §9.1) is
# parsed in the place of one that llhttp treats like any other (not CONNECT, not HEAD) and
# forwarded as it came, as HAProxy and nginx do.
STAND_IN: Final = b"POST"


def extension_method(data: bytes) -> tuple[bytes, bytes] | None:
    """``data`` begins (after the empty lines RFC 9112 §2.2 lets a server skip) with a
    request line whose method is a token llhttp refused: (that method, ``data`` with the
    stand-in in its place). None if it does not."""
    rest = data.lstrip(b"\r\n")
    sp = rest.find(b" ")
    if sp <= 0:
        return None
    method = rest[:sp]
    for c in method:
        if not TOKEN[c]:
            return None
    probe = httptools.HttpRequestParser(_Quiet())
    try:
        probe.feed_data(method + b" / HTTP/1.1\r\n")
    except httptools.HttpParserInvalidMethodError:
        return method, STAND_IN + rest[sp:]
    except httptools.HttpParserError:
        pass
    return None  # a method llhttp knows: what it refused lies further on
