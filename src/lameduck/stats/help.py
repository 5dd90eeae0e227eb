"""HELP text for the Prometheus families: Envoy writes only `# TYPE`, but the exposition format
(and `promtool check metrics`) wants a `# HELP` per family. Families not in the table get a
generic line naming the stat, so every family has one."""

from __future__ import annotations

from typing import Final

__all__ = ["HELP", "help_text"]

HELP: Final[dict[str, str]] = {
    # http.<listener>.
    "envoy_http_downstream_cx_total": "Downstream connections accepted.",
    "envoy_http_downstream_cx_active": "Downstream connections open.",
    "envoy_http_downstream_cx_drain_close": "Downstream connections closed by draining.",
    "envoy_http_downstream_cx_drain_time":
        "Milliseconds from the start of the listener's drain to each connection's close.",
    "envoy_http_downstream_rq_total": "Downstream requests received.",
    "envoy_http_downstream_rq_active": "Downstream requests in flight.",
    "envoy_http_downstream_rq_xx": "Downstream responses by status class.",
    "envoy_http_downstream_rq_completed": "Downstream requests whose response went out whole.",
    "envoy_http_downstream_rq_going_away":
        "Requests answered 503 going away while draining.",
    "envoy_http_downstream_rq_time":
        "Milliseconds from a request's head to its response's completion.",
    # cluster.<name>.
    "envoy_cluster_upstream_cx_total": "Upstream connections opened.",
    "envoy_cluster_upstream_cx_active": "Upstream connections open.",
    "envoy_cluster_upstream_cx_connect_fail": "Upstream connects that failed.",
    "envoy_cluster_upstream_cx_connect_timeout": "Upstream connects that timed out.",
    "envoy_cluster_upstream_cx_connect_ms": "Milliseconds each new upstream connection took.",
    "envoy_cluster_upstream_rq_total": "Requests sent upstream.",
    "envoy_cluster_upstream_rq_active": "Upstream requests in flight.",
    "envoy_cluster_upstream_rq_xx": "Upstream responses by status class.",
    "envoy_cluster_upstream_rq_timeout": "Upstream requests cut by the route timeout.",
    "envoy_cluster_upstream_rq_retry": "Upstream requests retried.",
    "envoy_cluster_upstream_rq_time":
        "Milliseconds from a request sent upstream to its response's completion.",
    "envoy_cluster_membership_total": "Endpoints in the cluster.",
    "envoy_cluster_membership_healthy": "Endpoints passing health checks.",
    # tcp.<listener>.
    "envoy_tcp_downstream_cx_total": "TCP proxy connections accepted.",
    "envoy_tcp_downstream_cx_active": "TCP proxy connections open.",
    "envoy_tcp_downstream_cx_drain_time":
        "Milliseconds from the start of the listener's drain to each connection's close.",
    # server.
    "envoy_server_live": "1 while the server is LIVE (not draining).",
    "envoy_server_state": "Server state: 0 LIVE, 1 DRAINING, 2 PRE_INITIALIZING, 3 INITIALIZING.",
    "envoy_server_uptime": "Seconds since the server started.",
    "envoy_server_hot_restart_epoch": "Hot restart generation: 0 for a first start.",
    "envoy_server_drain_active": "1 while a drain is in progress.",
    "envoy_server_workers": "Data-plane worker processes (workers: N).",
    "envoy_server_workers_replaced": "Workers that died or stopped answering and were replaced.",
    "envoy_server_worker_lost_requests": "Requests in flight in a worker that died.",
    "envoy_worker_downstream_cx_total": "Downstream connections this worker accepted.",
    "envoy_worker_downstream_rq_total": "Downstream requests this worker received.",
    "envoy_server_drain_completed": "Requests that completed normally during a drain.",
    "envoy_server_drain_refused": "Requests refused as going away during a drain.",
    "envoy_server_drain_cut": "Requests still in flight at the drain deadline, cut.",
}


def help_text(family: str, stat: str, kind: str) -> str:
    """The family's HELP line: from the table, else a generic one naming the stat's field (the
    part after the scope, which carries no listener or cluster name)."""
    known = HELP.get(family)
    if known is not None:
        return known
    return f"lameduck {kind} {stat.rpartition('.')[2]}, Envoy's stat name (docs/admin.md)."
