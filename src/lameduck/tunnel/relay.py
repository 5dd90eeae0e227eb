"""The byte relay of every tunnel — an HTTP/1.1 Upgrade (101), a CONNECT (2xx) over either
protocol, a TCP listener's connection: bytes relayed both ways as they come, with the drain
core's ``TunnelDrain`` deciding how it ends.

For a WebSocket each direction runs through a ``FrameTracker`` that walks frame headers without
buffering payloads, so a close frame can be injected at a frame boundary of that direction
(1001 "going away" on a proactive drain, 1002 toward a side that sent an invalid frame), and the
close handshake is seen. Once our close went into a direction, nothing more is forwarded there
(RFC 6455 §5.5.1); the trackers keep reading to see the peers' closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable

from lameduck.drain.connection import DrainedBy
from lameduck.drain.tunnel import Flow, TunnelAction, TunnelDrain, TunnelKind
from lameduck.tunnel.websocket import FrameTracker, close_frame

TO_UPSTREAM = Flow.TO_UPSTREAM
TO_CLIENT = Flow.TO_CLIENT


def abort_with_rst(t: asyncio.BaseTransport) -> None:
    """Abort with a TCP reset, not a FIN (SO_LINGER 0): a cut body or tunnel must not look
    complete to the peer."""
    sock = t.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    t.abort()  # type: ignore[attr-defined]


class TunnelEnd(asyncio.Protocol):
    """One socket of a tunnel; what it reads goes the way of ``flow``."""

    def __init__(self, relay: Relay, flow: Flow) -> None:
        self.relay = relay
        self.flow = flow

    def data_received(self, data: bytes) -> None:
        self.relay.feed(self.flow, data)

    def eof_received(self) -> bool:
        self.relay.eof(self.flow)
        return True  # half-close: the other direction may still carry bytes

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.lost(self.flow, exc)

    def pause_writing(self) -> None:
        # This socket cannot take more: stop reading the one that feeds it.
        self.relay.source(self.flow, back=True).pause_reading()

    def resume_writing(self) -> None:
        self.relay.source(self.flow, back=True).resume_reading()


class Pending(asyncio.Protocol):
    """A CONNECT's destination socket until its relay starts: keeps what arrives meanwhile."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.eof = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data

    def eof_received(self) -> bool:
        self.eof = True  # passed on once the relay starts
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def open_destination(loop: asyncio.AbstractEventLoop, host: str, port: int,
                     timeout: float) -> asyncio.Future[tuple[asyncio.Transport, Pending]]:
    """Connect to a CONNECT destination (the listener's allow-list chose it)."""
    return asyncio.ensure_future(asyncio.wait_for(
        loop.create_connection(Pending, host, port), timeout))  # type: ignore[arg-type]


def destination(fut: asyncio.Future[tuple[asyncio.Transport, Pending]],
                wanted: bool) -> tuple[asyncio.Transport, Pending] | None:
    """What ``open_destination`` gave: the socket, or None if it failed or was lost before the
    relay began (then closed, as is one no longer ``wanted``)."""
    if fut.cancelled() or fut.exception() is not None:
        return None
    t, pending = fut.result()
    if not wanted or pending.lost:
        t.abort()
        return None
    return t, pending


