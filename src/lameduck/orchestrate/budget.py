"""`lameduck budget`: the chain of timers a drain lives inside, checked and solved.

Draining is a chain of timeouts that only works if the numbers are ordered: each hop must give up
before the next one does. This module is pure: it takes values already parsed (a loaded
Config, a pod spec as a dict) and returns inequalities and proposals; the CLI reads the files.

The timeline (Kubernetes): t=0 pod deleted, preStop runs (P), SIGTERM, lameduck drains (accepting
work until drain.time T), exit by shutdown.deadline D, SIGKILL at terminationGracePeriodSeconds G.

The inequalities (all must hold):

- ``grace``: P + D + exit margin <= G. The grace period counts from the start of preStop and
  covers the stop after SIGTERM (the classic pitfall: 60 s grace, 55 s hook, a 10 s stop gets
  killed). The margin is the gap itself, so equality is enough (a 30 s grace with a 25 s deadline
  leaves a five-second margin).
- ``keepalive-client``: client keep-alive idle < LB idle, and ``keepalive-lb``: LB idle <
  lameduck's listener idle_timeout. On each hop the side that reuses a connection must give up
  first, or it sends on a socket the other side just closed (nginx's keep-alive race).
- ``deadline``: T + longest request <= D. Work is accepted until T, so a request that starts just
  before T needs its whole duration before the deadline cuts it; this is the
  max_request_duration + drainDuration of the usual grace formula, and subsumes the config's
  own D >= T rule.
- ``idle-close`` (only with ``drain.idle_close: on_response``): T + connection_grace <= D. An
  idle keep-alive connection is then closed only after a response that tells its client, or at
  T + G (HAProxy's ``option idle-close-on-response``): a SIGTERM with connections open exits at
  T + G, and a deadline before it closes them untold, the close that setting exists to avoid.
- ``lb-detection``: LB interval x fall + LB buffer <= hold, where the hold is how long the instance
  is guaranteed to take new work after it is unrouted: the preStop (the pod leaves the Endpoints
  at t=0, `lameduck prestop` fails the health check at t=0) plus, after SIGTERM, what lameduck
  keeps serving: with stop_accepting at_drain_end, T when shutdown.min_drain is unset (it serves
  until T) or min(shutdown.min_drain, T) when set (it exits once idle after min_drain); 0 when
  min_drain is unset and the preStop is `lameduck prestop` (its completion lets an idle process
  exit at once: the hook has already waited for the LB); 0 with stop_accepting immediately.
  LB detection time must be part of the drain sum.

Together they give the usual grace formula: G >= max_request + LB detection + LB_BUFFER + drain +
margin, which is what `solve` proposes.
"""

from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from lameduck.config import Config, StopAccepting, format_duration, parse_duration
from lameduck.drain.event import IdleClose
from lameduck.drain.prestop import Leave, PrestopStrategy
from lameduck.drain.process import min_drain_for

__all__ = [
    "DEFAULT_GRACE",
    "PRESTOP_DEFAULTS",
    "PRESTOP_LEAVES",
    "Budget",
    "BudgetError",
    "Inequality",
    "PodTimers",
    "PreStop",
    "budget_from",
    "check",
    "pod_timers",
    "proposal",
    "render",
    "solve",
]

DEFAULT_GRACE: Final = 30  # Kubernetes' terminationGracePeriodSeconds when unset
# `lameduck prestop` flags that bound the hook's duration (drain_timeout + lb_buffer at most),
# and their values when not given: the prestop subcommand's own defaults (cli.py).
PRESTOP_DEFAULTS: Final[dict[str, float]] = {"--drain-timeout": 20.0, "--lb-buffer": 10.0}
# lameduck prestop --strategy, the default first
PRESTOP_STRATEGIES: Final = tuple(s.value for s in PrestopStrategy)
PRESTOP_LEAVES: Final = tuple(s.value for s in Leave)  # lameduck prestop --leave
_WORKLOAD_KINDS: Final = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "PodTemplate"})
_SLEEP_RE: Final = re.compile(r"(\d+(?:\.\d+)?|\.\d+)([smhd]?)")
_SLEEP_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SHELLS: Final = frozenset({"sh", "bash", "dash", "ash", "zsh", "busybox"})


