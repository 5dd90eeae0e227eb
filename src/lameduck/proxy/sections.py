"""Field sections as HTTP/2 and HTTP/3 carry them: one set of rules for both codecs.

HTTP/3 took HTTP/2's message rules over unchanged (RFC 9114 §4.2, §4.3 restate RFC 9113
§8.2, §8.3): lower-case names, no connection-specific fields, ``te`` only "trailers", the
pseudo-fields first and each once, CONNECT with only ``:method`` and ``:authority``, an
extended CONNECT (RFC 8441, RFC 9220) with ``:protocol`` and all four, cookie crumbs joined
(RFC 9113 §8.2.3, RFC 9114 §4.2.1), and trailers without pseudo-fields. A message that breaks
one is malformed: HTTP/2 resets its stream with PROTOCOL_ERROR, HTTP/3 with H3_MESSAGE_ERROR.
The codecs differ in how they say it, never in what they accept, so the rules live here once.

Per-field work is cached: a client repeats the same fields on every request (and an upstream
the same names on every response), and the byte-wise checks (a bytes.translate each) were
most of a stream's cost. Keys are the bytes themselves, so a different (say, invalid) value
is always checked afresh. The caches are process-wide and bounded: entries are small and a
full dict is dropped, so endless distinct fields only cost their checks.
"""

from __future__ import annotations

from typing import Final, cast

from lameduck.proxy.fields import HOP_BY_HOP

# A field as decoded: ``object`` where it is only passed on or looked up (mypyc keeps a
# ``tuple[bytes, bytes]`` unboxed and would allocate a new tuple at every dict lookup).
Row = object

# RFC 9113 §8.2.2, RFC 9114 §4.2: connection-specific fields make a request malformed;
# responses drop them. The hop-by-hop set, but TE, allowed as "trailers" (checked on its own).
CONNECTION_SPECIFIC: Final = HOP_BY_HOP - {b"te"}
_SPECIAL: Final = CONNECTION_SPECIFIC | {b"te", b"content-length", b"cookie"}

# bytes.translate(None, delete=OK) leaves only what is not OK: one C pass per field.
NAME_OK: Final = bytes(c for c in range(0x21, 0x7F) if not 0x41 <= c <= 0x5A and c != 0x3A)
VALUE_OK: Final = bytes(c for c in range(256) if c not in (0x00, 0x0A, 0x0D))
_TOKEN_OK: Final = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_TARGET_OK: Final = bytes(c for c in range(0x21, 0x100) if c != 0x7F)
_WS: Final = b" \t"

CACHE_MAX: Final = 2048
CACHE_ENTRY_MAX: Final = 512  # name + value octets; longer fields are checked every time


class Malformed(Exception):
    """A malformed message (RFC 9113 §8.1.1, RFC 9114 §4.1.2): a stream error."""


# What a field is, once it passed the checks that need no other field (``classify``).
REGULAR: Final = 0
COOKIE: Final = 1
CONTENT_LENGTH: Final = 2
METHOD: Final = 3  # this and above: pseudo-fields
SCHEME: Final = 4
AUTHORITY: Final = 5
PATH: Final = 6
PROTOCOL: Final = 7
STATUS_FIELD: Final = 8  # a response's :status; malformed in a request
_PSEUDO: Final[dict[bytes, int]] = {
    b":method": METHOD, b":scheme": SCHEME, b":authority": AUTHORITY, b":path": PATH,
    b":protocol": PROTOCOL, b":status": STATUS_FIELD,
}
# (name, value) → kind, for requests and responses alike: a regular field's rules do not
# depend on the direction (RFC 9113 §8.2), and each pseudo-field has its own kind.
FIELD_KINDS: Final[dict[Row, int]] = {}


def classify(field: Row) -> int:
    """The kind of a request or response field, after the checks that depend on it alone
    (RFC 9113 §8.2.1, §8.2.2, §8.3.1, §8.3.2; RFC 9114 §4.2, §4.3): names lower-case visible
    ASCII or a known pseudo-field, values without NUL/CR/LF or edge whitespace, no
    connection-specific field, te only "trailers", content-length digits, :method a token,
    :path and :authority visible octets, :path not empty, :status three digits from 100 to
    599 but not 101 (no 101 in HTTP/2 or HTTP/3). Raises Malformed; remembers the kind of a
    field that passed. Whether a pseudo-field belongs in the message at hand is for
    ``request_fields`` and the client's response check to judge."""
    name, value = cast("tuple[bytes, bytes]", field)
    if value:
        if value.translate(None, VALUE_OK):
            raise Malformed
        first = value[0]
        last = value[-1]
        if first == 0x20 or first == 0x09 or last == 0x20 or last == 0x09:
            raise Malformed
    kind = _PSEUDO.get(name, REGULAR)
    if kind == METHOD:
        if not value or value.translate(None, _TOKEN_OK):
            raise Malformed
    elif kind == PATH:
        if not value or value.translate(None, _TARGET_OK):
            raise Malformed
    elif kind == AUTHORITY:
        if value.translate(None, _TARGET_OK):
            raise Malformed
    elif kind == REGULAR:
        if not name or name.translate(None, NAME_OK):  # also unknown pseudo-fields
            raise Malformed
        if name in _SPECIAL:
            if name == b"te":
                if value != b"trailers":
                    raise Malformed
            elif name == b"content-length":
                if not value.isdigit():
                    raise Malformed
                kind = CONTENT_LENGTH
            elif name == b"cookie":
                kind = COOKIE
            else:
                raise Malformed
    elif kind == STATUS_FIELD and (len(value) != 3 or not value.isdigit()
                                   or not 0x31 <= value[0] <= 0x35 or value == b"101"):
        raise Malformed
    if len(name) + len(value) <= CACHE_ENTRY_MAX:
        cache = FIELD_KINDS
        if len(cache) >= CACHE_MAX:
            cache.clear()
        cache[field] = kind
    return kind


