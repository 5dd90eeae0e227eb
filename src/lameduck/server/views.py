"""What the admin API shows of a process, built from its parts (Envoy's /clusters, /listeners,
/server_info shapes): plain functions of the data, no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lameduck.config import HostPort
from lameduck.drain.prestop import Prestop
from lameduck.listeners import Listener
from lameduck.upstream.cluster import Cluster


def fmt_addr(sockname: tuple) -> str:
    """A bound socket's name as the config writes addresses; ``-`` when not bound."""
    return str(HostPort(sockname[0], sockname[1])) if sockname else "-"


def prestop_view(p: Prestop | None, now: float, in_flight: int) -> dict[str, Any]:
    """The preStop state machine, for ``/prestop``."""
    if p is None:
        return {"state": "SERVING"}
    return {
        "state": p.state.name,
        "strategy": p.strategy.value,
        "drain_timeout": p.drain_timeout,
        "lb_buffer": p.lb_buffer,
        "elapsed": round(now - (p.started or 0.0), 3),
        "in_flight": in_flight,
        "timed_out": p.timed_out,
        "in_flight_at_timeout": p.in_flight_at_timeout,
        "transitions": [{"from": t.source.name, "to": t.target.name, "reason": t.reason,
                         "after": round(t.at - (p.started or 0.0), 3)}
                        for t in p.transitions],
    }


def clusters_view(clusters: Iterable[Cluster]) -> list[dict[str, Any]]:
    """Envoy's /clusters?format=json: each endpoint's counters, health flags and states."""
    out = []
    for c in clusters:
        hosts = []
        for ep in c.endpoints:
            hosts.append({
                "address": ep.address,
                "stats": {"cx_active": ep.cx_active, "cx_connect_fail": ep.cx_connect_fail,
                          "cx_total": ep.cx_total, "rq_active": ep.rq_active,
                          "rq_error": ep.rq_error, "rq_success": ep.rq_success,
                          "rq_timeout": ep.rq_timeout, "rq_total": ep.rq_total},
                "health_flags": ep.health_flags,
                "healthy": ep.drain.healthy,
                "admin_state": ep.drain.state.value,
                "weight": ep.weight,
                "maxconn": ep.maxconn,
                "agent": ep.agent_said,
            })
        out.append({"name": c.name, "lb_policy": c.lb_policy, "host_statuses": hosts})
    return out


def listener_addresses(listeners: Iterable[Listener]) -> list[tuple[str, str, int]]:
    """Where each listener is bound: a listener configured on port 0 reports the port the
    kernel gave it (Envoy's /listeners), the configured address until it is bound."""
    out = []
    for ls in listeners:
        if ls.sockname:
            out.append((ls.name, str(ls.sockname[0]), int(ls.sockname[1])))
        else:
            out.append((ls.name, ls.cfg.address.host, ls.cfg.address.port))
    return out


def drain_report_view(reports: Sequence[dict[str, Any]], last: int | None) -> dict[str, Any]:
    """``/drain_report``: the finished drains' reports (kept oldest first), newest first, the
    ``last`` newest of them if given."""
    newest = list(reversed(reports))
    return {"reports": newest if last is None else newest[:last]}
