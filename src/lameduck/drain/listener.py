"""A listener's node in the drain tree (Envoy: server -> listener -> connection).

It holds what every connection of the listener consults: the drain events that cover it, the
health-check-failed flag, and when it stops accepting. Connections keep a reference to it, so a
drain that starts later reaches them all without the shell walking them for the ramp.
"""

from __future__ import annotations

from lameduck.drain.event import Direction, DrainEvent, DrainType
from lameduck.drain.policy import Rng, response_drains


class ListenerDrain:
    """Drain state of one listener."""

    __slots__ = ("direction", "drain_type", "events", "grace", "hc_failed",
                 "idle_close_on_response", "name", "quiet", "stop_at")

    def __init__(
        self,
        name: str,
        direction: Direction = Direction.INBOUND,
        drain_type: DrainType = DrainType.DEFAULT,
        grace: float = 5.0,
        idle_close_on_response: bool = False,
    ) -> None:
        self.name = name
        self.direction = direction
        self.drain_type = drain_type
        self.grace = grace
        # drain.idle_close: on_response (event.IdleClose): an idle connection is not closed by
        # the drain until a response has told its client, or the drain's end (T + G).
        self.idle_close_on_response = idle_close_on_response
        self.events: tuple[DrainEvent, ...] = ()
        self.hc_failed = False
        self.stop_at: float | None = None
        # No event and no health-check fail: no response drains. Kept as a plain attribute so
        # the shell can skip the per-response decision (and its clock read) in one test.
        self.quiet = True

    @property
    def draining(self) -> bool:
        return bool(self.events)

    def add_event(self, event: DrainEvent) -> bool:
        """Attach an event if it covers this listener; a later one never weakens an earlier one."""
        if not event.covers(self.direction, self.drain_type):
            return False
        self.events = (*self.events, event)
        self.quiet = False
        return True

    def set_health_check_failed(self, failed: bool) -> None:
        """Envoy: while health-check-failed, every response of a ``default`` listener drains."""
        self.hc_failed = failed and self.drain_type is DrainType.DEFAULT
        self.quiet = not self.events and not self.hc_failed

    def stop_accepting(self, at: float) -> None:
        if self.stop_at is None or at < self.stop_at:
            self.stop_at = at

    def accepting(self, now: float) -> bool:
        return self.stop_at is None or now < self.stop_at

    def response_drains(self, now: float, rng: Rng) -> bool:
        """The per-response decision: any covering event (or health-check fail) may drain it."""
        if self.hc_failed:
            return True
        return any(response_drains(event, now, rng) for event in self.events)
