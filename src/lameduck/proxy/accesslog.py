"""The access log: Envoy's format operators and response flags, written off the request path.

An exchange records its facts as it goes (``flags``, a small int: one bit per fact, set where
the fact happens); a line is formatted only at settle, and only when the listener has a log.
Lines collect in a buffer written when it reaches ``FLUSH_SIZE``, ``FLUSH_INTERVAL`` after its
first line (a timer on the loop), on SIGUSR1 (which also reopens the file, for logrotate) and at
exit. Envoy's file access log buffers the same way (``--file-flush-interval-msec``).

Response flags are Envoy's codes where Envoy has one (its access-log docs, "Command Operators",
``%RESPONSE_FLAGS%``); the drain's own facts use codes Envoy does not use: see docs/access-log.md.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import re
import sys
import time
from collections.abc import Callable
from typing import IO, Any, Final

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

FLAG_CODES: Final = (
    (UH, "UH"), (UF, "UF"), (UT, "UT"), (URX, "URX"), (UC, "UC"), (UR, "UR"), (LR, "LR"),
    (DC, "DC"), (NR, "NR"), (DPE, "DPE"), (GA, "GA"), (CB, "CB"), (CA, "CA"), (RD, "RD"),
    (PD, "PD"), (SV, "SV"),
)

# Envoy's default format string (its access-log docs, "Default Format String").
DEFAULT_FORMAT: Final = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" '
    "%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% "
    '%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" '
    '"%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"\n'
)
FLUSH_SIZE: Final = 64 * 1024  # buffered characters that are written at once
FLUSH_INTERVAL: Final = 1.0  # seconds a line may wait in the buffer


def flag_string(flags: int) -> str:
    """Envoy's rendering: the codes joined by commas, "-" for none."""
    if not flags:
        return "-"
    return ",".join(code for bit, code in FLAG_CODES if flags & bit)


def new_request_id(bits: Callable[[int], int]) -> bytes:
    """A 128-bit random id as 32 hex digits (not uuid4's layout: one call and one format,
    no UUID object per request)."""
    return b"%032x" % bits(128)


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
        kept = ex.log_req
        if kept is None:
            return None
        path, authority, pairs, lines = kept
        if name == b":path":
            return path or None  # type: ignore[no-any-return]
        if name == b":authority":
            if authority is not None:
                return authority  # type: ignore[no-any-return]
            name = b"host"
        if lines:
            v = self.find(b"\r\n" + name + b":")
            if v is not None:
                return v
        for n, v in pairs:
            if n == name:
                return v or None  # type: ignore[no-any-return]
        return None

    def find(self, needle: bytes) -> bytes | None:
        """HTTP/1.1: the value after ``needle`` (CRLF, a lower-case name, a colon) in the head's
        lines, which keep their case; None if no line has that name."""
        blob = self.blob
        if blob is None:
            kept = self.ex.log_req
            if kept is None or not kept[3]:
                return None
            self.raw = b"".join(kept[3])
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


def req_header(ex: Any, name: bytes) -> bytes | None:
    """A request field of ``ex`` by lower-case name (``:method``, ``:path``, ``:authority``
    too), from what the codec kept for the log."""
    return Request(ex).get(name)


def _resp_header(ex: Any, name: bytes) -> bytes | None:
    fields = ex.resp_fields
    if fields is None:
        return None
    for n, v in fields:
        if n.lower() == name:
            return v  # type: ignore[no-any-return]
    return None


def _text(v: bytes | None) -> str:
    return v.decode("latin-1") if v else "-"


_second: list[Any] = [-1, "", -1, ""]  # the last second and millisecond formatted, and texts


