"""The control channel between the main process and a worker: JSON messages over a Unix
stream socket pair, each framed by its length (4 bytes, big-endian).

Control only: drain events, endpoint facts, status, stats. Nothing per request crosses it, so
JSON's cost does not matter and a message stays readable in a debugger or strace.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Callable
from typing import Any

Message = dict[str, Any]
HEADER = struct.Struct(">I")
MAX_MESSAGE = 64 << 20  # a stats snapshot of a large config; anything bigger is a bug


class Channel(asyncio.Protocol):
    """One end of the pair. ``on_message`` gets each message in order; ``on_lost`` once, when
    the other end is gone (its process exited, or a frame made no sense)."""

    def __init__(self, on_message: Callable[[Message], None],
                 on_lost: Callable[[], None]) -> None:
        self.on_message = on_message
        self.on_lost = on_lost
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.lost = False
        self.ended = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(buf)
            if n > MAX_MESSAGE:
                self._broken()
                return
            if len(buf) < HEADER.size + n:
                return
            raw = bytes(buf[HEADER.size:HEADER.size + n])
            del buf[:HEADER.size + n]
            try:
                msg = json.loads(raw)
            except ValueError:
                self._broken()
                return
            if self.lost:
                return
            self.on_message(msg)

    def _broken(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.lost:
            self.lost = True
            self.on_lost()

    def send(self, msg: Message) -> None:
        """Queued in the transport's buffer; dropped once the other end is gone, or once this
        end has said its last (``end``)."""
        t = self.transport
        if t is None or t.is_closing() or self.ended:
            return
        t.write(encode(msg))

    def end(self) -> None:
        """No more from this end (a half-close: what is queued is written first, and what the
        other end sends is still read): the other end reads to EOF, then closes."""
        t = self.transport
        if t is not None and not self.ended:
            self.ended = True
            t.write_eof()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def encode(msg: Message) -> bytes:
    raw = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(len(raw)) + raw


def read_one(sock: socket.socket) -> Message:
    """The first message, read blocking before the loop runs (a worker's config)."""
    def exactly(n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            part = sock.recv(n - len(chunks))
            if not part:
                raise ConnectionError("the main process closed the control channel")
            chunks += part
        return bytes(chunks)
    (n,) = HEADER.unpack(exactly(HEADER.size))
    if n > MAX_MESSAGE:
        raise ValueError(f"control message of {n} bytes")
    msg: Message = json.loads(exactly(n))
    return msg


async def open_channel(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                       on_message: Callable[[Message], None],
                       on_lost: Callable[[], None]) -> Channel:
    sock.setblocking(False)
    _, proto = await loop.connect_accepted_socket(lambda: Channel(on_message, on_lost), sock)
    return proto
