"""Demo origin: a small, fast HTTP/1.1 server for `lameduck run` to front and for tests to poke.

Why not ``http.server``: the origin has to keep up with a benchmark, pipeline, stream
with back-pressure, and misbehave on purpose (resets, hangs, short and close-delimited
bodies) so the proxy's failure handling can be tested against a real peer.

Endpoints: ``/``, ``/sleep?ms=``, ``/stream?chunks=&size=&interval_ms=``, ``/bytes?n=``,
``/echo`` (POST/PUT/PATCH), ``/status/N``, ``/headers``, ``/info``, ``/continue``,
``/close``, ``/close-delimited?n=``, ``/reset``, ``/partial?n=``, ``/hang``, and for
load-balancing tests:

- ``/health``: 200 ``ok`` while healthy, 503 ``failing`` after ``POST /health/fail``
  (``?immediate=1`` adds ``x-envoy-immediate-health-check-fail: true``), until
  ``POST /health/ok``. The state is per process.
- ``/agent``: ``GET`` shows the HAProxy agent-check text, ``POST /agent?say=TEXT`` (URL-encoded:
  ``drain``, ``maint``, ``down #bad disk``, ``50%``, ``maxconn:10``, ...) replaces it.

Options (``python -m lameduck.demo --help``): ``--name NAME`` adds ``X-Origin: NAME`` to every
response and ``"name"`` to ``/info``; ``--log FILE`` appends ``METHOD PATH X-REQUEST-ID`` (``-``
if absent; PATH with its query) per request as soon as its head is parsed, with one
``os.write`` on an ``O_APPEND`` fd, so it survives a SIGKILL; ``--agent-port PORT`` (0: any)
serves the agent text (``--agent-say``, default ``ready up 100%``) plus a newline to each TCP
connection, then closes, as an HAProxy ``agent-check`` expects. None of them costs anything
per request when off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import sys
from collections import deque
from collections.abc import Coroutine
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs

import httptools

HELLO = b"hello from the lameduck demo origin\n"

# Body pattern for /bytes, /close-delimited and /partial: byte i of the body is i % 251.
# A piece is a whole number of 251-byte periods (~64 KiB), so pieces concatenate seamlessly.
_PERIOD = 251
_PIECE = bytes(range(_PERIOD)) * 261
PIECE_SIZE = len(_PIECE)

# Transport buffer limits: above HIGH, streaming handlers wait for the client to catch up.
WRITE_HIGH = 512 * 1024
WRITE_LOW = 128 * 1024
# Stop reading the socket once this much response is queued. Deliberately larger than
# WRITE_HIGH so a client that uploads a few MB before reading (httpx, curl) can still echo
# without deadlocking, while a 50 MB echo is never buffered whole.
READ_PAUSE_BYTES = 16 * 1024 * 1024
MAX_CHUNK_SIZE = 16 * 1024 * 1024

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_TEXT = b"Content-Type: text/plain; charset=utf-8\r\n"
_JSON = b"Content-Type: application/json\r\n"
_OCTETS = b"Content-Type: application/octet-stream\r\n"
_LAST_CHUNK = b"0\r\n\r\n"

# Route kinds (ints keep dispatch a cheap comparison chain).
(
    K_ROOT,
    K_SLEEP,
    K_STREAM,
    K_BYTES,
    K_ECHO,
    K_STATUS,
    K_HEADERS,
    K_INFO,
    K_CONTINUE,
    K_CLOSE,
    K_CLOSE_DELIMITED,
    K_RESET,
    K_PARTIAL,
    K_HANG,
    K_HEALTH,
    K_HEALTH_FAIL,
    K_HEALTH_OK,
    K_AGENT,
    K_NOT_FOUND,
    K_BAD,
) = range(20)

_ROUTES: dict[bytes, int] = {
    b"/": K_ROOT,
    b"/sleep": K_SLEEP,
    b"/stream": K_STREAM,
    b"/bytes": K_BYTES,
    b"/echo": K_ECHO,
    b"/headers": K_HEADERS,
    b"/info": K_INFO,
    b"/continue": K_CONTINUE,
    b"/close": K_CLOSE,
    b"/close-delimited": K_CLOSE_DELIMITED,
    b"/reset": K_RESET,
    b"/partial": K_PARTIAL,
    b"/hang": K_HANG,
    b"/health": K_HEALTH,
    b"/health/fail": K_HEALTH_FAIL,
    b"/health/ok": K_HEALTH_OK,
    b"/agent": K_AGENT,
}
_ECHO_METHODS = frozenset((b"POST", b"PUT", b"PATCH"))

_requests_served = 0

# /health state of this process: healthy, failing, or failing with Envoy's immediate header.
HEALTH_OK, HEALTH_FAILING, HEALTH_FAILING_IMMEDIATE = range(3)
_health = HEALTH_OK
_IMMEDIATE_FAIL = b"x-envoy-immediate-health-check-fail: true\r\n"
_ALLOW_POST = b"Allow: POST\r\n"

# What the agent-check port says (see serve_agent); changed by POST /agent?say=.
DEFAULT_AGENT_SAY = "ready up 100%"
AGENT_SAY_MAX = 512
_agent_say = DEFAULT_AGENT_SAY


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode("latin-1")


_STATUS_LINES: dict[int, bytes] = {s.value: _status_line(s.value) for s in HTTPStatus}


class _BadParam(ValueError):
    """A query parameter that is not a usable integer; answered with 400."""


class _PortInfo:
    """Per listening port bytes, built once so the hot path only concatenates."""

    __slots__ = ("common", "port", "root")

    def __init__(self, port: int, extra: bytes = b"") -> None:
        self.port = port
        self.common = b"Server: lameduck-demo\r\nX-Origin-Port: %d\r\n" % port + extra
        self.root = (
            _STATUS_LINES[200]
            + self.common
            + _TEXT
            + b"Content-Length: %d\r\n\r\n" % len(HELLO)
            + HELLO
        )


class _Request:
    """One parsed request; slots keep the per-request allocation small."""

    __slots__ = (
        "body",
        "body_len",
        "complete",
        "continue_sent",
        "expect",
        "headers",
        "keep_alive",
        "kind",
        "method",
        "path",
        "query",
        "url",
        "version",
    )

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = b"GET"
        self.version = "1.1"
        self.path = b"/"
        self.query = b""
        self.kind = K_NOT_FOUND
        self.keep_alive = True
        self.complete = False
        self.expect = False
        self.continue_sent = False
        self.body: list[bytes] | None = None
        self.body_len = 0

    def header(self, name: bytes) -> bytes | None:
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None


class _ServerState:
    """One `serve()` call: its options and live connections (so shutdown can close them)."""

    __slots__ = ("connections", "extra", "log_fd", "name", "ports")

    def __init__(self, name: str | None = None, log_fd: int | None = None) -> None:
        self.connections: set[_Conn] = set()
        self.name = name
        self.log_fd = log_fd
        # Headers every response carries on top of the port's own.
        self.extra = b"X-Origin: " + name.encode("latin-1") + b"\r\n" if name else b""
        self.ports: dict[int, _PortInfo] = {}

    def port_info(self, port: int) -> _PortInfo:
        info = self.ports.get(port)
        if info is None:
            info = self.ports[port] = _PortInfo(port, self.extra)
        return info


_STATES: dict[asyncio.AbstractServer, _ServerState] = {}


class _Conn(asyncio.Protocol):
    """One client connection: parses with httptools and answers requests strictly in order.

    Requests are queued at headers-complete; the queue head is dispatched once complete
    (or at once for /echo, which streams its body). Only one response is in flight, which
    is what keeps pipelined answers ordered.
    """

    def __init__(self, state: _ServerState) -> None:
        self._state = state
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._info: _PortInfo | None = None
        self._cur: _Request | None = None
        self._queue: deque[_Request] = deque()
        self._active: _Request | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._discard = False
        self._eof = False
        self._close_after = False
        self._write_paused = False
        self._read_paused = False
        self._read_paused_for_write = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._resp_head = False
        self._resp_chunked = False

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH, low=WRITE_LOW)
        sockname = transport.get_extra_info("sockname")
        self._info = self._state.port_info(sockname[1] if isinstance(sockname, tuple) else 0)
        self._state.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._discard = True
        self._state.connections.discard(self)
        if self._task is not None:
            self._task.cancel()
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.cancel()

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Nothing after an Upgrade/CONNECT request is HTTP/1.1: answer it, then close.
            self._discard = True
            self._close_after = True
            if self._active is None and not self._queue:
                self._close()
            return
        except httptools.HttpParserCallbackError as exc:
            self._loop.call_exception_handler(
                {"message": "demo origin handler error", "exception": exc, "protocol": self}
            )
            self._abort()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        if self._closed:
            return
        if (
            self._write_paused
            and self._transport is not None
            and self._transport.get_write_buffer_size() > READ_PAUSE_BYTES
        ):
            self._read_paused_for_write = True
        self._update_reading()

    def eof_received(self) -> bool:
        self._eof = True
        self._discard = True
        cur = self._cur
        if cur is not None:
            self._cur = None
            if cur is self._active:  # an /echo whose body will never finish
                self._abort()
                return False
            if self._queue and self._queue[-1] is cur:
                self._queue.pop()
        active = self._active
        if (active is None and not self._queue) or (active is not None and active.kind == K_HANG):
            self._closed = True
            return False  # the transport closes itself
        return True  # half-closed: finish the queued responses, then close

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiter = self._drain_waiter
        if waiter is not None:
            self._drain_waiter = None
            if not waiter.done():
                waiter.set_result(None)
        if self._read_paused_for_write:
            self._read_paused_for_write = False
            self._update_reading()

    # -- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._cur = _Request()

    def on_url(self, url: bytes) -> None:
        req = self._cur
        assert req is not None
        req.url = url if not req.url else req.url + url

    def on_header(self, name: bytes, value: bytes) -> None:
        req = self._cur
        assert req is not None
        req.headers.append((name, value))
        if len(name) == 6 and name.lower() == b"expect" and value.lower() == b"100-continue":
            req.expect = True

    def on_headers_complete(self) -> None:
        req = self._cur
        assert req is not None
        if self._discard:  # closing, or behind a /hang: this request will never be answered
            return
        parser = self._parser
        req.method = parser.get_method()
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        url = req.url
        if url[:1] != b"/" and b"://" in url:  # absolute-form target
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        q = url.find(b"?")
        if q >= 0:
            req.path = url[:q]
            req.query = url[q + 1 :]
        else:
            req.path = url
        kind = _ROUTES.get(req.path)
        if kind is None:
            kind = K_STATUS if req.path.startswith(b"/status/") else K_NOT_FOUND
        req.kind = kind
        if kind == K_ECHO:
            req.body = []
        if kind == K_CONTINUE:
            req.expect = True
        elif req.expect and req.version != "1.1":
            req.expect = False
        self._queue.append(req)
        if kind == K_ECHO or req.expect:
            self._maybe_dispatch()

    def on_body(self, data: bytes) -> None:
        req = self._cur
        assert req is not None
        req.body_len += len(data)
        if req.kind == K_ECHO:
            if req is self._active:
                self._write_body(data)
            elif req.body is not None:
                req.body.append(data)

    def on_message_complete(self) -> None:
        req = self._cur
        assert req is not None
        self._cur = None
        req.complete = True
        if req is self._active:  # a streaming /echo just got its last byte
            self._end_body()
            self._finish(req)
        else:
            self._maybe_dispatch()

    # -- dispatch ---------------------------------------------------------------------

    def _maybe_dispatch(self) -> None:
        global _requests_served
        queue = self._queue
        while self._active is None and queue and not self._closed:
            req = queue[0]
            if req.expect and not req.continue_sent:
                req.continue_sent = True
                if not req.complete or req.kind == K_CONTINUE:
                    self._write(_CONTINUE)
            if not req.complete and req.kind != K_ECHO:
                break
            queue.popleft()
            _requests_served += 1
            if not self._dispatch(req):
                break  # still in flight; _finish() resumes the loop
            if not req.keep_alive or self._closed:
                self._close()
                return
        if (
            self._active is None
            and not queue
            and (self._eof or self._close_after)
            and self._cur is None
        ):
            self._close()
            return
        self._update_reading()

    def _finish(self, req: _Request) -> None:
        """The in-flight response is done: close or move on to the next request."""
        self._active = None
        self._task = None
        if self._closed:
            return
        if not req.keep_alive:
            self._close()
            return
        self._maybe_dispatch()

    def _dispatch(self, req: _Request) -> bool:
        """Answer `req`; True if the response is complete, False if it is still in flight."""
        kind = req.kind
        if kind == K_ROOT:
            if req.keep_alive and req.method == b"GET" and req.version == "1.1":
                self._write(self._port().root)
            else:
                self._respond(req, 200, HELLO)
            return True
        try:
            if kind == K_SLEEP:
                ms = _int_param(req, b"ms", 0, 3_600_000)
                return self._start(req, self._sleep(req, ms))
            if kind == K_STREAM:
                chunks = _int_param(req, b"chunks", 10, 10_000_000)
                size = _int_param(req, b"size", 1024, MAX_CHUNK_SIZE)
                interval = _int_param(req, b"interval_ms", 100, 3_600_000)
                return self._start(req, self._stream(req, chunks, size, interval))
            if kind == K_BYTES:
                n = _int_param(req, b"n", 0, 1 << 50)
                return self._start(req, self._pattern(req, n, n))
            if kind == K_ECHO:
                return self._echo(req)
            if kind == K_STATUS:
                return self._status(req)
            if kind == K_HEADERS:
                doc = {
                    "method": req.method.decode("latin-1"),
                    "path": req.path.decode("latin-1"),
                    "query": req.query.decode("latin-1"),
                    "http_version": req.version,
                    "headers": [
                        [n.decode("latin-1").lower(), v.decode("latin-1")] for n, v in req.headers
                    ],
                }
                self._respond(req, 200, json.dumps(doc).encode(), _JSON)
                return True
            if kind == K_INFO:
                info: dict[str, Any] = {
                    "pid": os.getpid(),
                    "port": self._port().port,
                    "requests": _requests_served,
                    # client connections not ended by the client (no FIN read yet), this one
                    # too: a test sees a proxy let one go while its answer is still due
                    "connections": sum(1 for c in self._state.connections if not c._eof),
                }
                if self._state.name is not None:
                    info["name"] = self._state.name
                self._respond(req, 200, json.dumps(info).encode(), _JSON)
                return True
            if kind == K_CONTINUE:
                self._respond(req, 200, b"received %d bytes\n" % req.body_len)
                return True
            if kind == K_CLOSE:
                req.keep_alive = False
                self._respond(req, 200, b"closing\n")
                return True
            if kind == K_CLOSE_DELIMITED:
                n = _int_param(req, b"n", 0, 1 << 50)
                return self._start(req, self._pattern(req, n, None))
            if kind == K_RESET:
                self._reset()
                return True
            if kind == K_PARTIAL:
                n = _int_param(req, b"n", 0, 1 << 49)
                return self._start(req, self._pattern(req, n, 2 * n))
            if kind == K_HANG:
                self._active = req
                self._discard = True  # never answered, so later requests never will be
                return False
            if kind == K_HEALTH:
                if _health == HEALTH_OK:
                    self._respond(req, 200, b"ok\n")
                else:
                    extra = _IMMEDIATE_FAIL if _health == HEALTH_FAILING_IMMEDIATE else b""
                    self._respond(req, 503, b"failing\n", extra=extra)
                return True
            if kind in (K_HEALTH_FAIL, K_HEALTH_OK):
                return self._set_health(req)
            if kind == K_AGENT:
                return self._agent(req)
            if kind == K_BAD:
                req.keep_alive = False
                self._respond(req, 400, b"bad request\n")
                return True
        except _BadParam as exc:
            self._respond(req, 400, f"{exc}\n".encode())
            return True
        self._respond(req, 404, b"not found\n")
        return True

    def _start(self, req: _Request, coro: Coroutine[Any, Any, None]) -> bool:
        self._active = req
        task = self._loop.create_task(coro)
        self._task = task
        task.add_done_callback(self._task_done)
        return False

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if self._closed:
            return
        if exc is not None:
            self._loop.call_exception_handler(
                {"message": "demo origin handler error", "exception": exc, "protocol": self}
            )
            self._abort()
            return
        req = self._active
        if req is not None:
            self._finish(req)

    # -- handlers ---------------------------------------------------------------------

    def _status(self, req: _Request) -> bool:
        try:
            status = int(req.path[len(b"/status/") :])
        except ValueError:
            status = 0
        if not 200 <= status <= 599:
            self._respond(req, 400, b"status must be 200..599\n")
        elif status in (204, 304):
            self._write(self._head(req, status, b"", None, bodiless=True))
        else:
            self._respond(req, status, b"status %d\n" % status)
        return True

    def _set_health(self, req: _Request) -> bool:
        global _health
        if req.method != b"POST":
            self._respond(req, 405, b"use POST\n", extra=_ALLOW_POST)
            return True
        if req.kind == K_HEALTH_OK:
            _health = HEALTH_OK
            self._respond(req, 200, b"ok\n")
            return True
        immediate = _flag_param(req, b"immediate")
        _health = HEALTH_FAILING_IMMEDIATE if immediate else HEALTH_FAILING
        self._respond(req, 200, b"failing immediately\n" if immediate else b"failing\n")
        return True

    def _agent(self, req: _Request) -> bool:
        """GET/HEAD: the current agent-check text; POST ?say=TEXT: replace it."""
        global _agent_say
        if req.method in (b"GET", b"HEAD"):
            self._respond(req, 200, _agent_say.encode("ascii") + b"\n")
            return True
        if req.method != b"POST":
            self._respond(req, 405, b"use GET or POST\n", extra=b"Allow: GET, POST\r\n")
            return True
        values = parse_qs(req.query.decode("latin-1"), keep_blank_values=True).get("say")
        if not values:
            raise _BadParam("say is required")
        say = values[0]
        if len(say) > AGENT_SAY_MAX or not all(" " <= c <= "~" for c in say):
            raise _BadParam(f"say must be at most {AGENT_SAY_MAX} printable ASCII characters")
        _agent_say = say
        self._respond(req, 200, say.encode("ascii") + b"\n")
        return True

    def _echo(self, req: _Request) -> bool:
        if req.method not in _ECHO_METHODS:
            self._respond(req, 405, b"use POST or PUT\n", extra=b"Allow: POST, PUT, PATCH\r\n")
            return True
        ctype = req.header(b"content-type")
        extra = b"Content-Type: " + ctype + b"\r\n" if ctype else _OCTETS
        te = req.header(b"transfer-encoding")
        if te is not None and b"chunked" in te.lower():
            head = self._head(req, 200, extra, None, chunked=True)
        else:
            cl = req.header(b"content-length")
            head = self._head(req, 200, extra, int(cl) if cl else 0)
        self._write(head)
        body, req.body = req.body, None
        for piece in body or ():
            self._write_body(piece)
        if req.complete:
            self._end_body()
            return True
        self._active = req
        return False

    async def _sleep(self, req: _Request, ms: int) -> None:
        await asyncio.sleep(ms / 1000)
        self._respond(req, 200, b"slept %d ms\n" % ms)

    async def _stream(self, req: _Request, chunks: int, size: int, interval_ms: int) -> None:
        self._write(self._head(req, 200, _OCTETS, None, chunked=True))
        piece = b"x" * size
        delay = interval_ms / 1000
        for i in range(chunks):
            if i and delay:
                await asyncio.sleep(delay)
            self._write_body(piece)
            if self._write_paused:
                await self._drain()
        self._end_body()

    async def _pattern(self, req: _Request, n: int, length: int | None) -> None:
        """Write n pattern bytes; length None = close-delimited, length > n = cut short."""
        self._write(self._head(req, 200, _OCTETS, length))
        if not self._resp_head:
            transport = self._transport
            assert transport is not None
            remaining = n
            while remaining >= PIECE_SIZE:
                transport.write(_PIECE)
                remaining -= PIECE_SIZE
                if self._write_paused:
                    await self._drain()
            if remaining:
                transport.write(_PIECE[:remaining])
        if length != n:
            req.keep_alive = False  # close (after flushing) ends the body early or delimits it

    # -- writing ----------------------------------------------------------------------

    def _port(self) -> _PortInfo:
        assert self._info is not None
        return self._info

    def _write(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    def _head(
        self,
        req: _Request,
        status: int,
        extra: bytes,
        length: int | None,
        *,
        chunked: bool = False,
        bodiless: bool = False,
    ) -> bytes:
        """Build the response head and remember how the body must be framed."""
        if self._close_after:
            req.keep_alive = False
        if chunked and req.version != "1.1":
            chunked = False  # HTTP/1.0 has no chunked coding: fall back to close-delimited
        if length is None and not chunked and not bodiless:
            req.keep_alive = False
        status_line = _STATUS_LINES.get(status) or _status_line(status)
        parts = [status_line, self._port().common, extra]
        if chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        elif length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if not req.keep_alive:
            parts.append(b"Connection: close\r\n")
        elif req.version == "1.0":
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        self._resp_head = req.method == b"HEAD" or bodiless
        self._resp_chunked = chunked
        return b"".join(parts)

    def _respond(
        self,
        req: _Request,
        status: int,
        body: bytes,
        ctype: bytes = _TEXT,
        extra: bytes = b"",
    ) -> None:
        head = self._head(req, status, extra + ctype, len(body))
        self._write(head if self._resp_head else head + body)

    def _write_body(self, data: bytes) -> None:
        if self._resp_head or not data:
            return
        transport = self._transport
        assert transport is not None
        if self._resp_chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)

    def _end_body(self) -> None:
        if self._resp_chunked and not self._resp_head:
            self._write(_LAST_CHUNK)

    async def _drain(self) -> None:
        while self._write_paused and not self._closed:
            waiter = self._loop.create_future()
            self._drain_waiter = waiter
            await waiter

    # -- connection state -------------------------------------------------------------

    def _update_reading(self) -> None:
        """Stop reading while the client is not draining responses or requests are queued."""
        if self._closed or self._eof or self._transport is None:
            return
        pause = self._read_paused_for_write or (self._active is not None and bool(self._queue))
        if pause != self._read_paused:
            self._read_paused = pause
            if pause:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()

    def _bad_request(self) -> None:
        self._discard = True
        cur, self._cur = self._cur, None
        if cur is not None:
            if cur is self._active:  # broken body under a streaming /echo: nothing to say
                self._abort()
                return
            if self._queue and self._queue[-1] is cur:
                self._queue.pop()
        bad = _Request()
        bad.kind = K_BAD
        bad.complete = True
        bad.keep_alive = False
        self._queue.append(bad)
        self._maybe_dispatch()

    def _close(self) -> None:
        self._discard = True
        if not self._closed:
            self._closed = True
            if self._transport is not None:
                self._transport.close()

    def _abort(self) -> None:
        self._discard = True
        self._closed = True
        if self._transport is not None:
            self._transport.abort()

    def _reset(self) -> None:
        """Abort with SO_LINGER 0 so the peer sees a TCP RST, not a tidy FIN."""
        sock = self._transport.get_extra_info("socket") if self._transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._abort()

    def shutdown(self) -> None:
        """Close now if idle, else after the response in flight (which says Connection: close)."""
        if self._closed:
            return
        active = self._active
        idle = active is None and not self._queue and self._cur is None
        if idle or (active is not None and active.kind == K_HANG):
            self._close()
        else:
            self._close_after = True
            self._discard = True

    def abort(self) -> None:
        self._abort()


class _LoggingConn(_Conn):
    """A `_Conn` that appends ``METHOD PATH X-REQUEST-ID`` to the request log at each request's
    headers-complete, before anything is answered. A subclass, so no log costs nothing."""

    def on_headers_complete(self) -> None:
        req = self._cur
        assert req is not None
        fd = self._state.log_fd
        assert fd is not None
        url = req.url
        if url[:1] != b"/" and b"://" in url:  # absolute-form target: log it origin-form
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        rid = req.header(b"x-request-id") or b"-"
        # One write on an O_APPEND fd: the line is in the file even if SIGKILL comes next.
        os.write(fd, b"%s %s %s\n" % (self._parser.get_method(), url, rid))
        super().on_headers_complete()


def _flag_param(req: _Request, name: bytes) -> bool:
    """A boolean query parameter: present and not ``0``/``false``/``no``/``off``/empty."""
    if not req.query:
        return False
    values = parse_qs(req.query.decode("latin-1"), keep_blank_values=True).get(name.decode())
    return values is not None and values[0].lower() not in ("", "0", "false", "no", "off")


def _int_param(req: _Request, name: bytes, default: int, maximum: int) -> int:
    if not req.query:
        return default
    values = parse_qs(req.query.decode("latin-1")).get(name.decode())
    if not values:
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise _BadParam(f"{name.decode()} must be an integer") from None
    if not 0 <= value <= maximum:
        raise _BadParam(f"{name.decode()} must be in 0..{maximum}")
    return value


async def serve(
    host: str, port: int, *, name: str | None = None, log_fd: int | None = None,
    sock: socket.socket | None = None,
) -> asyncio.AbstractServer:
    """Start the demo origin on host:port (0 picks a free port) and return the server.

    ``name``: sent as ``X-Origin`` on every response and shown by ``/info``; ``log_fd``: an
    fd opened for appending, that gets a ``METHOD PATH X-REQUEST-ID`` line per request;
    ``sock``: a listening socket to serve on instead of binding host:port.
    """
    if name is not None:
        _check_name(name)
    loop = asyncio.get_running_loop()
    state = _ServerState(name, log_fd)
    conn = _Conn if log_fd is None else _LoggingConn
    if sock is not None:
        server = await loop.create_server(lambda: conn(state), sock=sock, backlog=1024)
    else:
        server = await loop.create_server(
            lambda: conn(state), host, port, backlog=1024, reuse_address=True
        )
    _STATES[server] = state
    return server


def _check_name(name: str) -> str:
    if not name or not all(" " < c <= "~" for c in name):
        raise ValueError(f"origin name must be printable ASCII without spaces: {name!r}")
    return name


class _AgentConn(asyncio.Protocol):
    """HAProxy agent check: say the current text and a newline, then close.

    The write side is shut first and the socket closed at the peer's EOF (or after a
    timeout), so whatever the checker sent (``agent-send``) is read, not left unread: closing
    with unread input would send a reset that can destroy the answer in flight.
    """

    CLOSE_AFTER = 5.0

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.write(_agent_say.encode("ascii") + b"\n")
        if transport.can_write_eof():
            transport.write_eof()
        else:
            transport.close()
            return
        self._timer = asyncio.get_running_loop().call_later(self.CLOSE_AFTER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def serve_agent(host: str, port: int) -> asyncio.Server:
    """Serve the HAProxy agent-check text (``POST /agent?say=``) on host:port (0: any)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(_AgentConn, host, port, reuse_address=True)


