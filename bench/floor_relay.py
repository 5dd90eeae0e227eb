#!/usr/bin/env python3
"""The floor of bench/run.py's response-shape matrix: how little CPU a keep-alive HTTP/1.1
relay written in Python (uvloop + httptools) can spend per request.

It accepts HTTP/1.1 keep-alive GETs, forwards each client connection's requests, byte for
byte, on one upstream connection of its own (opened at its first request, reused for every
later one, closed with it), and relays the response bytes as they arrive, feeding them to an
httptools response parser to find where each response ends. Nothing else: no routing, no
header rewriting (no X-Forwarded-For), no timeouts, no flow control, no validation beyond
what the two parsers reject. Not a proxy to use; a lower bound for one.

    python bench/floor_relay.py --upstream 127.0.0.1:PORT [--port 0]

prints ``listening on 127.0.0.1:<port>`` once it accepts connections, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    """The one upstream connection of a client connection: response bytes go straight to the
    client; the parser says where each response ends."""

    def __init__(self, down: Downstream) -> None:
        self.down = down
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        if self.down.transport.is_closing():  # the client left while this connected
            transport.close()
        elif self.down.pending:
            transport.write(b"".join(self.down.pending))
            self.down.pending.clear()

    def data_received(self, data: bytes) -> None:
        self.down.transport.write(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.down.transport.close()

    def on_message_complete(self) -> None:  # the response's end (Content-Length or chunks)
        if not self.parser.should_keep_alive():
            self.down.transport.close()  # after what was written

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.transport.close()


class Downstream(asyncio.Protocol):
    """A client connection: its requests are parsed (to find their end, and to refuse what is
    not HTTP/1.1) and forwarded on its own upstream connection."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream_addr = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.up: Upstream | None = None
        self.pending: list[bytes] = []  # request bytes waiting for the upstream connection
        self.chunk = b""  # bytes received since the last request's end

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunk += data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        # Forwarded at its end, with whatever of a pipelined next request came in the same
        # read (the upstream gets the same bytes in the same order)
        data, self.chunk = self.chunk, b""
        if not data:
            return
        up = self.up
        if up is not None and up.transport is not None:
            up.transport.write(data)
            return
        self.pending.append(data)
        if up is None:
            self.up = Upstream(self)
            asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        host, port = self.upstream_addr
        try:
            await asyncio.get_running_loop().create_connection(lambda: self.up, host, port)
        except OSError:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()


async def serve(port: int, upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Downstream(upstream), "127.0.0.1", port,
                                      backlog=1024)
    print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True, metavar="HOST:PORT")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    args = p.parse_args()
    host, _, port = args.upstream.rpartition(":")
    uvloop.run(serve(args.port, (host, int(port))))


if __name__ == "__main__":
    main()
