"""The admin endpoints, Envoy's names and semantics.

Each handler takes the query and returns (status, content type, body). Anything that changes
state is POST-only; a wrong method is 405 with ``Allow``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote

from lameduck.admin.control import AdminControl, NotFound
from lameduck.config import HostPort, parse_duration
from lameduck.stats import render_json, render_prometheus, render_text

Query = dict[str, list[str]]
Reply = tuple[int, str, bytes]
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def parse_query(raw: str) -> Query:
    return parse_qs(raw, keep_blank_values=True)


def to_json(value: Any) -> bytes:
    """JSON (RFC 8259) for an answer: a non-finite float, which JSON cannot carry
    (``Infinity`` breaks strict parsers such as jq's or Go's), is written as null."""
    return (json.dumps(_finite(value), indent=2, allow_nan=False) + "\n").encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def duration_param(q: Query, name: str, default: str) -> float:
    """A duration parameter, finite: checked before anything changes, so a bad request leaves
    no state behind (``1e400h`` parses to infinity, which no timer or JSON answer can hold)."""
    text = q.get(name, [default])[0]
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{name}: invalid duration {text!r}: not a finite number of seconds")
    return seconds


class AdminHandlers:
    def __init__(self, control: AdminControl) -> None:
        self.c = control
        # path -> (method, handler)
        self.routes: dict[str, tuple[str, Callable[[Query], Reply]]] = {
            "/": ("GET", self.home),
            "/drain_listeners": ("POST", self.drain_listeners),
            "/healthcheck/fail": ("POST", self.healthcheck_fail),
            "/healthcheck/ok": ("POST", self.healthcheck_ok),
            "/ready": ("GET", self.ready),
            "/server_info": ("GET", self.server_info),
            "/stats": ("GET", self.stats),
            "/stats/prometheus": ("GET", self.prometheus),
            "/quitquitquit": ("POST", self.quit),
            "/clusters": ("GET", self.clusters),
            "/listeners": ("GET", self.listeners),
            "/prestop": ("POST", self.prestop),
        }

    def handle(self, method: str, path: str, query: str) -> tuple[int, str, bytes, str | None]:
        """Returns (status, content type, body, Allow header or None)."""
        route = self.routes.get(path)
        if route is None and path.startswith("/clusters/"):
            route = ("POST", lambda q: self.endpoint_state(path, q))
        if route is None:
            return 404, TEXT, b"not found\n", None
        want, fn = route
        if method != want and not (want == "GET" and method == "HEAD"):
            allow = "GET, HEAD" if want == "GET" else want
            return 405, TEXT, f"method {method} not allowed; use {want}\n".encode(), allow
        try:
            status, ctype, body = fn(parse_query(query))
        except ValueError as e:
            return 400, TEXT, f"{e}\n".encode(), None
        except NotFound as e:
            return 404, TEXT, f"{e}\n".encode(), None
        return status, ctype, body, None

    def home(self, q: Query) -> Reply:
        lines = [f"{m:5} {p}" for p, (m, _) in sorted(self.routes.items())]
        return 200, TEXT, ("lameduck admin\n" + "\n".join(lines) + "\n").encode()

    def drain_listeners(self, q: Query) -> Reply:
        skip_exit = "skip_exit" in q
        graceful = "graceful" in q
        if skip_exit and not graceful:
            raise ValueError("skip_exit must be used with graceful")
        self.c.drain_listeners(graceful, skip_exit, "inboundonly" in q)
        return 200, TEXT, b"OK\n"

    def healthcheck_fail(self, q: Query) -> Reply:
        self.c.healthcheck_fail()
        return 200, TEXT, b"OK\n"

    def healthcheck_ok(self, q: Query) -> Reply:
        self.c.healthcheck_ok()
        return 200, TEXT, b"OK\n"

    def ready(self, q: Query) -> Reply:
        state = self.c.state_name()
        return (200 if state == "LIVE" else 503), TEXT, f"{state}\n".encode()

    def server_info(self, q: Query) -> Reply:
        return 200, JSON, to_json(self.c.server_info())

    def stats(self, q: Query) -> Reply:
        flt = q.get("filter", [None])[0] or None
        snap = self.c.stats_snapshot()
        if q.get("format", [""])[0] == "json":
            return 200, JSON, render_json(snap, flt).encode()
        if q.get("format", [""])[0] == "prometheus":
            return self.prometheus(q)
        return 200, TEXT, render_text(snap, flt).encode()

    def prometheus(self, q: Query) -> Reply:
        body = render_prometheus(self.c.stats_snapshot())
        return 200, "text/plain; version=0.0.4; charset=utf-8", body.encode()

    def quit(self, q: Query) -> Reply:
        self.c.quit()
        return 200, TEXT, b"OK\n"

    def clusters(self, q: Query) -> Reply:
        """Envoy's /clusters: `cluster::host::stat::value` lines, or JSON with format=json;
        lameduck adds each endpoint's admin_state, agent words and active connections."""
        view = self.c.clusters_view()
        if q.get("format", [""])[0] == "json":
            return 200, JSON, to_json({"cluster_statuses": view})
        lines = []
        for cluster in view:
            name = cluster["name"]
            lines.append(f"{name}::lb_policy::{cluster['lb_policy']}")
            for ep in cluster["host_statuses"]:
                prefix = f"{name}::{ep['address']}"
                for stat, value in ep["stats"].items():
                    lines.append(f"{prefix}::{stat}::{value}")
                for key in ("health_flags", "admin_state", "weight", "maxconn", "agent"):
                    lines.append(f"{prefix}::{key}::{ep[key]}")
        return 200, TEXT, ("\n".join(lines) + "\n").encode()

    def listeners(self, q: Query) -> Reply:
        """Envoy's /listeners: ``name::address`` lines, or with format=json Envoy's
        ``listener_statuses`` with each ``local_address``; the address is the bound one, so a
        listener configured on port 0 shows the port the kernel gave it."""
        addrs = self.c.listener_addresses()
        if q.get("format", [""])[0] == "json":
            statuses = [{"name": name, "local_address": {"socket_address": {
                "address": host, "port_value": port}}} for name, host, port in addrs]
            return 200, JSON, to_json({"listener_statuses": statuses})
        lines = [f"{name}::{HostPort(host, port)}\n" for name, host, port in addrs]
        return 200, TEXT, "".join(lines).encode()

    def prestop(self, q: Query) -> Reply:
        """POST /prestop?strategy=hold-health|deregister-first&drain_timeout=20s&lb_buffer=10s:
        start the preStop FSM here (``lameduck prestop`` calls it, then follows
        /server_info's ``prestop``). A process runs one: asked again with the same strategy,
        the answer is the running one's state (a retried hook follows it); with another,
        409 Conflict naming the one running, not its state passed off as the new one's."""
        strategy = q.get("strategy", ["hold-health"])[0]
        if strategy not in ("hold-health", "deregister-first"):
            raise ValueError(f"unknown strategy {strategy!r}: use hold-health or "
                             "deregister-first")
        drain_timeout = duration_param(q, "drain_timeout", "20s")
        lb_buffer = duration_param(q, "lb_buffer", "10s")
        view = self.c.start_prestop(strategy, drain_timeout, lb_buffer)
        running = view.get("strategy", strategy)
        if running != strategy:
            return 409, TEXT, (
                f"a preStop with strategy {running} is already running (state "
                f"{view['state']}, started {view['elapsed']}s ago); one runs per process: "
                f"POST /prestop?strategy={running} follows it\n").encode()
        return 200, JSON, to_json(view)

    def endpoint_state(self, path: str, q: Query) -> Reply:
        """POST /clusters/<cluster>/endpoints/<host:port>?state=ready|drain|maint"""
        parts = path.split("/")
        if len(parts) != 5 or parts[3] != "endpoints" or not parts[2] or not parts[4]:
            raise NotFound("not found: use /clusters/<cluster>/endpoints/<host:port>")
        states = q.get("state")
        if not states or not states[0]:
            raise ValueError("missing state: use ?state=ready, drain or maint")
        self.c.set_endpoint_state(unquote(parts[2]), unquote(parts[4]), states[0])
        return 200, TEXT, b"OK\n"
