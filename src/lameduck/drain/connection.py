"""Per-connection drain state: open -> draining -> closing -> closed.

Rules kept here (docs/drain.md):
- A connection is drained by a response (the policy says so), proactively (its moment in
  [2T/3, T-G) came), or at the end (the deadline).
- Once draining, every later response drains too (HTTP/1: ``Connection: close``).
- A draining connection is closed once G has elapsed and no request is in flight.
- The proactive moment is drawn once per drain event, when the event reaches the connection
  (at the start of the drain, or at accept for later connections); the earliest moment wins.
- A connection also drains, the same way, when it reaches a limit of its own: its maximum
  duration (Envoy's ``max_connection_duration``, a moment kept here like the proactive one) or
  its maximum number of requests (Envoy's ``max_requests_per_connection``, which the shell
  counts and reports with ``drain_by_limit``).
- A connection drained by a response keeps its tunnels (WebSocket, CONNECT) until its
  proactive moment comes as well (as in Envoy): that moment still fires, as ``ConnAction.DRAIN``,
  for the shell to end its tunnels; nothing else changes (it stays drained by the response).
- ``drain.idle_close: on_response`` (the listener's ``idle_close_on_response``; HAProxy's
  ``option idle-close-on-response``): the drain never closes a connection while it is idle
  and its client has not been told. Its proactive moment, if it comes while the connection is
  idle, changes nothing on the wire: its next response drains it (HTTP/1.1 ``Connection:
  close``, HTTP/2 GOAWAY) and it closes after that response. One drained at its moment while
  busy closes once a later response has told its client. The drain's end, T + G of the first
  event (``end_at``), closes whatever is still waiting; the process's shutdown deadline still
  cuts everything.

The shell asks ``next_deadline()`` for the one timer it must keep, and reports time with
``on_timer``; the answer is a ``ConnAction`` for the shell to carry out.
"""

from __future__ import annotations

import math
from enum import Enum

from lameduck.drain.event import DrainEvent
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.policy import Rng, proactive_moment


class ConnState(Enum):
    OPEN = "open"
    DRAINING = "draining"
    CLOSING = "closing"
    CLOSED = "closed"


class Input(Enum):
    DRAIN = "drain"  # by a response, proactively, or at the end
    CLOSE = "close"  # the shell starts the staged close
    CLOSED = "closed"  # the socket is gone


class DrainedBy(Enum):
    RESPONSE = "response"
    PROACTIVE = "proactive"
    END = "end"
    MAX_DURATION = "max_duration"  # max_connection_duration reached
    MAX_REQUESTS = "max_requests"  # max_requests_per_connection reached


class ConnAction(Enum):
    NONE = "none"
    DRAIN = "drain"  # the proactive moment: H2 sends GOAWAY (if not yet), tunnels end
    CLOSE = "close"  # close now (staged)


# state x input -> next state. Anything missing is a no-op for a connection already past it.
TRANSITIONS: dict[tuple[ConnState, Input], ConnState] = {
    (ConnState.OPEN, Input.DRAIN): ConnState.DRAINING,
    (ConnState.OPEN, Input.CLOSE): ConnState.CLOSING,
    (ConnState.OPEN, Input.CLOSED): ConnState.CLOSED,
    (ConnState.DRAINING, Input.CLOSE): ConnState.CLOSING,
    (ConnState.DRAINING, Input.CLOSED): ConnState.CLOSED,
    (ConnState.CLOSING, Input.CLOSED): ConnState.CLOSED,
}


