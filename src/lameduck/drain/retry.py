"""When a failed upstream request may be tried again (RFC 9110 §9.2.2, RFC 9113 §8.7), sans-IO.

A retry after a drain cut is only safe when it cannot run a side effect twice: RFC 9110's
idempotent methods, an Idempotency-Key or a Resume-Seq (the app commits it once), or proof
that the first upstream never processed it.
The retry budget keeps retries from multiplying load on a fleet that is already short of an
instance. Replaying the request body (and its size limit) is the shell's business.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

# RFC 9110 §9.2.2: the methods whose intended effect is the same however often repeated.
IDEMPOTENT_METHODS: frozenset[bytes] = frozenset(
    {b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"}
)


# Request fields that make any method safe to send again: the app applies the request once
# (Idempotency-Key, IETF httpapi draft; Resume-Seq, lameduck.resume's commit-once).
REPLAY_SAFE_FIELDS: frozenset[bytes] = frozenset({b"idempotency-key", b"resume-seq"})


def may_retry(
    *,
    sent: bool,
    idempotent: bool,
    idempotency_key: bool,
    unprocessed: bool,
    response_started: bool,
) -> bool:
    """The safe-retry rule. Never once a response byte reached the client (it cannot be taken
    back). Otherwise yes if the request never left, if HTTP/2 proved it unprocessed
    (REFUSED_STREAM, or a stream above GOAWAY's last-stream-id), if the method is idempotent,
    or if it carries an Idempotency-Key or a Resume-Seq."""
    if response_started:
        return False
    return not sent or unprocessed or idempotent or idempotency_key


class Failure(IntEnum):
    """How an upstream request failed, as the exchange saw it."""

    CONNECT = 1  # the connection failed: the request never left
    RESET = 2  # reset, or a bad response, before any response byte
    REFUSED = 3  # HTTP/2 proved it unprocessed (REFUSED_STREAM, above GOAWAY's last id)
    TIMEOUT = 4  # no response within the route's timeout: it may still be running
    AFTER_HEAD = 5  # failed after the response had started


class Retry(IntEnum):
    """What to do about it."""

    ABORT = 1  # a response byte went out: the client can only see a reset
    FAIL = 2  # answer the client with the status
    FRESH = 3  # once more, on a fresh connection to the same endpoint
    ELSEWHERE = 4  # another endpoint if the policy and budget allow one, else answer
    ELSEWHERE_OR_FRESH = 5  # another endpoint, else once more to the same one, else answer
    # another endpoint, else the same one after a jittered back-off (HAProxy's ``retries``
    # reconnect to the same server), else answer
    ELSEWHERE_OR_LATER = 6


def decide(failure: Failure, *, started: bool, kept: bool, idempotent: bool, stale: bool,
           retried: bool) -> tuple[Retry, int]:
    """The retry decision, and the status the client gets if no retry happens.

    ``kept``: what was sent is still held whole for a replay (or nothing was sent);
    ``idempotent``: the method is, or the request carries an Idempotency-Key or Resume-Seq;
    ``stale``: it rode a reused pooled connection that returned no byte (the upstream had
    closed it); ``retried``: it was already sent once more to a fresh connection."""
    if started or failure is Failure.AFTER_HEAD:
        return Retry.ABORT, 0
    if failure is Failure.CONNECT:
        # never sent: any request may go anywhere, the same endpoint too once it had a moment
        return Retry.ELSEWHERE_OR_LATER, 503
    if failure is Failure.TIMEOUT:
        return Retry.FAIL, 504  # it may still run: never sent twice
    if failure is Failure.REFUSED:
        if not kept:
            return Retry.FAIL, 503
        return (Retry.ELSEWHERE if retried else Retry.ELSEWHERE_OR_FRESH), 503
    # RESET: sent, and maybe processed
    if not (kept and may_retry(sent=True, idempotent=idempotent, idempotency_key=False,
                               unprocessed=False, response_started=False)):
        return Retry.FAIL, 502
    if stale and not retried:
        return Retry.FRESH, 502
    return Retry.ELSEWHERE, 502


def back_off(retry: int, base: float, cap: float, rng: Callable[[], float]) -> float:
    """The wait before ``retry`` (1 = the first) to the same endpoint: Envoy's fully jittered
    exponential back-off (router ``retry_back_off``), uniform in [0, (2**retry - 1) * base],
    at most ``cap``; jittered so requests failed together do not come back together."""
    return rng() * min(cap, (2.0 ** min(max(retry, 1), 62) - 1.0) * base)


class RetryBudget:
    """Envoy's ``retry_budget`` (circuit_breaker.proto; ``RetryBudgetImpl::max`` in
    resource_manager_impl.h): at most ``max(budget_percent / 100 * active, min_retry_concurrency)``
    retries in flight, the product truncated to an integer as Envoy's uint64 conversion does.

    ``active_requests`` is Envoy's "active requests plus active pending requests" of the cluster
    (retries in flight count among them, as they are upstream requests too).
    """

    __slots__ = ("budget_percent", "min_retry_concurrency")

    def __init__(self, budget_percent: float = 20.0, min_retry_concurrency: int = 3) -> None:
        if not 0.0 <= budget_percent <= 100.0:
            raise ValueError("budget_percent must be 0..100")
        if min_retry_concurrency < 0:
            raise ValueError("min_retry_concurrency must be >= 0")
        self.budget_percent = budget_percent
        self.min_retry_concurrency = min_retry_concurrency

    def limit(self, active_requests: int) -> int:
        """How many retries may be in flight now."""
        return max(int(self.budget_percent / 100.0 * active_requests), self.min_retry_concurrency)

    def allows(self, active_requests: int, active_retries: int) -> bool:
        """May one more retry start?"""
        return active_retries < self.limit(active_requests)
