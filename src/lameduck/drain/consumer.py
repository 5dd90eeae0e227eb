"""The drain of a queue consumer, decided without I/O (the caller passes the time): stop
fetching at the signal, start a message of the batch in hand only if it can finish before
the deadline (and before its lease lets another consumer take it), then ack and release.
``lameduck.resume.consumer`` runs it with asyncio and Redis Streams; see its docstring and
docs/consumer-drain.md for the rules."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class Phase(Enum):
    RUNNING = "running"  # fetching and processing
    STOPPING = "stopping"  # no more fetching; finishing the batch in hand before the deadline
    STOPPED = "stopped"  # acked and released: the process may exit


class Event(Enum):
    STOP = "stop"  # SIGTERM, SIGINT or ``ConsumerRunner.stop()``
    FINISH = "finish"  # the runner is done (released), or gave up on an error


# (phase, event) -> next phase. A pair not in the table is a bug in the caller.
TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.RUNNING, Event.STOP): Phase.STOPPING,
    (Phase.STOPPING, Event.STOP): Phase.STOPPING,  # a second signal: the first deadline stands
    (Phase.STOPPED, Event.STOP): Phase.STOPPED,  # a late signal: nothing left to stop
    (Phase.RUNNING, Event.FINISH): Phase.STOPPED,  # ended without a signal (fetch failed)
    (Phase.STOPPING, Event.FINISH): Phase.STOPPED,
}


@dataclass(frozen=True, slots=True)
class ConsumerTimes:
    """The drain's time budget, in seconds.

    ``deadline`` is what the platform gives after SIGTERM (terminationGracePeriodSeconds,
    TimeoutStopSec) less what the rest of the process needs. ``margin`` is kept back at the
    end for ack, release and exit. ``item_budget`` is the longest one message may take: a
    message is not started unless it fits. ``lease`` is how long a fetched message stays this
    consumer's before others may claim it (a Redis group's XAUTOCLAIM min-idle, a visibility
    timeout); ``None`` when nobody claims.
    """

    deadline: float = 25.0
    margin: float = 1.0
    item_budget: float = 0.0
    lease: float | None = None

    def __post_init__(self) -> None:
        if not self.deadline > 0:
            raise ValueError("deadline must be > 0")
        if not 0 <= self.margin < self.deadline:
            raise ValueError("margin must be >= 0 and less than the deadline")
        if self.item_budget < 0:
            raise ValueError("item_budget must be >= 0")
        if self.lease is not None and not self.lease > self.margin + self.item_budget:
            raise ValueError("lease must exceed margin + item_budget, or no message could start")


class ConsumerDrain:
    """The drain of one consumer: RUNNING -> STOPPING -> STOPPED. Times are the caller's
    monotonic seconds; nothing here reads a clock or sleeps."""

    def __init__(self, times: ConsumerTimes | None = None) -> None:
        self.times = times or ConsumerTimes()
        self.phase = Phase.RUNNING
        self.stopped_at: float | None = None  # when the stop signal came

    def _apply(self, event: Event) -> None:
        try:
            self.phase = TRANSITIONS[self.phase, event]
        except KeyError:
            raise RuntimeError(f"consumer drain: {event.value} while {self.phase.value}") from None

    def stop(self, now: float) -> bool:
        """The stop signal. True if this call began the drain (later ones keep its deadline)."""
        first = self.phase is Phase.RUNNING
        self._apply(Event.STOP)
        if first:
            self.stopped_at = now
        return first

    def finish(self) -> None:
        """Acked and released: nothing more will be fetched or processed."""
        self._apply(Event.FINISH)

    @property
    def deadline(self) -> float:
        """The time by which the consumer must have exited; infinite until stopped."""
        return math.inf if self.stopped_at is None else self.stopped_at + self.times.deadline

    def should_fetch(self) -> bool:
        return self.phase is Phase.RUNNING

    def remaining(self, now: float) -> float:
        """Seconds left before the deadline (what ack and release may still use)."""
        return max(0.0, self.deadline - now)

    def work_left(self, now: float) -> float:
        """Seconds a message already started may still run before it is cut."""
        if self.phase is Phase.STOPPED:
            return 0.0
        return max(0.0, self.deadline - self.times.margin - now)

    def may_start(self, now: float, fetched_at: float | None = None) -> bool:
        """Whether the next message of the batch fetched at ``fetched_at`` (taken *before* the
        fetch was sent, so it is never later than the server's delivery) can be processed
        and acked in time: before the deadline, and before its lease lets another take it."""
        if self.phase is Phase.STOPPED:
            return False
        cutoff = self.deadline - self.times.margin
        if self.times.lease is not None and fetched_at is not None:
            cutoff = min(cutoff, fetched_at + self.times.lease - self.times.margin)
        return now + self.times.item_budget <= cutoff
