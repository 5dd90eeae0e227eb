"""The access log: Envoy's format operators and response flags, written off the request path.

An exchange records its facts as it goes (``flags``, a small int: one bit per fact, set where
the fact happens); a line is formatted only at settle, and only when the listener has a log.
The codecs keep the few request fields Envoy's default format logs as they read the head
(``Exchange.log_*``), so its line is one bytes format of values at hand (``default_line``);
other formats look fields up in what the codec kept (``Request``). Lines are bytes, collected
in a buffer written when it reaches ``FLUSH_SIZE``, ``FLUSH_INTERVAL`` after its first line (a
timer on the loop), on SIGUSR1 (which also reopens the file, for logrotate) and at exit.
Envoy's file access log buffers the same way (``--file-flush-interval-msec``).

Response flags are Envoy's codes where Envoy has one (its access-log docs, "Command Operators",
``%RESPONSE_FLAGS%``); the drain's own failures use codes Envoy does not use, and the drain's
facts about responses that succeeded (RD, PD) are ``%DRAIN_FLAGS%``: see docs/access-log.md.
``compile_format`` is what both ``validate`` (the config's validator) and a listener call, so
a format one accepts the other writes.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import sys
import time
from binascii import hexlify
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import IO, TYPE_CHECKING, Any, Final

from lameduck.proxy.message import HTTP2, HTTP3, HTTP10, HTTP11, SERVICE_TIME, STREAM

if TYPE_CHECKING:
    from lameduck.proxy.exchange import Exchange

# -- response flags (bits of Exchange.flags) ----------------------------------------------------
UH: Final = 1 << 0  # no healthy upstream
UF: Final = 1 << 1  # upstream connect failure
UT: Final = 1 << 2  # upstream request timeout (the route timeout, per_try_idle_timeout)
URX: Final = 1 << 3  # retry limit (num_retries or the retry budget) reached
UC: Final = 1 << 4  # upstream connection termination
UR: Final = 1 << 5  # upstream remote reset (an HTTP/2 stream refused or reset)
LR: Final = 1 << 6  # connection local reset (lameduck reset the client: the response was cut)
DC: Final = 1 << 7  # downstream connection termination (the client went away)
NR: Final = 1 << 8  # no route
DPE: Final = 1 << 9  # downstream protocol error
# The drain's own (not Envoy codes)
GA: Final = 1 << 10  # going away: refused after the drain time T
CB: Final = 1 << 11  # cut at the shutdown deadline before the response started (503)
CA: Final = 1 << 12  # cut at the shutdown deadline after the response started (reset)
RD: Final = 1 << 13  # this response drained its connection (Connection: close / GOAWAY)
PD: Final = 1 << 14  # its connection was drained proactively (at its drain moment)
SV: Final = 1 << 15  # its upstream connection was severed by the endpoint's drain stop
DR: Final = 1 << 16  # downstream remote reset (the client reset the HTTP/2 stream)
UPE: Final = 1 << 17  # upstream protocol error (a response that is no HTTP response: 502)
# Drain facts (%DRAIN_FLAGS%), not failures: a drained 200 logs no %RESPONSE_FLAGS%.
DRAIN_BITS: Final = RD | PD
FAILURE_BITS: Final = ~DRAIN_BITS

FLAG_CODES: Final = (
    (UH, "UH"), (UF, "UF"), (UT, "UT"), (URX, "URX"), (UC, "UC"), (UR, "UR"), (LR, "LR"),
    (DC, "DC"), (NR, "NR"), (DPE, "DPE"), (UPE, "UPE"), (GA, "GA"), (CB, "CB"), (CA, "CA"),
    (RD, "RD"), (PD, "PD"), (SV, "SV"),
    (DR, "DR"),
)

# Envoy's default format string (its access-log docs, "Default Format String").
DEFAULT_FORMAT: Final = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n'
)
FLUSH_SIZE: Final = 64 * 1024  # buffered bytes that are written at once
FLUSH_INTERVAL: Final = 1.0  # seconds a line may wait in the buffer


def flag_string(flags: int) -> str:
    """Envoy's rendering: the codes joined by commas, "-" for none."""
    if not flags:
        return "-"
    return ",".join(code for bit, code in FLAG_CODES if flags & bit)


_FLAG_BYTES: Final[dict[int, bytes]] = {}  # at most one entry per combination that happened