def request_fields(headers: list[tuple[bytes, bytes]], end_stream: bool) -> tuple[
        bytes, bytes | None, bytes | None, bytes | None, bytes | None,
        list[tuple[bytes, bytes]], int]:
    """Validate a request head (RFC 9113 §8.2, §8.3, RFC 8441 §4; RFC 9114 §4.2, §4.3,
    RFC 9220 §3): its method, scheme, authority, path, protocol, regular fields and
    content-length (-1 if none). Raises Malformed. The list of regular fields is ``headers``
    (the decoder's own list) or a new one: the caller's is left as it was."""
    method = scheme = authority = path = protocol = None
    cl = -1
    cookies = 0
    pseudo = 0  # how many pseudo-fields lead the list
    seen = 0
    kinds = FIELD_KINDS
    for row in cast("list[Row]", headers):
        kind = kinds.get(row, -1)
        if kind < 0:
            kind = classify(row)
        seen += 1
        if kind == REGULAR:
            continue
        value = cast("tuple[bytes, bytes]", row)[1]
        if kind >= METHOD:
            if pseudo + 1 != seen:  # after a regular field
                raise Malformed
            pseudo = seen
            if kind == METHOD:
                if method is not None:
                    raise Malformed
                method = value
            elif kind == PATH:
                if path is not None:
                    raise Malformed
                path = value
            elif kind == SCHEME:
                if scheme is not None:
                    raise Malformed
                scheme = value
            elif kind == AUTHORITY:
                if authority is not None:
                    raise Malformed
                authority = value
            elif kind == PROTOCOL:
                if protocol is not None:
                    raise Malformed
                protocol = value
            else:  # :status
                raise Malformed
        elif kind == CONTENT_LENGTH:
            n = int(value)
            if cl >= 0 and n != cl:
                raise Malformed
            cl = n
        else:
            cookies += 1
    if method is None:
        raise Malformed
    if method == b"CONNECT" and protocol is None:
        if authority is None or scheme is not None or path is not None:
            raise Malformed
    else:
        if protocol is not None and method != b"CONNECT":
            raise Malformed
        if scheme is None or path is None or (protocol is not None and authority is None):
            raise Malformed
        if path[0] != 0x2F and not (path == b"*" and method == b"OPTIONS"):
            raise Malformed
    if end_stream and cl > 0:
        raise Malformed
    if pseudo:
        headers = headers[pseudo:]
    if cookies > 1:
        headers = join_cookies(headers)
    return method, scheme, authority, path, protocol, headers, cl


def join_cookies(regular: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Cookie crumbs as one field where the first was (RFC 9113 §8.2.3, RFC 9114 §4.2.1)."""
    crumbs = [v for n, v in regular if n == b"cookie"]
    first = next(i for i, (n, _) in enumerate(regular) if n == b"cookie")
    joined = [f for f in regular if f[0] != b"cookie"]
    joined.insert(first, (b"cookie", b"; ".join(crumbs)))
    return joined


def trailers_ok(headers: list[tuple[bytes, bytes]]) -> bool:
    """A trailer section's fields may stand (RFC 9113 §8.1, RFC 9114 §4.1): no pseudo-field,
    names lower-case visible ASCII, values without NUL/CR/LF or edge whitespace, nothing
    connection-specific. A field a request head carried passed these checks already."""
    kinds = FIELD_KINDS
    for row in cast("list[Row]", headers):
        if kinds.get(row, METHOD) < METHOD:
            continue  # a request carried it: fine in trailers too
        name, value = cast("tuple[bytes, bytes]", row)
        if (name[:1] == b":" or name.translate(None, NAME_OK) or not name
                or value.translate(None, VALUE_OK)
                or (value and (value[0] in _WS or value[-1] in _WS))
                or name in CONNECTION_SPECIFIC):
            return False
    return True


# Field names as sent: lower-cased, b"" for connection-specific ones (dropped).
OUT_NAMES: Final[dict[bytes, bytes]] = {}


def out_name(name: bytes) -> bytes:
    """The form a field name is sent in (from an HTTP/1.1 upstream's head, say): lower case,
    or b"" if it must not be sent (RFC 9113 §8.2.2, RFC 9114 §4.2). Cached (``OUT_NAMES``)."""
    out = name.lower()
    if out in CONNECTION_SPECIFIC:
        out = b""
    if len(name) <= CACHE_ENTRY_MAX:
        if len(OUT_NAMES) >= CACHE_MAX:
            OUT_NAMES.clear()
        OUT_NAMES[name] = out
    return out


def outgoing(fields: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``fields`` (a head's or a trailer section's, as an HTTP/1.1 upstream gave them) as
    HTTP/2 or HTTP/3 sends them: names lower-cased, connection-specific and pseudo-fields
    left out, values without the edge whitespace those protocols forbid (RFC 9113 §8.2.1,
    RFC 9114 §4.2; no part of the value, RFC 9110 §5.5)."""
    out = []
    for name, value in fields:
        sent = OUT_NAMES.get(name)
        if sent is None:
            sent = out_name(name)
        if sent and sent[:1] != b":":
            out.append((sent, value.strip(b" \t")))
    return out
