"""What the admin API shows of a process, built from its parts (Envoy's /clusters, /listeners,
/server_info shapes): plain functions of the data, no I/O."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from lameduck import __version__
from lameduck.config import Config, HostPort, format_duration
from lameduck.drain import ProcessDrain
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
        "leave": p.leave.value,
        "awaiting": list(p.awaited),
        "confirmed_after": None if p.confirmed_after is None else round(p.confirmed_after, 3),
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


def add_cluster_counts(view: list[dict[str, Any]], other: Iterable[dict[str, Any]]) -> None:
    """Another process's ``clusters_view`` added into ``view`` (a main process's, whose
    endpoint states and health are the truth): request and connection counts summed."""
    for oc in other:
        mine = next((c for c in view if c["name"] == oc["name"]), None)
        if mine is None:
            continue
        for oh in oc["host_statuses"]:
            h = next((h for h in mine["host_statuses"] if h["address"] == oh["address"]), None)
            if h is not None:
                for k, v in oh["stats"].items():
                    h["stats"][k] += v


def server_info(process: ProcessDrain, cfg: Config, config_path: str | None, *, now: float,
                started_mono: float, started_wall: float, started_all: float, epoch: int,
                prestop: dict[str, Any], listeners: list[dict[str, Any]]) -> dict[str, Any]:
    """Envoy's ``/server_info``, plus the drain under way, the preStop FSM and each
    listener (``listeners``: from the data plane, which knows who accepts)."""
    uptime = now - started_mono
    d = cfg.drain
    ev = process.last_event
    drain: dict[str, Any] = {"active": process.drain_active(now)}
    if ev is not None:
        drain.update(
            cause=ev.cause.value,
            started=round(started_wall + (ev.start - started_mono), 3),
            elapsed=round(now - ev.start, 3),
            strategy=ev.strategy.value,
            time=ev.time,
            connection_grace=ev.grace,
        )
        if process.shutdown is not None:
            drain["deadline"] = process.exit_after
    return {
        "version": f"lameduck/{__version__}",
        "state": process.state.name,
        "uptime_current_epoch": f"{int(uptime)}s",
        "uptime_all_epochs": f"{int(time.time() - started_all)}s",
        "hot_restart_epoch": epoch,
        "pid": os.getpid(),
        "command_line_options": {
            "config_path": config_path or "",
            "drain_time": format_duration(d.time),
            "drain_strategy": d.strategy.value.capitalize(),
        },
        "drain": drain,
        "prestop": prestop,
        "listeners": listeners,
    }


def config_dump(cfg: Config, config_path: str | None, started_wall: float) -> dict[str, Any]:
    """The loaded config, defaults filled in (what ``lameduck run`` serves with)."""
    return {
        "config_path": config_path or "",
        "last_updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_wall)),
        "bootstrap": cfg.model_dump(mode="json"),
    }