def flag_bytes(flags: int) -> bytes:
    """``flag_string`` as bytes, made once per combination of flags."""
    if not flags:
        return b"-"
    text = _FLAG_BYTES.get(flags)
    if text is None:
        text = _FLAG_BYTES[flags] = flag_string(flags).encode()
    return text


_random_bytes: Final = os.urandom  # the request ids' randomness (one getrandom(2) a batch)


class _Ids:
    """Request ids made 64 at a time: one read of 64 times 16 random bytes from the kernel and
    one hexlify, then a slice per request (formatting a 128-bit int to hex per request cost
    2,500 instructions, 5 % of a keep-alive GET; the Mersenne Twister's bytes, 450)."""

    def __init__(self) -> None:
        self.hexes = b""
        self.at = 0


_ID_BATCH: Final = 64
_ids: Final = _Ids()


def _forget_ids() -> None:
    """A forked worker must not hand out the ids left in its parent's batch."""
    _ids.hexes = b""
    _ids.at = 0


os.register_at_fork(after_in_child=_forget_ids)


def new_request_id() -> bytes:
    """A 128-bit random id as 32 hex digits (not uuid4's layout: no UUID object per
    request)."""
    ids = _ids
    at = ids.at
    if at >= len(ids.hexes):
        ids.hexes = hexlify(_random_bytes(16 * _ID_BATCH))
        at = 0
    ids.at = at + 32
    return ids.hexes[at:at + 32]


# -- what a line is made of ---------------------------------------------------------------------
class Request:
    """The request fields of one line, looked up by lower-case name (``:method``, ``:path``,
    ``:authority`` too) in what the codec kept for the log (``ex.log_req``): HTTP/1.1's head
    lines as sent upstream (X-Forwarded-For with the client's address appended, as Envoy logs
    it), searched once lower-cased; HTTP/2's fields, and HTTP/1.1's routing ones (Host, ...),
    as received."""

    __slots__ = ("blob", "ex", "raw")

    def __init__(self, ex: Any) -> None:
        self.ex = ex
        self.blob: bytes | None = None
        self.raw: bytes | None = None

    def get(self, name: bytes) -> bytes | None:
        ex = self.ex
        if name == b":method":
            return ex.method or None  # type: ignore[no-any-return]
        if name == b"x-request-id" and ex.request_id:
            return ex.request_id  # type: ignore[no-any-return]  # also when lameduck made it
        if name in _KEPT:  # the default format's: what the codec kept as it read the head
            return _KEPT[name](ex) or None
        kept = ex.log_req
        if kept is None:
            return None
        path, pairs, lines = kept
        if name == b":path":
            return path or None  # type: ignore[no-any-return]
        if lines:
            v = self.find(b"\r\n" + name + b":")
            if v is not None:
                return v
        for n, v in pairs:
            if n.lower() == name:  # HTTP/1.1's names keep their case
                return v or None  # type: ignore[no-any-return]
        return None

    def find(self, needle: bytes) -> bytes | None:
        """HTTP/1.1: the value after ``needle`` (CRLF, a lower-case name, a colon) in the head's
        lines, which keep their case; None if no line has that name."""
        blob = self.blob
        if blob is None:
            kept = self.ex.log_req
            if kept is None or not kept[2]:
                return None
            self.raw = b"".join(kept[2])
            blob = self.blob = b"\r\n" + self.raw.lower()
        at = blob.find(needle)
        if at < 0:
            return None
        at += len(needle)
        end = blob.find(b"\r\n", at)
        if end < 0:
            end = len(blob)
        raw = self.raw
        assert raw is not None
        return raw[at - 2:end - 2].strip() or None


def authority(ex: Any) -> bytes | None:
    """``:authority``: as the codec kept it (HTTP/1.1: the Host sent upstream; HTTP/2: the
    ``:authority`` or Host received), else the first Host received (a request refused before
    it was routed)."""
    host: bytes | None = ex.log_host
    if host is None and ex.log_req is not None:
        for n, v in ex.log_req[1]:
            if n.lower() == b"host":
                return v  # type: ignore[no-any-return]
    return host


