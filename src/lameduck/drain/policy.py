"""The two drain decisions of Envoy's draining docs as pure functions: does this response drain its
connection, and when is a connection drained proactively.

``rng`` is any callable returning a float uniform in [0, 1) (``random.random``), injected so that
tests and the simulator are deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lameduck.drain.event import DrainEvent, Strategy

Rng = Callable[[], float]


def response_drains(event: DrainEvent, now: float, rng: Rng) -> bool:
    """Gradual: P(drain) rises linearly from 0 at the start to 1 at T/2; immediate: always."""
    if event.strategy is Strategy.IMMEDIATE:
        return True
    half = event.time / 2.0
    elapsed = now - event.start
    if elapsed >= half:  # also covers T == 0
        return True
    if elapsed <= 0.0:
        return False
    return rng() < elapsed / half


# Windows narrower than this are empty: G == T/3 written in config units (900ms and 300ms) is not
# exact in floats, and must not leave a window a few ulps wide.
WINDOW_EPSILON = 1e-9


def proactive_window(event: DrainEvent) -> tuple[float, float] | None:
    """[start + 2T/3, start + T - G): late enough to let responses drain first, early enough
    that G elapses before T. Empty when G >= T/3: then nothing is drained proactively.

    The rule is decided on the durations, not on the absolute bounds: ``start + T - G`` and
    ``start + 2T/3`` round differently for each start, so with G == T/3 (T = 900ms, G = 300ms)
    comparing them would give a window one ulp wide for some starts and none for others."""
    if event.time / 3.0 - event.grace <= WINDOW_EPSILON:
        return None
    lo = event.start + event.time * 2.0 / 3.0
    hi = event.start + event.time - event.grace
    if hi <= lo:
        return None
    return lo, hi


def proactive_moment(event: DrainEvent, accepted_at: float, rng: Rng) -> float | None:
    """A uniform random moment in the window, spreading the closes (no reconnect herd at T).

    None when the window is empty or the connection was accepted after 2T/3 (its first
    response drains it instead).
    """
    window = proactive_window(event)
    if window is None:
        return None
    lo, hi = window
    if accepted_at > lo:
        return None
    # Clamp: lo + r*(hi-lo) can round up to hi for r close to 1.
    return min(lo + rng() * (hi - lo), math.nextafter(hi, lo))
