"""The admin listener: a small HTTP/1.1 server on loopback (httptools, keep-alive)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import httptools

from lameduck.admin.guard import AdminGuard, read_token
from lameduck.admin.handlers import AdminHandlers
from lameduck.config import HostPort

log = logging.getLogger("lameduck.admin")


# the answers made of a main process's workers' numbers, which it gathers first
REFRESHED = frozenset(("/stats", "/stats/prometheus", "/clusters", "/server_info",
                       "/prestop"))
# the request fields the guard looks at; the rest are read and dropped
GUARDED = frozenset((b"host", b"origin", b"sec-fetch-site", b"authorization"))
MAX_HEAD = 65536


class AdminProtocol(asyncio.Protocol):
    def __init__(self, handlers: AdminHandlers, guard: AdminGuard) -> None:
        self.handlers = handlers
        self.guard = guard
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply(400, "text/plain", b"upgrade not supported\n", None, close=True)
        except httptools.HttpParserError:
            self._reply(400, "text/plain", b"bad request\n", None, close=True)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > 8192:
            raise ValueError("url too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD:
            raise ValueError("request head too large")
        name = name.lower()
        if name in GUARDED:
            # a second Host or Authorization is not the one checked: refuse the request
            self.headers[name] = value if name not in self.headers else b"\x00duplicate"

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        path, _, query = self.url.decode("latin-1").partition("?")
        refused = self.guard.refuse(self.headers)
        if refused is not None:
            status, reason = refused
            log.warning("admin: %s %s refused: %s", method, path,
                        reason.decode("latin-1").strip())
            self._reply(status, "text/plain; charset=utf-8", reason,
                        "Bearer" if status == 401 else None, close=True)
            return
        pending = self.handlers.c.refresh() if path in REFRESHED else None
        if pending is not None:
            # the numbers are the workers': ask them first, reading nothing more meanwhile
            # (the answers keep the requests' order)
            t = self.transport
            if t is not None:
                t.pause_reading()
            keep = self.parser.should_keep_alive()
            task = asyncio.ensure_future(pending)
            task.add_done_callback(lambda _t: self._answer(method, path, query, keep))
            return
        self._answer(method, path, query, self.parser.should_keep_alive())

    def _answer(self, method: str, path: str, query: str, keep_alive: bool) -> None:
        t = self.transport
        if t is not None and not t.is_closing():
            t.resume_reading()
        try:
            status, ctype, body, allow = self.handlers.handle(method, path, query)
        except Exception:  # the admin API must never take the process down
            log.exception("admin handler failed for %s %s", method, path)
            status, ctype, body, allow = 500, "text/plain", b"internal error\n", None
        self._reply(status, ctype, body, allow, close=not keep_alive, head=method == "HEAD")

    def _reply(self, status: int, ctype: str, body: bytes, allow: str | None, close: bool,
               head: bool = False) -> None:
        """``allow``: the Allow header of a 405, or the WWW-Authenticate scheme of a 401."""
        t = self.transport
        if t is None or t.is_closing():
            return
        lines = [f"HTTP/1.1 {status} {_phrase(status)}", f"content-type: {ctype}",
                 f"content-length: {len(body)}", "cache-control: no-cache, max-age=0"]
        if allow:
            # RFC 6750 §3: a 401 names the scheme to use
            lines.append(f"www-authenticate: {allow}" if status == 401 else f"allow: {allow}")
        if close:
            lines.append("connection: close")
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body))
        if close:
            t.close()


def _phrase(status: int) -> str:
    return {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
            404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 500: "Internal Server Error",
            503: "Service Unavailable"}.get(status, "Unknown")


async def start_admin(
    loop: asyncio.AbstractEventLoop, handlers: AdminHandlers, host: str, port: int,
    sock: socket.socket | None = None, token_file: str | None = None,
) -> asyncio.AbstractServer:
    """``sock``: an already listening socket (handed over by a hot restart) instead of a bind;
    it is not served until ``start_serving()``: the previous process answers on it until it
    hands over, and one API must not answer for two processes.
    ``token_file``: admin.token_file, read once here (OSError names it)."""
    guard = AdminGuard(host, read_token(token_file) if token_file else None)
    if sock is not None:
        return await loop.create_server(lambda: AdminProtocol(handlers, guard), sock=sock,
                                        start_serving=False)
    try:
        return await loop.create_server(lambda: AdminProtocol(handlers, guard), host, port,
                                        reuse_address=True)
    except OSError as e:
        # asyncio's text ("error while attempting to bind on address ...") names no owner
        reason = os.strerror(e.errno) if e.errno else str(e)
        err = OSError(f"admin on {HostPort(host, port)}: {reason[:1].lower()}{reason[1:]}")
        err.errno = e.errno
        raise err from e
