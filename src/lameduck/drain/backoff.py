"""When to reconnect, decided without I/O (the random source is passed in, as ``rng()``
uniform in [0, 1), like ``random.random``): the first attempt
uniform in 0..``first`` seconds (RFC 6455 §7.2.3 suggests 0 to 5 s), then truncated exponential
backoff with full jitter, so clients cut together do not come back together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    first: float = 5.0   # the first attempt: uniform in [0, first]
    base: float = 1.0    # attempt k >= 1: uniform in [0, min(cap, base * 2**k)]
    cap: float = 30.0
    max_attempts: int = 12  # then give up

    def __post_init__(self) -> None:
        if self.first < 0 or self.base <= 0 or self.cap <= 0 or self.max_attempts < 1:
            raise ValueError(f"bad backoff: {self}")

    def delay(self, attempt: int, rng: Callable[[], float]) -> float:
        """The wait before reconnect ``attempt`` (0 = the first after a cut)."""
        if attempt <= 0:
            return rng() * self.first
        return rng() * min(self.cap, self.base * 2.0 ** min(attempt, 62))
