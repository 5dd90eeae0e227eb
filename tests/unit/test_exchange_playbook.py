"""The real ``Exchange`` (the one HTTP/1.1 and HTTP/2 both run), played with no sockets.

One table covers the retry decision: which failure, on which kind of request and connection,
is sent again (to a fresh connection to the same endpoint, or to another endpoint) and which is
answered from here — RFC 9110 §9.2.2 (idempotent methods), ``Idempotency-Key``, RFC 9113 §8.7
(refused streams were not processed), the retry policy's ``num_retries`` and the replay bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lameduck.drain.endpoint import AdminState, PersistenceTable
from lameduck.drain.retry import RetryBudget
from lameduck.proxy.admission import Client
from lameduck.proxy.exchange import Exchange
from lameduck.proxy.message import HTTP11, RequestHead
from lameduck.proxy.replay import REPLAY_LIMIT
from lameduck.upstream.connector import UpstreamError
from tests.playbook import Context, Downstream, Upstream, pooled, request

CLIENT = Client("10.0.0.1", b"http", False)


@dataclass
class Case:
    name: str
    method: bytes
    failure: str  # connect | reset | stale | refused | timeout | after_head
    endpoints: int = 2
    retryable: bool | None = None  # None: by method
    multiplexed: bool = False
    body: int = 0  # request body bytes sent before the failure
    num_retries: int = 2  # the cluster's retry_policy
    # What follows: "same" (fresh connection to the failed endpoint), "later" (the same, after
    # a back-off), "other" (another endpoint), or a status answered locally, or "abort" (the
    # client sees a reset).
    expect: str | int = "other"


CASES = [
    Case("GET, connect refused: never sent, another endpoint", b"GET", "connect"),
    Case("POST, connect refused: never sent, safe anywhere", b"POST", "connect"),
    Case("POST, connect refused, no other endpoint: the same one after a back-off", b"POST",
         "connect", endpoints=1, expect="later"),
    Case("GET, connect refused, no other endpoint, num_retries 0: answered", b"GET",
         "connect", endpoints=1, num_retries=0, expect=503),
    Case("GET reset before any byte: idempotent, elsewhere", b"GET", "reset"),
    Case("POST reset before any byte: not safe to send twice", b"POST", "reset", expect=502),
    Case("POST with Idempotency-Key reset: the app dedupes, elsewhere", b"POST", "reset",
         retryable=True),
    Case("GET on a stale pooled connection: once more, fresh, same endpoint", b"GET", "stale",
         expect="same"),
    Case("PUT with a body on a stale pooled connection: replayed", b"PUT", "stale", body=1000,
         expect="same"),
    Case("PUT whose body outgrew the replay bound: answered", b"PUT", "stale",
         body=REPLAY_LIMIT + 1, expect=502),
    Case("POST on a stale pooled connection: answered", b"POST", "stale", expect=502),
    Case("POST refused by HTTP/2 (unprocessed): elsewhere", b"POST", "refused",
         multiplexed=True),
    Case("POST refused, one endpoint: a fresh connection to it", b"POST", "refused",
         endpoints=1, multiplexed=True, expect="same"),
    Case("GET timed out: never retried (it may still run)", b"GET", "timeout", expect=504),
    Case("GET reset after the response head: the client sees a reset", b"GET", "after_head",
         expect="abort"),
    Case("GET reset, policy num_retries 0: answered", b"GET", "reset", num_retries=0,
         expect=502),
]

def _attached(ctx: Context, case: Case) -> tuple[Upstream, object, object]:
    """The request started and attached to its first upstream (pooled or new)."""
    if case.failure == "stale":
        pooled(ctx, 0)
    ex, down = request(ctx, case.method, case.retryable, body=case.body > 0)
    if case.failure == "stale":
        up = ex.up
        assert isinstance(up, Upstream)
    else:
        assert len(ctx.connects) == 1
        if case.failure == "connect":
            return None, ex, down  # type: ignore[return-value]
        up = ctx.connects[0].succeed(case.multiplexed)
    if case.body:
        ex.request_body(b"x" * case.body, case.body)
        ex.request_complete()
    return up, ex, down


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_retry_decision(case: Case) -> None:
    ctx = Context(endpoints=case.endpoints, num_retries=case.num_retries)
    up, _ex, down = _attached(ctx, case)
    first = ctx.eps[0] if case.failure == "stale" else ctx.connects[0].endpoint
    before = len(ctx.connects)
    if case.failure == "connect":
        ctx.connects[0].fail()
    elif case.failure == "refused":
        up.sink.on_upstream_refused()
    elif case.failure == "timeout":
        up.sink.on_upstream_error(UpstreamError.TIMEOUT, False)
    elif case.failure == "after_head":
        up.sink.on_response_head(200, [], None, False)
        up.sink.on_upstream_error(UpstreamError.RESET, True)
    else:
        up.sink.on_upstream_error(UpstreamError.RESET, False)
    retried = ctx.connects[before:] if case.failure != "connect" else ctx.connects[1:]
    stats = ctx.cluster.stats
    down.log = [e for e in down.log if e[0] != "release"]  # flow-control credit: not asked
    if case.expect == "later":
        assert retried == [] and down.log == []  # not at once: after the back-off
        ctx.loop.advance(ctx.loop.now + ctx.cluster.back_off_max)
        retried = ctx.connects[1:]
    if case.expect in ("same", "later", "other"):
        assert len(retried) == 1, down.log
        target = retried[0].endpoint
        assert (target is first) == (case.expect != "other")
        assert stats.upstream_rq_retry == 1
        assert down.log == []  # nothing answered yet
        # the retry carries the request again, with the body sent so far
        again = retried[0].succeed(case.multiplexed)
        assert again.sent.startswith(case.method + b" /x HTTP/1.1\r\n")
        assert len(again.sent) - again.sent.index(b"\r\n\r\n") - 4 == case.body
        again.sink.on_response_head(200, [], 0, False)
        again.sink.on_response_complete()
        assert [e for e in down.log if e[0] != "release"] == [
            ("head", 200), ("end", None), ("done",)]
        assert ctx.cluster.retries_active == 0  # the budget's slot came back
    elif case.expect == "abort":
        assert retried == []
        assert down.log == [("head", 200), ("abort",)]
    else:
        assert retried == [], f"sent again: {case.name}"
        assert down.log == [("local", case.expect), ("done",)]
        assert stats.upstream_rq_retry == 0
    assert ctx.process.ledger.active == (1 if case.expect == "abort" else 0)


def test_refused_twice_on_the_only_endpoint_is_answered_503() -> None:
    ctx = Context(endpoints=1)
    _ex, down = request(ctx, b"POST")
    ctx.connects[0].succeed(multiplexed=True).sink.on_upstream_refused()
    ctx.connects[1].succeed(multiplexed=True).sink.on_upstream_refused()
    assert len(ctx.connects) == 2
    assert down.log == [("local", 503), ("done",)]
    assert ctx.cluster.stats.upstream_rq_retry == 1


def test_a_retry_moves_the_persistence_record_to_the_endpoint_that_answers() -> None:
    ctx = Context(endpoints=2)
    ctx.cluster.persistence = PersistenceTable(60.0)
    _ex, _ = request(ctx, b"GET")
    first = ctx.connects[0].endpoint
    ctx.connects[0].fail()
    other = ctx.connects[1].endpoint
    assert other is not first
    ctx.connects[1].succeed().sink.on_response_head(200, [], 0, False)
    assert ctx.cluster.persistence is not None
    assert ctx.cluster.persistence.lookup("10.0.0.1", 0.0) is other


def test_no_endpoint_left_answers_503_with_retry_after() -> None:
    ctx = Context(endpoints=1)
    ctx.cluster.set_state(ctx.eps[0], AdminState.DRAIN, 0.0)
    _ex, down = request(ctx)
    assert ctx.connects == []
    assert down.log == [("local", 503), ("done",)]
    assert ctx.cluster.stats.upstream_cx_none_healthy == 1


def test_admission_health_check_route_and_going_away() -> None:
    ctx = Context()
    ex, _ = request(ctx)
    assert ex.admitted and ctx.process.ledger.active == 1
    # the health-check path is answered here, never routed
    d = Downstream(ctx)
    assert not Exchange(d, b"GET").admit(ctx, RequestHead(b"GET", b"app", b"/healthz", [],
                                                          HTTP11), CLIENT)
    assert d.log == [("answer", 200), ("done",)]
    # past the drain time the ledger takes no more: the codec says going away
    ctx.process.ledger.accepting = False
    d = Downstream(ctx)
    assert not Exchange(d, b"GET").admit(ctx, RequestHead(b"GET", b"app", b"/x", [], HTTP11),
                                         CLIENT)
    assert d.log == [("going_away",)]
    assert ctx.stats.downstream_rq_going_away == 1
    assert ctx.process.ledger.active == 1  # the refused one was never counted in flight


def test_request_body_waits_for_the_upstream_and_is_given_back_when_sent() -> None:
    """Bytes read before the upstream is attached are held; their flow-control credit goes
    back only once they were handed on (an HTTP/2 client's window bounds what it may send)."""
    ctx = Context()
    ex, down = request(ctx, b"POST", body=True)
    ex.request_body(b"a" * 100, 109)  # 9 bytes of padding count against the window too
    assert [e for e in down.log if e[0] == "release"] == []
    up = ctx.connects[0].succeed()
    assert up.sent.endswith(b"a" * 100)
    assert down.log == [("release", 109)]
    # the upstream pushes back: credit is kept until it resumes
    ex.pause_request_body()
    assert down.held
    ex.request_body(b"b" * 10, 10)
    assert down.log == [("release", 109)]
    ex.resume_request_body()
    assert not down.held and down.log[-1] == ("release", 10)


# -- the same endpoint after a back-off (HAProxy's retries, Envoy's retry_back_off) -----------

def test_connect_refused_on_the_only_endpoint_is_retried_after_a_jittered_back_off() -> None:
    ctx = Context(endpoints=1, route_timeout=1.0)
    ctx.draws = [0.4]  # the first retry waits 0.4 x 25 ms
    _ex, down = request(ctx, b"POST")
    ctx.connects[0].fail()
    ctx.loop.advance(0.0099)
    assert len(ctx.connects) == 1 and down.log == []
    ctx.loop.advance(0.0101)
    assert [c.endpoint for c in ctx.connects] == [ctx.eps[0], ctx.eps[0]]
    up = ctx.connects[1].succeed()
    up.sink.on_response_head(200, [], 0, False)
    up.sink.on_response_complete()
    assert down.log == [("head", 200), ("end", None), ("done",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_retry, stats.upstream_rq_retry_success) == (1, 1)
    assert stats.upstream_cx_connect_fail == 1
    assert ctx.cluster.retries_active == 0


def test_back_off_grows_and_num_retries_bounds_the_tries() -> None:
    ctx = Context(endpoints=1, num_retries=2)
    ctx.draws = [0.999, 0.999]
    _ex, down = request(ctx)
    ctx.connects[0].fail()
    ctx.loop.advance(0.0249)  # retry 1: up to 25 ms
    assert len(ctx.connects) == 1
    ctx.loop.advance(0.0250)
    ctx.connects[1].fail()
    ctx.loop.advance(0.0250 + 0.0748)  # retry 2: up to 75 ms
    assert len(ctx.connects) == 2
    ctx.loop.advance(0.0250 + 0.0750)
    assert len(ctx.connects) == 3
    ctx.connects[2].fail()  # the policy's two retries are spent: answered
    assert down.log == [("local", 503), ("done",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_retry, stats.upstream_rq_retry_limit_exceeded) == (2, 1)
    assert all(t.cancelled() for t in ctx.loop.timers)


def test_an_exhausted_retry_budget_answers_at_once() -> None:
    ctx = Context(endpoints=1)
    ctx.cluster.budget = RetryBudget(0.0, 0)  # no retry in flight allowed
    _ex, down = request(ctx)
    ctx.connects[0].fail()
    assert down.log == [("local", 503), ("done",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_retry_overflow, stats.upstream_rq_retry) == (1, 0)
    ctx.loop.advance(1.0)
    assert len(ctx.connects) == 1


def test_a_back_off_that_would_outlast_the_route_timeout_is_not_taken() -> None:
    ctx = Context(endpoints=1, route_timeout=0.05)
    ctx.draws = [0.999]
    _ex, down = request(ctx)  # the route timeout runs from the first connect: ends at 50 ms
    ctx.loop.advance(0.04)
    ctx.connects[0].fail()  # a back-off of ~25 ms would end past 50 ms: answered now
    assert down.log == [("local", 503), ("done",)]
    assert ctx.cluster.stats.upstream_rq_retry == 0
    ctx.loop.advance(1.0)
    assert len(ctx.connects) == 1


def test_a_retry_gets_only_what_is_left_of_the_route_timeout() -> None:
    ctx = Context(endpoints=1, route_timeout=1.0)
    ctx.draws = [0.4]
    request(ctx)
    ctx.loop.advance(0.3)
    ctx.connects[0].fail()
    ctx.loop.advance(0.31)
    assert ctx.connects[1].succeed().timeout == pytest.approx(0.69)


def test_a_connect_outlasting_the_route_timeout_is_answered_504() -> None:
    ctx = Context(endpoints=1, route_timeout=0.5)
    _ex, down = request(ctx)
    ctx.loop.advance(0.5)
    assert down.log == [("local", 504), ("done",)]
    assert ctx.cluster.stats.upstream_rq_timeout == 1
    late = ctx.connects[0].succeed()  # the connect ends after all: kept for the next request
    assert not late.closed and ctx.eps[0].idle == [late]
    assert ctx.eps[0].connecting == 0


# -- max_connecting: a cold pool opens a few connections at a time ------------------------

def test_requests_past_max_connecting_wait_for_the_first_free_connection() -> None:
    ctx = Context(endpoints=1, max_connecting=2, route_timeout=5.0)
    got = [request(ctx) for _ in range(4)]
    stats = ctx.cluster.stats
    assert len(ctx.connects) == 2  # two connects under way; two requests in line
    assert (stats.upstream_rq_pending_total, stats.upstream_rq_pending_active) == (2, 2)
    first = ctx.connects[0].succeed()  # a connect slot is free: the third connects
    ctx.loop.run_soon()
    assert len(ctx.connects) == 3 and stats.upstream_rq_pending_active == 1
    first.sink.on_response_head(200, [], 0, False)
    first.sink.on_response_complete()  # back in the pool: the fourth takes it, no connect
    ctx.loop.run_soon()
    assert len(ctx.connects) == 3 and stats.upstream_rq_pending_active == 0
    assert first.sink is got[3][0]
    first.sink.on_response_head(200, [], 0, False)
    first.sink.on_response_complete()
    for c in ctx.connects[1:]:
        up = c.succeed()
        up.sink.on_response_head(200, [], 0, False)
        up.sink.on_response_complete()
    assert all(d.log == [("head", 200), ("end", None), ("done",)] for _, d in got)
    assert ctx.eps[0].connecting == 0 and not ctx.eps[0].waiting


def test_a_request_in_line_is_bounded_by_the_route_timeout() -> None:
    ctx = Context(endpoints=1, max_connecting=1, route_timeout=1.0)
    _a, first = request(ctx)
    ctx.loop.advance(0.5)
    _b, second = request(ctx)
    assert len(ctx.connects) == 1
    ctx.loop.advance(1.0)  # the first's route timeout: it was still connecting
    assert first.log == [("local", 504), ("done",)]
    assert second.log == []
    ctx.loop.advance(1.5)  # the second's, in line
    assert second.log == [("local", 504), ("done",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_timeout, stats.upstream_rq_pending_active) == (2, 0)
    assert not ctx.eps[0].waiting


def test_a_request_cut_in_line_passes_its_turn_on() -> None:
    """The shutdown deadline cuts a request waiting for a connection as it cuts any other
    (the codec answers it); the one behind it gets the connection."""
    ctx = Context(endpoints=1, max_connecting=1)
    request(ctx)
    cut, _ = request(ctx)
    third, down = request(ctx)
    # what the codecs' ``cut`` does to an exchange with no response byte sent
    cut.finished = cut.resp_done = True
    cut.detach()
    cut.settle(False)
    assert ctx.cluster.stats.upstream_rq_pending_active == 1
    ctx.connects[0].succeed()
    ctx.loop.run_soon()
    assert len(ctx.connects) == 2  # the third's turn came
    up = ctx.connects[1].succeed()
    assert up.sink is third
    up.sink.on_response_head(200, [], 0, False)
    up.sink.on_response_complete()
    assert down.log == [("head", 200), ("end", None), ("done",)]


# -- the route timeout from the request's end, and the per-try idle timeout -----------------
# The real HTTP/1.1 upstream connection carries both on its one timer (Envoy's route
# ``timeout`` and ``per_try_idle_timeout``).

OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"


def test_an_upload_longer_than_the_route_timeout_is_not_cut() -> None:
    """Envoy's route timeout starts once the whole request is in: a 20 s upload under a 15 s
    route timeout is answered; the timeout runs 15 s from the body's end."""
    ctx = Context(endpoints=1, route_timeout=15.0)
    ex, down = request(ctx, b"POST", body=True)
    conn, wire = ctx.connects[0].succeed_h1(ctx.loop)
    for t in range(1, 21):
        ctx.loop.advance(float(t))
        ex.request_body(b"x" * 10, 10)
    ex.request_complete()  # t = 20
    assert wire.take().endswith(b"0\r\n\r\n")
    ctx.loop.advance(34.999)
    assert [e for e in down.log if e[0] != "release"] == [] and wire.ended is None
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    assert [e for e in down.log if e[0] != "release"] == [
        ("head", 200), ("body", b"ok"), ("end", None), ("done",)]
    assert ctx.cluster.stats.upstream_rq_timeout == 0


def test_the_route_timeout_ends_timeout_after_the_uploads_end() -> None:
    ctx = Context(endpoints=1, route_timeout=15.0)
    ex, down = request(ctx, b"POST", body=True)
    _conn, wire = ctx.connects[0].succeed_h1(ctx.loop)
    ctx.loop.advance(20.0)
    ex.request_body(b"x" * 10, 10)
    ex.request_complete()
    ctx.loop.advance(34.999)
    assert wire.ended is None
    ctx.loop.advance(35.0)
    assert wire.ended == ("rst", 35.0)
    assert [e for e in down.log if e[0] != "release"] == [("local", 504), ("done",)]
    assert ctx.cluster.stats.upstream_rq_timeout == 1


def test_the_route_timeout_spans_the_response_to_its_last_byte() -> None:
    """Envoy's route timeout ends when the response is complete, not at its head: a body
    still coming at the deadline is cut, and the client sees a reset (it must not look
    whole)."""
    ctx = Context(endpoints=1, route_timeout=5.0)
    _ex, down = request(ctx)
    conn, wire = ctx.connects[0].succeed_h1(ctx.loop)
    ctx.loop.advance(1.0)
    conn.data_received(OK_HEAD + b"a" * 10)
    ctx.loop.advance(4.999)
    conn.data_received(b"b" * 10)
    assert wire.ended is None
    ctx.loop.advance(5.0)
    assert wire.ended == ("rst", 5.0)
    assert down.log == [("head", 200), ("body", b"a" * 10), ("body", b"b" * 10), ("abort",)]
    assert ctx.cluster.stats.upstream_rq_timeout == 1


def test_a_response_stalled_mid_body_is_cut_at_the_per_try_idle_timeout() -> None:
    """No route timeout: only the idle timeout ends it, counted from the last upstream
    byte."""
    ctx = Context(endpoints=1, per_try_idle_timeout=3.0)
    _ex, down = request(ctx)
    conn, wire = ctx.connects[0].succeed_h1(ctx.loop)
    ctx.loop.advance(1.0)
    conn.data_received(OK_HEAD + b"a" * 10)
    ctx.loop.advance(2.5)
    conn.data_received(b"b" * 10)  # progress: the idle timeout runs from here
    ctx.loop.advance(5.499)
    assert wire.ended is None
    ctx.loop.advance(5.5)
    assert wire.ended == ("rst", 5.5)
    assert down.log == [("head", 200), ("body", b"a" * 10), ("body", b"b" * 10), ("abort",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_per_try_idle_timeout, stats.upstream_rq_timeout) == (1, 0)


def test_no_response_byte_within_the_per_try_idle_timeout_is_answered_504() -> None:
    ctx = Context(endpoints=1, route_timeout=15.0, per_try_idle_timeout=3.0)
    _ex, down = request(ctx)
    _conn, wire = ctx.connects[0].succeed_h1(ctx.loop)
    ctx.loop.advance(2.999)
    assert wire.ended is None
    ctx.loop.advance(3.0)
    assert wire.ended == ("rst", 3.0)
    assert down.log == [("local", 504), ("done",)]
    stats = ctx.cluster.stats
    assert (stats.upstream_rq_per_try_idle_timeout, stats.upstream_rq_timeout) == (1, 0)
    assert stats.upstream_rq_retry == 0  # it may still run there: never sent twice
