"""HELP text for the Prometheus families: Envoy writes only `# TYPE`, but the exposition format
(and `promtool check metrics`) wants a `# HELP` per family, and a reader wants it to say what
is counted. Every family lameduck renders has a line here (tests/unit/test_stats.py checks it
against every scope's fields); a listener's or cluster's name is a label, never in the family,
so one line serves every listener. Units: durations are milliseconds, as Envoy's histograms."""

from __future__ import annotations

from typing import Final

__all__ = ["HELP", "help_text"]

HELP: Final[dict[str, str]] = {
    # http.<listener>. (label envoy_http_conn_manager_prefix)
    "envoy_http_downstream_cx_total": "Downstream connections accepted.",
    "envoy_http_downstream_cx_active": "Downstream connections open.",
    "envoy_http_downstream_cx_drain_close":
        "Downstream connections closed because the listener drains.",
    "envoy_http_downstream_cx_drain_time":
        "Milliseconds from the start of the listener's drain to each connection's close.",
    "envoy_http_downstream_cx_http1_active": "HTTP/1.x downstream connections open.",
    "envoy_http_downstream_cx_http2_total": "HTTP/2 downstream connections accepted.",
    "envoy_http_downstream_cx_http2_active": "HTTP/2 downstream connections open.",
    "envoy_http_downstream_cx_http3_total": "HTTP/3 (QUIC) downstream connections accepted.",
    "envoy_http_downstream_cx_http3_active": "HTTP/3 (QUIC) downstream connections open.",
    "envoy_http_downstream_cx_ssl_total": "Downstream TLS connections handshaken.",
    "envoy_http_downstream_cx_upgrades_total":
        "Downstream WebSocket upgrades and CONNECT tunnels established.",
    "envoy_http_downstream_cx_upgrades_active":
        "Downstream WebSocket upgrades and CONNECT tunnels open.",
    "envoy_http_downstream_cx_idle_timeout":
        "Downstream connections closed after idle_timeout without a request.",
    "envoy_http_downstream_cx_max_duration_reached":
        "Downstream connections drained because max_connection_duration passed.",
    "envoy_http_downstream_cx_max_requests_reached":
        "Downstream connections drained after max_requests_per_connection requests.",
    "envoy_http_downstream_cx_send_timeout":
        "Downstream connections reset because the client read nothing for send_timeout.",
    "envoy_http_downstream_cx_protocol_error":
        "Downstream connections closed for an HTTP protocol error by the client.",
    "envoy_http_downstream_cx_destroy_remote_active_rq":
        "Downstream connections the client closed with a request in flight.",
    "envoy_http_downstream_cx_destroy_local_active_rq":
        "Downstream connections lameduck closed with a request in flight.",
    "envoy_http_downstream_rq_total": "Downstream requests received.",
    "envoy_http_downstream_rq_active": "Downstream requests in flight.",
    "envoy_http_downstream_rq_http1_total": "Downstream HTTP/1.x requests received.",
    "envoy_http_downstream_rq_http2_total": "Downstream HTTP/2 requests received.",
    "envoy_http_downstream_rq_http3_total": "Downstream HTTP/3 requests received.",
    "envoy_http_downstream_rq_xx":
        "Downstream responses sent, by status class (label envoy_response_code_class).",
    "envoy_http_downstream_rq_completed": "Downstream requests whose response went out whole.",
    "envoy_http_downstream_rq_header_timeout":
        "Downstream requests whose head did not arrive within request_headers_timeout.",
    "envoy_http_downstream_rq_body_timeout":
        "Downstream requests whose body stalled past request_body_timeout.",
    "envoy_http_downstream_rq_rx_reset": "Downstream requests the client reset or abandoned.",
    "envoy_http_downstream_rq_going_away":
        "Downstream requests answered 503 going away while draining.",
    "envoy_http_downstream_rq_time":
        "Milliseconds from a request's head to its response's completion.",
    # http.<listener>.http2. (label envoy_http_conn_manager_prefix)
    "envoy_http2_goaway_sent": "HTTP/2 GOAWAY frames sent to clients (a drain sends two).",
    "envoy_http2_rx_reset": "HTTP/2 streams the client reset (RST_STREAM received).",
    "envoy_http2_tx_reset": "HTTP/2 streams lameduck reset (RST_STREAM sent, REFUSED_STREAM too).",
    "envoy_http2_rx_messaging_error":
        "HTTP/2 connections ended with a GOAWAY error for a client's protocol violation.",
    "envoy_http2_flood":
        "HTTP/2 connections closed for a flood: rapid reset, PING, SETTINGS or empty frames.",
    # http.<listener>.http3. (label envoy_http_conn_manager_prefix)
    "envoy_http3_goaway_sent": "HTTP/3 GOAWAY frames sent to clients (a drain sends two).",
    "envoy_http3_rx_reset":
        "HTTP/3 streams the client reset (RESET_STREAM) or stopped (STOP_SENDING).",
    "envoy_http3_connections_refused":
        "New QUIC connections refused with CONNECTION_CLOSE (draining, or no room left).",
    "envoy_http3_tx_reset":
        "HTTP/3 streams lameduck reset: malformed, rejected after the final GOAWAY, or cut.",
    "envoy_http3_packets_forwarded":
        "QUIC packets handed to an older process after a hot restart (its connections).",
    "envoy_http3_packets_forward_dropped":
        "QUIC packets for an older process dropped: its forwarding socket was full.",
    # cluster.<name>. (label envoy_cluster_name)
    "envoy_cluster_upstream_cx_total": "Upstream connections opened.",
    "envoy_cluster_upstream_cx_http2_total": "HTTP/2 upstream connections opened.",
    "envoy_cluster_upstream_cx_active": "Upstream connections open.",
    "envoy_cluster_upstream_cx_close_notify":
        "Upstream connections closed after the upstream's GOAWAY or Connection: close.",
    "envoy_cluster_upstream_cx_connect_fail": "Upstream connects that failed.",
    "envoy_cluster_upstream_cx_connect_timeout": "Upstream connects that timed out.",
    "envoy_cluster_upstream_cx_destroy_remote": "Upstream connections the upstream closed.",
    "envoy_cluster_upstream_cx_idle_timeout":
        "Idle upstream connections closed after the cluster's idle_timeout.",
    "envoy_cluster_upstream_cx_connect_ms": "Milliseconds each new upstream connection took.",
    "envoy_cluster_upstream_cx_none_healthy":
        "Requests answered 503 because no endpoint was READY and healthy.",
    "envoy_cluster_upstream_cx_drain_stop_drop":
        "Upstream connections severed by an endpoint's drain stop.",
    "envoy_cluster_upstream_rq_total": "Requests sent upstream.",
    "envoy_cluster_upstream_rq_active": "Upstream requests in flight.",
    "envoy_cluster_upstream_rq_pending_total":
        "Upstream requests that waited for a connection (max_connecting).",
    "envoy_cluster_upstream_rq_pending_active": "Upstream requests waiting for a connection.",
    "envoy_cluster_upstream_rq_xx":
        "Upstream responses received, by status class (label envoy_response_code_class).",
    "envoy_cluster_upstream_rq_timeout": "Upstream requests cut by the route timeout.",
    "envoy_cluster_upstream_rq_per_try_idle_timeout":
        "Upstream tries ended because no byte came for per_try_idle_timeout.",
    "envoy_cluster_upstream_cx_protocol_error":
        "Upstream responses that were no HTTP response (a status outside 100-599): 502 UPE.",
    "envoy_cluster_upstream_rq_rx_reset":
        "Upstream requests whose connection the upstream reset or closed mid-exchange.",
    "envoy_cluster_upstream_rq_tx_reset": "Upstream HTTP/2 streams lameduck reset.",
    "envoy_cluster_upstream_rq_retry": "Upstream requests retried.",
    "envoy_cluster_upstream_rq_retry_success": "Retried upstream requests answered below 500.",
    "envoy_cluster_upstream_rq_retry_overflow":
        "Upstream requests not retried because the retry budget was spent.",
    "envoy_cluster_upstream_rq_retry_limit_exceeded":
        "Upstream requests not retried because retry_policy.num_retries was reached.",
    "envoy_cluster_upstream_rq_time":
        "Milliseconds from a request sent upstream to its response's completion.",
    "envoy_cluster_membership_total": "Endpoints in the cluster.",
    "envoy_cluster_membership_healthy":
        "Endpoints passing health checks, agent checks and outlier detection.",
    "envoy_cluster_membership_excluded":
        "Endpoints given no new sessions: admin state DRAIN or MAINT.",
    "envoy_cluster_lb_persistence_records": "Session persistence records held.",
    # cluster.<name>.health_check.
    "envoy_cluster_health_check_attempt": "Active health checks sent.",
    "envoy_cluster_health_check_success": "Active health checks that passed.",
    "envoy_cluster_health_check_failure":
        "Active health checks answered with an unexpected status or timed out.",
    "envoy_cluster_health_check_network_failure":
        "Active health checks that could not connect or were reset.",
    "envoy_cluster_health_check_healthy": "Endpoints passing active health checks.",
    # cluster.<name>.outlier_detection.
    "envoy_cluster_outlier_detection_ejections_active": "Endpoints ejected now.",
    "envoy_cluster_outlier_detection_ejections_enforced_total": "Ejections carried out.",
    "envoy_cluster_outlier_detection_ejections_overflow":
        "Ejections skipped because max_ejection_percent was reached.",
    "envoy_cluster_outlier_detection_ejections_enforced_consecutive_5xx":
        "Ejections carried out for consecutive 5xx responses.",
    "envoy_cluster_outlier_detection_ejections_enforced_consecutive_gateway_failure":
        "Ejections carried out for consecutive gateway failures (502-504, connect failure, reset).",
    "envoy_cluster_outlier_detection_ejections_detected_consecutive_5xx":
        "Endpoints detected as outliers for consecutive 5xx responses.",
    "envoy_cluster_outlier_detection_ejections_detected_consecutive_gateway_failure":
        "Endpoints detected as outliers for consecutive gateway failures.",
    # tcp.<listener>. (label envoy_tcp_prefix)
    "envoy_tcp_downstream_cx_total": "TCP proxy connections accepted.",
    "envoy_tcp_downstream_cx_active": "TCP proxy connections open.",
    "envoy_tcp_downstream_cx_drain_close":
        "TCP proxy connections closed once quiet, from their drain moment on.",
    "envoy_tcp_downstream_cx_drain_time":
        "Milliseconds from the start of the listener's drain to each connection's close.",
    "envoy_tcp_downstream_cx_no_route":
        "TCP proxy connections closed at once: no READY, healthy endpoint to relay to.",
    "envoy_tcp_downstream_cx_cut":
        "TCP proxy connections reset by the shutdown deadline or an endpoint's drain stop.",
    "envoy_tcp_upstream_connect_fail":
        "TCP proxy connects to an endpoint that failed (the next endpoint is tried).",
    # listener.<listener>. (label envoy_listener_address)
    "envoy_listener_downstream_global_cx_overflow":
        "Connections closed at once: the process held its cap of downstream connections.",
    # listener_manager.
    "envoy_listener_manager_listener_added":
        "Listeners this process serves that the process before it did not.",
    "envoy_listener_manager_listener_modified":
        "Listeners whose config changed from the process before this one.",
    "envoy_listener_manager_listener_removed":
        "Listeners of the process before this one that this one does not serve.",
    "envoy_listener_manager_total_listeners_active": "Listeners serving.",
    "envoy_listener_manager_total_listeners_draining": "Listeners draining.",
    # server.
    "envoy_server_live": "1 while the server is LIVE (not draining).",
    "envoy_server_state": "Server state: 0 LIVE, 1 DRAINING, 2 PRE_INITIALIZING, 3 INITIALIZING.",
    "envoy_server_uptime": "Seconds since the server started.",
    "envoy_server_total_connections": "Downstream connections open on every listener.",
    "envoy_server_hot_restart_epoch": "Hot restart generation: 0 for a first start.",
    "envoy_server_parent_connections":
        "Connections the process before this one (hot restart) still holds while it drains.",
    "envoy_server_prestop_state":
        "lameduck prestop state: 0 SERVING, 1 DRAINING, 2 CLOSING, 3 CLOSED.",
    "envoy_server_workers": "Data-plane worker processes (workers: N).",
    "envoy_server_workers_replaced": "Workers that died or stopped answering and were replaced.",
    "envoy_server_worker_lost_requests": "Requests in flight in a worker that died.",
    "envoy_worker_downstream_cx_total": "Downstream connections this worker accepted.",
    "envoy_worker_downstream_rq_total": "Downstream requests this worker received.",
    # server.drain.
    "envoy_server_drain_active": "1 while a drain is in progress.",
    "envoy_server_drain_completed": "Requests that completed normally during a drain.",
    "envoy_server_drain_refused": "Requests refused as going away during a drain.",
    "envoy_server_drain_cut": "Requests still in flight at the drain deadline, cut.",
    "envoy_server_drain_cut_before_response":
        "Requests cut at the drain deadline that got a 503 instead of a response.",
    "envoy_server_drain_cut_reset":
        "Requests cut at the drain deadline whose connection was reset mid-response.",
    "envoy_server_drain_cx_drained_by_response":
        "Connections drained by a response that closed them (Connection: close).",
    "envoy_server_drain_cx_drained_proactive":
        "Connections closed at their proactive drain moment, not by a response.",
    "envoy_server_drain_cx_closed_at_end": "Connections still open when the drain ended.",
    "envoy_server_drain_cx_reset_listener_close":
        "Connections queued in the kernel, not yet accepted, reset when a listener closed.",
}


def help_text(family: str, stat: str, kind: str) -> str:
    """The family's HELP line: from the table; a family missing from it (a stat added without a
    line here) says which stat it is and where it is described, not a false meaning."""
    known = HELP.get(family)
    if known is not None:
        return known
    return f"The {kind} {stat.rpartition('.')[2]}: see docs/admin.md."