def start_time(ex: Any, now: float, wall: float) -> str:
    """ISO 8601 UTC with milliseconds, as Envoy writes %START_TIME%; formatted once per
    millisecond (tens of requests share one at full load)."""
    ms = int((wall - (now - ex.t0)) * 1000)
    cache = _second
    if cache[2] == ms:
        return cache[3]  # type: ignore[no-any-return]
    sec = ms // 1000
    if cache[0] != sec:
        cache[0] = sec
        cache[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    text = f"{cache[1]}.{ms % 1000:03d}Z"
    cache[2] = ms
    cache[3] = text
    return text


def protocol(ex: Any) -> str:
    return "HTTP/2" if ex.sid else ("HTTP/1.0" if ex.v10 else "HTTP/1.1")


def upstream_host(ex: Any) -> str | None:
    ep = ex.endpoint
    return None if ep is None else ep.address  # type: ignore[no-any-return]  # host:port


def upstream_cluster(ex: Any) -> str | None:
    c = ex.cluster
    return None if c is None else c.name  # type: ignore[no-any-return]


def remote_address(ex: Any) -> str | None:
    t = ex.down.transport
    peer = t.get_extra_info("peername") if t is not None else None
    if not peer:
        return None
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def duration(ex: Any, now: float) -> int:
    return int((now - ex.t0) * 1000)


Op = Callable[[Any, float, float, Request], str]
_OP = re.compile(r"%([A-Z_]+)(?:\(([^)]*)\))?%")


def _req_op(arg: str) -> Op:
    # "X?Y": X, else Y (Envoy's alternative header)
    names = [a.strip().lower().encode() for a in arg.split("?")]
    def op(ex: Any, now: float, wall: float, req: Request) -> str:
        for n in names:
            v = req.get(n)
            if v:
                return _text(v)
        return "-"
    return op


def _operator(name: str, arg: str | None) -> Op:
    """One command operator, as a function of (exchange, loop time, wall time)."""
    if name == "REQ" and arg:
        return _req_op(arg)
    if name == "RESP" and arg:
        key = arg.strip().lower().encode()
        return lambda ex, now, wall, req: _text(_resp_header(ex, key))
    simple: dict[str, Op] = {
        "START_TIME": lambda ex, now, wall, req: start_time(ex, now, wall),
        "PROTOCOL": lambda ex, now, wall, req: protocol(ex),
        "RESPONSE_CODE": lambda ex, now, wall, req: str(ex.status),
        "RESPONSE_FLAGS": lambda ex, now, wall, req: flag_string(ex.flags),
        "BYTES_RECEIVED": lambda ex, now, wall, req: str(ex.bytes_rx),
        "BYTES_SENT": lambda ex, now, wall, req: str(ex.bytes_tx),
        "DURATION": lambda ex, now, wall, req: str(duration(ex, now)),
        "UPSTREAM_HOST": lambda ex, now, wall, req: upstream_host(ex) or "-",
        "UPSTREAM_CLUSTER": lambda ex, now, wall, req: upstream_cluster(ex) or "-",
        "DOWNSTREAM_REMOTE_ADDRESS": lambda ex, now, wall, req: remote_address(ex) or "-",
        "REQUEST_ID": lambda ex, now, wall, req: _text(ex.request_id),
    }
    op = simple.get(name)
    if op is None:
        raise ValueError(f"access log format: unknown operator %{name}%")
    return op


def compile_text(fmt: str) -> Callable[[Any, float, float], str]:
    """A format string (Envoy's operators; anything else is literal) as one function. No
    newline is added: Envoy's default format ends with one, a custom one says where."""
    parts: list[str | Op] = []
    pos = 0
    for m in _OP.finditer(fmt):
        if m.start() > pos:
            parts.append(fmt[pos:m.start()])
        parts.append(_operator(m.group(1), m.group(2)))
        pos = m.end()
    if pos < len(fmt):
        parts.append(fmt[pos:])

    ops: list[Op] = [_literal(p) if isinstance(p, str) else p for p in parts]

    def line(ex: Any, now: float, wall: float) -> str:
        req = Request(ex)
        return "".join([op(ex, now, wall, req) for op in ops])
    return line


def _literal(text: str) -> Op:
    return lambda ex, now, wall, req: text


_ORIGINAL_PATH: Final = b"\r\nx-envoy-original-path:"
_XFF: Final = b"\r\nx-forwarded-for:"
_AGENT: Final = b"\r\nuser-agent:"


def default_line(ex: Any, now: float, wall: float) -> str:
    """Envoy's default format (``DEFAULT_FORMAT``) written out as one f-string: the line most
    logs use, made without a call per operator (``compile_text`` gives the same text)."""
    req = Request(ex)
    kept = ex.log_req
    h1 = kept is not None and bool(kept[3])
    path = (req.find(_ORIGINAL_PATH) if h1 else req.get(b"x-envoy-original-path")) or (
        kept[0] if kept is not None else None)
    xff = req.find(_XFF) if h1 else req.get(b"x-forwarded-for")
    agent = req.find(_AGENT) if h1 else req.get(b"user-agent")
    endpoint = ex.endpoint
    return (f'[{start_time(ex, now, wall)}] "{_text(ex.method)} {_text(path)} {protocol(ex)}" '
            f"{ex.status} {flag_string(ex.flags)} {ex.bytes_rx} {ex.bytes_tx} "
            f"{int((now - ex.t0) * 1000)} "
            f"{_text(_resp_header(ex, b'x-envoy-upstream-service-time'))} "
            f'"{_text(xff)}" "{_text(agent)}" '
            f'"{_text(req.get(b"x-request-id"))}" "{_text(req.get(b":authority"))}" '
            f'"{"-" if endpoint is None else endpoint.address}"\n')


def json_line(ex: Any, now: float, wall: float) -> str:
    """``format: json``: one object per line, keys named after Envoy's operators."""
    req = Request(ex)

    def h(name: bytes) -> str | None:
        v = req.get(name)
        return v.decode("latin-1") if v else None
    rec = {
        "start_time": start_time(ex, now, wall),
        "method": h(b":method"),
        "path": h(b":path"),
        "protocol": protocol(ex),
        "response_code": ex.status,
        "response_flags": flag_string(ex.flags),
        "bytes_received": ex.bytes_rx,
        "bytes_sent": ex.bytes_tx,
        "duration": duration(ex, now),
        "upstream_host": upstream_host(ex),
        "upstream_cluster": upstream_cluster(ex),
        "downstream_remote_address": remote_address(ex),
        "request_id": h(b"x-request-id"),
        "authority": h(b":authority"),
        "user_agent": h(b"user-agent"),
        "x_forwarded_for": h(b"x-forwarded-for"),
        "traceparent": h(b"traceparent"),
    }
    return json.dumps(rec, separators=(",", ":")) + "\n"


# -- where lines go ---------------------------------------------------------------------------
class LogFile:
    """One destination (a path, or stdout), shared by the listeners that name it; a buffer
    written by size and by time, never per line."""

    def __init__(self, path: str, loop: asyncio.AbstractEventLoop) -> None:
        self.path = path
        self.loop = loop
        self.buf: list[str] = []
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None
        self.stream: IO[str] = self._open()

    def _open(self) -> IO[str]:
        if self.path == "stdout":
            return sys.stdout
        return open(self.path, "a", encoding="utf-8")  # kept open: written by the buffer

    def write(self, line: str) -> None:
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
        data = "".join(self.buf)
        self.buf = []
        self.size = 0
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a full disk or a closed stdout must not fail requests

    def reopen(self) -> None:
        """SIGUSR1: what is buffered goes to the old file, the rest to a new one."""
        self.flush()
        if self.path == "stdout":
            return
        old, self.stream = self.stream, self._open()
        old.close()

    def close(self) -> None:
        self.flush()
        if self.path != "stdout":
            self.stream.close()
        _FILES.pop(self.path, None)


_FILES: dict[str, LogFile] = {}


class AccessLog:
    """A listener's access log: its format and its destination."""

    def __init__(self, file: LogFile, fmt: str | None, loop: asyncio.AbstractEventLoop) -> None:
        self.file = file
        self.loop = loop
        self.line = (json_line if fmt == "json" else default_line if fmt is None
                     else compile_text(fmt))

    def record(self, ex: Any) -> None:
        """At settle: one line for ``ex``."""
        self.file.write(self.line(ex, self.loop.time(), time.time()))


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
