"""The reconnect delays (drain/backoff.py): RFC 6455 §7.2.3's random first attempt, then
truncated exponential backoff with full jitter; the random source is passed in."""

from __future__ import annotations

import random
import statistics

import pytest

from lameduck.drain.backoff import Backoff


def test_first_attempt_uniform_over_the_window() -> None:
    b = Backoff()
    rng = random.Random(1)
    d = [b.delay(0, rng.random) for _ in range(20000)]
    assert 0 <= min(d) < 0.01 and 4.99 < max(d) <= 5.0
    assert abs(statistics.mean(d) - 2.5) < 0.05
    # no clump: each half-second of the window gets about a tenth
    counts = [sum(1 for x in d if i / 2 <= x < (i + 1) / 2) for i in range(10)]
    assert max(counts) < 1.1 * min(counts)


def test_later_attempts_grow_then_stay_under_the_cap() -> None:
    b = Backoff(first=5.0, base=1.0, cap=30.0)
    rng = random.Random(2)
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 30.0), (60, 30.0),
                             (10**6, 30.0)]:
        d = [b.delay(attempt, rng.random) for _ in range(3000)]
        assert min(d) >= 0 and max(d) <= ceiling
        assert max(d) > 0.95 * ceiling  # full jitter: the whole range is used


def test_same_seed_same_delays() -> None:
    b = Backoff()
    assert ([b.delay(i % 4, random.Random(9).random) for i in range(8)]
            == [b.delay(i % 4, random.Random(9).random) for i in range(8)])


@pytest.mark.parametrize("kw", [{"first": -1}, {"base": 0}, {"cap": 0}, {"max_attempts": 0}])
def test_bad_settings_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bad backoff"):
        Backoff(**kw)
