"""Drain events: the one value captured when a drain starts and pushed to every covered connection.

An event is immutable and validated on construction (like h11's events), so an impossible drain
cannot exist. Time is a float on the caller's monotonic clock; the core never reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class Strategy(StrEnum):
    """Envoy's ``--drain-strategy``."""

    GRADUAL = "gradual"
    IMMEDIATE = "immediate"


class IdleClose(StrEnum):
    """When the drain closes a keep-alive connection that is idle (``drain.idle_close``).

    ``immediate``: at its proactive moment (HTTP/2: GOAWAY) and G later (Envoy's draining).
    ``on_response``: never while it is idle: after its next response, which says so, or at the
    end of the drain (T + G), like HAProxy's ``option idle-close-on-response``. A load balancer
    that reuses idle connections (AWS ALB) then never sends a request into a close.
    """

    IMMEDIATE = "immediate"
    ON_RESPONSE = "on_response"


class Direction(StrEnum):
    """Envoy's ``traffic_direction``; ``/drain_listeners?inboundonly`` filters on it."""

    INBOUND = "inbound"
    OUTBOUND = "outbound"


class DrainType(StrEnum):
    """Envoy's ``drain_type``: ``modify_only`` ignores health-check fail and drain_listeners."""

    DEFAULT = "default"
    MODIFY_ONLY = "modify_only"


class Cause(StrEnum):
    """Why a drain started; decides which listeners it covers."""

    SHUTDOWN = "shutdown"
    DRAIN_LISTENERS = "drain_listeners"
    HOT_RESTART = "hot_restart"
    RELOAD = "reload"


@dataclass(frozen=True, slots=True)
class DrainEvent:
    """One drain sequence: start (monotonic seconds), strategy, T, G, and what it covers."""

    start: float
    strategy: Strategy
    time: float  # T: the drain time (Envoy --drain-time-s)
    grace: float  # G: per-connection grace (Envoy HCM drain_timeout)
    cause: Cause = Cause.SHUTDOWN
    inbound_only: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.time)
                and math.isfinite(self.grace)):
            raise ValueError("drain start, time and grace must be finite numbers")
        if self.time < 0:
            raise ValueError(f"drain time must be >= 0, got {self.time}")
        if self.grace < 0:
            raise ValueError(f"connection grace must be >= 0, got {self.grace}")
        if not isinstance(self.strategy, Strategy):
            raise ValueError(f"unknown drain strategy {self.strategy!r}")

    @property
    def ends_at(self) -> float:
        """When T has passed: listeners stop (unless skip_exit), shutdown takes no new work."""
        return self.start + self.time

    def elapsed(self, now: float) -> float:
        return max(0.0, now - self.start)

    def covers(self, direction: Direction, drain_type: DrainType) -> bool:
        """Whether a listener with these settings takes part in this drain (as in Envoy)."""
        if drain_type is DrainType.MODIFY_ONLY and self.cause is Cause.DRAIN_LISTENERS:
            return False
        return not (self.inbound_only and direction is not Direction.INBOUND)
