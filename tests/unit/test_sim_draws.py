"""The simulator's vectorised draws give what the drain core's scalar functions give, draw for
draw: the same uniform number in, the same moment, decision or delay out."""

from __future__ import annotations

import numpy as np
import pytest

from lameduck.drain.backoff import Backoff
from lameduck.drain.event import DrainEvent, Strategy
from lameduck.drain.policy import proactive_moment, response_drains
from lameduck.sim.draws import (
    backoff_delays,
    lognormal,
    lognormal_mean,
    proactive_moments,
    responses_drain,
)

EVENTS = [
    DrainEvent(100.0, Strategy.GRADUAL, 20.0, 5.0),
    DrainEvent(3.5, Strategy.GRADUAL, 0.9, 0.3),  # G == T/3: no window
    DrainEvent(0.0, Strategy.IMMEDIATE, 6.0, 1.0),
    DrainEvent(7.0, Strategy.GRADUAL, 0.0, 0.0),  # T = 0
    DrainEvent(1e6 + 0.1, Strategy.GRADUAL, 2.0, 0.2),
]


@pytest.mark.parametrize("event", EVENTS)
def test_proactive_moments_equal_the_core(event: DrainEvent) -> None:
    rng = np.random.default_rng(1)
    accepted = event.start + rng.uniform(-5.0, event.time, 2000)
    u = rng.random(2000)
    u[:3] = [0.0, 1.0 - 2**-53, 0.5]
    got = proactive_moments(event, accepted, u)
    for a, x, g in zip(accepted, u, got, strict=True):
        want = proactive_moment(event, float(a), lambda x=x: float(x))
        assert (g == np.inf) if want is None else g == want


@pytest.mark.parametrize("event", EVENTS)
def test_responses_drain_equal_the_core(event: DrainEvent) -> None:
    rng = np.random.default_rng(2)
    now = event.start + rng.uniform(-1.0, event.time + 1.0, 2000)
    now[:2] = [event.start, event.start + event.time / 2.0]
    u = rng.random(2000)
    got = responses_drain(event, now, u)
    for t, x, g in zip(now, u, got, strict=True):
        assert g == response_drains(event, float(t), lambda x=x: float(x))


def test_backoff_delays_equal_the_core() -> None:
    rng = np.random.default_rng(3)
    for backoff in (Backoff(), Backoff(first=0.5, base=0.1, cap=4.0)):
        attempts = rng.integers(0, 80, 1000)
        u = rng.random(1000)
        got = backoff_delays(backoff, attempts, u)
        for k, x, g in zip(attempts, u, got, strict=True):
            assert g == backoff.delay(int(k), lambda x=x: float(x))


def test_lognormal_has_its_median_p99_and_mean() -> None:
    rng = np.random.default_rng(4)
    d = lognormal(rng, 0.02, 0.5, 400_000)
    assert np.median(d) == pytest.approx(0.02, rel=0.02)
    assert np.quantile(d, 0.99) == pytest.approx(0.5, rel=0.05)
    assert d.mean() == pytest.approx(lognormal_mean(0.02, 0.5), rel=0.05)
    assert (lognormal(rng, 0.1, 0.1, 5) == 0.1).all()
