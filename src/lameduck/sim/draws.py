"""The drain core's per-connection draws over arrays of connections at once.

Each function here is the vectorised form of one scalar function of ``lameduck.drain``: given the
same uniform numbers it returns what the scalar one returns, connection for connection
(tests/unit/test_sim_draws.py checks it element by element). The bounds come from the core
itself (``proactive_window``), so a change there reaches the simulator. Vectorising is what lets
one process replay a drain of thousands of connections per instance in milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from lameduck.drain.backoff import Backoff
from lameduck.drain.event import DrainEvent, Strategy
from lameduck.drain.policy import proactive_window

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def proactive_moments(event: DrainEvent, accepted_at: Floats, u: Floats) -> Floats:
    """``policy.proactive_moment`` for each connection; +inf where it returns None."""
    out = np.full(accepted_at.shape, np.inf)
    window = proactive_window(event)
    if window is None:
        return out
    lo, hi = window
    take = accepted_at <= lo
    top = math.nextafter(hi, lo)
    out[take] = np.minimum(lo + u[take] * (hi - lo), top)
    return out


def responses_drain(event: DrainEvent, now: Floats, u: Floats) -> Bools:
    """``policy.response_drains`` for responses starting at ``now`` with the draws ``u``."""
    if event.strategy is Strategy.IMMEDIATE:
        return np.ones(now.shape, dtype=bool)
    half = event.time / 2.0
    elapsed = now - event.start
    if half <= 0.0:
        return elapsed >= half
    return (elapsed >= half) | ((elapsed > 0.0) & (u < elapsed / half))


def backoff_delays(backoff: Backoff, attempt: Ints, u: Floats) -> Floats:
    """``Backoff.delay`` for each attempt number."""
    k = np.minimum(attempt, 62).astype(np.float64)
    later = np.minimum(backoff.cap, backoff.base * np.exp2(k))
    return np.where(attempt <= 0, u * backoff.first, u * later)


def lognormal(rng: np.random.Generator, median: float, p99: float, n: int) -> Floats:
    """Durations with a long tail, given as a median and a 99th percentile (p99 >= median)."""
    if n == 0:
        return np.empty(0)
    if median <= 0.0:
        return np.zeros(n)
    if p99 <= median:
        return np.full(n, median)
    return np.exp(rng.normal(math.log(median), lognormal_sigma(median, p99), n))


def lognormal_sigma(median: float, p99: float) -> float:
    """The log-scale spread that puts the 99th percentile at ``p99`` (0: no tail)."""
    if median <= 0.0 or p99 <= median:
        return 0.0
    return math.log(p99 / median) / Z99


def lognormal_mean(median: float, p99: float) -> float:
    """The mean of ``lognormal(median, p99)``: what Little's law needs for the load."""
    if median <= 0.0 or p99 <= median:
        return max(median, 0.0)
    sigma = lognormal_sigma(median, p99)
    return median * math.exp(sigma * sigma / 2.0)