class BudgetError(ValueError):
    """Bad input (a field missing or malformed); the message names the field. CLI exit 2."""


Term = tuple[str, float]


def _fmt(seconds: float) -> str:
    """Whole seconds stay in seconds (a 60 s grace reads "60s", as Kubernetes writes it)."""
    if seconds == math.inf:
        return "no limit"
    return f"{int(seconds)}s" if seconds == int(seconds) else format_duration(seconds)


@dataclass(frozen=True, slots=True)
class Inequality:
    """One link of the chain with its numbers: ``sum(left) op sum(right)``."""

    name: str
    left: tuple[Term, ...]
    op: str  # "<" or "<="
    right: tuple[Term, ...]
    reason: str  # what breaks when it does not hold

    @property
    def lhs(self) -> float:
        return sum(v for _, v in self.left)

    @property
    def rhs(self) -> float:
        return sum(v for _, v in self.right)

    @property
    def holds(self) -> bool:
        return self.lhs < self.rhs if self.op == "<" else self.lhs <= self.rhs

    def line(self) -> str:
        """`OK  grace: preStop (55s) + ... = 70s <= terminationGracePeriodSeconds (60s)`."""
        def side(terms: tuple[Term, ...]) -> str:
            text = " + ".join(f"{label} ({_fmt(v)})" for label, v in terms)
            return f"{text} = {_fmt(sum(v for _, v in terms))}" if len(terms) > 1 else text

        status = "OK  " if self.holds else "FAIL"
        return f"{status} {self.name}: {side(self.left)} {self.op} {side(self.right)}"

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "holds": self.holds, "op": self.op,
                "left": [[label, v] for label, v in self.left], "lhs": self.lhs,
                "right": [[label, _json_num(v)] for label, v in self.right],
                "rhs": _json_num(self.rhs), "reason": self.reason}


def _json_num(v: float) -> float | None:
    return None if v == math.inf else v


@dataclass(frozen=True, slots=True)
class Budget:
    """Every timer of the chain, in seconds (counts for lb_fall/lb_rise)."""

    grace_period: float  # terminationGracePeriodSeconds
    prestop: float  # how long the preStop hook runs
    drain_time: float  # drain.time (T)
    shutdown_deadline: float  # shutdown.deadline (D)
    min_drain: float | None = None  # shutdown.min_drain (None: unset)
    accept_until_drain_end: bool = True  # shutdown.stop_accepting == at_drain_end
    lameduck_prestop: bool = False  # the preStop hook is `lameduck prestop`
    exit_margin: float = 5.0  # a five-second margin for the framework to unwind
    lb_interval: float = 2.0
    lb_fall: int = 3
    lb_rise: int = 2  # not in the drain chain: how soon a new pod is routable (reported only)
    lb_buffer: float = 5.0  # LB_BUFFER: slack after the LB should have noticed
    lb_idle: float = 60.0  # the LB's idle timeout
    client_idle: float = 30.0  # the clients' keep-alive idle towards the LB
    listener_idle: float = 60.0  # lameduck's listener idle_timeout (min over listeners); 0 = none
    max_request: float = 15.0  # the longest request (max route timeout unless given)
    connection_grace: float = 5.0  # drain.connection_grace (G of the drain, not the pod's)
    idle_close_on_response: bool = False  # drain.idle_close: on_response (exits at T + G)

    @property
    def lb_detection(self) -> float:
        return self.lb_interval * self.lb_fall

    @property
    def effective_min_drain(self) -> float:
        """How long an idle lameduck keeps serving after SIGTERM (the runtime's own rule)."""
        return min_drain_for(self.min_drain, self.drain_time,
                             accepting_until_t=self.accept_until_drain_end,
                             deregistered=self.lameduck_prestop)

    @property
    def serving_after_sigterm(self) -> float:
        """New work guaranteed after SIGTERM: lameduck may exit once idle after min_drain."""
        if not self.accept_until_drain_end:
            return 0.0
        return min(self.effective_min_drain, self.drain_time)

    @property
    def hold(self) -> float:
        return self.prestop + self.serving_after_sigterm


