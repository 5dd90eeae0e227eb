"""Stat scopes: slotted objects whose int attributes are the stats (Envoy's names).

The hot path bumps them as `stats.downstream_rq_total += 1`: one attribute store, no dict, no
lock, no allocation. Names and kinds are only looked at when someone asks for /stats.
Every field not named in `GAUGES` or `HISTOGRAMS` is a counter (monotonic); gauges go up and
down; a histogram field holds a `Histogram` (milliseconds, Envoy's default buckets) whose
``record`` is a bisect and two adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from lameduck.stats.histogram import Histogram

__all__ = [
    "SCOPE_CLASSES",
    "ClusterStats",
    "ConnectionStats",
    "DrainStats",
    "HealthCheckStats",
    "Http2Stats",
    "Http3Stats",
    "HttpStats",
    "ListenerManagerStats",
    "ListenerStats",
    "OutlierStats",
    "ServerStats",
    "TcpStats",
    "name_histograms",
    "stat_fields",
]


def name_gauges(cls: type, names: set[str]) -> None:
    """Set a scope class's ``GAUGES``. After the class, not in its body: compiled with mypyc,
    a ``ClassVar`` in a dataclass body would become a field (mypyc/mypyc#1122)."""
    setattr(cls, "GAUGES", frozenset(names))  # noqa: B010


def name_histograms(cls: type, names: set[str]) -> None:
    """Set a scope class's ``HISTOGRAMS`` (its `Histogram` fields), after the class like
    ``GAUGES``."""
    setattr(cls, "HISTOGRAMS", frozenset(names))  # noqa: B010


def stat_fields(scope: Any) -> tuple[str, ...]:
    """The stat names of a scope instance or class, in declaration order: those it
    ``PUBLISHED`` when it names them (see ``TcpStats``), else every field."""
    published: frozenset[str] | None = getattr(scope, "PUBLISHED", None)
    return tuple(f.name for f in fields(scope) if published is None or f.name in published)


@dataclass(slots=True)
class ConnectionStats:
    """What every downstream connection counts, whatever it speaks: the connection drain
    manager bumps these for HTTP and TCP listeners alike."""

    downstream_cx_total: int = 0
    downstream_cx_active: int = 0
    downstream_cx_drain_close: int = 0
    # ms from the start of the listener's drain to each connection's close while it drains
    downstream_cx_drain_time: Histogram = field(default_factory=Histogram)


@dataclass(slots=True)
class HttpStats(ConnectionStats):
    """One per listener's HTTP connection manager, rendered under `http.<listener>.`."""

    downstream_cx_http1_active: int = 0
    downstream_cx_http2_total: int = 0
    downstream_cx_http2_active: int = 0
    downstream_cx_http3_total: int = 0  # QUIC connections (listeners[].http3)
    downstream_cx_http3_active: int = 0
    downstream_cx_ssl_total: int = 0
    downstream_cx_upgrades_total: int = 0  # WebSocket upgrades and CONNECT tunnels
    downstream_cx_upgrades_active: int = 0
    downstream_cx_idle_timeout: int = 0
    downstream_cx_max_duration_reached: int = 0  # drained by max_connection_duration
    downstream_cx_max_requests_reached: int = 0  # drained by max_requests_per_connection
    downstream_cx_send_timeout: int = 0  # reset: the client took nothing for send_timeout
    downstream_cx_protocol_error: int = 0
    downstream_cx_destroy_remote_active_rq: int = 0
    downstream_cx_destroy_local_active_rq: int = 0
    downstream_rq_total: int = 0
    downstream_rq_active: int = 0
    downstream_rq_http1_total: int = 0
    downstream_rq_http2_total: int = 0
    downstream_rq_http3_total: int = 0
    downstream_rq_1xx: int = 0
    downstream_rq_2xx: int = 0
    downstream_rq_3xx: int = 0
    downstream_rq_4xx: int = 0
    downstream_rq_5xx: int = 0
    downstream_rq_completed: int = 0
    downstream_rq_header_timeout: int = 0
    downstream_rq_body_timeout: int = 0  # request_body_timeout (nginx client_body_timeout)
    downstream_rq_rx_reset: int = 0
    downstream_rq_going_away: int = 0  # lameduck's: answered 503 "going away" while draining
    downstream_rq_time: Histogram = field(default_factory=Histogram)  # ms, head to response end

    def count_status(self, status: int) -> None:
        """Bump downstream_rq_<N>xx for a response status; statuses outside 100..599 are ignored."""
        klass = status // 100
        if klass == 2:
            self.downstream_rq_2xx += 1
        elif klass == 5:
            self.downstream_rq_5xx += 1
        elif klass == 4:
            self.downstream_rq_4xx += 1
        elif klass == 3:
            self.downstream_rq_3xx += 1
        elif klass == 1:
            self.downstream_rq_1xx += 1


name_gauges(HttpStats, {
    "downstream_cx_active", "downstream_cx_http1_active", "downstream_cx_http2_active",
    "downstream_cx_http3_active", "downstream_cx_upgrades_active", "downstream_rq_active",
})
name_histograms(HttpStats, {"downstream_cx_drain_time", "downstream_rq_time"})


@dataclass(slots=True)
class Http2Stats:
    """The HTTP/2 codec of one listener, rendered under `http.<listener>.http2.` (Envoy's
    codec stat names)."""

    goaway_sent: int = 0  # both GOAWAY frames of a drain count
    rx_reset: int = 0  # streams the client reset
    tx_reset: int = 0  # streams we reset (REFUSED_STREAM included)
    rx_messaging_error: int = 0  # connection errors caused by the client (GOAWAY with an error)
    flood: int = 0  # a flood limit was hit: rapid reset, PING, SETTINGS, empty frames


name_gauges(Http2Stats, set())


@dataclass(slots=True)
class Http3Stats:
    """The HTTP/3 side of one listener (``listeners[].http3``), rendered under
    `http.<listener>.http3.`: the codec's counts, named as the HTTP/2 codec's, and QUIC
    packets that reached this process after a hot restart for a connection an older process
    still drains, handed on to it over a Unix socket."""

    goaway_sent: int = 0  # both GOAWAY frames of a drain count
    rx_reset: int = 0  # streams the client reset (RESET_STREAM) or stopped (STOP_SENDING)
    tx_reset: int = 0  # streams we reset: malformed, rejected past the final GOAWAY, cut
    connections_refused: int = 0  # a new connection refused (draining, or no room)
    packets_forwarded: int = 0
    packets_forward_dropped: int = 0  # that socket's buffer was full: lost, QUIC resends


name_gauges(Http3Stats, set())


@dataclass(slots=True)
class ClusterStats:
    """One per upstream cluster, rendered under `cluster.<name>.`."""

    upstream_cx_total: int = 0
    upstream_cx_http2_total: int = 0
    upstream_cx_active: int = 0
    upstream_cx_close_notify: int = 0  # closed after the upstream's GOAWAY (or Connection: close)
    upstream_cx_connect_fail: int = 0
    upstream_cx_connect_timeout: int = 0
    upstream_cx_destroy_remote: int = 0
    upstream_cx_idle_timeout: int = 0
    upstream_cx_protocol_error: int = 0  # responses that were no HTTP response (502 UPE)
    upstream_rq_total: int = 0
    upstream_rq_active: int = 0
    upstream_rq_pending_total: int = 0  # waited in line for a connection (max_connecting)
    upstream_rq_pending_active: int = 0
    upstream_rq_1xx: int = 0
    upstream_rq_2xx: int = 0
    upstream_rq_3xx: int = 0
    upstream_rq_4xx: int = 0
    upstream_rq_5xx: int = 0
    upstream_rq_timeout: int = 0  # the route timeout ended before the response did
    upstream_rq_per_try_idle_timeout: int = 0  # no upstream byte for per_try_idle_timeout
    upstream_rq_rx_reset: int = 0
    upstream_rq_tx_reset: int = 0
    upstream_rq_retry: int = 0
    upstream_rq_retry_success: int = 0  # a retried request answered below 500
    upstream_rq_retry_overflow: int = 0  # not retried: the retry budget was spent
    upstream_rq_retry_limit_exceeded: int = 0  # not retried: retry_policy.num_retries reached
    upstream_cx_none_healthy: int = 0  # answered 503: no READY, healthy endpoint
    upstream_cx_drain_stop_drop: int = 0  # connections severed by drain stop (0s, drop at end)
    membership_total: int = 0
    membership_healthy: int = 0  # passing health checks, agent and outlier detection
    membership_excluded: int = 0  # not given new sessions: DRAIN or MAINT
    lb_persistence_records: int = 0
    upstream_rq_time: Histogram = field(default_factory=Histogram)  # ms, sent to response end
    upstream_cx_connect_ms: Histogram = field(default_factory=Histogram)  # each new connection

    def count_status(self, status: int) -> None:
        """Bump upstream_rq_<N>xx for an upstream status; statuses outside 100..599 are ignored."""
        klass = status // 100
        if klass == 2:
            self.upstream_rq_2xx += 1
        elif klass == 5:
            self.upstream_rq_5xx += 1
        elif klass == 4:
            self.upstream_rq_4xx += 1
        elif klass == 3:
            self.upstream_rq_3xx += 1
        elif klass == 1:
            self.upstream_rq_1xx += 1


name_gauges(ClusterStats, {"upstream_cx_active", "upstream_rq_active",
                           "upstream_rq_pending_active", "membership_total",
                           "membership_healthy", "membership_excluded",
                           "lb_persistence_records"})
name_histograms(ClusterStats, {"upstream_rq_time", "upstream_cx_connect_ms"})


@dataclass(slots=True)
class TcpStats(HttpStats):
    """One per `protocol: tcp` listener, rendered under `tcp.<listener>.` (Envoy tcp_proxy).
    Its ``downstream_cx_drain_close`` counts connections closed once quiet, from their
    proactive drain moment.

    Each relayed connection is one exchange (admitted, routed, retried, settled and logged by
    the same ``proxy.exchange.Exchange`` as an HTTP request), so this is an ``HttpStats`` for the
    exchange's books; only Envoy tcp_proxy's names are ``PUBLISHED``."""

    downstream_cx_no_route: int = 0  # closed at once: no READY, healthy endpoint to relay to
    downstream_cx_cut: int = 0  # reset: the shutdown deadline, or its endpoint's drain stop
    upstream_connect_fail: int = 0  # an endpoint that could not be reached (then the next)


setattr(TcpStats, "PUBLISHED", frozenset({  # noqa: B010  (after the class: see name_gauges)
    "downstream_cx_total", "downstream_cx_active", "downstream_cx_drain_close",
    "downstream_cx_drain_time", "downstream_cx_no_route", "downstream_cx_cut",
    "upstream_connect_fail"}))
name_gauges(TcpStats, set(HttpStats.GAUGES))  # type: ignore[attr-defined]
name_histograms(TcpStats, set(HttpStats.HISTOGRAMS))  # type: ignore[attr-defined]


@dataclass(slots=True)
class HealthCheckStats:
    """Active health checks of a cluster, rendered under `cluster.<name>.health_check.`."""

    attempt: int = 0
    success: int = 0
    failure: int = 0  # a check answered with an unexpected status (or timed out)
    network_failure: int = 0  # a check that could not connect or was reset
    healthy: int = 0  # endpoints passing (gauge)


name_gauges(HealthCheckStats, {"healthy"})


@dataclass(slots=True)
class OutlierStats:
    """Passive outlier detection, rendered under `cluster.<name>.outlier_detection.`."""

    ejections_active: int = 0
    ejections_enforced_total: int = 0
    ejections_overflow: int = 0
    ejections_enforced_consecutive_5xx: int = 0
    ejections_enforced_consecutive_gateway_failure: int = 0
    ejections_detected_consecutive_5xx: int = 0
    ejections_detected_consecutive_gateway_failure: int = 0


name_gauges(OutlierStats, {"ejections_active"})


@dataclass(slots=True)
class ServerStats:
    """Process-wide, rendered under `server.`.

    `state` uses Envoy's numbering (0 LIVE, 1 DRAINING, 2 PRE_INITIALIZING, 3 INITIALIZING) so
    existing alerts keep working; `live` is 1 while LIVE; `uptime` is in seconds.
    """

    live: int = 0
    state: int = 0
    uptime: int = 0
    total_connections: int = 0
    hot_restart_epoch: int = 0  # 0 for a first start, +1 per hot restart
    parent_connections: int = 0  # connections the previous process still holds while it drains
    prestop_state: int = 0  # 0 SERVING, 1 DRAINING, 2 CLOSING, 3 CLOSED (lameduck prestop)


name_gauges(ServerStats, {"live", "state", "uptime", "total_connections", "hot_restart_epoch",
                          "parent_connections", "prestop_state"})


@dataclass(slots=True)
class DrainStats:
    """What draining did, rendered under `server.drain.`: the proof of "no failed request"."""

    active: int = 0  # 1 while a drain is in progress
    completed: int = 0  # requests that completed normally during a drain
    refused: int = 0  # requests answered "going away" (503 + close, or REFUSED_STREAM)
    cut: int = 0  # requests still in flight at the deadline, all cut
    cut_before_response: int = 0  # ... of which got a 503 instead of a response
    cut_reset: int = 0  # ... of which had their connection reset mid-response
    cx_drained_by_response: int = 0  # connections closed via a response (Connection: close)
    cx_drained_proactive: int = 0  # connections drained at their proactive moment
    cx_closed_at_end: int = 0  # connections still open when the drain ended
    # Connections the kernel had queued, not yet accepted, when a listener closed: reset,
    # so their clients were refused although they connected in time.
    cx_reset_listener_close: int = 0


name_gauges(DrainStats, {"active"})


@dataclass(slots=True)
class ListenerManagerStats:
    """Listener lifecycle, rendered under `listener_manager.`."""

    listener_added: int = 0
    listener_removed: int = 0
    listener_modified: int = 0
    total_listeners_active: int = 0
    total_listeners_draining: int = 0


name_gauges(ListenerManagerStats, {"total_listeners_active", "total_listeners_draining"})


@dataclass(slots=True)
class ListenerStats:
    """One per listener, rendered under `listener.<name>.` (Envoy's listener scope)."""

    # Accepted and closed at once: the process held its downstream connection cap, derived
    # from RLIMIT_NOFILE so that upstream connects still find a descriptor (Envoy's
    # downstream_global_cx_overflow; HAProxy derives its maxconn from ulimit-n alike).
    downstream_global_cx_overflow: int = 0


name_gauges(ListenerStats, set())


SCOPE_CLASSES: tuple[type, ...] = (
    HttpStats,
    Http2Stats,
    Http3Stats,
    ClusterStats,
    TcpStats,
    HealthCheckStats,
    OutlierStats,
    ServerStats,
    DrainStats,
    ListenerManagerStats,
    ListenerStats,
)
"""Every scope class, so tests can check each one's GAUGES against its fields."""
