"""The cluster carrying out the drain core's endpoint decisions, with a fake clock and timers."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from lameduck.drain.endpoint import AdminState, EndpointDrain, Layer, PersistenceTable
from lameduck.drain.health import OutlierDetector, parse_agent
from lameduck.drain.retry import RetryBudget
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.pool import Endpoint


class Timers:
    """loop.call_at, by hand."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, Callable[[], None]]] = []
        self.now = 0.0

    def call_at(self, at: float, cb: Callable[[], None]) -> None:
        self.pending.append((at, cb))

    def advance(self, to: float) -> None:
        self.now = to
        due = sorted((p for p in self.pending if p[0] <= to), key=lambda p: p[0])
        self.pending = [p for p in self.pending if p[0] > to]
        for _, cb in due:
            cb()


class Conn:
    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.closed = False
        ep.conns.add(self)

    def sever(self) -> None:
        self.closed = True
        self.ep.conns.discard(self)


def make(n: int = 3, drain_stop: float = 10.0, drop: bool = False, clear: bool = False,
         persistence: bool = True) -> tuple[Cluster, list[Endpoint], Timers]:
    eps = [Endpoint("127.0.0.1", 8000 + i, 4, 1, EndpointDrain(drain_stop, drop, clear))
           for i in range(n)]
    c = Cluster("app", eps, 1.0, 30.0)
    timers = Timers()
    c.schedule = timers.call_at
    c.clock = lambda: timers.now
    if persistence:
        c.persistence = PersistenceTable(60.0)
    return c, eps, timers


def test_only_ready_healthy_endpoints_take_new_sessions() -> None:
    c, (a, b, d), _ = make(persistence=False)
    c.set_state(b, AdminState.DRAIN, 0.0)
    c.set_state(d, AdminState.MAINT, 0.0)
    assert {c.pick() for _ in range(10)} == {a}
    a.hc_ok = False
    c.health_changed(a)
    assert c.pick() is None
    assert (c.stats.membership_total, c.stats.membership_healthy,
            c.stats.membership_excluded) == (3, 2, 2)


def test_cookie_record_sticks_and_a_drain_endpoint_keeps_it_until_drain_stop() -> None:
    c, _, _ = make(drain_stop=10.0)
    ep, key = c.pick_sticky(None, Layer.L7, 0.0, cookie=True)
    assert ep is not None and key is not None
    assert c.pick_sticky(key, Layer.L7, 1.0, cookie=True) == (ep, key)  # refreshed, same key
    c.set_state(ep, AdminState.DRAIN, 2.0)
    assert c.pick_sticky(key, Layer.L7, 11.9, cookie=True) == (ep, key)  # drain stop: 12.0
    assert all(c.pick() is not ep for _ in range(10))  # no new sessions meanwhile
    moved, new_key = c.pick_sticky(key, Layer.L7, 12.0, cookie=True)
    assert moved is not ep and moved is not None
    assert new_key != key  # the cookie is rewritten
    assert c.pick_sticky(new_key, Layer.L7, 12.5, cookie=True) == (moved, new_key)


def test_layer4_discards_a_drain_endpoints_record_at_once_keeping_the_source_ip_key() -> None:
    c, _, _ = make(drain_stop=100.0)
    ep, key = c.pick_sticky("10.0.0.1", Layer.L4, 0.0, cookie=False)
    assert key == "10.0.0.1" and ep is not None
    c.set_state(ep, AdminState.DRAIN, 1.0)
    moved, key2 = c.pick_sticky("10.0.0.1", Layer.L4, 1.5, cookie=False)
    assert moved is not ep and key2 == "10.0.0.1"


def test_clear_persistence_on_drain_and_maint_rebalance_at_once() -> None:
    c, _, _ = make(drain_stop=100.0, clear=True)
    ep, key = c.pick_sticky(None, Layer.L7, 0.0, cookie=True)
    assert ep is not None
    c.set_state(ep, AdminState.DRAIN, 1.0)
    moved, _ = c.pick_sticky(key, Layer.L7, 1.1, cookie=True)
    assert moved is not ep
    c2, _, _ = make(drain_stop=100.0)
    ep2, key2 = c2.pick_sticky(None, Layer.L7, 0.0, cookie=True)
    assert ep2 is not None
    c2.set_state(ep2, AdminState.MAINT, 1.0)
    assert c2.pick_sticky(key2, Layer.L7, 1.1, cookie=True)[0] is not ep2