def check(b: Budget) -> list[Inequality]:
    """The four links of the chain (five inequalities, six with ``idle_close: on_response``),
    in timeline order."""
    listener_idle = b.listener_idle if b.listener_idle > 0 else math.inf
    if not b.accept_until_drain_end:
        after = "after SIGTERM (stop_accepting: immediately)"
    elif b.min_drain is not None:
        after = "min(shutdown.min_drain, drain.time)"
    elif b.lameduck_prestop:
        after = "after SIGTERM (lameduck prestop done, min_drain unset)"
    else:
        after = "drain.time (min_drain unset)"
    return [
        Inequality(
            "grace",
            (("preStop", b.prestop), ("shutdown.deadline", b.shutdown_deadline),
             ("exit margin", b.exit_margin)),
            "<=", (("terminationGracePeriodSeconds", b.grace_period),),
            "the kubelet sends SIGKILL mid-drain: the grace period counts from the start of "
            "preStop and covers the stop after SIGTERM (the classic pitfall: 60 s grace, "
            "55 s hook, 10 s stop gets killed)"),
        Inequality(
            "keepalive-client", (("client keep-alive idle", b.client_idle),), "<",
            (("LB idle timeout", b.lb_idle),),
            "the LB closes idle client connections the clients still consider live; their next "
            "request races the close"),
        Inequality(
            "keepalive-lb", (("LB idle timeout", b.lb_idle),), "<",
            (("listener idle_timeout", listener_idle),),
            "lameduck closes idle connections the LB still considers live: the classic race "
            "where a request is sent on a socket the other side just closed"),
        Inequality(
            "deadline",
            (("drain.time", b.drain_time), ("longest request", b.max_request)),
            "<=", (("shutdown.deadline", b.shutdown_deadline),),
            "a request accepted just before drain.time is cut by the deadline (a grace "
            "shorter than the drain deadline: SIGKILL fires mid-drain; the longest legitimate "
            "request dictates the whole chain)"),
        *([Inequality(
            "idle-close",
            (("drain.time", b.drain_time), ("drain.connection_grace", b.connection_grace)),
            "<=", (("shutdown.deadline", b.shutdown_deadline),),
            "with drain.idle_close: on_response an idle connection is closed only after a "
            "response that tells its client, or at drain.time + connection_grace: a deadline "
            "before that closes it untold, and a balancer that sends on it then answers 502")]
          if b.idle_close_on_response else []),
        Inequality(
            "lb-detection",
            (("LB interval x fall", b.lb_detection), ("LB buffer", b.lb_buffer)),
            "<=", (("preStop", b.prestop), (after, b.serving_after_sigterm)),
            "the instance stops taking work before the LB has noticed: requests hit a dead "
            "port (LB detection time belongs in the drain sum)"),
    ]


def _above(x: float) -> float:
    """The smallest whole second strictly greater than x (idle timeouts are set in seconds)."""
    return float(math.floor(x) + 1)


def solve(b: Budget) -> Budget:
    """The smallest values that make the chain hold, raising only what must move.

    External facts stay as given (the preStop hook, the LB's interval/fall/buffer, the client
    idle, the longest request, the margin); lameduck's timers and the grace period grow to fit,
    following the usual grace formula: G = max_request + LB detection + LB_BUFFER + drain + margin.
    """
    min_drain, drain_time, accept = b.min_drain, b.drain_time, b.accept_until_drain_end
    need = b.lb_detection + b.lb_buffer
    if b.hold < need:  # keep serving after SIGTERM until the LB has surely noticed
        extra = need - b.prestop
        accept = True
        if min_drain is not None or b.lameduck_prestop:
            min_drain = max(b.effective_min_drain, extra)
        drain_time = max(drain_time, extra)
    deadline = max(b.shutdown_deadline, drain_time + b.max_request)
    if b.idle_close_on_response:  # the exit with connections open comes at T + G
        deadline = max(deadline, drain_time + b.connection_grace)
    grace = max(b.grace_period, float(math.ceil(b.prestop + deadline + b.exit_margin)))
    lb_idle = b.lb_idle if b.client_idle < b.lb_idle else _above(b.client_idle)
    listener_idle = b.listener_idle
    if listener_idle > 0 and not lb_idle < listener_idle:
        listener_idle = _above(lb_idle)
    return replace(b, grace_period=grace, drain_time=drain_time, shutdown_deadline=deadline,
                   min_drain=min_drain, accept_until_drain_end=accept, lb_idle=lb_idle,
                   listener_idle=listener_idle)


