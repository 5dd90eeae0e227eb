"""Play a connection through a drain on a fake clock (mitmproxy's Playbook, h11's ConnectionPair).

Small pieces, no sockets, no sleeps:

- ``FakeClock``: a monotonic clock that only moves when the test says so.
- ``ScriptedRng``: returns queued values in order and fails loudly when the core draws one more
  than the test scripted, so every random decision in a test is visible in its text.
- ``RecordingCodec``: a codec on the real drain manager (``lameduck.proxy.downstream``, the one
  HTTP/1.1 and HTTP/2 share) that speaks no protocol: it is busy while a request the test began
  is in flight, and logs what the manager asks of it (the drain notice, the final notice, the
  proactive moment for its tunnels, the staged close).
- ``Play``: one such connection on ``tests.playbook.Loop`` told the time by the ``FakeClock``.
  The manager keeps its own timer; ``run`` fires it when the clock passes it. The log holds
  ``(time, entry)`` pairs::

      play = Play.accept(listener, at=0.0, rng=ScriptedRng(0.5))
      play.run(until=T)
      assert play.log == [(x, NOTICE), (x, DRAIN), (x + G, FINAL), (x + G, CLOSE)]
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

from lameduck.drain import (
    ConnAction,
    ConnectionDrain,
    ConnState,
    Direction,
    DrainedBy,
    DrainEvent,
    DrainType,
    ListenerDrain,
    ProcessDrain,
)
from lameduck.proxy.downstream import Downstream
from lameduck.stats import DrainStats, HttpStats
from tests.playbook import Loop, Transport

# What the log records: the manager's requests to the codec, and the responses of the test.
NOTICE = "notice"  # drain_notice(): go elsewhere (HTTP/2: GOAWAY 2^31-1)
FINAL = "final"  # final_notice(): the last word (HTTP/2: the final GOAWAY, RFC 9113 §6.8)
DRAIN = ConnAction.DRAIN  # drain_tunnels(PROACTIVE): the proactive moment, tunnels end from now
END = DrainedBy.END  # drain_tunnels(END): the drain is over, tunnels end now
CLOSE = ConnAction.CLOSE  # the staged close begins (RFC 9112 §9.6)
RESPONSE = "response"  # a response that did not drain its connection
RESPONSE_DRAINS = "response-drains"  # a response that drains it (HTTP/1: Connection: close)


class FakeClock:
    """A monotonic clock in float seconds; callable like ``time.monotonic``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def set(self, t: float) -> float:
        if t < self.now:
            raise AssertionError(f"a monotonic clock cannot go back from {self.now} to {t}")
        self.now = t
        return t

    def advance(self, dt: float) -> float:
        return self.set(self.now + dt)


class ScriptedRng:
    """An ``Rng`` that returns the queued values in order; an unscripted draw is a test failure."""

    def __init__(self, *values: float) -> None:
        self.queue: deque[float] = deque()
        self.drawn: list[float] = []
        self.push(*values)

    def push(self, *values: float) -> ScriptedRng:
        for v in values:
            if not 0.0 <= v < 1.0:
                raise ValueError(f"rng values lie in [0, 1), got {v}")
            self.queue.append(v)
        return self

    def __call__(self) -> float:
        if not self.queue:
            raise AssertionError(f"unscripted rng draw (after {len(self.drawn)} scripted ones)")
        v = self.queue.popleft()
        self.drawn.append(v)
        return v

    @property
    def exhausted(self) -> bool:
        return not self.queue


def listener_with(*events: DrainEvent, grace: float | None = None, name: str = "ingress",
                  direction: Direction = Direction.INBOUND,
                  drain_type: DrainType = DrainType.DEFAULT,
                  on_response: bool = False) -> ListenerDrain:
    """A listener carrying ``events``; its grace is the first event's G unless given.
    ``on_response``: ``drain.idle_close: on_response``."""
    if grace is None:
        grace = events[0].grace if events else 5.0
    listener = ListenerDrain(name, direction, drain_type, grace, on_response)
    for event in events:
        listener.add_event(event)
    return listener