def keep_for_log(ex: Exchange, fields: list[tuple[bytes, bytes]]) -> None:
    """The default format's request fields, as received (the first of each name), in one pass
    over the request's fields; admission replaces X-Forwarded-For and the authority with what
    it sent and routed by (a request answered before admission keeps these)."""
    for n, v in fields:
        # The spellings clients send compared first: ``lower()`` is a method call by name.
        size = len(n)
        if size == 10:
            if ex.log_agent is None and (n == b"User-Agent" or n == b"user-agent"
                                         or n.lower() == b"user-agent"):
                ex.log_agent = v.strip()
        elif size == 15:
            if ex.log_xff is None and n.lower() == b"x-forwarded-for":
                ex.log_xff = v.strip()
        elif size == 4:
            if ex.log_host is None and (n == b"Host" or n == b"host" or n.lower() == b"host"):
                ex.log_host = v
        elif size == 21 and ex.log_opath is None and n.lower() == b"x-envoy-original-path":
            ex.log_opath = v.strip()


# The request fields the codecs keep for the default format, by the name a format asks for.
_KEPT: Final[dict[bytes, Callable[[Any], bytes | None]]] = {
    b"x-envoy-original-path": lambda ex: ex.log_opath,  # type: ignore[no-any-return]
    b"x-forwarded-for": lambda ex: ex.log_xff,  # type: ignore[no-any-return]
    b"user-agent": lambda ex: ex.log_agent,  # type: ignore[no-any-return]
    b":authority": authority,
}


def _resp_header(ex: Any, name: bytes) -> bytes | None:
    if name == SERVICE_TIME and ex.svc_ms >= 0:
        return b"%d" % ex.svc_ms  # the proxy's own, as the client got it
    fields = ex.resp_fields
    if fields is None:
        return None
    size = len(name)
    for n, v in fields:
        if len(n) == size and n.lower() == name:  # no lowered copy of every field
            return v  # type: ignore[no-any-return]
    return None


def _text(v: bytes | None) -> str:
    return v.decode("latin-1") if v else "-"


class _Stamp:
    """The last second formatted, and its text."""

    def __init__(self) -> None:
        self.sec = -1
        self.sec_text = b""


_stamp: Final = _Stamp()
# ".000Z" to ".999Z": a millisecond's text is looked up, not formatted (callgrind counted
# 850 instructions a line for the bytes format that made it).
_MS_TEXT: Final = tuple(b".%03dZ" % ms for ms in range(1000))


def stamp_second(sec: int) -> bytes:
    """``sec`` (since the epoch) as ISO 8601 UTC to the second, formatted once per second
    (as nginx caches its ``$time_local``)."""
    st = _stamp
    if st.sec != sec:
        st.sec = sec
        st.sec_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)).encode()
    return st.sec_text