# --- the pod spec --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LameduckPrestop:
    """A ``lameduck prestop`` hook's flags, as parsed (``lameduck simulate`` runs its FSM)."""

    strategy: str
    drain_timeout: float
    lb_buffer: float


@dataclass(frozen=True, slots=True)
class PreStop:
    """How long a preStop hook runs, and how that was worked out."""

    seconds: float
    source: str
    notes: tuple[str, ...] = ()
    lameduck: LameduckPrestop | None = None  # the hook is (or runs) `lameduck prestop`


@dataclass(frozen=True, slots=True)
class PodTimers:
    grace_period: float
    prestop: PreStop
    container: str | None
    notes: tuple[str, ...] = field(default=())


def _pod_spec(doc: object) -> tuple[Mapping[str, Any], str]:
    if not isinstance(doc, Mapping):
        raise BudgetError("pod: expected a YAML mapping (a Pod or a Deployment)")
    kind = doc.get("kind")
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        raise BudgetError(f"spec: missing or not a mapping (kind: {kind or 'unset'})")
    if kind in _WORKLOAD_KINDS or (kind is None and "template" in spec):
        template = spec.get("template")
        inner = template.get("spec") if isinstance(template, Mapping) else None
        if not isinstance(inner, Mapping):
            raise BudgetError(f"spec.template.spec: missing or not a mapping (kind: {kind})")
        return inner, "spec.template.spec"
    if kind not in (None, "Pod"):
        raise BudgetError(f"kind: {kind!r} has no pod spec; expected Pod, Deployment, "
                          "StatefulSet, DaemonSet, ReplicaSet or Job")
    return spec, "spec"


def pod_timers(doc: object, container: str | None = None) -> PodTimers:
    """terminationGracePeriodSeconds and the preStop of the lameduck container.

    The container is the one named `container`, else one named "lameduck", else the first with
    a preStop hook: that is the hook the kubelet waits for before SIGTERM.
    """
    spec, at = _pod_spec(doc)
    raw = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise BudgetError(f"{at}.terminationGracePeriodSeconds: expected a whole number of "
                          f"seconds >= 0, got {raw!r}")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise BudgetError(f"{at}.containers: missing or empty")
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping):
            raise BudgetError(f"{at}.containers[{i}]: expected a mapping")

    def prestop_of(c: Mapping[str, Any]) -> object:
        lifecycle = c.get("lifecycle")
        return lifecycle.get("preStop") if isinstance(lifecycle, Mapping) else None

    names = [c.get("name") for c in containers]
    if container is not None:
        if container not in names:
            raise BudgetError(f"{at}.containers: no container named {container!r} "
                              f"(have: {', '.join(map(str, names))})")
        index = names.index(container)
    elif "lameduck" in names:
        index = names.index("lameduck")
    else:
        index = next((i for i, c in enumerate(containers) if prestop_of(c) is not None), -1)
    if index < 0:
        return PodTimers(float(raw), PreStop(0.0, "no preStop hook"), None,
                         ("no container has a preStop hook: SIGTERM comes at once",))
    hook = prestop_of(containers[index])
    where = f"{at}.containers[{index}].lifecycle.preStop"
    if hook is None:
        return PodTimers(float(raw), PreStop(0.0, "no preStop hook"), str(names[index]),
                         (f"container {names[index]!r} has no preStop hook: SIGTERM comes at "
                          "once",))
    return PodTimers(float(raw), prestop_duration(hook, where), str(names[index]))


def _sleep_seconds(arg: str, where: str) -> float:
    m = _SLEEP_RE.fullmatch(arg)
    if m is None:
        raise BudgetError(f"{where}: cannot read `sleep {arg}` as a duration")
    return float(m.group(1)) * _SLEEP_UNITS[m.group(2)]