async def shutdown(server: asyncio.AbstractServer, grace: float = 1.0) -> None:
    """Stop listening, let in-flight responses finish for up to `grace` s, then drop the rest.

    Needed because ``server.close()`` leaves accepted keep-alive connections open.
    """
    server.close()
    state = _STATES.pop(server, None)
    if state is None:
        return
    for conn in list(state.connections):
        conn.shutdown()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while state.connections and loop.time() < deadline:
        await asyncio.sleep(0.01)
    for conn in list(state.connections):
        conn.abort()
    await asyncio.sleep(0)


async def _run(args: argparse.Namespace) -> int:
    global _agent_say
    host, port = args.host, args.port
    log_fd = None
    if args.log is not None:
        try:
            log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            print(f"lameduck demo origin: cannot open {args.log}: {exc}", file=sys.stderr)
            return 1
    sock = None
    try:
        if args.fd is not None:
            sock = socket.socket(fileno=args.fd)
            sock.setblocking(False)
            host = sock.getsockname()[0]
        server = await serve(host, port, name=args.name, log_fd=log_fd, sock=sock)
    except OSError as exc:
        print(f"lameduck demo origin: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    agent = None
    if args.agent_port is not None:
        _agent_say = args.agent_say
        try:
            agent = await serve_agent(host, args.agent_port)
        except OSError as exc:
            print(
                f"lameduck demo origin: cannot listen on {host}:{args.agent_port}: {exc}",
                file=sys.stderr,
            )
            return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    print(f"listening on {host}:{bound}", flush=True)
    if agent is not None:
        agent_bound = agent.sockets[0].getsockname()[1] if agent.sockets else args.agent_port
        print(f"agent on {host}:{agent_bound}", flush=True)
    await stop.wait()
    if agent is not None:
        agent.close()
    await shutdown(server)
    if log_fd is not None:
        os.close(log_fd)
    return 0


def _agent_text(value: str) -> str:
    if len(value) > AGENT_SAY_MAX or not all(" " <= c <= "~" for c in value):
        raise argparse.ArgumentTypeError("must be printable ASCII")
    return value


def _name(value: str) -> str:
    try:
        return _check_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """Run the demo origin until SIGTERM/SIGINT; exit status 0 on a signal."""
    parser = argparse.ArgumentParser(
        prog="python -m lameduck.demo", description="lameduck demo HTTP/1.1 origin"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--fd",
        type=int,
        metavar="FD",
        help="serve on this inherited listening socket instead of binding --host/--port "
        "(a parent that holds the port across restarts of the origin)",
    )
    parser.add_argument(
        "--name", type=_name, help="send X-Origin: NAME on every response, show it in /info"
    )
    parser.add_argument(
        "--log",
        metavar="FILE",
        help="append 'METHOD PATH X-REQUEST-ID' per request to FILE as its head arrives",
    )
    parser.add_argument(
        "--agent-port",
        type=int,
        metavar="PORT",
        help="serve an HAProxy agent check on PORT (0: any free port)",
    )
    parser.add_argument(
        "--agent-say",
        type=_agent_text,
        default=DEFAULT_AGENT_SAY,
        metavar="TEXT",
        help="the agent check's first answer (default: %(default)r; POST /agent?say= changes it)",
    )
    args = parser.parse_args(argv)
    loop_factory = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(_run(args))