class Relay:
    """Both sockets of one tunnel. ``on_end(cut)`` runs once, when both are closed.

    The client side is a socket, or an HTTP/2 stream (``http2``: its transport facade,
    ``http2.tunnel.StreamSide``), where an opaque tunnel drained proactively is reset only once
    G has elapsed (Envoy's draining docs)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        client: asyncio.Transport,
        upstream: asyncio.Transport,
        kind: TunnelKind,
        grace: float,
        on_end: Callable[[bool], None],
        rsv1_allowed: bool = False,
        http2: bool = False,
    ) -> None:
        self.loop = loop
        self.kind = kind
        self.dest = {TO_UPSTREAM: upstream, TO_CLIENT: client}
        self.drain = TunnelDrain(kind, grace, http2)
        self.trackers: dict[Flow, FrameTracker] | None = None
        if kind is TunnelKind.WEBSOCKET:
            # RSV1 marks a compressed message when permessage-deflate was negotiated
            self.trackers = {TO_UPSTREAM: FrameTracker(True, rsv1_allowed),
                             TO_CLIENT: FrameTracker(False, rsv1_allowed)}
        self.stopped = {TO_UPSTREAM: False, TO_CLIENT: False}  # our close went that way
        self.deaf = {TO_UPSTREAM: False, TO_CLIENT: False}  # its sender broke the protocol
        self.eofs = {TO_UPSTREAM: False, TO_CLIENT: False}
        self.lost_sides = {TO_UPSTREAM: False, TO_CLIENT: False}
        self.timer: asyncio.TimerHandle | None = None
        self.on_end = on_end
        self.ended = False
        self.cut = False
        self.last_activity = loop.time()  # the last byte relayed (opaque tunnels only)
        # Bytes relayed each way, for the access log: from the client, and to it.
        self.rx = 0
        self.tx = 0

    def start(self, to_upstream: bytes, to_client: bytes) -> None:
        """Take both sockets over; bytes that came with the request or the 101 go first."""
        for flow, t in self.dest.items():
            # The protocol reading a socket relays its bytes the other way.
            t.set_protocol(TunnelEnd(self, TO_CLIENT if flow is TO_UPSTREAM else TO_UPSTREAM))
        if to_client:
            self.feed(TO_CLIENT, to_client)
        if to_upstream:
            self.feed(TO_UPSTREAM, to_upstream)
        for t in self.dest.values():
            t.resume_reading()

    def source(self, flow: Flow, back: bool = False) -> asyncio.Transport:
        """The socket ``flow`` is read from (``back``: the socket that feeds ``flow``'s reader)."""
        if back:
            return self.dest[flow]
        return self.dest[TO_CLIENT if flow is TO_UPSTREAM else TO_UPSTREAM]

    # -- bytes ----------------------------------------------------------------------------------
    def feed(self, flow: Flow, data: bytes) -> None:
        if self.ended:
            return
        trackers = self.trackers
        if trackers is None:
            self.last_activity = self.loop.time()
            self._count(flow, len(data))
            self.dest[flow].write(data)
            return
        if self.deaf[flow]:
            return  # RFC 6455 §7.1.7: after an invalid frame its sender is not read any more
        tr = trackers[flow]
        d = self.drain
        while data:
            owed = d.owes_close(flow)
            if owed and tr.at_boundary:
                self._act(d.boundary(flow, self.loop.time()))
                continue
            n = tr.feed(data, stop_at_boundary=owed)
            if n and not self.stopped[flow]:
                self._count(flow, n)
                self.dest[flow].write(data[:n] if n < len(data) else data)
            if tr.error is not None:
                self.deaf[flow] = True
                self._act(d.invalid(flow, self.loop.time(), tr.at_boundary))
                self._boundaries()
                return
            if tr.close_seen:
                self._act(d.close_seen(flow))
            if n == 0 and not owed:
                break
            data = data[n:]
        self._boundaries()

    def _count(self, flow: Flow, n: int) -> None:
        if flow is TO_UPSTREAM:
            self.rx += n
        else:
            self.tx += n

    def _boundaries(self) -> None:
        """Send the closes owed into directions that stand at a frame boundary now."""
        if self.trackers is None:
            return
        d = self.drain
        for flow, tr in self.trackers.items():
            if d.owes_close(flow) and tr.at_boundary and not self.ended:
                self._act(d.boundary(flow, self.loop.time()))

    def eof(self, flow: Flow) -> None:
        """The sender of ``flow`` shut down writing: pass the FIN on."""
        self.eofs[flow] = True
        t = self.dest[flow]
        if not self.stopped[flow] and t.can_write_eof() and not t.is_closing():
            t.write_eof()
        if all(self.eofs.values()):
            self._close_both()

    def lost(self, flow: Flow, exc: Exception | None) -> None:
        """The socket ``flow`` is read from is gone: the tunnel ends (the other side closed)."""
        self.lost_sides[flow] = True
        if not self.ended:
            self._act(self.drain.ended())
            self._close_both()
        self._maybe_end()

    # -- drain ----------------------------------------------------------------------------------
    def drain_by(self, by: DrainedBy) -> None:
        """The connection this tunnel rides on was drained (by a response, proactively, or at the
        end of the drain)."""
        if self.ended:
            return
        self._act(self.drain.drain(self.loop.time(), by))
        self._boundaries()
        self._arm()

    def _arm(self) -> None:
        at = self.drain.next_deadline()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if at is not None and not self.ended:
            self.timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self.timer = None
        if not self.ended:
            self._act(self.drain.timer(self.loop.time()))
            self._arm()

    def _act(self, action: TunnelAction) -> None:
        if action is TunnelAction.NOTHING:
            return
        if action is TunnelAction.SEND_CLOSE_TO_CLIENT:
            self.stopped[TO_CLIENT] = True
            self.dest[TO_CLIENT].write(close_frame(self.drain.close_code(TO_CLIENT)))
        elif action is TunnelAction.SEND_CLOSE_TO_UPSTREAM:
            self.stopped[TO_UPSTREAM] = True
            self.dest[TO_UPSTREAM].write(
                close_frame(self.drain.close_code(TO_UPSTREAM), mask=True))
        elif action is TunnelAction.CLOSE_BOTH:
            self._close_both()
        elif action is TunnelAction.RESET_BOTH:
            self.cut = True
            self._reset_both()
        self._arm()

    # -- ending ---------------------------------------------------------------------------------
    def end(self, reset: bool) -> None:
        """End the tunnel from outside (a TCP listener's drain, a drain stop): FIN both ways,
        or reset both (counted as cut)."""
        if reset:
            self.cut = True
            if self.ended:
                # closed with a FIN already, but a side is still open (its peer does not
                # read what is buffered for it): reset what is left
                for t in self.dest.values():
                    if not t.is_closing() or t.get_write_buffer_size():
                        abort_with_rst(t)
                return
        self._end(reset)

    def _close_both(self) -> None:
        self._end(reset=False)

    def _reset_both(self) -> None:
        self._end(reset=True)

    def _end(self, reset: bool) -> None:
        """Close both sides (after what is buffered has been written), or reset them."""
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for t in self.dest.values():
            if reset:
                abort_with_rst(t)
            elif not t.is_closing():
                t.close()
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self.ended and all(self.lost_sides.values()) and self.on_end is not None:
            on_end, self.on_end = self.on_end, None  # type: ignore[assignment]
            on_end(self.cut)