def _segments(tokens: Sequence[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for t in tokens:
        if t and all(ch in ";&|\n" for ch in t):
            out.append([])
        else:
            out[-1].append(t)
    return [s for s in out if s]


def _prestop_flags(args: Sequence[str], where: str
                   ) -> tuple[float, list[str], LameduckPrestop]:
    values = dict(PRESTOP_DEFAULTS)
    given: set[str] = set()
    choices = {"--strategy": PRESTOP_STRATEGIES, "--leave": PRESTOP_LEAVES}
    picked = {"--strategy": PRESTOP_STRATEGIES[0], "--leave": Leave.TIMER.value}
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        i += 1
        if flag not in values and flag not in choices:
            continue
        if not eq:
            value = args[i] if i < len(args) else ""
            i += 1
        if flag in choices:  # as argparse checks them when the hook runs
            if value not in choices[flag]:
                raise BudgetError(f"{where}: lameduck prestop {flag}: {value!r} is "
                                  f"not one of {', '.join(choices[flag])}")
            picked[flag] = value
            continue
        try:
            values[flag] = parse_duration(value)
        except ValueError as e:
            raise BudgetError(f"{where}: lameduck prestop {flag}: {e}") from None
        given.add(flag)
    strategy, leave = picked["--strategy"], Leave(picked["--leave"])
    parts = [f"{f} {format_duration(v)}" + ("" if f in given else " (default)")
             for f, v in values.items()]
    if leave is Leave.CONFIRM:  # CLOSING may end early, on the evidence; counted: the bound
        parts.append("--leave confirm (--lb-buffer counted: the bound)")
    hook = LameduckPrestop(strategy, values["--drain-timeout"], values["--lb-buffer"])
    return sum(values.values()), parts, hook


def _command_seconds(cmd: list[str], where: str
                     ) -> tuple[float, str, LameduckPrestop | None] | None:
    while len(cmd) > 1 and os.path.basename(cmd[0]) == "exec":
        cmd = cmd[1:]
    if not cmd:
        return None
    prog = os.path.basename(cmd[0])
    if prog == "sleep":
        if len(cmd) < 2:
            raise BudgetError(f"{where}: `sleep` without a duration")
        total = sum(_sleep_seconds(a, where) for a in cmd[1:])
        return total, f"sleep {' '.join(cmd[1:])}", None
    if prog == "lameduck" and len(cmd) > 1 and cmd[1] == "prestop":
        seconds, parts, hook = _prestop_flags(cmd[2:], where)
        return seconds, "lameduck prestop: " + ", ".join(parts), hook
    return None


def prestop_duration(hook: object, where: str) -> PreStop:
    """How long the kubelet waits on this preStop hook before it sends SIGTERM."""
    if not isinstance(hook, Mapping):
        raise BudgetError(f"{where}: expected a mapping with exec, httpGet or sleep")
    if "sleep" in hook:
        sleep = hook["sleep"]
        secs = sleep.get("seconds") if isinstance(sleep, Mapping) else None
        if isinstance(secs, bool) or not isinstance(secs, int) or secs < 0:
            raise BudgetError(f"{where}.sleep.seconds: expected a whole number >= 0, got {secs!r}")
        return PreStop(float(secs), f"sleep action ({secs}s)")
    if "httpGet" in hook or "tcpSocket" in hook:
        return PreStop(0.0, "httpGet hook", (
            f"{where}: an httpGet hook takes as long as its handler answers; counted as 0s: "
            "pass --prestop with the real duration",))
    exec_ = hook.get("exec")
    command = exec_.get("command") if isinstance(exec_, Mapping) else None
    if not isinstance(command, list) or not command or not all(
            isinstance(c, str) for c in command):
        raise BudgetError(f"{where}.exec.command: expected a list of strings")
    found = _command_seconds(list(command), f"{where}.exec.command")
    if found is not None:
        return PreStop(found[0], found[1], lameduck=found[2])
    if os.path.basename(command[0]) in _SHELLS and "-c" in command[1:-1]:
        script = command[command.index("-c") + 1]
        lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|\n")
        lexer.whitespace = " \t\r"
        try:
            tokens = list(lexer)
        except ValueError as e:
            raise BudgetError(f"{where}.exec.command: cannot parse the shell script: {e}") from None
        total, parts, unknown = 0.0, [], []
        hook: LameduckPrestop | None = None
        for seg in _segments(tokens):
            got = _command_seconds(seg, f"{where}.exec.command")
            if got is None:
                unknown.append(os.path.basename(seg[0]))
            else:
                total += got[0]
                parts.append(got[1])
                hook = hook or got[2]
        if parts:
            notes = tuple(f"{where}: `{u}` counted as 0s (unknown duration; --prestop overrides)"
                          for u in unknown)
            return PreStop(total, "sh -c: " + "; ".join(parts), notes, hook)
    raise BudgetError(f"{where}.exec.command: cannot tell how long {shlex.join(command)!r} runs "
                      "(known: sleep N, lameduck prestop, either inside sh -c); pass --prestop")


# --- from a loaded config ------------------------------------------------------------------------


def budget_from(cfg: Config, pod: PodTimers, *, max_request: float | None = None,
                prestop: float | None = None, **lb: Any) -> Budget:
    """A Budget from the lameduck config, the pod, and the LB's parameters (Budget's names)."""
    if max_request is None:
        timeouts = [(f"listeners[{i}].routes[{j}].timeout", r.timeout)
                    for i, ls in enumerate(cfg.listeners) for j, r in enumerate(ls.routes)]
        unbounded = [name for name, t in timeouts if t == 0]
        if unbounded:
            raise BudgetError(f"{unbounded[0]}: 0s means no limit, so the longest request is "
                              "unknown: pass --max-request")
        if not timeouts:
            raise BudgetError("listeners[].routes: no route timeout to take the longest request "
                              "from: pass --max-request")
        max_request = max(t for _, t in timeouts)
    idles = [ls.idle_timeout for ls in cfg.listeners if ls.idle_timeout > 0]
    return Budget(
        grace_period=pod.grace_period,
        prestop=pod.prestop.seconds if prestop is None else prestop,
        drain_time=cfg.drain.time, shutdown_deadline=cfg.shutdown.deadline,
        min_drain=cfg.shutdown.min_drain,
        accept_until_drain_end=cfg.shutdown.stop_accepting is StopAccepting.AT_DRAIN_END,
        lameduck_prestop="lameduck prestop" in pod.prestop.source,
        listener_idle=min(idles) if idles else 0.0, max_request=max_request,
        connection_grace=cfg.drain.connection_grace,
        idle_close_on_response=cfg.drain.idle_close is IdleClose.ON_RESPONSE, **lb)


def proposal(cfg: Config, old: Budget, new: Budget) -> dict[str, Any]:
    """What to change, as snippets of the pod spec, the lameduck config and the LB settings."""
    out: dict[str, Any] = {"pod": {"spec": {"terminationGracePeriodSeconds":
                                            int(new.grace_period)}}}
    lameduck: dict[str, Any] = {
        "drain": {"time": format_duration(new.drain_time)},
        "shutdown": {"deadline": format_duration(new.shutdown_deadline)},
    }
    if new.min_drain is not None:
        lameduck["shutdown"]["min_drain"] = format_duration(new.min_drain)
    if new.accept_until_drain_end != old.accept_until_drain_end:
        lameduck["shutdown"]["stop_accepting"] = StopAccepting.AT_DRAIN_END.value
    if cfg.hot_restart.parent_shutdown_time < new.drain_time:  # the config demands it >= T
        lameduck["hot_restart"] = {"parent_shutdown_time": format_duration(new.drain_time)}
    if new.listener_idle != old.listener_idle:
        lameduck["listeners"] = [
            {"name": ls.name, "idle_timeout": format_duration(new.listener_idle)}
            for ls in cfg.listeners if 0 < ls.idle_timeout <= new.lb_idle]
    out["lameduck"] = lameduck
    if new.lb_idle != old.lb_idle:
        out["load_balancer"] = {"idle_timeout": format_duration(new.lb_idle)}
    return out


def render(ineqs: Sequence[Inequality]) -> list[str]:
    """One line per inequality, and under each that breaks, what goes wrong."""
    lines: list[str] = []
    for q in ineqs:
        lines.append(q.line())
        if not q.holds:
            lines.append(f"     broken: {q.reason}")
    return lines


def confirmed_leaves(report_dir: str, last: int = 5) -> list[dict[str, Any]]:
    """The ``leave`` records of the newest drain reports in ``report_dir`` (newest first): how
    long a ``leave: confirm`` took (``confirmed_after``; None: the bound won) against its
    bound. Unreadable files are skipped: a budget never fails on a report."""
    import glob
    import json

    out: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(report_dir, "drain-*.json")), reverse=True):
        try:
            with open(path, encoding="utf-8") as f:
                leave = json.load(f).get("leave")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(leave, dict):
            out.append({**leave, "report": os.path.basename(path)})
            if len(out) >= last:
                break
    return out
