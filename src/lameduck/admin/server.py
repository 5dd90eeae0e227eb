"""The admin listener: a small HTTP/1.1 server on loopback (httptools, keep-alive)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import httptools

from lameduck.admin.handlers import AdminHandlers
from lameduck.config import HostPort

log = logging.getLogger("lameduck.admin")


class AdminProtocol(asyncio.Protocol):
    def __init__(self, handlers: AdminHandlers) -> None:
        self.handlers = handlers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

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

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > 8192:
            raise ValueError("url too long")

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode("latin-1")
        path, _, query = self.url.decode("latin-1").partition("?")
        try:
            status, ctype, body, allow = self.handlers.handle(method, path, query)
        except Exception:  # the admin API must never take the process down
            log.exception("admin handler failed for %s %s", method, path)
            status, ctype, body, allow = 500, "text/plain", b"internal error\n", None
        self._reply(status, ctype, body, allow, close=not self.parser.should_keep_alive(),
                    head=method == "HEAD")

    def _reply(self, status: int, ctype: str, body: bytes, allow: str | None, close: bool,
               head: bool = False) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        lines = [f"HTTP/1.1 {status} {_phrase(status)}", f"content-type: {ctype}",
                 f"content-length: {len(body)}", "cache-control: no-cache, max-age=0"]
        if allow:
            lines.append(f"allow: {allow}")
        if close:
            lines.append("connection: close")
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body))
        if close:
            t.close()


def _phrase(status: int) -> str:
    return {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 500: "Internal Server Error",
            503: "Service Unavailable"}.get(status, "Unknown")


async def start_admin(
    loop: asyncio.AbstractEventLoop, handlers: AdminHandlers, host: str, port: int,
    sock: socket.socket | None = None,
) -> asyncio.AbstractServer:
    """``sock``: an already listening socket (handed over by a hot restart) instead of a bind."""
    if sock is not None:
        return await loop.create_server(lambda: AdminProtocol(handlers), sock=sock)
    try:
        return await loop.create_server(lambda: AdminProtocol(handlers), host, port,
                                        reuse_address=True)
    except OSError as e:
        # asyncio's text ("error while attempting to bind on address ...") names no owner
        reason = os.strerror(e.errno) if e.errno else str(e)
        err = OSError(f"admin on {HostPort(host, port)}: {reason[:1].lower()}{reason[1:]}")
        err.errno = e.errno
        raise err from e
