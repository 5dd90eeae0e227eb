"""Streams on shared, multiplexed connections (HTTP/2): where a new stream goes, and its wait
for a stream slot.

An endpoint's multiplexed connections are shared by many exchanges at once. Each exchange
gets a stream, and two waits decide when it is sent:

- **Placement** (``Placement``): a new stream goes on the first shared connection that takes
  one more; else on a connection being opened that is expected to have room for it (the stream
  limit the endpoint's connections said last, RFC 9113 §6.5.2 SETTINGS_MAX_CONCURRENT_STREAMS);
  else on a new connection; else, when ``max_connecting`` connections to the endpoint are being
  opened already, in the endpoint's line (``Endpoint.waiting``, where HTTP/1.1 requests wait for
  a connect slot), placed again when one of those is open or failed.
- **Slots** (``SharedConn``): a stream handed out is sent at once when the connection has a
  free stream slot, waits in the connection's queue when it has none yet (its SETTINGS not in,
  or the upstream lowered its limit), and is refused — never sent, so safe to send again (RFC
  9113 §8.7) — when the upstream allows no stream at all or the connection stops taking new ones
  (GOAWAY, lost).

The codec's connection subclasses ``SharedConn`` with what is its own (the frame layer's say,
the stream it makes, the socket), and its pool ``Placement`` with how a connection is opened;
this module imports no codec. Both are native base classes, not protocols: a stream placed,
started and ended per request calls them directly, not by name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Final, Protocol, cast

from mypy_extensions import mypyc_attr

if TYPE_CHECKING:
    from lameduck.upstream.connector import UpstreamConn
    from lameduck.upstream.pool import Endpoint


class QueuedStream(Protocol):
    """A stream waiting in its connection's queue for a stream slot."""

    def send_head(self) -> None:
        """A slot is free: send the request (its head, what it held of its body)."""

    def refuse(self) -> None:
        """It will never be sent here: refused (it leaves the queue with ``SharedConn.leave``)."""


# What ``SharedConn.start`` decides for a stream whose request is ready (Final: compiled in
# as constants, not looked up by name per request).
SEND: Final = 0  # a slot is free: send it now
QUEUED: Final = 1  # in the queue, sent when a slot frees (or refused with the rest)
REFUSE: Final = 2  # never sent here: refused, safe to send again elsewhere


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' fake connections
class SharedConn(asyncio.Protocol):
    """One multiplexed connection to an endpoint as its pool counts it: the streams it may
    carry, those handed out and not started, those waiting for a slot. A stream is *busy* from
    its hand-out (``take``) to its end (``stream_gone``)."""

    def __init__(self, max_streams: int, expected: int) -> None:
        self.max_streams = max_streams  # ours (the cluster's max_concurrent_streams)
        self.expected = expected  # the upstream's limit as guessed before its SETTINGS
        self.reserved = 0  # streams handed out, not yet started
        self.waiting: deque[QueuedStream] = deque()  # started, waiting for a slot
        self.alive = True
        self.goaway = False  # the upstream is draining this connection: no new streams
        self.idle_since = 0.0

    # -- what the codec says ---------------------------------------------------------------
    def wire_can_open(self) -> bool:
        """The frame layer may open a stream now (not closed, no GOAWAY, under the upstream's
        limit, stream ids left)."""
        raise NotImplementedError

    def on_wire(self) -> int:
        """Streams open on the wire (sent, not yet ended)."""
        raise NotImplementedError

    def peer_limit(self) -> int:
        """The upstream's MAX_CONCURRENT_STREAMS as its last SETTINGS said (RFC 9113 §6.5.2),
        read from the frame layer; -1: no SETTINGS yet."""
        raise NotImplementedError

    def new_stream(self) -> UpstreamConn:
        """A stream for an exchange, not started (``take`` counts it)."""
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        """GOAWAY and close, no stream cut: idle, or the last stream of a drained one ended."""
        raise NotImplementedError

    # -- the numbers -----------------------------------------------------------------------
    @property
    def limit(self) -> int:
        """Streams it may carry: ours and the upstream's limit (until its SETTINGS come, what
        the endpoint's earlier connections said)."""
        peer = self.peer_limit()
        return min(self.max_streams, peer if peer >= 0 else self.expected)

    @property
    def busy(self) -> int:
        return self.on_wire() + self.reserved + len(self.waiting)

    @property
    def has_room(self) -> bool:
        """A stream can be opened on the wire now. Until the upstream's SETTINGS are in, one
        stream at a time: its stream limit is not known, and a stream over it is refused."""
        n = self.on_wire()
        return self.wire_can_open() and n < self.max_streams and (n == 0 or self.peer_limit() >= 0)

    @property
    def can_take(self) -> bool:
        """A stream may be handed out: it will be sent at once, or after the ones before it."""
        return (self.alive and not self.goaway and self.wire_can_open()
                and self.busy < self.limit)

    @property
    def allows_none(self) -> bool:
        """The upstream's SETTINGS said MAX_CONCURRENT_STREAMS 0: nothing can be sent here."""
        return self.peer_limit() == 0

    # -- a stream's way through ------------------------------------------------------------
    def take(self) -> UpstreamConn:
        """Hand a stream out (placement chose this connection)."""
        self.reserved += 1
        return self.new_stream()

    def start(self, stream: QueuedStream) -> int:
        """A handed-out stream's request is ready: ``SEND``, ``QUEUED`` or ``REFUSE``."""
        self.reserved -= 1
        if not self.alive or self.goaway:
            return REFUSE  # lost, or GOAWAY came between the hand-out and now
        if self.has_room:
            return SEND
        if self.allows_none:
            return REFUSE  # the exchange may try again, then answers 503
        self.waiting.append(stream)
        return QUEUED

    def give_back(self) -> None:
        """A stream handed out was let go before it started."""
        self.reserved -= 1

    def leave(self, stream: QueuedStream) -> None:
        """A started stream ended before its slot came (refused, cut, its client gone)."""
        with contextlib.suppress(ValueError):
            self.waiting.remove(stream)

    def stream_gone(self) -> None:
        """A stream ended: start those that waited for a slot; the idle clock starts when the
        last one ends; a drained connection closes."""
        if self.waiting:
            self.start_waiting()
        if not self.busy:
            self.idle_since = self.now()
            if self.goaway or not self.alive:
                self.close()

    def start_waiting(self) -> None:
        """Send what waited while there are slots (the upstream's SETTINGS, or a stream's end,
        may have made some); refuse it all if the upstream allows no stream."""
        if self.allows_none:
            self.refuse_waiting()  # they would wait for good
            return
        waiting = self.waiting
        while waiting and self.alive and not self.goaway and self.has_room:
            waiting.popleft().send_head()

    def refuse_waiting(self) -> None:
        """Refuse every stream waiting for a slot (GOAWAY, lost): retried elsewhere."""
        while self.waiting:
            self.waiting[0].refuse()  # leaves the queue


