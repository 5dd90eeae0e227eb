"""A cluster: endpoints, how new sessions are spread over them, and their drain and health.

The decisions are the drain core's (``drain/endpoint.py``: drain-stop order; ``drain/health.py``:
rise/fall, agent words, outlier ejection; ``drain/retry.py``: the retry budget) and the
balancer's (``balancer.py``); this holds the state they act on and carries out what they decide:
which endpoints take new sessions, which records are honoured, which connections are severed.
Timers come from the wiring (``schedule``), so nothing here owns a loop.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import Any

from lameduck.drain.endpoint import (
    AdminState,
    ConnAction,
    Layer,
    PersistenceTable,
    Route,
    decide,
)
from lameduck.drain.health import AgentReport, OutlierDetector, agent_weight
from lameduck.drain.retry import RetryBudget
from lameduck.stats import ClusterStats, OutlierStats
from lameduck.upstream.balancer import LeastRequest, RoundRobin
from lameduck.upstream.errlog import ErrorLog
from lameduck.upstream.pool import Endpoint

Schedule = Callable[[float, Callable[[], None]], Any]
"""``loop.call_at``: run a callback at a loop time."""


class Cluster:
    """Endpoints balanced over those READY and healthy, with persistence and drain stop."""

    __slots__ = ("available", "back_off_base", "back_off_max", "balancer", "budget",
                 "by_cookie", "clock", "connect_timeout", "connector", "cookie_name",
                 "endpoints", "errlog", "idle_timeout", "lb_policy", "name", "num_retries",
                 "on_change", "on_record", "outlier", "outlier_stats", "persistence",
                 "retries_active", "schedule", "stats", "uneject_timer")

    def __init__(
        self,
        name: str,
        endpoints: list[Endpoint],
        connect_timeout: float,
        idle_timeout: float,
        lb_policy: str = "round_robin",
        rng: Callable[[], float] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError(f"cluster {name!r} has no endpoints")
        self.name = name
        self.endpoints = endpoints
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.stats = ClusterStats()
        self.lb_policy = lb_policy
        if lb_policy == "least_request":
            self.balancer: RoundRobin | LeastRequest = LeastRequest(rng or random.random)
        else:
            self.balancer = RoundRobin()
        # How exchanges get an upstream of a multiplexed (HTTP/2) cluster, set by the wiring
        # (upstream/ does not import the codecs); None: a keep-alive HTTP/1.1 pool.
        self.connector: Callable[[Endpoint], Any] | None = None
        self.schedule: Schedule | None = None
        self.uneject_timer: Any = None  # what ``schedule`` returned (a TimerHandle)
        self.clock: Callable[[], float] = time.monotonic  # the wiring gives loop.time
        self.on_change: Callable[[], None] | None = None
        # A persistence record made or moved here (a worker tells the others: a client's
        # next connection may land in any of them)
        self.on_record: Callable[[str, Endpoint], None] | None = None
        self.persistence: PersistenceTable[str, Endpoint] | None = None
        self.by_cookie = False
        self.cookie_name = b""
        self.outlier: OutlierDetector | None = None
        self.outlier_stats = OutlierStats()
        self.num_retries = 2
        # A never-sent request retried on the same endpoint waits first (Envoy's
        # retry_back_off defaults: 25 ms base, ten times that at most).
        self.back_off_base = 0.025
        self.back_off_max = 0.25
        self.budget = RetryBudget()
        self.retries_active = 0
        self.available: list[Endpoint] = []
        self.errlog: ErrorLog | None = None  # made at the first error, with the loop's clock
        self.refresh()

    # -- which endpoints take new sessions ------------------------------------------------------
    def refresh(self) -> None:
        """Recompute the endpoints that take new sessions (after any state or health change)."""
        self.available = [ep for ep in self.endpoints if ep.drain.up and ep.weight > 0]
        st = self.stats
        st.membership_total = len(self.endpoints)
        st.membership_healthy = sum(1 for ep in self.endpoints if ep.drain.healthy)
        st.membership_excluded = sum(
            1 for ep in self.endpoints if ep.drain.state is not AdminState.READY)
        if self.on_change is not None:
            self.on_change()

    def pick(self, exclude: Endpoint | None = None) -> Endpoint | None:
        """A READY, healthy endpoint with room (``maxconn``), or None: nothing to send to."""
        eps = self.available
        if exclude is None and len(eps) == 1:
            ep: Endpoint | None = eps[0]
        else:
            ep = self.balancer.pick(eps, exclude)
        if ep is not None and ep.maxconn and ep.rq_active >= ep.maxconn:
            room = [e for e in eps if e is not exclude and (not e.maxconn
                                                            or e.rq_active < e.maxconn)]
            ep = self.balancer.pick(room) if room else None
        return ep

    def pick_sticky(self, key: str | None, layer: Layer, now: float,
                    cookie: bool) -> tuple[Endpoint | None, str | None]:
        """The drain-stop decision for a new session with persistence: (endpoint, the key its
        record is now under). ``cookie``: the key is a cookie's value, and a new record gets a
        new random one (the cookie is rewritten); else the key is the source IP. ``key`` None:
        the client brought no cookie."""
        table = self.persistence
        assert table is not None
        found = table.lookup(key, now) if key is not None else None
        d = decide(True, found.drain if found is not None else None, layer, now)
        if d.route is Route.STICK and found is not None:
            table.record(key, found, now)  # type: ignore[arg-type]
            if self.on_record is not None:  # refreshed: in every worker
                self.on_record(key, found)  # type: ignore[arg-type]
            return found, key
        if d.discard and key is not None:
            table.discard(key)
        ep = self.pick()
        if ep is None:
            return None, None
        if cookie or key is None:
            key = os.urandom(12).hex()  # a new record: the cookie is (re)written
        table.record(key, ep, now)
        self.stats.lb_persistence_records = len(table)
        if self.on_record is not None:
            self.on_record(key, ep)
        return ep, key

    def retry_started(self, retrying: bool) -> bool:
        """A request (or a TCP connection) is tried again: counted, and its first retry takes
        a slot in the budget it holds until ``retry_ended``, however many more tries it
        makes. Returns True: it is retrying now."""
        self.stats.upstream_rq_retry += 1
        if not retrying:
            self.retries_active += 1
        return True

    def retry_ended(self, answered: bool) -> None:
        """A request that retried has ended (any way): its slot in the budget is free."""
        self.retries_active -= 1
        if answered:
            self.stats.upstream_rq_retry_success += 1

    def connect_failed(self, ep: Endpoint) -> None:
        """A connection to ``ep`` failed before the request went (counted, and towards its
        outlier ejection)."""
        self.stats.upstream_cx_connect_fail += 1
        self.upstream_error(ep, "connect failure")
        self.request_failed(ep, True)

    def upstream_error(self, ep: Endpoint, cause: str) -> None:
        """A connect failure, reset or timeout, in the log with the endpoint, rate-limited
        per endpoint and cause (``errlog.py``): a dead origin cannot flood the log."""
        el = self.errlog
        if el is None:
            el = self.errlog = ErrorLog(self.name, self.clock, self.schedule)
        el.failed(ep.address, cause)

    def rebind(self, key: str, ep: Endpoint, now: float) -> None:
        """A retried request moved to ``ep``: its record follows it."""
        if self.persistence is not None:
            self.persistence.record(key, ep, now)
            if self.on_record is not None:
                self.on_record(key, ep)

    def retry_allowed(self, tries: int, retrying: bool) -> bool:
        """May a request that has made ``tries`` retries make one more (``num_retries``, the
        budget)? A refusal is counted. ``retrying``: this request is retrying already; its slot
        in the budget is reused, as Envoy releases the previous retry before it asks for the
        next."""
        st = self.stats
        if tries >= self.num_retries:
            st.upstream_rq_retry_limit_exceeded += 1
            return False
        if not self.budget.allows(st.upstream_rq_active, self.retries_active - retrying):
            st.upstream_rq_retry_overflow += 1
            return False
        return True

    def retry_target(self, failed: Endpoint, tries: int, retrying: bool) -> Endpoint | None:
        """Another endpoint for a retry, if the policy and the budget allow one."""
        if not self.retry_allowed(tries, retrying):
            return None
        return self.pick(failed)

    # -- admin state, health --------------------------------------------------------------------
    def find(self, address: str) -> Endpoint | None:
        for ep in self.endpoints:
            if ep.address == address:
                return ep
        return None

    def set_state(self, ep: Endpoint, state: AdminState, now: float) -> None:
        """READY / DRAIN / MAINT from the admin API or an agent; starts the drain stop timer."""
        was = ep.drain.state
        ep.drain.set_state(state, now)
        if state is not AdminState.READY and was is AdminState.READY:
            ep.close_all()  # idle connections: no new session will want them (sticky ones
            # open their own)
        self._apply_connections(ep, now)
        at = ep.drain.next_change(now)
        if at is not None and self.schedule is not None:
            self.schedule(at, lambda: self._apply_connections(ep, at))
        self.refresh()

    def _apply_connections(self, ep: Endpoint, now: float) -> None:
        if ep.drain.connections(now) is ConnAction.DROP:
            self.stats.upstream_cx_drain_stop_drop += ep.sever()

    def health_changed(self, ep: Endpoint) -> None:
        """One of the endpoint's health sources changed: refresh who takes new sessions."""
        if ep.update_health():
            if not ep.drain.healthy:
                ep.close_all()
            self.refresh()

    def agent_report(self, ep: Endpoint, report: AgentReport, now: float) -> None:
        """An agent's words: admin state, up/down, weight and maxconn (HAProxy agent-check)."""
        changed = False
        if report.admin is not None and report.admin is not ep.drain.state:
            self.set_state(ep, report.admin, now)
        if report.up is not None and report.up != ep.agent_up:
            ep.agent_up = report.up
            self.health_changed(ep)
        if report.weight_percent is not None:
            weight = agent_weight(ep.weight_config, report.weight_percent)
            if weight != ep.weight:
                ep.weight = weight
                changed = True
        if report.maxconn is not None:
            ep.maxconn = report.maxconn
        if changed:
            self.refresh()

    # -- passive health (outlier detection) -----------------------------------------------------
    def request_failed(self, ep: Endpoint, gateway: bool) -> None:
        """A 5xx, or a connect failure, reset or timeout (``gateway``)."""
        ep.rq_error += 1
        od = self.outlier
        if od is None:
            return
        if od.failure(ep, self.clock(), gateway):
            ep.ejected = True
            self.health_changed(ep)
            self._arm_uneject()
        self._sync_outlier()

    def _arm_uneject(self) -> None:
        """One timer, at the earliest ejection's end."""
        od = self.outlier
        if od is None or self.schedule is None:
            return
        if self.uneject_timer is not None:
            self.uneject_timer.cancel()
            self.uneject_timer = None
        at = od.next_uneject()
        if at is not None:
            self.uneject_timer = self.schedule(at, self._uneject)

    def request_ok(self, ep: Endpoint) -> None:
        ep.rq_success += 1
        od = self.outlier
        if od is not None:
            od.success(ep, self.clock())

    def _uneject(self) -> None:
        self.uneject_timer = None
        od = self.outlier
        if od is None:
            return
        for ep in od.uneject_due(self.clock()):
            ep.ejected = False
            self.health_changed(ep)
        self._arm_uneject()
        self._sync_outlier()

    def _sync_outlier(self) -> None:
        od = self.outlier
        if od is None:
            return
        s = self.outlier_stats
        s.ejections_active = od.ejections_active
        s.ejections_enforced_total = od.ejections_enforced_total
        s.ejections_overflow = od.ejections_overflow
        s.ejections_enforced_consecutive_5xx = od.ejections_enforced_consecutive_5xx
        s.ejections_enforced_consecutive_gateway_failure = (
            od.ejections_enforced_consecutive_gateway_failure)
        s.ejections_detected_consecutive_5xx = od.ejections_detected_consecutive_5xx
        s.ejections_detected_consecutive_gateway_failure = (
            od.ejections_detected_consecutive_gateway_failure)

    # -- pools ------------------------------------------------------------------------------------
    def expire_idle(self, now: float) -> None:
        """Close pooled connections idle longer than ``idle_timeout`` (0 = keep them); drop
        expired persistence records."""
        if self.persistence is not None:
            self.persistence.expire(now)
            self.stats.lb_persistence_records = len(self.persistence)
        if self.idle_timeout <= 0:
            return
        for ep in self.endpoints:
            self.stats.upstream_cx_idle_timeout += ep.expire(now, self.idle_timeout)

    def close_idle(self) -> None:
        for ep in self.endpoints:
            ep.close_all()