def start_stamp(ms: int) -> bytes:
    """ISO 8601 UTC with milliseconds (``ms`` since the epoch), as Envoy writes %START_TIME%."""
    return stamp_second(ms // 1000) + _MS_TEXT[ms % 1000]


# "0" to "1023": the numbers of a line (status, byte counts, durations) are mostly small, and
# one looked up makes no bytes object (mypyc formats an int to a new one).
_SMALL: Final = tuple(b"%d" % n for n in range(1024))


def number_bytes(n: int) -> bytes:
    """``n`` in decimal, as bytes."""
    if 0 <= n < 1024:
        return _SMALL[n]
    return b"%d" % n


def start_time(ex: Any, now: float, wall: float) -> str:
    """%START_TIME% of ``ex``, given the loop time and the wall time at ``now``."""
    return start_stamp(int((wall - (now - ex.t0)) * 1000)).decode()


def protocol_bytes(version: int) -> bytes:
    """%PROTOCOL%: "-" for a TCP connection, as Envoy writes it; a request line that was no
    HTTP/1.x (answered 400/505, version 0) reads HTTP/1.1."""
    if version == HTTP11:
        return b"HTTP/1.1"
    if version == HTTP2:
        return b"HTTP/2"
    if version == HTTP10:
        return b"HTTP/1.0"
    if version == HTTP3:
        return b"HTTP/3"
    return b"-" if version == STREAM else b"HTTP/1.1"


def protocol(ex: Any) -> str:
    return protocol_bytes(ex.version).decode()


def upstream_host(ex: Any) -> str | None:
    ep = ex.endpoint
    return None if ep is None else ep.address  # type: ignore[no-any-return]  # host:port


def upstream_cluster(ex: Any) -> str | None:
    c = ex.cluster
    return None if c is None else c.name  # type: ignore[no-any-return]


def remote_address(ex: Any) -> str | None:
    """The client's address as ``host:port`` (``[host]:port`` for IPv6), read from the
    transport once per connection (``Downstream.log_peer``), not once per line."""
    down = ex.down
    text: str | None = getattr(down, "log_peer", None)
    if text is not None:
        return text or None
    t = down.transport
    if t is None:
        return None
    peer = t.get_extra_info("peername")
    if not peer:
        text = ""
    else:
        host, port = peer[0], peer[1]
        text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    down.log_peer = text
    return text or None


def duration(ex: Any, now: float) -> int:
    return int((now - ex.t0) * 1000)


Op = Callable[[Any, float, float, Request], str]


class FormatError(ValueError):
    """A format lameduck cannot write: ``validate`` and ``run`` refuse it the same way (the
    config's validator compiles the format with ``compile_format``, as a listener does)."""


# Envoy's command operator: %NAME%, %NAME(ARG)%, and %NAME(ARG):N% (the value cut to N
# characters), its access-log docs, "Format Rules" and "Command Operators".
_OP: Final = re.compile(r"%([A-Z0-9_]+)(?:\(([^)]*)\))?(?::([0-9]+))?%")


def _req_op(arg: str, limit: int | None) -> Op:
    # "X?Y": X, else Y (Envoy's alternative header)
    names = [a.strip().lower().encode() for a in arg.split("?")]
    if len(names) > 2 or not all(names):
        raise FormatError(f"%REQ({arg})%: one header name, or two as X?Y (Envoy's alternative)")

    def op(ex: Any, now: float, wall: float, req: Request) -> str:
        for n in names:
            v = req.get(n)
            if v:
                return _text(v)[:limit]
        return "-"
    return op


def _resp_op(arg: str, limit: int | None) -> Op:
    key = arg.strip().lower().encode()
    if not key or b"?" in key:
        raise FormatError(f"%RESP({arg})%: one response header name")
    return lambda ex, now, wall, req: _text(_resp_header(ex, key))[:limit]


# strftime's specifiers %START_TIME(...)% takes, beside Envoy's own %s and %f / %1f..%9f: the
# C standard's that do not depend on the locale, formatted in UTC as Envoy formats them.
START_TIME_SPECIFIERS: Final = "aAbBdDeFHIjmMpRSTuwyYzZnt%"


def _start_time_op(arg: str) -> Op:
    """%START_TIME(FORMAT)%: strftime's specifiers (``START_TIME_SPECIFIERS``, UTC), %s (seconds
    since the epoch) and %f / %Nf (the second's fraction to 9 or N digits), as Envoy's
    access-log docs define them; any other specifier is refused, not written literally."""
    if not arg:
        return lambda ex, now, wall, req: start_time(ex, now, wall)
    parts: list[str | int] = []  # a strftime format, or a number of fraction digits (0: %s)
    chunk = ""
    i = 0
    while i < len(arg):
        c = arg[i]
        if c != "%":
            chunk += c
            i += 1
            continue
        spec = arg[i + 1:i + 2]
        if spec == "f" or (spec and spec in "123456789" and arg[i + 2:i + 3] == "f"):
            digits = 9 if spec == "f" else int(spec)
            i += 2 if spec == "f" else 3
        elif spec == "s":
            digits = 0
            i += 2
        elif spec and spec in START_TIME_SPECIFIERS:
            chunk += "UTC" if spec == "Z" else "%" + spec  # glibc's gmtime() zone is "GMT"
            i += 2
            continue
        else:
            raise FormatError(
                f"%START_TIME({arg})%: unsupported specifier {'%' + spec!r} (supported: %s, "
                f"%f, %1f..%9f and {', '.join('%' + x for x in START_TIME_SPECIFIERS)})")
        if chunk:
            parts.append(chunk)
            chunk = ""
        parts.append(digits)
    if chunk:
        parts.append(chunk)

    def op(ex: Any, now: float, wall: float, req: Request) -> str:
        at = wall - (now - ex.t0)
        sec = int(at // 1)
        out = []
        for p in parts:
            if isinstance(p, str):
                out.append(time.strftime(p, time.gmtime(sec)))
            elif p == 0:
                out.append(str(sec))
            else:
                scale = 10 ** p
                out.append(str(min(int((at - sec) * scale), scale - 1)).zfill(p))
        return "".join(out)
    return op


def drain_flag_string(flags: int) -> str:
    """%DRAIN_FLAGS%: the drain's facts about a response that may well have succeeded (RD, PD),
    kept out of %RESPONSE_FLAGS%, which dashboards read as failures."""
    return flag_string(flags & DRAIN_BITS)


_SIMPLE: Final[dict[str, Op]] = {
    "PROTOCOL": lambda ex, now, wall, req: protocol(ex),
    "RESPONSE_CODE": lambda ex, now, wall, req: str(ex.status),
    "RESPONSE_FLAGS": lambda ex, now, wall, req: flag_string(ex.flags & FAILURE_BITS),
    "DRAIN_FLAGS": lambda ex, now, wall, req: drain_flag_string(ex.flags),
    "BYTES_RECEIVED": lambda ex, now, wall, req: str(ex.bytes_rx),
    "BYTES_SENT": lambda ex, now, wall, req: str(ex.bytes_tx),
    "DURATION": lambda ex, now, wall, req: str(duration(ex, now)),
    "UPSTREAM_HOST": lambda ex, now, wall, req: upstream_host(ex) or "-",
    "UPSTREAM_CLUSTER": lambda ex, now, wall, req: upstream_cluster(ex) or "-",
    "DOWNSTREAM_REMOTE_ADDRESS": lambda ex, now, wall, req: remote_address(ex) or "-",
    "REQUEST_ID": lambda ex, now, wall, req: _text(ex.request_id),
}
# Every operator a format may name (docs/access-log.md lists them).
OPERATORS: Final = ("START_TIME", "REQ", "RESP", *_SIMPLE)


def _operator(name: str, arg: str | None, limit: int | None) -> Op:
    """One command operator, as a function of (exchange, loop time, wall time, request)."""
    if name in ("REQ", "RESP"):
        if arg is None or not arg.strip():
            raise FormatError(f"%{name}(X)% needs a header name in its parentheses")
        return _req_op(arg, limit) if name == "REQ" else _resp_op(arg, limit)
    if limit is not None:
        raise FormatError(f"%{name}%: only %REQ(X)% and %RESP(X)% take a length (:{limit})")
    if name == "START_TIME":
        return _start_time_op(arg or "")
    op = _SIMPLE.get(name)
    if op is None:
        raise FormatError(f"unknown operator %{name}% (lameduck writes: "
                          f"{', '.join('%' + n + '%' for n in OPERATORS)})")
    if arg is not None:
        raise FormatError(f"%{name}% takes no argument, got ({arg})")
    return op


def compile_text(fmt: str) -> Callable[[Any, float, float], str]:
    """A format string (Envoy's operators; anything else is literal) as one function. No
    newline is added: Envoy's default format ends with one, a custom one says where. A '%'
    that starts no operator is refused, as Envoy refuses it ("Couldn't find valid command")."""
    ops: list[Op] = []
    pos = 0
    while pos < len(fmt):
        at = fmt.find("%", pos)
        if at < 0:
            ops.append(_literal(fmt[pos:]))
            break
        if at > pos:
            ops.append(_literal(fmt[pos:at]))
        m = _OP.match(fmt, at)
        if m is None:
            raise FormatError(f"no command operator at position {at} ({fmt[at:at + 24]!r}): "
                              "'%' starts one, as %NAME%, %NAME(ARG)% or %NAME(ARG):N%")
        limit = m.group(3)
        ops.append(_operator(m.group(1), m.group(2), None if limit is None else int(limit)))
        pos = m.end()

    def line(ex: Any, now: float, wall: float) -> str:
        req = Request(ex)
        return "".join([op(ex, now, wall, req) for op in ops])
    return line


def compile_format(fmt: str | None) -> Callable[[Any, float, float], str] | None:
    """A listener's ``access_log.format``: None (Envoy's default, by ``default_line``), "json"
    (``json_line``) or a format string with at least one operator (a line with none, such as
    a misspelt "jsn", would write the same text for every request: refused)."""
    if fmt is None:
        return None
    if fmt == "json":
        return json_line
    if "%" not in fmt:
        raise FormatError(f"{fmt!r} is neither \"json\" nor a format string (one with a "
                          "command operator such as %RESPONSE_CODE%)")
    return compile_text(fmt)


def _literal(text: str) -> Op:
    return lambda ex, now, wall, req: text


def default_line(ex: Exchange, now: float, wall: float) -> bytes:
    """Envoy's default format (``DEFAULT_FORMAT``) as one bytes format of the fields the codec
    kept: no call per operator, no decoding (``compile_text`` gives the same text, tested)."""
    kept = ex.log_req
    path = ex.log_opath or (kept[0] if kept is not None else None) or b"-"
    # (``ex`` typed: native reads of its fields, not the lookups by name of the Any-typed
    # helpers the format operators share)
    host = ex.log_host
    if not host:
        host = authority(ex) or b"-"  # a request refused before it was routed
    svc = b"-"
    resp = ex.resp_fields
    if ex.svc_ms >= 0:
        svc = number_bytes(ex.svc_ms)  # the proxy's own, as the client got it
    elif resp is not None:
        for n, v in resp:
            if len(n) == 29 and n.lower() == b"x-envoy-upstream-service-time":
                svc = v
                break
    ep = ex.endpoint
    method = ex.method or b"-"
    xff = ex.log_xff or b"-"
    agent = ex.log_agent or b"-"
    rid = ex.request_id or b"-"
    at = int((wall - (now - ex.t0)) * 1000)
    sec = stamp_second(at // 1000)  # the stamp in two pieces: no bytes made for it
    msec = _MS_TEXT[at % 1000]
    proto = protocol_bytes(ex.version)
    flags = flag_bytes(ex.flags & FAILURE_BITS)
    status = number_bytes(ex.status)
    rx = number_bytes(ex.bytes_rx)
    tx = number_bytes(ex.bytes_tx)
    ms = number_bytes(int((now - ex.t0) * 1000))
    upstream = b"-" if ep is None else ep.address_bytes
    # the format stays a literal in both calls (mypyc builds it in one piece, no format parsed)
    line = b'[%s%s] "%s %s %s" %s %s %s %s %s %s "%s" "%s" "%s" "%s" "%s"\n' % (
        sec, msec, method, path, proto, status, flags, rx, tx, ms, svc, xff, agent, rid, host,
        upstream)
    if _isascii(line):
        return line
    # A field with bytes beyond ASCII: written as the text formats write it (each byte a
    # latin-1 character, the line UTF-8).
    return b'[%s%s] "%s %s %s" %s %s %s %s %s %s "%s" "%s" "%s" "%s" "%s"\n' % (
        sec, msec, _utf8(method), _utf8(path), proto, status, flags, rx, tx, ms, _utf8(svc),
        _utf8(xff), _utf8(agent), _utf8(rid), _utf8(host), upstream)


# bytes.isascii called through the method itself: no lookup by name per line (mypyc has no
# primitive for it).
_isascii: Final[Callable[[bytes], bool]] = bytes.isascii


def _utf8(v: bytes) -> bytes:
    return v.decode("latin-1").encode()


# a JSON string literal, quoted, beyond ASCII as \u escapes (json.dumps' default)
_json_text: Final[Callable[[str], str]] = encode_basestring_ascii


def _json_str(v: str | None) -> str:
    return "null" if v is None else _json_text(v)


def _json_field(req: Request, name: bytes) -> str:
    v = req.get(name)
    return _json_text(v.decode("latin-1")) if v else "null"


def json_line(ex: Any, now: float, wall: float) -> str:
    """``format: json``: one object per line, keys named after Envoy's operators. Written
    field by field, as ``json.dumps(record, separators=(",", ":"))`` writes that record
    (strings escaped by the json module's own ASCII encoder, keys in this order): no dict and
    no encoder object per line (json.dumps cost 85,000 instructions a line, callgrind)."""
    req = Request(ex)
    flags = ex.flags
    return "".join([
        '{"start_time":"', start_time(ex, now, wall),
        '","method":', _json_field(req, b":method"),
        ',"path":', _json_field(req, b":path"),
        ',"protocol":"', protocol(ex),
        '","response_code":', str(ex.status),
        ',"response_flags":"', flag_string(flags & FAILURE_BITS),
        '","drain_flags":"', drain_flag_string(flags),
        '","bytes_received":', str(ex.bytes_rx),
        ',"bytes_sent":', str(ex.bytes_tx),
        ',"duration":', str(duration(ex, now)),
        ',"upstream_host":', _json_str(upstream_host(ex)),
        ',"upstream_cluster":', _json_str(upstream_cluster(ex)),
        ',"downstream_remote_address":', _json_str(remote_address(ex)),
        ',"request_id":', _json_field(req, b"x-request-id"),
        ',"authority":', _json_field(req, b":authority"),
        ',"user_agent":', _json_field(req, b"user-agent"),
        ',"x_forwarded_for":', _json_field(req, b"x-forwarded-for"),
        ',"traceparent":', _json_field(req, b"traceparent"),
        "}\n",
    ])


# -- where lines go ---------------------------------------------------------------------------
class LogFile:
    """One destination (a path, or stdout), shared by the listeners that name it; a buffer
    of lines (bytes, written in binary: no encoding per line) written by size and by time,
    never per line."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.loop = loop
        self.buf: list[bytes] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None
        self.stream: IO[bytes] | None = self._open()

    def _open(self) -> IO[bytes] | None:
        if self.path == "stdout":
            return None  # sys.stdout as it is when written (see ``flush``)
        return open(self.path, "ab")  # kept open: written by the buffer

    def write(self, line: bytes) -> None:
        self.buf.append(line)
        self.size += len(line)
        if self.size >= FLUSH_SIZE:
            self.flush()
        elif self.timer is None:
            self.timer = self.loop.call_later(FLUSH_INTERVAL, self._tick)

    def _tick(self) -> None:
        self.timer = None
        self.flush()

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.buf:
            return
        data = b"".join(self.buf)
        self.buf = []
        self.size = 0
        try:
            if self.stream is None:
                _to_stdout(data)
            else:
                self.stream.write(data)
                self.stream.flush()
        except (OSError, ValueError):
            pass  # a full disk or a closed stdout must not fail requests

    def reopen(self) -> None:
        """SIGUSR1: what is buffered goes to the old file, the rest to a new one."""
        self.flush()
        if self.stream is None:
            return
        old, self.stream = self.stream, self._open()
        old.close()

    def close(self) -> None:
        self.flush()
        if self.stream is not None:
            self.stream.close()
        _FILES.pop(self.path, None)


def _to_stdout(data: bytes) -> None:
    """Lines to stdout after what was written to it as text (its binary buffer if it has one:
    a replaced stdout, as under a test runner, may be text only)."""
    out = sys.stdout
    raw = getattr(out, "buffer", None)
    out.flush()
    if raw is None:
        out.write(data.decode())
        out.flush()
    else:
        raw.write(data)
        raw.flush()


_FILES: dict[str, LogFile] = {}


class AccessLog:
    """A listener's access log: its format and its destination."""

    def __init__(self, file: LogFile, fmt: str | None, loop: asyncio.AbstractEventLoop) -> None:
        self.file = file
        self.loop = loop
        # None: Envoy's default format, by its own fast path
        self.text = compile_format(fmt)
        # The wall clock as an offset from the loop's, read again once a second: no wall
        # clock read per line, and a step of the wall clock shows within a second.
        self.wall_offset = 0.0
        self.wall_until = -1.0

    def record(self, ex: Exchange, now: float) -> None:
        """At settle (``now``: the loop's time): one line for ``ex``."""
        if now >= self.wall_until:
            self.wall_offset = time.time() - now
            self.wall_until = now + 1.0
        wall = now + self.wall_offset
        text = self.text
        if text is None:
            self.file.write(default_line(ex, now, wall))
        else:
            self.file.write(text(ex, now, wall).encode())


def open_access_log(path: str, fmt: str | None, loop: asyncio.AbstractEventLoop) -> AccessLog:
    """Opened now (append), so a path that cannot be written fails the start."""
    f = _FILES.get(path)
    if f is None or f.loop is not loop:
        f = _FILES[path] = LogFile(path, loop)
    return AccessLog(f, fmt, loop)


def reopen_access_logs() -> list[str]:
    """SIGUSR1: reopen every access log file; the paths reopened."""
    done = []
    for f in list(_FILES.values()):
        if f.path != "stdout":
            f.reopen()
            done.append(f.path)
    return done


@atexit.register
def flush_access_logs() -> None:
    """At exit (and when a server stops): nothing buffered is lost."""
    for f in list(_FILES.values()):
        f.flush()
