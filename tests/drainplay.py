"""Play a connection through a drain on a fake clock (mitmproxy's Playbook, h11's ConnectionPair).

Three small pieces, no sockets, no sleeps:

- ``FakeClock``: a monotonic clock that only moves when the test says so.
- ``ScriptedRng``: returns queued values in order and fails loudly when the core draws one more
  than the test scripted, so every random decision in a test is visible in its text.
- ``Play``: one ``ConnectionDrain`` driven the way the I/O shell drives it. It keeps the one timer
  the core asks for (``next_deadline``), fires it when the clock passes it, tracks requests in
  flight (``idle``), and records what the core told the shell to do as ``(time, action)`` pairs::

      play = Play.accept(listener, at=0.0, rng=ScriptedRng(0.5))
      play.run(until=T)
      assert play.log == [(x, DRAIN), (x + G, CLOSE)]   # drained at 2T/3+..., idle, closes at +G
"""

from __future__ import annotations

from collections import deque

from lameduck.drain import (
    ConnAction,
    ConnectionDrain,
    ConnState,
    Direction,
    DrainEvent,
    DrainType,
    ListenerDrain,
)

# What the log records besides ConnAction.DRAIN / ConnAction.CLOSE.
RESPONSE = "response"  # a response that did not drain its connection
RESPONSE_DRAINS = "response-drains"  # a response that drains it (HTTP/1: Connection: close)
DRAIN = ConnAction.DRAIN
CLOSE = ConnAction.CLOSE


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
                  drain_type: DrainType = DrainType.DEFAULT) -> ListenerDrain:
    """A listener carrying ``events``; its grace is the first event's G unless given."""
    if grace is None:
        grace = events[0].grace if events else 5.0
    listener = ListenerDrain(name, direction, drain_type, grace)
    for event in events:
        listener.add_event(event)
    return listener


class Play:
    """One connection driven through a drain on a fake clock; ``log`` holds ``(time, action)``."""

    def __init__(self, conn: ConnectionDrain, clock: FakeClock, rng: ScriptedRng) -> None:
        self.conn = conn
        self.clock = clock
        self.rng = rng
        self.in_flight = 0
        self.log: list[tuple[float, object]] = []

    # -- set-up -------------------------------------------------------------------------------
    @classmethod
    def accept(cls, listener: ListenerDrain, at: float = 0.0,
               rng: ScriptedRng | None = None, clock: FakeClock | None = None) -> Play:
        """Accept a connection at ``at``: the listener's events are replayed to it (rng draws)."""
        clock = clock if clock is not None else FakeClock(at)
        clock.set(at)
        rng = rng if rng is not None else ScriptedRng()
        return cls(ConnectionDrain(listener, at, rng), clock, rng)

    @classmethod
    def through(cls, event: DrainEvent, accepted_at: float = 0.0, *rng_values: float) -> Play:
        """The common case: one listener, one event, one connection accepted at ``accepted_at``.

        If the connection is accepted before the event starts, the event is pushed to it at
        ``event.start`` (the shell walking live connections); otherwise it is replayed at accept.
        """
        rng = ScriptedRng(*rng_values)
        if accepted_at < event.start:
            listener = listener_with(grace=event.grace)
            play = cls.accept(listener, accepted_at, rng)
            play.run(until=event.start)
            play.drain_event(event)
            return play
        return cls.accept(listener_with(event), accepted_at, rng)

    # -- inputs -------------------------------------------------------------------------------
    def drain_event(self, event: DrainEvent) -> None:
        """A drain event starts now: the shell adds it to the listener and pushes it here."""
        self.conn.listener.add_event(event)
        self.conn.on_drain_event(event, self.rng)

    def response(self, at: float) -> bool:
        """A response starts at ``at``; returns whether it drains the connection."""
        self.run(until=at)
        drains = self.conn.on_response(self.clock.now, self.rng)
        self.log.append((self.clock.now, RESPONSE_DRAINS if drains else RESPONSE))
        return drains

    def begin(self, at: float) -> None:
        """A request arrives at ``at`` and is in flight until ``end``."""
        self.run(until=at)
        self.in_flight += 1

    def end(self, at: float, drains: bool | None = None) -> None:
        """The response to the oldest request in flight is sent at ``at`` and completes."""
        assert self.in_flight > 0, "end() without begin()"
        got = self.response(at)
        if drains is not None:
            assert got is drains, f"response at {at} drains={got}, expected {drains}"
        self.in_flight -= 1
        if self.in_flight == 0:
            self._record(self.conn.on_idle(self.clock.now))

    # -- time ---------------------------------------------------------------------------------
    def run(self, until: float) -> list[tuple[float, object]]:
        """Move the clock to ``until``, firing the connection's timer at each deadline on the way.

        Returns the entries logged meanwhile. The timer fires exactly at ``next_deadline()``.
        """
        start = len(self.log)
        while True:
            deadline = self.conn.next_deadline()
            if deadline is None or deadline > until:
                break
            self.clock.set(max(deadline, self.clock.now))
            action = self.conn.on_timer(self.clock.now, idle=self.in_flight == 0)
            self._record(action)
            if action is ConnAction.NONE and self.conn.next_deadline() == deadline:
                raise AssertionError(f"timer at {deadline} fired but did not move on")
        self.clock.set(max(until, self.clock.now))
        return self.log[start:]

    def _record(self, action: ConnAction) -> None:
        if action is not ConnAction.NONE:
            self.log.append((self.clock.now, action))

    # -- what the shell sees ------------------------------------------------------------------
    @property
    def state(self) -> ConnState:
        return self.conn.state

    @property
    def actions(self) -> list[tuple[float, object]]:
        """The log without plain (non-draining) responses."""
        return [(t, a) for t, a in self.log if a != RESPONSE]
