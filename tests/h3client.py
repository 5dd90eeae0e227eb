"""An HTTP/3 client for the tests, on aioquic's own asyncio client (``aioquic.asyncio.connect``
with its ``H3Connection``): a real peer that is not lameduck's shell, and that shows what came
on the wire (the GOAWAY identifiers on the server's control stream, stream resets, the
server's transport parameters).

    async with h3_connect(ld.addr) as c:
        reply = await c.request("GET", "/")
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import Buffer, BufferReadError
from aioquic.h3.connection import H3_ALPN, ErrorCode, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration

GOAWAY = 0x07  # RFC 9114 §7.2.6


def goaway_ids(uni: dict[int, bytearray]) -> list[int]:
    """The GOAWAY identifiers on the server's control stream, in order, from what a client
    read of the server's unidirectional streams (aioquic's client parses GOAWAY but reports
    nothing of it)."""
    for data in uni.values():
        buf = Buffer(data=bytes(data))
        if buf.pull_uint_var() != 0:  # not the control stream (RFC 9114 §6.2.1)
            continue
        ids = []
        try:
            while not buf.eof():
                kind, length = buf.pull_uint_var(), buf.pull_uint_var()
                payload = buf.pull_bytes(length)
                if kind == GOAWAY:
                    ids.append(Buffer(data=payload).pull_uint_var())
        except BufferReadError:
            pass  # a frame not whole yet
        return ids
    return []


@dataclass
class Reply:
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    reset: int | None = None  # the server's RESET_STREAM error code
    closed: bool = False  # the connection ended before the response did

    def header(self, name: bytes) -> bytes | None:
        return next((v for n, v in self.headers if n == name), None)


class H3Client(QuicConnectionProtocol):
    """One QUIC connection speaking HTTP/3."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.replies: dict[int, Reply] = {}
        self.waiters: dict[int, asyncio.Future[Reply]] = {}
        self.uni: dict[int, bytearray] = {}
        self.authority = b"localhost"
        self.terminated: qe.ConnectionTerminated | None = None
        self.gone = asyncio.Event()

    def quic_event_received(self, event: qe.QuicEvent) -> None:
        if isinstance(event, qe.StreamDataReceived) and event.stream_id % 4 == 3:
            self.uni.setdefault(event.stream_id, bytearray()).extend(event.data)
        elif isinstance(event, qe.StreamReset) and event.stream_id in self.waiters:
            self.replies[event.stream_id].reset = event.error_code
            self._done(event.stream_id)
        elif isinstance(event, qe.ConnectionTerminated):
            self.terminated = event
            for sid in list(self.waiters):
                self.replies[sid].closed = True
                self._done(sid)
            self.gone.set()
        for ev in self.h3.handle_event(event):
            reply = self.replies.get(ev.stream_id)  # type: ignore[attr-defined]
            if reply is None:
                continue
            if isinstance(ev, HeadersReceived):
                status = next((v for n, v in ev.headers if n == b":status"), None)
                if status is None:
                    reply.trailers = list(ev.headers)
                elif int(status) >= 200:
                    reply.status = int(status)
                    reply.headers = [(n, v) for n, v in ev.headers if not n.startswith(b":")]
            elif isinstance(ev, DataReceived):
                reply.body += ev.data
            if getattr(ev, "stream_ended", False):
                self._done(ev.stream_id)  # type: ignore[attr-defined]

    def _done(self, sid: int) -> None:
        fut = self.waiters.pop(sid, None)
        if fut is not None and not fut.done():
            fut.set_result(self.replies[sid])

    async def wait_connected(self) -> None:
        """aioquic's, with the wait's ConnectionError read when a connect is given up
        (cancelled): else asyncio logs "Future exception was never retrieved" once that
        connection ends."""
        try:
            await super().wait_connected()
        except asyncio.CancelledError:
            waiter = self._connected_waiter
            if waiter is not None:
                waiter.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise

    async def rebind(self) -> None:
        """Go on from a new local port, as after a NAT rebinding (RFC 9000 §9.3): the same
        connection, its packets from another address; the old socket closed."""
        old = self._transport
        loop = asyncio.get_running_loop()
        host = old.get_extra_info("sockname")[0]  # type: ignore[union-attr]
        client = self

        class _Relay(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                client.datagram_received(data, addr)

        transport, _ = await loop.create_datagram_endpoint(_Relay, local_addr=(host, 0))
        self._transport = transport  # type: ignore[assignment]
        old.close()  # type: ignore[union-attr]
        self._quic.send_ping(0)  # a packet from the new address at once
        self.transmit()

    def _fields(self, method: str, path: str, headers: list[tuple[bytes, bytes]] | None
                ) -> list[tuple[bytes, bytes]]:
        if method == "CONNECT":  # RFC 9114 §4.4: no :scheme, no :path
            return [(b":method", b"CONNECT"), (b":authority", path.encode()), *(headers or [])]
        return [(b":method", method.encode()), (b":scheme", b"https"),
                (b":authority", self.authority), (b":path", path.encode()), *(headers or [])]

    def begin(self, method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None,
              body: bytes = b"") -> tuple[int, asyncio.Future[Reply]]:
        """Send a request's head (and the start of its body) now, not its end: an upload
        under way, its stream open until ``more(sid, ..., end=True)``. Its stream id and the
        future of its reply."""
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, self._fields(method, path, headers), end_stream=False)
        if body:
            self.h3.send_data(sid, body, end_stream=False)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.replies[sid] = Reply()
        self.waiters[sid] = fut
        self.transmit()
        return sid, fut

    def more(self, sid: int, data: bytes, end: bool = False) -> None:
        """More of an upload's body (``begin``); ``end`` ends the request."""
        self.h3.send_data(sid, data, end_stream=end)
        self.transmit()

    def send(self, method: str, path: str, headers: list[tuple[bytes, bytes]] | None = None,
             body: bytes = b"", trailers: list[tuple[bytes, bytes]] | None = None
             ) -> asyncio.Future[Reply]:
        """Send a request now; the future has its reply."""
        sid = self._quic.get_next_available_stream_id()
        fields = self._fields(method, path, headers)
        self.h3.send_headers(sid, fields, end_stream=not body and not trailers)
        if body:
            self.h3.send_data(sid, body, end_stream=not trailers)
        if trailers:
            self.h3.send_headers(sid, trailers, end_stream=True)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.replies[sid] = Reply()
        self.waiters[sid] = fut
        self.transmit()
        return fut

    async def request(self, method: str, path: str, **kw: Any) -> Reply:
        return await self.send(method, path, **kw)

    def goaways(self) -> list[int]:
        """The GOAWAY identifiers on the server's control stream, in order (aioquic's client
        parses GOAWAY but reports nothing of it)."""
        return goaway_ids(self.uni)

    def went_away(self) -> bool:
        """The server sent a GOAWAY (RFC 9114 §5.2), or the connection ended: a client opens
        no new stream on it (those below the identifier still complete)."""
        return self.terminated is not None or bool(self.goaways())

    def unprocessed(self, sid: int, reply: Reply) -> bool:
        """The server said it did not process stream ``sid``, so a client may send the request
        again elsewhere, whatever its method: reset with H3_REQUEST_REJECTED (RFC 9114 §4.1.1),
        or ended without a response at or above the last GOAWAY's identifier (§5.2: "were not
        processed"). Anything else that ended without a response may have been processed."""
        if reply.status:
            return False
        if reply.reset == ErrorCode.H3_REQUEST_REJECTED:
            return True
        ids = self.goaways()
        return bool(ids) and sid >= ids[-1]

    def settings(self) -> dict[int, int]:
        return dict(self.h3._received_settings or {})

    @property
    def max_streams(self) -> int:
        """The server's limit on our bidirectional streams (QUIC MAX_STREAMS)."""
        return self._quic._remote_max_streams_bidi

    @property
    def idle_timeout(self) -> float | None:
        """The server's max_idle_timeout transport parameter (RFC 9000 §18.2), seconds."""
        return self._quic._remote_max_idle_timeout  # type: ignore[no-any-return]


def client_configuration(ca: str | None = None) -> QuicConfiguration:
    qc = QuicConfiguration(is_client=True, alpn_protocols=list(H3_ALPN))
    if ca is None:
        qc.verify_mode = ssl.CERT_NONE
    else:
        qc.load_verify_locations(ca)
    qc.server_name = "localhost"
    return qc


@contextlib.asynccontextmanager
async def h3_connect(addr: str, ca: str | None = None) -> AsyncIterator[H3Client]:
    host, port = addr.rsplit(":", 1)
    async with connect(host, int(port), configuration=client_configuration(ca),
                       create_protocol=H3Client, wait_connected=True) as client:
        yield client  # type: ignore[misc]


async def counted_active(ld: Any, timeout: float = 15.0) -> bool:
    """Wait (off the loop) until the lameduck ``ld`` counts one request in flight: the one
    just sent has reached it."""
    from tests.procs import wait_until

    return await asyncio.to_thread(
        wait_until, lambda: ld.stat("http.ingress.downstream_rq_active") == 1, timeout)
