"""``lameduck top``: a live terminal view of a running lameduck, read from its admin API only.

Everything shown comes from ``/server_info``, ``/stats?format=json``, ``/clusters?format=json``
and ``/listeners?format=json``, so it watches any lameduck it can reach (over SSH, beside a
drain in progress) without touching it. The ramp's close probability and the proactive window
are computed here from the drain event ``/server_info`` reports, by the rules of docs/drain.md;
per-second rates come from successive samples of the counters.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

EXIT_OK = 0
EXIT_UNREACHABLE = 2  # the admin API did not answer the first sample
REFRESH = 0.25  # seconds between samples (~4 per second)
RATE_WINDOW = 2.0  # seconds of samples a rate is taken over: steadier than one 250 ms step

# The drain's counters (server.drain.*), in the order they happen in a drain.
DRAIN_KINDS: list[tuple[str, str]] = [
    ("cx_drained_by_response", "connections drained by a response"),
    ("cx_drained_proactive", "connections drained proactively"),
    ("cx_closed_at_end", "connections closed at the end"),
    ("cx_reset_listener_close", "reset in the accept queue at listener close"),
    ("completed", "requests completed during the drain"),
    ("refused", "requests refused (going away)"),
    ("cut", "requests cut at the deadline"),
    ("cut_before_response", "  of them before the response (503)"),
    ("cut_reset", "  of them reset mid-response"),
]


class AdminUnreachable(Exception):
    pass


def _get(base: str, path: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace").strip() or e.reason
        raise AdminUnreachable(f"{base}{path}: {e.code} {detail}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise AdminUnreachable(f"{base}{path}: {e}") from None


@dataclass
class Sample:
    """One reading of the admin API, at ``at`` (monotonic seconds)."""

    at: float
    info: dict[str, Any]
    stats: dict[str, int]
    clusters: list[dict[str, Any]]
    listeners: dict[str, str]  # name -> bound host:port


def fetch(admin: str, timeout: float = 1.0) -> Sample:
    base = f"http://{admin}"
    info = _get(base, "/server_info", timeout)
    # the histograms come last in an element of their own (Envoy's): no "name"
    stats = {s["name"]: s["value"]
             for s in _get(base, "/stats?format=json", timeout)["stats"] if "name" in s}
    clusters = _get(base, "/clusters?format=json", timeout)["cluster_statuses"]
    listeners = {}
    for ls in _get(base, "/listeners?format=json", timeout)["listener_statuses"]:
        sa = ls["local_address"]["socket_address"]
        host = f"[{sa['address']}]" if ":" in sa["address"] else sa["address"]
        listeners[ls["name"]] = f"{host}:{sa['port_value']}"
    return Sample(time.monotonic(), info, stats, clusters, listeners)


@dataclass
class History:
    """The last RATE_WINDOW seconds of samples, for per-second rates of counters."""

    samples: deque[Sample] = field(default_factory=deque)

    def add(self, s: Sample) -> None:
        self.samples.append(s)
        while len(self.samples) > 2 and s.at - self.samples[1].at >= RATE_WINDOW:
            self.samples.popleft()

    def rate(self, name: str) -> float | None:
        """Per second over the window; None until two samples exist."""
        if len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        dt = last.at - first.at
        if dt <= 0:
            return None
        return max(0, last.stats.get(name, 0) - first.stats.get(name, 0)) / dt


def ramp_probability(strategy: str, drain_time: float, elapsed: float) -> float:
    """The chance a response drains its connection now (docs/drain.md, per response):
    gradual rises linearly from 0 to 1 over T/2; immediate is always 1."""
    if strategy != "gradual" or elapsed >= drain_time / 2.0:
        return 1.0
    return max(0.0, elapsed / (drain_time / 2.0))


def proactive_window(drain_time: float, grace: float) -> tuple[float, float] | None:
    """[2T/3, T - G): when idle connections no response drained are drained; None when the
    window is empty (G ≥ T/3)."""
    lo, hi = 2.0 * drain_time / 3.0, drain_time - grace
    return (lo, hi) if hi - lo > 1e-9 else None


def bar(done: float, total: float, width: int = 30) -> str:
    """An ASCII bar: readable in any terminal and in plain text, where colour is absent."""
    frac = 1.0 if total <= 0 else min(1.0, max(0.0, done / total))
    n = round(frac * width)
    return "[" + "#" * n + "." * (width - n) + "]"


def _secs(v: float) -> str:
    return f"{v:.2f}s"


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r:.1f}"


STATE_STYLE = {"LIVE": "bold green", "DRAINING": "bold yellow"}


def _drain_lines(info: dict[str, Any]) -> list[Text]:
    d = info.get("drain") or {}
    opts = info.get("command_line_options") or {}
    if "elapsed" not in d:
        return [Text(f"drain     none yet (drain.time {opts.get('drain_time', '?')}, "
                     f"{str(opts.get('drain_strategy', '?')).lower()})")]
    elapsed, t = float(d["elapsed"]), float(d.get("time", 0.0))
    strategy, grace = str(d.get("strategy", "?")), float(d.get("connection_grace", 0.0))
    head = (f"drain     {'active' if d.get('active') else 'over'}, cause {d.get('cause', '?')}, "
            f"{strategy}, T {_secs(t)}, G {_secs(grace)}")
    lines = [Text(head),
             Text(f"elapsed   {_secs(elapsed)}  {bar(elapsed, t)} of T {_secs(t)}")]
    if "deadline" in d:
        deadline = float(d["deadline"])
        lines.append(Text(f"deadline  {_secs(max(0.0, deadline - elapsed))} left  "
                          f"{bar(elapsed, deadline)} of {_secs(deadline)}"))
    if strategy == "gradual":
        p = ramp_probability(strategy, t, elapsed)
        lines.append(Text(f"ramp      P(response drains) {p:4.0%}  {bar(p, 1.0)} "
                          f"(elapsed / (T/2), 100% from {_secs(t / 2)})"))
    else:
        lines.append(Text("ramp      immediate: every response drains"))
    win = proactive_window(t, grace)
    if win is None:
        lines.append(Text("proactive none (G >= T/3): idle connections close at T"))
    else:
        lo, hi = win
        where = "before" if elapsed < lo else "inside" if elapsed < hi else "past"
        lines.append(Text(f"proactive [{_secs(lo)}, {_secs(hi)}) = [2T/3, T-G): now {where}"))
    return lines


def _listener_table(s: Sample, h: History) -> Table:
    t = Table(title="listeners", title_justify="left", box=None, pad_edge=False)
    for col in ("listener", "address", "status", "cx_active", "rq_active", "rq/s",
                "going_away", "drain_close"):
        t.add_column(col, justify="left" if col in ("listener", "address", "status")
                     else "right")
    infos = {ls["name"]: ls for ls in s.info.get("listeners", [])}
    for name in sorted(set(s.listeners) | set(infos)):
        li = infos.get(name, {})
        # HAProxy's frontend words: OPEN accepts, STOP does not; DRAIN: open and draining
        status = ("STOP" if not li.get("accepting", True)
                  else "DRAIN" if li.get("draining") else "OPEN")
        p = f"http.{name}." if f"http.{name}.downstream_cx_active" in s.stats else f"tcp.{name}."
        http = p.startswith("http.")
        t.add_row(name, s.listeners.get(name, li.get("address", "?")), status,
                  str(s.stats.get(p + "downstream_cx_active", 0)),
                  str(s.stats.get(p + "downstream_rq_active", 0)) if http else "-",
                  _rate(h.rate(p + "downstream_rq_total")) if http else "-",
                  str(s.stats.get(p + "downstream_rq_going_away", 0)) if http else "-",
                  str(s.stats.get(p + "downstream_cx_drain_close", 0)))
    return t


def _probes_table(s: Sample) -> Table | None:
    """Each health-check path's probers (HAProxy's words: UP until ``fall`` failing answers,
    then DOWN; GONE: stopped probing) and top talkers; None when no listener has any."""
    rows = []
    for li in s.info.get("listeners", []):
        lp = li.get("lb_probes") or {}
        for p in lp.get("probers", []):
            state = "GONE" if p.get("gone") else "DOWN" if p.get("fell_ago") is not None else "UP"
            iv = p.get("interval")
            rows.append((li.get("name", "?"), "prober", str(p.get("address", "?")), state,
                         f"{p.get('failing', 0)}/{p.get('fall', '?')}",
                         "-" if iv is None else _secs(float(iv)),
                         _secs(float(p.get("last_seen_ago", 0.0)))))
        for t in lp.get("top_talkers", [])[:5]:
            rows.append((li.get("name", "?"), "talker", str(t.get("address", "?")),
                         f"{t.get('requests', 0)} rq, {t.get('connections', 0)} cx", "", "",
                         _secs(float(t.get("last_seen_ago", 0.0)))))
    if not rows:
        return None
    t = Table(title="health-check probers and top talkers (leave: confirm's evidence)",
              title_justify="left", box=None, pad_edge=False)
    for col in ("listener", "kind", "address", "state", "failing", "interval", "last seen"):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    return t


def _drain_table(s: Sample, h: History) -> Table:
    t = Table(title="drain counters (server.drain.*)", title_justify="left", box=None,
              pad_edge=False)
    t.add_column("stat")
    t.add_column("total", justify="right")
    t.add_column("per s", justify="right")
    t.add_column("")
    for name, what in DRAIN_KINDS:
        stat = f"server.drain.{name}"
        t.add_row(name, str(s.stats.get(stat, 0)), _rate(h.rate(stat)), what)
    return t


def _cluster_table(s: Sample) -> Table:
    t = Table(title="cluster endpoints", title_justify="left", box=None, pad_edge=False)
    for col in ("cluster", "endpoint", "admin", "health", "weight", "cx_active", "rq_active",
                "rq_total"):
        t.add_column(col, justify="right" if col in ("weight", "cx_active", "rq_active",
                                                      "rq_total") else "left")
    for c in s.clusters:
        for ep in c.get("host_statuses", []):
            st = ep.get("stats", {})
            flags = str(ep.get("health_flags", ""))
            # HAProxy's words: READY / DRAIN / MAINT for the admin state, UP / DOWN for health
            health = "UP" if ep.get("healthy", flags == "healthy") else f"DOWN ({flags})"
            t.add_row(c.get("name", "?"), ep.get("address", "?"),
                      str(ep.get("admin_state", "?")).upper(), health,
                      str(ep.get("weight", "")), str(st.get("cx_active", 0)),
                      str(st.get("rq_active", 0)), str(st.get("rq_total", 0)))
    return t


def render(admin: str, s: Sample, h: History, error: str | None = None) -> Group:
    """The whole view; ``error``: the last failed sample (the view then shows the last good one
    under it, so a lameduck that exited at the end of its drain leaves its final numbers)."""
    i = s.info
    state = str(i.get("state", "?"))
    prestop = (i.get("prestop") or {}).get("state", "?")
    parts: list[RenderableType] = [
        Text(f"lameduck top  {admin}  pid {i.get('pid', '?')}  {i.get('version', '')}  "
             f"up {i.get('uptime_current_epoch', '?')}  epoch {i.get('hot_restart_epoch', 0)}")]
    if error is not None:  # on top: a short terminal crops the bottom of the view
        parts.append(Text(f"admin API unreachable (retrying): {error}", style="bold red"))
    rq = sum(v for k, v in s.stats.items() if k.startswith("http.")
             and k.endswith(".downstream_rq_active"))
    cx = sum(v for k, v in s.stats.items() if k.endswith(".downstream_cx_active")
             and k.startswith(("http.", "tcp.")))
    line = Text("state     ")
    line.append(state, style=STATE_STYLE.get(state, "bold red"))
    line.append(f"  prestop {prestop}  in flight: requests {rq}, connections {cx}")
    parts.append(line)
    parts.extend(_drain_lines(i))
    parts += [Text(""), _listener_table(s, h), Text("")]
    probes = _probes_table(s)
    if probes is not None:
        parts += [probes, Text("")]
    parts += [_drain_table(s, h), Text(""), _cluster_table(s), Text("")]
    parts.append(Text("Ctrl-C to quit", style="dim"))
    return Group(*parts)


def snapshot(admin: str, out: Console, say: Callable[[str], None]) -> int:
    """One plain-text view (stdout is not a terminal, or --once): two samples a refresh
    apart, so the rates have a value."""
    h = History()
    try:
        h.add(fetch(admin))
        time.sleep(REFRESH)
        s = fetch(admin)
    except AdminUnreachable as e:
        say(f"lameduck top: admin API unreachable: {e}")
        return EXIT_UNREACHABLE
    h.add(s)
    group = render(admin, s, h)
    out.print(Group(*group.renderables[:-1]))  # no "Ctrl-C to quit" in a snapshot
    return EXIT_OK


def live(admin: str, out: Console, say: Callable[[str], None]) -> int:
    """Redraw ~4 times a second on the terminal's alternate screen until Ctrl-C (exit 0; the
    terminal is restored). The first sample must answer (else exit 2, as a typo in the address
    would); after that a failed sample is shown and retried, which is how a lameduck that
    exits at the end of its drain looks."""
    h = History()
    try:
        s = fetch(admin)
    except AdminUnreachable as e:
        say(f"lameduck top: admin API unreachable: {e}")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_OK
    h.add(s)
    try:
        with Live(render(admin, s, h), console=out, screen=True, auto_refresh=False,
                  redirect_stdout=False, redirect_stderr=False) as view:
            next_at = time.monotonic()
            while True:
                next_at += REFRESH
                time.sleep(max(0.0, next_at - time.monotonic()))
                error = None
                try:
                    s = fetch(admin)
                    h.add(s)
                except AdminUnreachable as e:
                    error = str(e)
                view.update(render(admin, s, h, error), refresh=True)
                next_at = max(next_at, time.monotonic() - REFRESH)
    except KeyboardInterrupt:
        pass
    return EXIT_OK