class ClockLoop(Loop):
    """The playbook's fake event loop, telling the time by a ``FakeClock`` (it cannot go back)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.timers: list[asyncio.TimerHandle] = []

    @property  # type: ignore[override]
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, t: float) -> None:
        self.clock.set(t)


class Side:
    """What a listener gives its downstream connections (``ConnectionContext``), for one."""

    def __init__(self, loop: Loop, listener: ListenerDrain, rng: ScriptedRng) -> None:
        self.loop = loop
        self.drain = listener
        self.rng = rng
        self.stats = HttpStats()
        self.drain_stats = DrainStats()
        self.process = ProcessDrain()  # its ledger counts the connections not yet heard from
        self.connections: set[Any] = set()
        self.idle_timeout = math.inf  # the codecs' own timeouts are test_downstream_playbook's
        self.scheme = b"http"
        self.generate_request_id = False
        self.suppress_envoy_headers = True
        self.traffic = None  # no leave: confirm watch
        self.alt_svc = None  # no HTTP/3
        self.closed: list[Any] = []

    def on_connection_closed(self, conn: Any) -> None:
        self.closed.append(conn)


class RecordingCodec(Downstream):
    """A codec that speaks no protocol: what the drain manager asked of it goes to ``log``."""

    def __init__(self, ctx: Side, log: list[tuple[float, object]]) -> None:
        super().__init__(ctx)
        self.log = log
        self.in_flight = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ctx = self.ctx
        self.take(transport)
        now = self.loop.time()
        self.idle_since = now
        self.drain = ConnectionDrain(ctx.drain, now, ctx.rng)
        ctx.connections.add(self)
        ctx.stats.downstream_cx_total += 1
        ctx.stats.downstream_cx_active += 1
        self.arm_drain()

    def _note(self, entry: object) -> None:
        self.log.append((self.loop.time(), entry))

    def busy(self) -> bool:
        return self.in_flight > 0

    def timeouts(self, now: float) -> float:
        return math.inf  # no request header or idle timeout of its own

    def drain_notice(self) -> None:
        self._note(NOTICE)

    def final_notice(self) -> None:
        if not self.final_sent:  # once, like HTTP/2's final GOAWAY
            self.final_sent = True
            self._note(FINAL)

    def drain_tunnels(self, by: DrainedBy) -> None:
        self._note(DRAIN if by is DrainedBy.PROACTIVE else by)

    def flush(self) -> None:
        pass  # nothing is ever held back

    def on_staged_close(self, t: asyncio.Transport) -> None:
        self._note(CLOSE)

    def abandon_all(self) -> None:
        self.in_flight = 0


class Play:
    """One connection driven through a drain on a fake clock; ``log`` holds ``(time, entry)``."""

    def __init__(self, listener: ListenerDrain, clock: FakeClock, rng: ScriptedRng) -> None:
        self.clock = clock
        self.rng = rng
        self.loop = ClockLoop(clock)
        self.side = Side(self.loop, listener, rng)
        self.log: list[tuple[float, object]] = []
        self.codec = RecordingCodec(self.side, self.log)
        self.socket = Transport(self.loop)
        self.codec.connection_made(self.socket)

    # -- set-up -------------------------------------------------------------------------------
    @classmethod
    def accept(cls, listener: ListenerDrain, at: float = 0.0,
               rng: ScriptedRng | None = None, clock: FakeClock | None = None) -> Play:
        """Accept a connection at ``at``: the listener's events are replayed to it (rng draws)."""
        clock = clock if clock is not None else FakeClock(at)
        clock.set(at)
        rng = rng if rng is not None else ScriptedRng()
        return cls(listener, clock, rng)

    @classmethod
    def through(cls, event: DrainEvent, accepted_at: float = 0.0, *rng_values: float,
                on_response: bool = False) -> Play:
        """The common case: one listener, one event, one connection accepted at ``accepted_at``.

        If the connection is accepted before the event starts, the event is pushed to it at
        ``event.start`` (the shell walking live connections); otherwise it is replayed at accept.
        """
        rng = ScriptedRng(*rng_values)
        if accepted_at < event.start:
            listener = listener_with(grace=event.grace, on_response=on_response)
            play = cls.accept(listener, accepted_at, rng)
            play.run(until=event.start)
            play.drain_event(event)
            return play
        return cls.accept(listener_with(event, on_response=on_response), accepted_at, rng)

    # -- inputs -------------------------------------------------------------------------------
    def drain_event(self, event: DrainEvent) -> None:
        """A drain event starts now: the shell adds it to the listener and pushes it here."""
        self.side.drain.add_event(event)
        self.codec.on_drain_event(event)

    def response(self, at: float) -> bool:
        """A response starts at ``at``; returns whether it drains the connection."""
        self.run(until=at)
        drains = self.codec.response_drains()
        self.log.append((self.clock.now, RESPONSE_DRAINS if drains else RESPONSE))
        return drains

    def begin(self, at: float) -> None:
        """A request arrives at ``at`` and is in flight until ``end``."""
        self.run(until=at)
        self.codec.in_flight += 1

    def end(self, at: float, drains: bool | None = None) -> None:
        """The response to the oldest request in flight is sent at ``at`` and completes."""
        assert self.codec.in_flight > 0, "end() without begin()"
        got = self.response(at)
        if drains is not None:
            assert got is drains, f"response at {at} drains={got}, expected {drains}"
        self.codec.in_flight -= 1
        if self.codec.in_flight == 0:
            self.codec.on_idle(self.clock.now)

    def no_new_work(self, at: float) -> None:
        """T passes at ``at``: the process takes no new request, and says so."""
        self.run(until=at)
        self.codec.no_new_work()

    def close_at_end(self, at: float) -> None:
        """The drain's deadline comes at ``at``: the shell's last word to the connection."""
        self.run(until=at)
        self.codec.close_at_end()

    # -- time ---------------------------------------------------------------------------------
    def run(self, until: float) -> list[tuple[float, object]]:
        """Move the clock to ``until``, firing the manager's timer whenever it is due on the way.

        Returns the entries logged meanwhile.
        """
        start = len(self.log)
        self.loop.advance(max(until, self.clock.now))
        return self.log[start:]

    # -- what the shell sees ------------------------------------------------------------------
    @property
    def conn(self) -> ConnectionDrain:
        """The drain core's state of this connection (the manager's ``drain``)."""
        return self.codec.drain

    @property
    def in_flight(self) -> int:
        return self.codec.in_flight

    @property
    def state(self) -> ConnState:
        return self.conn.state

    @property
    def actions(self) -> list[tuple[float, object]]:
        """The log without plain (non-draining) responses."""
        return [(t, a) for t, a in self.log if a != RESPONSE]
