"""When a failed upstream request may be tried again (RFC 9110 §9.2.2, RFC 9113 §8.7), sans-IO.

A retry after a drain cut is only safe when it cannot run a side effect twice: RFC 9110's
idempotent methods, an Idempotency-Key or a Resume-Seq (the app commits it once), or proof
that the first upstream never processed it.
The retry budget keeps retries from multiplying load on a fleet that is already short of an
instance. Replaying the request body (and its size limit) is the shell's business.
"""

from __future__ import annotations

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
