"""The admin endpoints, Envoy's names and semantics.

Each handler takes the query and returns (status, content type, body). Anything that changes
state is POST-only; a wrong method is 405 with ``Allow``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote

from lameduck.admin.control import AdminControl, NotFound
from lameduck.config import HostPort, parse_duration
from lameduck.stats import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    StatKind,
    of_type,
    process_metrics,
    render_json,
    render_process,
    render_prometheus,
    render_text,
    used_only,
)

Query = dict[str, list[str]]
Reply = tuple[int, str, bytes]
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"
# Envoy's /stats?type= values
STAT_TYPES: dict[str, StatKind | None] = {"All": None, "Counters": COUNTER, "Gauges": GAUGE,
                                          "Histograms": HISTOGRAM}
LOG_LEVELS = ("debug", "info", "warning", "error")
# Envoy's other level names, mapped onto Python's
LOG_ALIASES = {"trace": "debug", "warn": "warning", "critical": "critical", "off": "off"}
# config keys whose value is a secret itself (not a path to one): shown as "[redacted]"
SECRET_KEYS = ("token", "password", "secret", "private_key", "passphrase")

log = logging.getLogger("lameduck.admin")


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


def redact(value: Any) -> Any:
    """The config with every secret value replaced: a key named like a secret (``token``,
    ``*_password``, ...) unless it names a file (``token_file``, a TLS ``key`` path), which is
    shown, as a path says where the secret is, not what."""
    if isinstance(value, dict):
        return {k: ("[redacted]" if _secret_key(k) and v is not None else redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def _secret_key(key: str) -> bool:
    key = key.lower()
    return not key.endswith(("_file", "_path")) and any(
        key == word or key.endswith("_" + word) for word in SECRET_KEYS)


class AdminHandlers:
    def __init__(self, control: AdminControl) -> None:
        self.c = control
        # the request's method, for a route that answers several (GET /logging lists the
        # levels, POST /logging sets them)
        self.method = "GET"
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
            "/help": ("GET", self.help),
            "/reset_counters": ("POST", self.reset_counters),
            "/config_dump": ("GET", self.config_dump),
            "/logging": ("GET, POST", self.logging),
            "/drain_report": ("GET", self.drain_report),
        }
        # routes under a prefix, the handler given the path; the key is the pattern /help shows
        self.prefix_routes: dict[str, tuple[str, Callable[[str, Query], Reply]]] = {
            "/clusters/<cluster>/endpoints/<host:port>": ("POST", self.endpoint_state),
        }

    def handle(self, method: str, path: str, query: str) -> tuple[int, str, bytes, str | None]:
        """Returns (status, content type, body, Allow header or None)."""
        route = self.routes.get(path)
        if route is None:
            for pattern, (m, under) in self.prefix_routes.items():
                if path.startswith(pattern.partition("<")[0]):
                    route = (m, functools.partial(under, path))
                    break
        if route is None:
            return 404, TEXT, b"not found\n", None
        want, fn = route
        allowed = want.split(", ")
        if "GET" in allowed:
            allowed.insert(allowed.index("GET") + 1, "HEAD")
        if method not in allowed:
            return (405, TEXT, f"method {method} not allowed; use {want}\n".encode(),
                    ", ".join(allowed))
        self.method = "GET" if method == "HEAD" else method
        try:
            status, ctype, body = fn(parse_query(query))
        except ValueError as e:
            status, ctype, body = 400, TEXT, f"{e}\n".encode()
        except NotFound as e:
            status, ctype, body = 404, TEXT, f"{e}\n".encode()
        log.debug("admin: %s %s: %d", method, path, status)
        return status, ctype, body, None

    def home(self, q: Query) -> Reply:
        """Admin home page: every endpoint with its method."""
        lines = [f"{m:5} {p}" for p, (m, _) in sorted(self.routes.items())]
        return 200, TEXT, ("lameduck admin\n" + "\n".join(lines) + "\n").encode()

    def help(self, q: Query) -> Reply:
        """Print the admin commands, one per line with what it does (Envoy's /help)."""
        table: list[tuple[str, str, Callable[..., Reply]]] = [
            (p, m, fn) for p, (m, fn) in self.routes.items()]
        table += [(p, m, fn) for p, (m, fn) in self.prefix_routes.items()]
        lines = [f"  {p}: {_summary(fn)} ({m})\n" for p, m, fn in sorted(table)]
        return 200, TEXT, ("admin commands are:\n" + "".join(lines)).encode()

    def drain_listeners(self, q: Query) -> Reply:
        """Drain the listeners (graceful, skip_exit, inboundonly as in Envoy)."""
        skip_exit = "skip_exit" in q
        graceful = "graceful" in q
        if skip_exit and not graceful:
            raise ValueError("skip_exit must be used with graceful")
        self.c.drain_listeners(graceful, skip_exit, "inboundonly" in q)
        return 200, TEXT, b"OK\n"

    def healthcheck_fail(self, q: Query) -> Reply:
        """Fail health checks: not ready, every response drains its connection."""
        self.c.healthcheck_fail()
        return 200, TEXT, b"OK\n"

    def healthcheck_ok(self, q: Query) -> Reply:
        """Undo /healthcheck/fail."""
        self.c.healthcheck_ok()
        return 200, TEXT, b"OK\n"

    def ready(self, q: Query) -> Reply:
        """200 LIVE when live, else 503 and the state's name."""
        state = self.c.state_name()
        return (200 if state == "LIVE" else 503), TEXT, f"{state}\n".encode()

    def server_info(self, q: Query) -> Reply:
        """Server state, uptime, drain and preStop as JSON."""
        return 200, JSON, to_json(self.c.server_info())

    def stats(self, q: Query) -> Reply:
        """The stats, Envoy's name: value lines (filter, format=json, usedonly, type).

        ``usedonly``: the stats non-zero now or seen non-zero by an earlier read (a reset
        counter stays); ``type``: Envoy's All, Counters, Gauges or Histograms.
        """
        flt = q.get("filter", [None])[0] or None
        kind_name = q.get("type", ["All"])[0] or "All"
        if kind_name not in STAT_TYPES:
            raise ValueError(f"type: unknown {kind_name!r}: use All, Counters, Gauges or "
                             "Histograms")
        snap = self.c.stats_snapshot()
        snap = of_type(snap, STAT_TYPES[kind_name])
        if "usedonly" in q:
            snap = used_only(snap, self.c.used_stats())
        if q.get("format", [""])[0] == "json":
            return 200, JSON, render_json(snap, flt).encode()
        if q.get("format", [""])[0] == "prometheus":
            return self.prometheus(q)
        return 200, TEXT, render_text(snap, flt).encode()

    def prometheus(self, q: Query) -> Reply:
        """The stats in Prometheus text exposition, Envoy's names and labels, then the
        client libraries' ``process_*`` metrics of the process that answers (the main one)."""
        body = render_prometheus(self.c.stats_snapshot()) + render_process(process_metrics())
        return 200, "text/plain; version=0.0.4; charset=utf-8", body.encode()

    def quit(self, q: Query) -> Reply:
        """Exit at once, without a drain."""
        self.c.quit()
        return 200, TEXT, b"OK\n"

    def clusters(self, q: Query) -> Reply:
        """Per endpoint: Envoy's cluster::host::stat::value lines, or JSON with format=json.

        Lameduck adds each endpoint's admin_state, agent words and active connections."""
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
        """Each listener's name::address (format=json: Envoy's listener_statuses).

        The address is the bound one, so a listener configured on port 0 shows the port the
        kernel gave it."""
        addrs = self.c.listener_addresses()
        if q.get("format", [""])[0] == "json":
            statuses = [{"name": name, "local_address": {"socket_address": {
                "address": host, "port_value": port}}} for name, host, port in addrs]
            return 200, JSON, to_json({"listener_statuses": statuses})
        lines = [f"{name}::{HostPort(host, port)}\n" for name, host, port in addrs]
        return 200, TEXT, "".join(lines).encode()

    def prestop(self, q: Query) -> Reply:
        """Start the preStop health-check FSM (strategy, drain_timeout, lb_buffer, leave).

        POST /prestop?strategy=hold-health|deregister-first&drain_timeout=20s&lb_buffer=10s
        [&leave=timer|confirm]
        starts the preStop FSM here (``lameduck prestop`` calls it, then follows
        /server_info's ``prestop``). A process runs one: asked again with the same strategy,
        the answer is the running one's state (a retried hook follows it); with another,
        409 Conflict naming the one running, not its state passed off as the new one's."""
        strategy = q.get("strategy", ["hold-health"])[0]
        if strategy not in ("hold-health", "deregister-first"):
            raise ValueError(f"unknown strategy {strategy!r}: use hold-health or "
                             "deregister-first")
        drain_timeout = duration_param(q, "drain_timeout", "20s")
        lb_buffer = duration_param(q, "lb_buffer", "10s")
        leave = q.get("leave", ["timer"])[0]
        if leave not in ("timer", "confirm"):
            raise ValueError(f"unknown leave {leave!r}: use timer or confirm")
        view = self.c.start_prestop(strategy, drain_timeout, lb_buffer, leave)
        running = view.get("strategy", strategy)
        if running != strategy:
            return 409, TEXT, (
                f"a preStop with strategy {running} is already running (state "
                f"{view['state']}, started {view['elapsed']}s ago); one runs per process: "
                f"POST /prestop?strategy={running} follows it\n").encode()
        return 200, JSON, to_json(view)

    def drain_report(self, q: Query) -> Reply:
        """GET /drain_report[?last=N]: the last drains' reports (counts, settings, a 100 ms
        timeline), newest first; ``lameduck report`` draws one."""
        last: int | None = None
        if "last" in q:
            text = q["last"][0]
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"last: want a count >= 1, got {text!r}")
            last = int(text)
        return 200, JSON, to_json(self.c.drain_reports(last))

    def endpoint_state(self, path: str, q: Query) -> Reply:
        """Set an endpoint's admin state: ?state=ready, drain or maint."""
        parts = path.split("/")
        if len(parts) != 5 or parts[3] != "endpoints" or not parts[2] or not parts[4]:
            raise NotFound("not found: use /clusters/<cluster>/endpoints/<host:port>")
        states = q.get("state")
        if not states or not states[0]:
            raise ValueError("missing state: use ?state=ready, drain or maint")
        self.c.set_endpoint_state(unquote(parts[2]), unquote(parts[4]), states[0])
        return 200, TEXT, b"OK\n"

    def reset_counters(self, q: Query) -> Reply:
        """Reset all counters to zero; gauges are untouched (Envoy's, for use with /stats)."""
        self.c.reset_counters()
        return 200, TEXT, b"OK\n"

    def config_dump(self, q: Query) -> Reply:
        """The effective config, defaults filled in, as JSON; secret values redacted."""
        dump = {"@type": "lameduck.BootstrapConfigDump", **self.c.config_dump()}
        return 200, JSON, to_json({"configs": [redact(dump)]})

    def logging(self, q: Query) -> Reply:
        """List the loggers' levels (GET); set them: POST ?level=L for all, ?<logger>=L one."""
        if q and self.method != "POST":
            raise ValueError("setting a level changes state: use POST /logging?level=...")
        known = self.c.loggers()
        levels: dict[str, str] = {}  # all checked before any is set
        for name, values in q.items():
            level = values[0].lower()
            level = LOG_ALIASES.get(level, level)
            if level not in (*LOG_LEVELS, *LOG_ALIASES.values()):
                raise ValueError(f"{name}: unknown level {values[0]!r}: use "
                                 f"{', '.join(LOG_LEVELS)} (or trace, warn, critical, off)")
            if name != "level" and name not in known:
                raise ValueError(f"unknown logger {name!r}: one of {', '.join(sorted(known))}")
            levels[name] = level
        for name, level in levels.items():
            self.c.set_log_level(None if name == "level" else name, level)
        lines = [f"  {name}: {level}\n" for name, level in sorted(self.c.loggers().items())]
        return 200, TEXT, ("active loggers:\n" + "".join(lines)).encode()


def _summary(fn: Callable[..., Any]) -> str:
    """What /help says of a route: its handler's docstring's first line."""
    doc = (fn.__doc__ or "").strip()
    return doc.splitlines()[0].rstrip(".") if doc else "(undocumented)"
