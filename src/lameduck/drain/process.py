"""The process drain: server state, the listeners' drain tree, and the shutdown sequence.

Rules kept here (docs/drain.md; Envoy's admin drain and server state):
- ``state`` is Envoy's ``server_info`` state: LIVE, or DRAINING once health-check-failed or
  shutting down. ``/ready`` and every health-check path answer 503 unless LIVE.
- Health-check fail makes every response of a ``default`` listener drain; it has no T, so
  nothing is drained proactively.
- ``drain_listeners``: graceful keeps accepting until T then stops unless skip_exit; not graceful
  stops accepting at once; both drain existing connections; inboundonly filters by direction.
- Shutdown (SIGTERM): not ready at once; one event over every listener; accept until T
  (``at_drain_end``) or stop at once (``immediately``); from T on no new work; exit when no
  request is in flight and either no connection is left (after min_drain) or T has passed, and
  never later than the deadline, where what is left is cut. A connection that has sent
  nothing yet holds the exit until G after its accept (``arriving_until``): its request may be
  on the way. With ``idle_close: on_response``
  open connections are waited for until T + G (the drain's end: an idle one is closed only
  after a response that tells its client, or then).
- min_drain unset means "serve until T" while listeners accept until T: an idle moment early
  in the drain says nothing about clients that have not yet seen the endpoint removal, and an
  exit then closes the port under them (ECONNREFUSED). It means 0 where nobody can still be
  on the way: listeners that stop at once, a hot restart (the successor accepts), or a
  completed preStop, which already waited for the load balancer.
- ``shutdown.leave: confirm`` (SIGTERM with no preStop run before it): while min_drain (the
  bound) has not passed, the health-check path's evidence (``drain/probers.py``) is read
  every ``LEAVE_POLL``; once it shows the load balancer let go, an idle process may exit at
  once (min_drain 0). The bound passing first ends the watch; min_drain then decides as with
  ``timer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from lameduck.drain.event import Cause, DrainEvent, IdleClose, Strategy
from lameduck.drain.ledger import Ledger
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.prestop import Leave
from lameduck.drain.probers import Evidence

# shutdown.leave: confirm: how often the evidence is read again while nothing says when it
# changes (new probes and traffic arrive at any time).
LEAVE_POLL = 0.1


class ServerState(IntEnum):
    """Envoy's ``server.state`` values, in Envoy's numbering."""

    LIVE = 0
    DRAINING = 1
    PRE_INITIALIZING = 2
    INITIALIZING = 3


@dataclass(frozen=True, slots=True)
class DrainSettings:
    time: float = 20.0
    strategy: Strategy = Strategy.GRADUAL
    grace: float = 5.0
    idle_close: IdleClose = IdleClose.IMMEDIATE


@dataclass(frozen=True, slots=True)
class ShutdownSettings:
    deadline: float = 25.0
    min_drain: float | None = None  # None: T while accepting until T, else 0 (see above)
    stop_accepting_at_drain_end: bool = True
    leave: Leave = Leave.TIMER  # confirm: watch for the load balancer to let go (see above)

    def __post_init__(self) -> None:
        if self.deadline < 0 or (self.min_drain is not None and self.min_drain < 0):
            raise ValueError("shutdown deadline and min_drain must be >= 0")


class Step(Enum):
    """What the shell does next during a shutdown."""

    WAIT = "wait"  # nothing yet: call again at ``next_deadline``
    EXIT = "exit"  # close what is idle and exit: nothing is lost
    CUT = "cut"  # the deadline: cut what is in flight, then exit


class LeaveStep(Enum):
    """What the shell does with ``shutdown.leave: confirm`` after reading the evidence."""

    IDLE = "idle"  # no watch (none started, or it ended): nothing to do
    WAIT = "wait"  # keep watching: read the evidence again at ``leave_next``
    CONFIRMED = "confirmed"  # the load balancer let go: stop watching, an idle process exits
    BOUND = "bound"  # min_drain passed first: stop watching, min_drain decides


def min_drain_for(explicit: float | None, drain_time: float, *, accepting_until_t: bool,
              deregistered: bool, hot_restart: bool = False) -> float:
    """How long an idle process keeps serving after its shutdown starts: ``shutdown.min_drain``
    when set; else T while it accepts until T (a client that has not yet seen it leave must
    not find a closed port), 0 once a preStop hook ran to its end (the load balancer stopped
    sending here) or for a hot restart (the new process serves), or when it stops accepting
    at once."""
    if explicit is not None:
        return explicit
    if deregistered or hot_restart or not accepting_until_t:
        return 0.0
    return drain_time


class ProcessDrain:
    """Pure drain control for one process. Times are the caller's monotonic seconds."""

    def __init__(
        self,
        drain: DrainSettings | None = None,
        shutdown: ShutdownSettings | None = None,
    ) -> None:
        self.settings = drain or DrainSettings()
        self.shutdown_settings = shutdown or ShutdownSettings()
        self.listeners: dict[str, ListenerDrain] = {}
        self.ledger = Ledger()
        self.initializing = True
        self.hc_failed = False
        self.shutdown: DrainEvent | None = None
        # Seconds from the start of the shutdown to the hard exit (a hot restart sets its own).
        self.exit_after = self.shutdown_settings.deadline
        self.last_event: DrainEvent | None = None
        # A preStop hook ran to its end: the load balancer has already stopped sending here.
        self.deregistered = False
        # shutdown.leave: confirm: watching the health-check path now; its bound (seconds
        # from the shutdown's start, None: no watch ran); when the balancer was seen to let
        # go (seconds from the start, None: not seen)
        self.leave_watching = False
        self.leave_bound: float | None = None
        self.confirmed_after: float | None = None
        # A graceful drain_listeners without skip_exit: it becomes the shutdown at its T, so
        # its drain is over only at the exit.
        self.drain_exits = False

    # -- the tree ---------------------------------------------------------------------------
    def add_listener(self, listener: ListenerDrain) -> ListenerDrain:
        listener.grace = self.settings.grace
        listener.idle_close_on_response = self.settings.idle_close is IdleClose.ON_RESPONSE
        listener.set_health_check_failed(self.hc_failed)
        self.listeners[listener.name] = listener
        return listener

    def _event(self, now: float, cause: Cause, inbound_only: bool = False) -> DrainEvent:
        """A new drain event, of any cause: from now until the drain is over (``tick``) the
        ledger counts the requests that complete for the drain report's ``completed``."""
        s = self.settings
        event = DrainEvent(now, s.strategy, s.time, s.grace, cause, inbound_only)
        self.last_event = event
        self.ledger.draining = True
        return event

    # -- state ------------------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        if self.hc_failed or self.shutdown is not None:
            return ServerState.DRAINING
        if self.initializing:
            return ServerState.INITIALIZING
        return ServerState.LIVE

    @property
    def live(self) -> bool:
        return self.state is ServerState.LIVE

    def initialized(self) -> None:
        self.initializing = False

    def healthcheck_fail(self) -> None:
        self.hc_failed = True
        for listener in self.listeners.values():
            listener.set_health_check_failed(True)

    def healthcheck_ok(self) -> None:
        self.hc_failed = False
        for listener in self.listeners.values():
            listener.set_health_check_failed(False)

    # -- drains -----------------------------------------------------------------------------
    def drain_listeners(
        self, now: float, graceful: bool, skip_exit: bool, inbound_only: bool
    ) -> tuple[DrainEvent, list[ListenerDrain]]:
        """Admin ``/drain_listeners``; returns the event and the listeners it reached."""
        event = self._event(now, Cause.DRAIN_LISTENERS, inbound_only)
        reached = [ls for ls in self.listeners.values() if ls.add_event(event)]
        for listener in reached:
            if not graceful:
                listener.stop_accepting(now)
            elif not skip_exit:
                listener.stop_accepting(event.ends_at)
        if graceful and not skip_exit:
            self.drain_exits = True
        return event, reached

    def start_shutdown(
        self, now: float, cause: Cause = Cause.SHUTDOWN, deadline: float | None = None,
    ) -> tuple[DrainEvent, list[ListenerDrain]]:
        """SIGTERM: not ready at once, one event over every listener. Idempotent.

        A hot restart (``Cause.HOT_RESTART``) is the same drain with the parent's own deadline
        (``parent_shutdown_time``); its listeners stop accepting at once, since the new process
        accepts on the same sockets."""
        if self.shutdown is not None:
            return self.shutdown, []
        event = self._event(now, cause)
        self.shutdown = event
        if deadline is not None:
            self.exit_after = deadline
        stop = (event.ends_at if self.shutdown_settings.stop_accepting_at_drain_end
                and cause is not Cause.HOT_RESTART else now)
        reached = [ls for ls in self.listeners.values() if ls.add_event(event)]
        for listener in self.listeners.values():
            listener.stop_accepting(stop)
        if (self.shutdown_settings.leave is Leave.CONFIRM and cause is Cause.SHUTDOWN
                and not self.deregistered):
            self.leave_watching = True
            self.leave_bound = self.min_drain
        self.tick(now)
        return event, reached

    def prestop_done(self) -> None:
        """The preStop sequence completed (it waited out the load balancer's removal): a
        shutdown's own watch has nothing left to prove."""
        self.deregistered = True
        self.leave_watching = False

    def leave_step(self, now: float, lb: Evidence) -> LeaveStep:
        """``shutdown.leave: confirm``: the evidence ``lb`` read at ``now`` (see the module).
        The shell reads it first at the shutdown's start, then at ``leave_next``."""
        ev = self.shutdown
        if not self.leave_watching or ev is None or self.leave_bound is None:
            return LeaveStep.IDLE
        if lb.confirmed:
            self.leave_watching = False
            self.confirmed_after = now - ev.start
            return LeaveStep.CONFIRMED
        if now >= ev.start + self.leave_bound:
            self.leave_watching = False
            return LeaveStep.BOUND
        return LeaveStep.WAIT

    def leave_next(self, now: float) -> float:
        """When to read the evidence again while ``leave_step`` says WAIT: soon, never past
        the bound."""
        ev = self.shutdown
        assert ev is not None and self.leave_bound is not None
        return min(ev.start + self.leave_bound, now + LEAVE_POLL)

    @property
    def min_drain(self) -> float:
        """Seconds from the shutdown's start before an idle process may exit."""
        ev = self.shutdown
        settings = self.shutdown_settings
        if ev is None:
            return settings.min_drain or 0.0
        if self.confirmed_after is not None:
            return 0.0
        return min_drain_for(settings.min_drain, ev.time,
                             accepting_until_t=settings.stop_accepting_at_drain_end,
                             deregistered=self.deregistered,
                             hot_restart=ev.cause is Cause.HOT_RESTART)

    @property
    def deadline(self) -> float | None:
        return None if self.shutdown is None else self.shutdown.start + self.exit_after

    @property
    def connections_end(self) -> float:
        """From when the shutdown closes connections left open: T, or T + G with
        ``idle_close: on_response`` (an idle one the drain has not told yet waits until then)."""
        ev = self.shutdown
        assert ev is not None
        if self.settings.idle_close is IdleClose.ON_RESPONSE:
            return ev.ends_at + ev.grace
        return ev.ends_at

    def drain_active(self, now: float) -> bool:
        """A drain is under way: its time T has not passed, or requests it let in are still
        in flight (``server.drain.active``)."""
        ev = self.last_event
        return ev is not None and (now < ev.ends_at or not self.ledger.idle)

    def tick(self, now: float) -> None:
        """Apply time: from T on a shutting-down process takes no new work; a drain that does
        not exit is over once it is no longer active (``drain_active``), and a request that
        completes after that is no drain's (a shutdown counts until the exit)."""
        if self.shutdown is not None:
            if now >= self.shutdown.ends_at:
                self.ledger.accepting = False
        elif self.ledger.draining and not self.drain_exits and not self.drain_active(now):
            self.ledger.draining = False

    def arriving_until(self, silent_since: float) -> float:
        """Until when the exit waits for connections that have sent nothing yet, the latest
        accepted at ``silent_since`` (0: none): G after that accept, never past the deadline
        (0: none waited for).

        Such a client connected to send a request, which may be on its way: closed before it
        comes, the client reads a close it cannot tell from a failure, on a connection it
        never used (RFC 9112 §9.3.1 lets it retry only what it may retry). HAProxy's soft-stop
        never closes a front connection before its first request; G bounds the wait here, so
        that a TCP health check, a port scan or an unused pre-connection holds an exit no
        later than G after its accept (T + G at the latest while listeners accept until T).
        The deadline waits for none of them: nothing was read from them, so closing them
        cuts no request."""
        ev = self.shutdown
        if ev is None or not silent_since:
            return 0.0
        return min(silent_since + ev.grace, ev.start + self.exit_after)

    def shutdown_step(self, now: float, connections: int, unread: int = 0,
                      silent_since: float = 0.0) -> Step:
        """The exit decision; ``connections`` is the number of downstream connections open,
        ``unread`` those of them with a request on the way not read yet: still in their TLS
        handshake, or with a request head partly read. A client mid-handshake has requests
        on the way (a TLS 1.3 client sends them right behind its Finished, RFC 8446 §2) that
        nothing can turn away before the handshake ends — no response, no GOAWAY — and a
        head partly read is a request its client sent; so each is waited for like a request
        in flight, also after T (its connection is then told no new work as soon as it
        speaks), and the deadline cuts it.

        ``silent_since``: the latest accept of a connection that has sent nothing yet (0:
        none); the exit waits for it until ``arriving_until``."""
        ev = self.shutdown
        if ev is None:
            return Step.WAIT
        self.tick(now)
        busy = not self.ledger.idle or unread > 0
        if now >= ev.start + self.exit_after:
            return Step.CUT if busy else Step.EXIT
        if now < ev.start + self.min_drain:
            return Step.WAIT
        # Completion counts requests, not connections: no EXIT while any is active.
        if not busy and self.arriving_until(silent_since) <= now and (
                connections == 0 or now >= self.connections_end):
            return Step.EXIT
        return Step.WAIT

    def next_deadline(self, now: float, silent_since: float = 0.0) -> float | None:
        """When ``shutdown_step`` may next change its answer without other input."""
        ev = self.shutdown
        if ev is None:
            return None
        marks = (ev.start + self.min_drain, ev.ends_at, self.connections_end,
                 ev.start + self.exit_after, self.arriving_until(silent_since))
        future = [m for m in marks if m > now]
        return min(future) if future else None
