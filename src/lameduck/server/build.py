"""The config, built into what a process runs: the drain core, stats, clusters (endpoints,
persistence, outlier detection, retries, HTTP/2 pools, health and agent checkers) and listeners.

No socket is opened here (listeners bind in ``start``, checkers in ``start``): a config can be
built and looked at in a test, with a loop whose timers never fire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from lameduck.config import ClusterConfig, Config, drain_settings
from lameduck.drain import ListenerDrain, ProcessDrain
from lameduck.drain.endpoint import AdminState, EndpointDrain, PersistenceTable
from lameduck.drain.health import OutlierDetector
from lameduck.drain.retry import RetryBudget
from lameduck.http2.connection import H2Limits
from lameduck.http2.upstream import H2Pool
from lameduck.listeners import HttpListener, Listener, TcpListener
from lameduck.stats import (
    DrainStats,
    HealthCheckStats,
    Http2Stats,
    Http3Stats,
    HttpStats,
    ListenerManagerStats,
    ServerStats,
    StatsRegistry,
    TcpStats,
)
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.health import AgentChecker, HealthChecker
from lameduck.upstream.pool import Endpoint
from lameduck.upstream.router import Route, Router


@dataclass
class Built:
    """What one process runs, as configured."""

    process: ProcessDrain
    registry: StatsRegistry
    server_stats: ServerStats
    drain_stats: DrainStats
    lm_stats: ListenerManagerStats
    clusters: dict[str, Cluster]
    checkers: list[HealthChecker | AgentChecker]
    listeners: list[Listener]


def build(cfg: Config, loop: asyncio.AbstractEventLoop, rng: Callable[[], float],
          on_change: Callable[[], None]) -> Built:
    """``on_change``: a connection closed or a request ended (the shutdown check)."""
    process = ProcessDrain(*drain_settings(cfg))
    registry = StatsRegistry()
    server_stats = registry.add("server", ServerStats())
    drain_stats = registry.add("server.drain", DrainStats())
    lm_stats = registry.add("listener_manager", ListenerManagerStats())
    clusters: dict[str, Cluster] = {}
    checkers: list[HealthChecker | AgentChecker] = []
    for cc in cfg.clusters:
        cluster = make_cluster(cc, loop, rng)
        if cc.protocol == "h2":
            h2 = cc.http2
            # The upstream is configured, not a stranger: its refusals (REFUSED_STREAM
            # under load) are not a rapid-reset attack.
            limits = H2Limits(initial_window_size=h2.initial_stream_window_size,
                              connection_window=h2.initial_connection_window_size,
                              max_resets_per_window=1 << 20)
            cluster.connector = H2Pool(cluster, limits, h2.max_concurrent_streams, loop).connect
        registry.add(f"cluster.{cc.name}", cluster.stats)
        if cc.outlier_detection is not None:
            registry.add(f"cluster.{cc.name}.outlier_detection", cluster.outlier_stats)
        if cc.health_check is not None:
            hstats = registry.add(f"cluster.{cc.name}.health_check", HealthCheckStats())
            checkers.append(HealthChecker(cluster, loop, cc.health_check, hstats))
        if any(e.agent_port is not None for e in cc.endpoints):
            checkers.append(AgentChecker(cluster, loop, cc.agent_check))
        clusters[cc.name] = cluster
    listeners: list[Listener] = []
    for lc in cfg.listeners:
        ld = process.add_listener(ListenerDrain(lc.name, lc.direction, lc.drain_type))
        if lc.protocol == "tcp":
            assert lc.cluster is not None
            # drain.idle_close is for HTTP: no response ever tells a relayed TCP client, so its
            # connections keep the default (closed once quiet from their proactive moment).
            ld.idle_close_on_response = False
            tstats = registry.add(f"tcp.{lc.name}", TcpStats())
            listeners.append(TcpListener(lc, loop, process, ld, clusters[lc.cluster], tstats,
                                         drain_stats, on_change, rng))
            continue
        router = Router([Route(r.prefix, clusters[r.cluster], r.host, r.timeout,
                               r.per_try_idle_timeout)
                         for r in lc.routes])
        stats = registry.add(f"http.{lc.name}", HttpStats())
        h2stats = registry.add(f"http.{lc.name}.http2", Http2Stats())
        h3stats = (registry.add(f"http.{lc.name}.http3", Http3Stats())
                   if lc.http3 is not None else None)
        listeners.append(HttpListener(lc, loop, process, ld, router, stats, drain_stats,
                                      on_change, rng, h2stats, h3stats))
    for ln in listeners:
        registry.add(f"listener.{ln.name}", ln.listener_stats)
    return Built(process, registry, server_stats, drain_stats, lm_stats, clusters, checkers,
                 listeners)


def make_cluster(cc: ClusterConfig, loop: asyncio.AbstractEventLoop,
                 rng: Callable[[], float]) -> Cluster:
    """A cluster and its endpoints as configured: drain stop, persistence, outlier
    detection, retries; timers on this loop."""
    eps = []
    for e in cc.endpoints:
        drain = EndpointDrain(cc.drain_stop, cc.drop_at_drain_end,
                              cc.clear_persistence_on_drain)
        eps.append(Endpoint(e.host, e.port, cc.max_idle_connections, e.weight, drain,
                            e.agent_port, cc.max_connecting))
    cluster = Cluster(cc.name, eps, cc.connect_timeout, cc.idle_timeout, cc.lb_policy,
                      rng)
    cluster.schedule = loop.call_at
    cluster.clock = loop.time
    for ep, e in zip(eps, cc.endpoints, strict=True):
        if e.state is not AdminState.READY:  # as if set at start: drain stop runs from now
            cluster.set_state(ep, e.state, loop.time())
    p = cc.persistence
    if p is not None:
        cluster.persistence = PersistenceTable(p.timeout, p.max_records)
        cluster.by_cookie = p.type == "cookie"
        cluster.cookie_name = p.cookie_name.encode()
    od = cc.outlier_detection
    if od is not None:
        cluster.outlier = OutlierDetector(od.consecutive_5xx, od.consecutive_gateway_failure,
                                          od.base_ejection_time, od.max_ejection_time,
                                          od.max_ejection_percent)
        for ep in eps:
            cluster.outlier.add(ep)
    rp = cc.retry_policy
    cluster.num_retries = rp.num_retries
    cluster.back_off_base = rp.retry_back_off.base_interval
    cluster.back_off_max = rp.retry_back_off.cap
    cluster.budget = RetryBudget(rp.retry_budget.budget_percent,
                                 rp.retry_budget.min_retry_concurrency)
    return cluster
