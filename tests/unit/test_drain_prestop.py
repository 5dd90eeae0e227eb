"""The preStop health-check FSM on a fake clock."""

from __future__ import annotations

import pytest

from lameduck.drain.prestop import (
    Prestop,
    PrestopAction,
    PrestopState,
    PrestopStrategy,
)

S, D, C, X = (PrestopState.SERVING, PrestopState.DRAINING, PrestopState.CLOSING,
              PrestopState.CLOSED)
DRAIN, FAIL = PrestopAction.DRAIN_LISTENERS, PrestopAction.FAIL_HEALTH


def path(p: Prestop) -> list[tuple[PrestopState, PrestopState]]:
    return [(t.source, t.target) for t in p.transitions]


def test_hold_health_keeps_health_while_requests_are_in_flight() -> None:
    p = Prestop(PrestopStrategy.HOLD_HEALTH, drain_timeout=30.0, lb_buffer=6.0)
    assert p.start(100.0) == [DRAIN]
    assert p.state is D and p.next_deadline() == 130.0
    assert p.tick(110.0, 1) == []  # a long request: health stays 200, the LB keeps us
    assert p.state is D
    assert p.tick(115.0, 0) == [FAIL]  # the last one finished: now the LB may take us out
    assert p.state is C and p.next_deadline() == 121.0
    assert p.tick(120.9, 0) == []
    assert p.tick(121.0, 0) == []
    assert p.state is X and p.done and not p.timed_out
    assert path(p) == [(S, D), (D, C), (C, X)]
    assert p.transitions[1].reason == "no request in flight"


def test_hold_health_drain_timeout_moves_on_with_requests_in_flight() -> None:
    p = Prestop(PrestopStrategy.HOLD_HEALTH, drain_timeout=10.0, lb_buffer=2.0)
    p.start(0.0)
    assert p.tick(9.99, 3) == []
    assert p.tick(10.0, 3) == [FAIL]
    assert p.timed_out and p.in_flight_at_timeout == 3
    assert p.transitions[-1].reason == "drain_timeout with 3 in flight"
    p.tick(12.0, 3)
    assert p.done


def test_deregister_first_fails_health_then_drains() -> None:
    p = Prestop(PrestopStrategy.DEREGISTER_FIRST, drain_timeout=20.0, lb_buffer=5.0)
    assert p.start(0.0) == [FAIL]
    assert p.state is C and p.next_deadline() == 5.0
    assert p.tick(4.0, 2) == []
    assert p.tick(5.0, 2) == [DRAIN]  # propagated: drain what is left
    assert p.state is D and p.next_deadline() == 25.0
    assert p.tick(7.0, 0) == []
    assert p.done and path(p) == [(S, C), (C, D), (D, X)]


def test_deregister_first_idle_closes_as_soon_as_it_drains() -> None:
    p = Prestop(PrestopStrategy.DEREGISTER_FIRST, drain_timeout=20.0, lb_buffer=5.0)
    p.start(0.0)
    assert p.tick(5.0, 0) == [DRAIN]
    assert p.done and not p.timed_out


def test_deregister_first_timeout() -> None:
    p = Prestop(PrestopStrategy.DEREGISTER_FIRST, drain_timeout=1.0, lb_buffer=1.0)
    p.start(0.0)
    p.tick(1.0, 4)
    assert p.state is D
    p.tick(2.0, 4)
    assert p.done and p.timed_out and p.in_flight_at_timeout == 4


def test_start_is_once_and_values_are_checked() -> None:
    p = Prestop(PrestopStrategy.HOLD_HEALTH, drain_timeout=1.0, lb_buffer=1.0)
    assert p.start(0.0) == [DRAIN]
    assert p.start(0.5) == []
    assert p.started == 0.0
    with pytest.raises(ValueError):
        Prestop(PrestopStrategy.HOLD_HEALTH, drain_timeout=-1.0, lb_buffer=1.0)
