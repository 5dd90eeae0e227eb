"""The safe-retry rule (retry only what is unsent, refused unprocessed, idempotent or keyed,
and never once a response byte reached the client), Envoy's retry budget and the per-request
retry count."""

from __future__ import annotations

import itertools

import pytest

from lameduck.drain.retry import (
    IDEMPOTENT_METHODS,
    Failure,
    Retry,
    RetryBudget,
    back_off,
    decide,
    may_retry,
)


def test_idempotent_methods_are_rfc9110s() -> None:
    assert frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"}) == (
        IDEMPOTENT_METHODS
    )
    for method in (b"POST", b"PATCH", b"CONNECT", b"get"):
        assert method not in IDEMPOTENT_METHODS


FLAGS = ("sent", "idempotent", "idempotency_key", "unprocessed", "response_started")


@pytest.mark.parametrize("values", list(itertools.product((False, True), repeat=len(FLAGS))))
def test_retry_rule_truth_table(values: tuple[bool, ...]) -> None:
    f = dict(zip(FLAGS, values, strict=True))
    # written independently: a retry is unsafe iff a byte went out to the client, or the
    # request reached the upstream, may have been processed, and is neither idempotent nor keyed
    unsafe = f["response_started"] or (
        f["sent"] and not f["unprocessed"] and not f["idempotent"] and not f["idempotency_key"]
    )
    assert may_retry(**f) is (not unsafe)


def test_retry_rule_landmarks() -> None:
    base = dict.fromkeys(FLAGS, False)
    assert may_retry(**base)  # never sent
    assert not may_retry(**{**base, "sent": True})  # a POST that reached the upstream
    assert may_retry(**{**base, "sent": True, "unprocessed": True})  # REFUSED_STREAM
    assert may_retry(**{**base, "sent": True, "idempotent": True})
    assert may_retry(**{**base, "sent": True, "idempotency_key": True})
    everything = dict.fromkeys(FLAGS, True)
    assert not may_retry(**everything)  # a response byte already reached the client


def test_retry_rule_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        may_retry(True, True, True, True, True)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- budget


def test_budget_defaults_are_envoys() -> None:
    b = RetryBudget()
    assert (b.budget_percent, b.min_retry_concurrency) == (20.0, 3)


def test_min_retry_concurrency_is_a_floor() -> None:
    b = RetryBudget(20.0, 3)
    for active in (0, 1, 10, 19):  # 20% of 19 = 3.8 → 3
        assert b.limit(active) == 3
        assert b.allows(active, 2)
        assert not b.allows(active, 3)


def test_budget_percent_of_active_requests() -> None:
    b = RetryBudget(20.0, 3)
    assert b.limit(20) == 4
    assert b.allows(20, 3)
    assert not b.allows(20, 4)
    assert b.limit(100) == 20
    assert b.allows(100, 19)
    assert not b.allows(100, 20)
    assert b.limit(104) == 20  # 20.8 truncated, as Envoy's uint64 conversion
    assert RetryBudget(25.0, 10).limit(100) == 25  # Envoy's doc example


def test_budget_edges() -> None:
    assert not RetryBudget(0.0, 0).allows(1000, 0)  # no budget at all
    assert RetryBudget(0.0, 1).allows(1000, 0)
    assert RetryBudget(100.0, 0).limit(7) == 7
    assert not RetryBudget(100.0, 0).allows(0, 0)


@pytest.mark.parametrize(("pct", "floor"), [(-1.0, 3), (100.5, 3), (20.0, -1)])
def test_budget_config_is_validated(pct: float, floor: int) -> None:
    with pytest.raises(ValueError):
        RetryBudget(pct, floor)


# The retry decision, as one table: (failure, started, kept, idempotent, stale, retried) ->
# (what to do, the status if nothing is retried).
F, R = Failure, Retry
DECISIONS = [
    # never sent: anywhere, the same endpoint too after a back-off (a POST, a retried one)
    ((F.CONNECT, False, True, False, False, False), (R.ELSEWHERE_OR_LATER, 503)),
    ((F.CONNECT, False, False, False, False, True), (R.ELSEWHERE_OR_LATER, 503)),
    ((F.RESET, False, True, True, False, False), (R.ELSEWHERE, 502)),  # idempotent
    ((F.RESET, False, True, False, False, False), (R.FAIL, 502)),  # POST: maybe processed
    ((F.RESET, False, False, True, False, False), (R.FAIL, 502)),  # body no longer kept
    ((F.RESET, False, True, True, True, False), (R.FRESH, 502)),  # stale pooled connection
    ((F.RESET, False, True, True, True, True), (R.ELSEWHERE, 502)),  # ... already tried fresh
    ((F.RESET, False, True, False, True, False), (R.FAIL, 502)),  # stale, but a POST
    ((F.REFUSED, False, True, False, False, False), (R.ELSEWHERE_OR_FRESH, 503)),  # unprocessed
    ((F.REFUSED, False, True, False, False, True), (R.ELSEWHERE, 503)),
    ((F.REFUSED, False, False, False, False, False), (R.FAIL, 503)),  # body over the bound
    ((F.TIMEOUT, False, True, True, False, False), (R.FAIL, 504)),  # may still be running
    ((F.AFTER_HEAD, False, True, True, False, False), (R.ABORT, 0)),
    ((F.RESET, True, True, True, True, False), (R.ABORT, 0)),  # a response byte went out
    ((F.CONNECT, True, True, True, False, False), (R.ABORT, 0)),
]


@pytest.mark.parametrize(("given", "want"), DECISIONS)
def test_retry_decision_table(given: tuple, want: tuple) -> None:
    failure, started, kept, idempotent, stale, retried = given
    assert decide(failure, started=started, kept=kept, idempotent=idempotent, stale=stale,
                  retried=retried) == want


def test_back_off_is_envoys_fully_jittered_exponential() -> None:
    """Retry n waits uniform in [0, (2^n - 1) x base], at most the cap (Envoy's
    retry_back_off, base 25 ms, cap ten times that)."""
    top = 1.0 - 1e-12  # rng() is below 1
    assert back_off(1, 0.025, 0.25, lambda: top) == pytest.approx(0.025)
    assert back_off(2, 0.025, 0.25, lambda: top) == pytest.approx(0.075)
    assert back_off(3, 0.025, 0.25, lambda: top) == pytest.approx(0.175)
    assert back_off(4, 0.025, 0.25, lambda: top) == pytest.approx(0.25)  # capped
    assert back_off(500, 0.025, 0.25, lambda: top) == pytest.approx(0.25)  # no overflow
    assert back_off(2, 0.025, 0.25, lambda: 0.0) == 0.0
    assert back_off(2, 0.025, 0.25, lambda: 0.5) == pytest.approx(0.0375)