class ConnectionDrain:
    """The drain side of one downstream connection; the shell owns the socket."""

    __slots__ = ("accepted_at", "drained_at", "drained_by", "end_at", "ended", "grace_elapsed",
                 "listener", "max_at", "proactive_at", "proactive_fired", "state", "told")

    def __init__(self, listener: ListenerDrain, accepted_at: float, rng: Rng,
                 max_duration: float = math.inf) -> None:
        self.listener = listener
        self.accepted_at = accepted_at
        self.max_at = accepted_at + max_duration  # math.inf: no max_connection_duration
        self.state = ConnState.OPEN
        self.proactive_at: float | None = None
        self.drained_at: float | None = None
        self.drained_by: DrainedBy | None = None
        self.grace_elapsed = False
        self.proactive_fired = False
        # on_response: a response went out since the connection drained (its client knows),
        # and the drain's end (T + G of the first event), when what still waits is closed.
        self.told = False
        self.end_at = math.inf
        self.ended = False  # the drain's end has come: nothing waits for a response any more
        for event in listener.events:  # replay events that started before this accept
            self.on_drain_event(event, rng)

    def _go(self, inp: Input) -> bool:
        nxt = TRANSITIONS.get((self.state, inp))
        if nxt is None:
            return False
        self.state = nxt
        return True

    def on_drain_event(self, event: DrainEvent, rng: Rng) -> None:
        """Draw this connection's proactive moment for a new event (the earliest one wins).

        Health-check fail alone has no T, so it never draws a moment; but a drain event that
        runs while health-check-failed (a prestop that fails the check, then SIGTERM) has its
        T, and its moments spread the closes as always instead of leaving them all for T.
        """
        if self.state is not ConnState.OPEN:
            return
        moment = proactive_moment(event, self.accepted_at, rng)
        if moment is not None and (self.proactive_at is None or moment < self.proactive_at):
            self.proactive_at = moment
        end = event.ends_at + event.grace
        if end < self.end_at:
            self.end_at = end

    def _drain(self, now: float, by: DrainedBy) -> None:
        if self._go(Input.DRAIN):
            self.drained_at = now
            self.drained_by = by

    def on_response(self, now: float, rng: Rng) -> bool:
        """Called as a response starts; True means this response drains the connection.

        An open connection whose proactive moment passed while it was idle (on_response) is
        drained by this response, whatever the ramp says."""
        if self.state is ConnState.OPEN:
            if not self.proactive_fired and not self.listener.response_drains(now, rng):
                return False
            self._drain(now, DrainedBy.RESPONSE)
        self.told = True
        return True

    def drain_by_limit(self, now: float, by: DrainedBy) -> bool:
        """A limit of the connection's own was reached (``MAX_REQUESTS``): it drains as if by
        a response. True if this call drained it."""
        if self.state is ConnState.OPEN:
            self._drain(now, by)
            return True
        return False

    def next_deadline(self) -> float | None:
        """The one moment the shell must call ``on_timer`` at, or None."""
        if self.state is ConnState.OPEN:
            p = self.proactive_at
            if self.proactive_fired:  # on_response: its moment passed while idle
                p = self.end_at if self.end_at != math.inf else None
            if self.max_at != math.inf and (p is None or self.max_at < p):
                return self.max_at
            return p
        if self.state is not ConnState.DRAINING:
            return None
        at: float | None = None
        if not self.grace_elapsed:
            assert self.drained_at is not None
            at = self.drained_at + self.listener.grace
        elif self.waits_for_response():
            at = self.end_at
        p = self.proactive_at
        if p is not None and not self.proactive_fired and (at is None or p < at):
            at = p  # drained by a response: the moment still ends its tunnels
        return at

    def on_timer(self, now: float, idle: bool) -> ConnAction:
        """Advance time; ``idle`` means no request is in flight on the connection."""
        if now >= self.end_at:
            self.ended = True  # (busy then: closed once idle, with no timer left to wait on)
        if self.state is ConnState.OPEN:
            if self.proactive_fired:  # on_response: its moment passed while idle
                if now >= self.end_at:
                    return self._end(now, idle)
            elif self.proactive_at is not None and now >= self.proactive_at:
                self.proactive_fired = True
                if idle and self.listener.idle_close_on_response:
                    return ConnAction.NONE  # nothing on the wire: its next response drains it
                self._drain(now, DrainedBy.PROACTIVE)
                return self._close_if_graced(now, idle) or ConnAction.DRAIN
            if now < self.max_at:
                return ConnAction.NONE
            # its max duration: drained, its tunnels keep their proactive moment (if any)
            self._drain(now, DrainedBy.MAX_DURATION)
            return self._close_if_graced(now, idle) or ConnAction.NONE
        moment = False
        if (self.state is ConnState.DRAINING and self.proactive_at is not None
                and not self.proactive_fired and now >= self.proactive_at):
            self.proactive_fired = True
            moment = True
        return self._close_if_graced(now, idle) or (ConnAction.DRAIN if moment
                                                     else ConnAction.NONE)

    def _close_if_graced(self, now: float, idle: bool) -> ConnAction | None:
        if self.state is not ConnState.DRAINING:
            return None
        assert self.drained_at is not None
        if now >= self.drained_at + self.listener.grace:
            self.grace_elapsed = True
            if idle and (now >= self.end_at or not self.waits_for_response()):
                self._go(Input.CLOSE)
                return ConnAction.CLOSE
        return None

    def _end(self, now: float, idle: bool) -> ConnAction:
        """on_response: the drain's end (T + G) came for a connection still waiting for a
        response: drained now (``END``), closed now if idle, else once idle."""
        self._drain(now, DrainedBy.END)
        self.grace_elapsed = True
        if idle:
            self._go(Input.CLOSE)
            return ConnAction.CLOSE
        return ConnAction.NONE

    def waits_for_response(self) -> bool:
        """on_response: a connection the drain's own moment drained stays open, idle, until a
        response has told its client (an HTTP/1.1 client learns it only from a response's
        ``Connection: close``) or the drain's end. Drained by a response or a limit of its
        own, it was told by that response."""
        return (self.listener.idle_close_on_response and not self.told and not self.ended
                and self.drained_by is DrainedBy.PROACTIVE)

    def holds_open(self, now: float) -> bool:
        """on_response, before the drain's end: the drain must not close this connection while
        it is idle (T passing included), since its client has not been told yet."""
        if not self.listener.idle_close_on_response or now >= self.end_at:
            return False
        return self.state is ConnState.OPEN or (self.state is ConnState.DRAINING
                                                and self.waits_for_response())

    def on_idle(self, now: float) -> ConnAction:
        """The last in-flight request ended: a draining connection past its grace closes now
        (on_response: once told, or at the drain's end)."""
        if (self.state is ConnState.DRAINING and self.grace_elapsed
                and (now >= self.end_at or not self.waits_for_response())):
            self._go(Input.CLOSE)
            return ConnAction.CLOSE
        return ConnAction.NONE

    def drain_at_end(self, now: float) -> bool:
        """The deadline came: drain whatever is left. True if this call drained it."""
        if self.state is ConnState.OPEN:
            self._drain(now, DrainedBy.END)
            return True
        return False

    def close(self) -> None:
        self._go(Input.CLOSE)

    def closed(self) -> None:
        self._go(Input.CLOSED)