def test_drain_stop_zero_severs_at_once_and_drop_at_drain_end_when_the_timer_fires() -> None:
    c, (a, b, _), timers = make(drain_stop=0.0)
    conns = [Conn(a), Conn(a), Conn(b)]
    c.set_state(a, AdminState.DRAIN, 0.0)
    assert [x.closed for x in conns] == [True, True, False]
    assert c.stats.upstream_cx_drain_stop_drop == 2

    c, (a, _, _), timers = make(drain_stop=5.0, drop=True)
    conn = Conn(a)
    c.set_state(a, AdminState.DRAIN, 0.0)
    timers.advance(4.9)
    assert not conn.closed
    timers.advance(5.0)
    assert conn.closed and c.stats.upstream_cx_drain_stop_drop == 1

    c, (a, _, _), timers = make(drain_stop=5.0, drop=False)
    conn = Conn(a)
    c.set_state(a, AdminState.DRAIN, 0.0)
    timers.advance(50.0)
    assert not conn.closed  # no "Drop at Drain Time End": the timer leaves connections alone


def test_a_stale_drain_stop_timer_does_not_cut_a_later_drain() -> None:
    c, (a, _, _), timers = make(drain_stop=5.0, drop=True)
    conn = Conn(a)
    c.set_state(a, AdminState.DRAIN, 0.0)
    c.set_state(a, AdminState.READY, 1.0)
    c.set_state(a, AdminState.DRAIN, 3.0)
    timers.advance(5.0)  # the first drain's timer
    assert not conn.closed
    timers.advance(8.0)
    assert conn.closed


def test_agent_words_move_state_health_weight_and_maxconn() -> None:
    c, (a, b, _), _ = make(persistence=False)
    c.agent_report(a, parse_agent(b"drain"), 0.0)
    assert a.drain.state is AdminState.DRAIN and a not in c.available
    c.agent_report(a, parse_agent(b"ready down"), 1.0)
    assert a.drain.state is AdminState.READY and not a.drain.healthy
    assert a.health_flags == "/failed_agent_check"
    c.agent_report(a, parse_agent(b"up 50%"), 2.0)
    assert a.drain.healthy and a in c.available
    b.weight_config = b.weight = 4
    c.agent_report(b, parse_agent(b"50% maxconn:1"), 3.0)
    assert (b.weight, b.maxconn) == (2, 1)
    b.rq_active = 1  # full: new sessions go elsewhere
    assert all(c.pick() is not b for _ in range(10))
    c.agent_report(b, parse_agent(b"0%"), 4.0)  # weight 0: out, even when alone
    for ep in c.endpoints:
        if ep is not b:
            c.set_state(ep, AdminState.MAINT, 4.0)
    assert c.pick() is None


def test_outlier_ejection_takes_an_endpoint_out_and_brings_it_back() -> None:
    c, (a, b, d), timers = make(persistence=False)
    c.outlier = OutlierDetector(3, 3, 1.0, 10.0, 50)
    for ep in (a, b, d):
        c.outlier.add(ep)
    c.request_failed(a, True)
    c.request_failed(a, True)
    assert a in c.available
    c.request_failed(a, True)
    assert a not in c.available and a.health_flags == "/failed_outlier_check"
    assert c.outlier_stats.ejections_active == 1
    timers.advance(1.0)
    assert a in c.available and c.outlier_stats.ejections_active == 0


def test_retry_target_is_another_endpoint_within_the_limit_and_the_budget() -> None:
    c, (a, b), _ = make(n=2, persistence=False)
    c.num_retries = 1
    assert c.retry_target(a, 0, False) is b
    assert c.retry_target(a, 1, True) is None
    assert c.stats.upstream_rq_retry_limit_exceeded == 1
    c.budget = RetryBudget(0.0, 1)
    c.retries_active = 1
    assert c.retry_target(a, 0, False) is None  # another request holds the only slot
    assert c.stats.upstream_rq_retry_overflow == 1
    assert c.retry_target(a, 0, True) is b  # its own slot, reused


@pytest.mark.parametrize("policy", ["round_robin", "least_request"])
def test_balancers_spread_over_available_endpoints(policy: str) -> None:
    eps = [Endpoint("127.0.0.1", 9000 + i, 4) for i in range(3)]
    c = Cluster("app", eps, 1.0, 30.0, policy, random.Random(7).random)
    seen = [c.pick() for _ in range(300)]
    counts = [seen.count(ep) for ep in eps]
    assert min(counts) >= 60, counts
