"""The preStop health-check FSM of a preStop hook, sans-IO.

SERVING -> DRAINING -> CLOSING -> CLOSED, in one of two orders:

hold-health (the usual Envoy drain.sh): drain first, keep the health check answering 200 while
requests are in flight, so the external load balancer keeps the backend and they finish:

    SERVING  --start-->                      DRAINING  (drain_listeners?graceful&skip_exit)
    DRAINING --in flight == 0-->             CLOSING   (health check fails: the LB takes it out)
    DRAINING --drain_timeout-->              CLOSING   (timed out: what is left may be cut)
    CLOSING  --lb_buffer elapsed-->          CLOSED    (the LB saw it: interval x fall + margin)

deregister-first (Kubernetes Endpoints): leave the rotation first, then drain:

    SERVING  --start-->                      CLOSING   (readiness and health check fail)
    CLOSING  --lb_buffer elapsed-->          DRAINING  (propagated: drain_listeners)
    DRAINING --in flight == 0-->             CLOSED
    DRAINING --drain_timeout-->              CLOSED    (timed out)

The leave rule (``leave``) decides when CLOSING ends. ``timer`` (drain.sh's ``LB_BUFFER``, a
Kubernetes preStop ``sleep``): at ``lb_buffer``. ``confirm``: as soon as the evidence on the
health-check path shows the load balancer has let go (``drain/probers.py``: every prober has seen
``fall`` failing answers and nothing new arrives), with ``lb_buffer`` as the bound:

    CLOSING  --lb confirmed (confirm)-->     CLOSED / DRAINING   (the reason names the probers)
    CLOSING  --lb_buffer elapsed-->          CLOSED / DRAINING   (the reason names what was awaited)

"In flight" is the drain.sh completion test: downstream_rq_active + upstream_rq_active (requests,
not connections: a keep-alive connection may stay open after its last response). The shell
carries out the actions, calls ``tick`` when the count may have changed and at
``next_deadline()``; the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum, StrEnum

from lameduck.drain.probers import Evidence


class PrestopState(IntEnum):
    SERVING = 0
    DRAINING = 1
    CLOSING = 2
    CLOSED = 3


class PrestopStrategy(StrEnum):
    HOLD_HEALTH = "hold-health"
    DEREGISTER_FIRST = "deregister-first"


class Leave(StrEnum):
    """When a preStop's CLOSING (and SIGTERM's not-ready phase, ``shutdown.leave``) ends:
    after a fixed time (``timer``: ``lb_buffer``), or once the health-check path shows the load
    balancer has let go (``confirm``, with the fixed time as the bound)."""

    TIMER = "timer"
    CONFIRM = "confirm"


class PrestopAction(Enum):
    DRAIN_LISTENERS = "drain_listeners"  # POST /drain_listeners?graceful&skip_exit
    FAIL_HEALTH = "fail_health"  # POST /healthcheck/fail


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    source: PrestopState
    target: PrestopState
    reason: str


@dataclass(slots=True)
class Prestop:
    strategy: PrestopStrategy
    drain_timeout: float  # the longest DRAINING may last with requests in flight
    lb_buffer: float  # how long the LB needs to notice a failed health check, plus a margin
    leave: Leave = Leave.TIMER
    state: PrestopState = PrestopState.SERVING
    started: float | None = None
    timed_out: bool = False  # DRAINING ended by drain_timeout, requests still in flight
    in_flight_at_timeout: int = 0
    closing_since: float | None = None  # CLOSING began (the health check fails from here)
    confirmed_after: float | None = None  # confirm: seconds CLOSING took when the LB was seen
    # confirm, while CLOSING: what the rule still waits for (empty in every other state: the
    # bound's transition names what was still awaited when it won)
    awaited: tuple[str, ...] = ()
    transitions: list[Transition] = field(default_factory=list)
    _until: float | None = None  # the current state's deadline

    def __post_init__(self) -> None:
        if self.drain_timeout < 0 or self.lb_buffer < 0:
            raise ValueError("drain_timeout and lb_buffer must be >= 0")

    @property
    def done(self) -> bool:
        return self.state is PrestopState.CLOSED

    def _go(self, now: float, target: PrestopState, reason: str) -> None:
        self.transitions.append(Transition(now, self.state, target, reason))
        self.state = target

    def start(self, now: float) -> list[PrestopAction]:
        """Begin (once; a second call changes nothing)."""
        if self.state is not PrestopState.SERVING:
            return []
        self.started = now
        if self.strategy is PrestopStrategy.HOLD_HEALTH:
            self._go(now, PrestopState.DRAINING, "prestop: drain first, health check held")
            self._until = now + self.drain_timeout
            return [PrestopAction.DRAIN_LISTENERS]
        self._go(now, PrestopState.CLOSING, "prestop: deregister first (health check fails)")
        self._until = now + self.lb_buffer
        self.closing_since = now
        return [PrestopAction.FAIL_HEALTH]

    def tick(self, now: float, in_flight: int,
             lb: Evidence | None = None) -> list[PrestopAction]:
        """Time passed, the count of requests in flight changed or (``confirm``) the evidence
        ``lb`` on the health-check path changed."""
        hold = self.strategy is PrestopStrategy.HOLD_HEALTH
        until = self._until
        if self.state is PrestopState.DRAINING:
            if in_flight <= 0:
                reason = "no request in flight"
            elif until is not None and now >= until:
                self.timed_out = True
                self.in_flight_at_timeout = in_flight
                reason = f"drain_timeout with {in_flight} in flight"
            else:
                return []
            if hold:
                self._go(now, PrestopState.CLOSING, reason)
                self._until = now + self.lb_buffer
                self.closing_since = now
                return [PrestopAction.FAIL_HEALTH]
            self._go(now, PrestopState.CLOSED, reason)
            self._until = None
            return []
        if self.state is PrestopState.CLOSING and until is not None:
            confirm = self.leave is Leave.CONFIRM
            if confirm and lb is not None and lb.confirmed and now < until:
                since = self.closing_since if self.closing_since is not None else now
                self.confirmed_after = now - since
                why = f"lb converged (confirm): {lb.detail}"
            elif now >= until:
                if confirm:
                    left = lb.detail if lb is not None else "no evidence"
                    why = f"lb_buffer elapsed before the LB was seen to stop: {left}"
                elif hold:
                    why = "lb_buffer elapsed: the LB has taken it out"
                else:
                    why = "lb_buffer elapsed: deregistered, now drain"
            else:
                if confirm and lb is not None:
                    self.awaited = lb.awaited
                return []
            self.awaited = ()  # CLOSING ends: nothing is awaited any more
            if hold:
                self._go(now, PrestopState.CLOSED, why)
                self._until = None
                return []
            self._go(now, PrestopState.DRAINING, why)
            self._until = now + self.drain_timeout
            out = [PrestopAction.DRAIN_LISTENERS]
            return out + self.tick(now, in_flight)
        return []

    def next_deadline(self) -> float | None:
        return self._until
