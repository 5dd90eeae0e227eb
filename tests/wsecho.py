"""A WebSocket echo server (the `websockets` library) for tunnel tests: a real upstream peer.

Run as ``python tests/wsecho.py PORT`` (0: any free port); once ready it prints ``listening
on 127.0.0.1:P`` (P the port bound), then one line per connection end: ``closed <code>
<reason>`` (the close code it received from its peer, or ``closed none`` when the connection
died without a close frame), flushed at once so a test can read what the upstream saw.
"""

from __future__ import annotations

import asyncio
import sys

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


async def echo(ws: ServerConnection) -> None:
    try:
        async for message in ws:
            if message == "hold":
                continue  # answered by nothing: the client waits
            await ws.send(message)
    except ConnectionClosed:
        pass
    rcvd = ws.protocol.close_rcvd
    line = f"closed {rcvd.code} {rcvd.reason}" if rcvd is not None else "closed none"
    print(line, flush=True)


async def main(port: int) -> None:
    async with serve(echo, "127.0.0.1", port, ping_interval=None, close_timeout=2,
                     max_size=None) as server:
        bound = next(iter(server.sockets)).getsockname()[1]
        print(f"listening on 127.0.0.1:{bound}", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