@mypyc_attr(allow_interpreted_subclasses=True)  # the tests' fake openers
class Placement:
    """Where the new streams of one cluster's exchanges go, per endpoint (its ``connect``)."""

    def __init__(self, max_streams: int, loop: asyncio.AbstractEventLoop) -> None:
        self.max_streams = max_streams
        self.loop = loop
        # Each endpoint's stream limit as its connections' SETTINGS said: a new connection
        # expects it until its own SETTINGS come.
        self.learned: dict[Endpoint, int] = {}
        # Connections being opened, per endpoint, with the streams promised on each.
        self.opening: dict[Endpoint, list[tuple[asyncio.Future[SharedConn], list[
            asyncio.Future[UpstreamConn]]]]] = {}

    async def open(self, ep: Endpoint, expected: int) -> SharedConn:
        """A new connection to ``ep``, open (its SETTINGS may still be on the way), expecting
        ``expected`` streams; it raises what failed."""
        raise NotImplementedError

    def connect(self, ep: Endpoint) -> asyncio.Future[UpstreamConn]:
        """A stream on a connection with room, or on one being opened for it."""
        fut: asyncio.Future[UpstreamConn] = self.loop.create_future()
        self.place(ep, fut)
        return fut

    def place(self, ep: Endpoint, fut: asyncio.Future[UpstreamConn]) -> None:
        room = self.max_streams  # what a new connection is expected to take
        for c in ep.shared:
            conn = cast("SharedConn", c)
            if conn.can_take or (conn.alive and not conn.goaway and conn.allows_none):
                # (an upstream that allows no stream refuses it: no new connection for that)
                fut.set_result(conn.take())
                return
            if conn.peer_limit() >= 0:
                # the endpoint's SETTINGS, as its last connection said (at least one: an
                # upstream that allows none must not make every request open a connection)
                room = max(conn.limit, 1)
                self.learned[ep] = room
        pending = self.opening.setdefault(ep, [])
        for _, waiters in pending:
            if len(waiters) < room:
                waiters.append(fut)
                return
        if ep.max_connecting and len(pending) >= ep.max_connecting:
            # Every connection being opened is full and there are ``max_connecting`` of them:
            # in the endpoint's line (the one HTTP/1.1 requests wait in), placed again when
            # one of those is open (or failed).
            self._line_up(ep, fut)
            return
        self._open_for(ep, fut)

    # (The closures are made here, off the path of a stream placed on an open connection: a
    # function with a lambda allocates its environment at every call.)
    def _line_up(self, ep: Endpoint, fut: asyncio.Future[UpstreamConn]) -> None:
        ep.waiting.append(lambda: self.place(ep, fut) if not fut.done() else None)

    def _open_for(self, ep: Endpoint, fut: asyncio.Future[UpstreamConn]) -> None:
        """A new connection, ``fut`` its first waiter."""
        conn_fut = asyncio.ensure_future(self.open(ep, self.learned.get(ep, self.max_streams)),
                                         loop=self.loop)
        waiters = [fut]
        self.opening[ep].append((conn_fut, waiters))
        conn_fut.add_done_callback(lambda f: self.opened(ep, f, waiters))

    def opened(self, ep: Endpoint, f: asyncio.Future[SharedConn],
               waiters: list[asyncio.Future[UpstreamConn]]) -> None:
        """A connection being opened is open, or failed: its waiters get their streams, or
        the failure."""
        pending = self.opening.get(ep, [])
        for i, (cf, _) in enumerate(pending):
            if cf is f:
                del pending[i]
                break
        if not pending:
            self.opening.pop(ep, None)
        exc = f.exception() if not f.cancelled() else asyncio.CancelledError()
        for w in waiters:
            if w.done():
                continue  # gave up meanwhile
            if exc is not None:
                w.set_exception(exc)
            else:
                w.set_result(f.result().take())
        if exc is None and f.result().alive:
            # Shared only now, with its waiters' streams reserved: were it shared when the
            # connect finished, a request in between would see it empty and take a stream,
            # and the waiters would then overfill it (one queued behind the limit).
            ep.shared.append(f.result())
        # A connect slot is free (and maybe streams on the new connection): those in line
        # are placed again, in order (one that finds no room yet joins the line again).
        for wake in ep.take_line():
            wake()
