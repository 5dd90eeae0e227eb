"""A simulation scenario: the YAML ``lameduck budget`` reads (the pod spec, the lameduck config,
the load balancer's values) plus what only a simulation needs (the fleet, the clients, the
rollout). Loaded and checked here; every error names the field it is about, as
``lameduck validate`` does for a config.

The file (paths are relative to it; docs/simulate.md has every key with its default)::

    pod: deployment.yaml          # Pod or Deployment: grace period, preStop, replicas, strategy
    config: lameduck.yaml         # the lameduck config (unset: the embedded default)
    lameduck: {drain: {strategy: immediate}}   # merged over it (to compare one change)
    lb: {kind: endpoints, interval: 2s, fall: 3, rise: 2, propagation: {median: 1s, p99: 4s}}
    fleet: {replicas: 50, capacity: 200}
    clients: [{count: 20000, protocol: http1, rate: 0.5, duration: {median: 20ms, p99: 1s}}]
    rollout: {at: 30s, max_surge: 25%, max_unavailable: 0, readiness: {median: 5s, p99: 15s}}
    duration: 5m
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from lameduck.config import (
    Config,
    ConfigError,
    default_config,
    load_config_text,
    parse_config_text,
    parse_duration,
    strict_yaml_documents,
)
from lameduck.drain.event import IdleClose
from lameduck.drain.prestop import PrestopStrategy
from lameduck.orchestrate.budget import BudgetError, PodTimers, pod_timers
from lameduck.sim.walk import Proto


class ScenarioError(ValueError):
    """A bad scenario; the message names the file and the field."""


class Reconnect(StrEnum):
    IMMEDIATE = "immediate"  # a new connection as soon as the old one is gone
    BACKOFF = "backoff"  # lameduck's client backoff (drain/backoff.py): 0-5 s, then exponential
    NEXT_REQUEST = "next_request"  # when the client has its next request (after a think time)


class LbKind(StrEnum):
    ENDPOINTS = "endpoints"  # Kubernetes Endpoints: out at deletion, seen after a delay
    HEALTH_CHECK = "health_check"  # an LB health-checking the listener (HAProxy's inter/fall)


class Balance(StrEnum):
    RANDOM = "random"
    ROUND_ROBIN = "round_robin"
    LEAST_CONN = "least_conn"


@dataclass(frozen=True, slots=True)
class Dist:
    """A duration with a long tail: lognormal with this median and 99th percentile."""

    median: float
    p99: float


@dataclass(frozen=True, slots=True)
class ClientClass:
    name: str
    count: int
    protocol: Proto
    rate: float  # requests per second per client while connected (0: none, e.g. WebSocket)
    duration: Dist
    reconnect: Reconnect
    retry_refused: bool  # a refused connect or a going-away 503 is retried once
    retry_reset: bool  # a request cut at the deadline is retried once


@dataclass(frozen=True, slots=True)
class Lb:
    kind: LbKind = LbKind.ENDPOINTS
    interval: float = 2.0
    fall: int = 3
    rise: int = 2
    buffer: float = 5.0
    idle: float = 60.0
    client_idle: float = 30.0
    propagation: Dist = Dist(1.0, 4.0)
    nodes: int = 1
    balance: Balance = Balance.RANDOM
    retries: int = 0
    phase: float | None = None  # health_check: the checks' offset (None: random per pod)


@dataclass(frozen=True, slots=True)
class Rollout:
    at: float
    max_surge: int
    max_unavailable: int
    readiness: Dist


@dataclass(frozen=True, slots=True)
class SingleDrain:
    at: float
    instances: int  # pods 0..n-1 are deleted at ``at`` (preStop, SIGTERM, SIGKILL)


@dataclass(frozen=True, slots=True)
class PrestopModel:
    """The preStop hook: a plain wait, or ``lameduck prestop``'s health-check FSM."""

    seconds: float
    strategy: PrestopStrategy | None = None  # None: a sleep (the kubelet just waits)
    drain_timeout: float = 0.0
    lb_buffer: float = 0.0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    config: Config
    pod: PodTimers
    prestop: PrestopModel
    lb: Lb
    replicas: int
    capacity: float  # requests in flight one instance serves
    clients: tuple[ClientClass, ...]
    rollout: Rollout | None
    drain: SingleDrain | None
    duration: float
    warmup: float = 5.0  # the clients' first connections are spread over this
    seed: int = 1
    sample: float = 0.1  # the timelines' step
    resolution: float = 0.005  # connects and closes are handled in steps this long
    max_request: float = 15.0  # for --solve (lameduck budget's --max-request)
    exit_margin: float = 5.0
    source: str = "<scenario>"

    def with_lameduck(self, **sections: Mapping[str, Any]) -> Scenario:
        """The same scenario with config sections replaced (``--solve`` tries values)."""
        data = self.config.model_dump(mode="json", exclude_none=True)
        for key, value in sections.items():
            data[key] = {**data.get(key, {}), **value}
        try:
            cfg = load_config_text(yaml.safe_dump(data), f"{self.source}: lameduck")
        except ConfigError as e:
            raise ScenarioError(str(e)) from None
        return replace(self, config=cfg)


class _Fields:
    """Reads a mapping, naming ``where.key`` in every error; unknown keys are errors."""

    def __init__(self, data: object, where: str, source: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{source}: {where or 'top level'}: expected a mapping, "
                                f"got {type(data).__name__}")
        self.data = data
        self.where = where
        self.source = source
        self.seen: set[str] = set()

    def name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {self.name(key)}: {message}")

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def sub(self, key: str) -> _Fields:
        return _Fields(self.get(key, {}) or {}, self.name(key), self.source)

    def duration(self, key: str, default: float | None) -> float:
        raw = self.get(key)
        if raw is None:
            if default is None:
                raise self.fail(key, "required (a duration: 5s, 250ms, 2m)")
            return default
        try:
            value = parse_duration(raw)
        except ValueError as e:
            raise self.fail(key, str(e)) from None
        if value < 0:
            raise self.fail(key, f"must be >= 0, got {raw!r}")
        return value

    def number(self, key: str, default: float, lo: float = 0.0) -> float:
        raw = self.get(key, default)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            raise self.fail(key, f"expected a number, got {raw!r}")
        if raw < lo:
            raise self.fail(key, f"must be >= {lo:g}, got {raw!r}")
        return float(raw)

    def count(self, key: str, default: int | None, lo: int = 1) -> int:
        raw = self.get(key, default)
        if raw is None:
            raise self.fail(key, f"required (a whole number >= {lo})")
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < lo:
            raise self.fail(key, f"expected a whole number >= {lo}, got {raw!r}")
        return raw

    def choice(self, key: str, enum: type[StrEnum], default: StrEnum) -> Any:
        raw = self.get(key, default.value)
        try:
            return enum(raw)
        except ValueError:
            allowed = ", ".join(e.value for e in enum)
            raise self.fail(key, f"expected one of {allowed}, got {raw!r}") from None

    def flag(self, key: str, default: bool) -> bool:
        raw = self.get(key, default)
        if not isinstance(raw, bool):
            raise self.fail(key, f"expected true or false, got {raw!r}")
        return raw

    def dist(self, key: str, default: Dist) -> Dist:
        raw = self.get(key)
        if raw is None:
            return default
        if not isinstance(raw, Mapping):  # one duration: always that long
            v = self.duration(key, None)
            return Dist(v, v)
        f = _Fields(raw, self.name(key), self.source)
        median = f.duration("median", None)
        p99 = f.duration("p99", median)
        if p99 < median:
            raise f.fail("p99", f"must be >= median ({median:g}s), got {p99:g}s")
        f.done()
        return Dist(median, p99)

    def done(self) -> None:
        extra = sorted(set(map(str, self.data)) - self.seen)
        if extra:
            raise self.fail(extra[0], f"unknown key (known: {', '.join(sorted(self.seen))})")


def _scale(raw: object, replicas: int, name: str, up: bool, fields: _Fields) -> int:
    """Kubernetes' maxSurge (rounded up) / maxUnavailable (rounded down): a count or N%."""
    if isinstance(raw, bool):
        raise fields.fail(name, f"expected a count or a percentage, got {raw!r}")
    if isinstance(raw, int) and raw >= 0:
        return raw
    if isinstance(raw, str) and (m := re.fullmatch(r"(\d+(?:\.\d+)?)%", raw.strip())):
        exact = float(m.group(1)) * replicas / 100.0
        return math.ceil(exact - 1e-9) if up else math.floor(exact + 1e-9)
    raise fields.fail(name, f"expected a count or a percentage (25%), got {raw!r}")


def _read(path: Path, what: str, source: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{source}: {what}: cannot read {path}: {e.strerror or e}") from None


def _yaml_file(path: Path, what: str, source: str) -> object:
    """The first document of a YAML file, parsed as lameduck parses its config: a duplicate
    key is refused, not silently resolved to the last one."""
    text = _read(path, what, source)
    try:
        docs = [d for d in strict_yaml_documents(text) if d is not None]
    except yaml.YAMLError as e:
        # one line, as the config loader words it: where, then the problem
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ScenarioError(f"{source}: {what}: {path}: {where}invalid YAML: {problem}") from None
    if not docs:
        raise ScenarioError(f"{source}: {what}: {path} holds no YAML document")
    return docs[0]


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _prestop_model(pod: PodTimers) -> PrestopModel:
    """A ``lameduck prestop`` hook runs the real FSM with the flags ``lameduck budget`` parsed
    from it; any other hook is a wait of its duration."""
    hook = pod.prestop.lameduck
    if hook is None:
        return PrestopModel(pod.prestop.seconds)
    return PrestopModel(pod.prestop.seconds, PrestopStrategy(hook.strategy),
                        hook.drain_timeout, hook.lb_buffer)


def load_scenario(path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
                  ) -> Scenario:
    """Read a scenario file (``overrides``: top-level keys replaced, for tests and --solve)."""
    source = os.fspath(path)
    data = _yaml_file(Path(source), "scenario", source)
    if overrides:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{source}: top level: expected a mapping")
        data = {**data, **overrides}
    return scenario_from(data, Path(source).parent, source)


def scenario_from(data: object, base: Path, source: str = "<scenario>") -> Scenario:
    """A scenario from parsed YAML; relative paths are taken from ``base``."""
    top = _Fields(data, "", source)
    # the pod spec: a file or inline, as `lameduck budget --pod` reads it
    pod_raw = top.get("pod")
    if isinstance(pod_raw, str):
        pod_doc = _yaml_file(base / pod_raw, "pod", source)
    elif isinstance(pod_raw, Mapping):
        pod_doc = pod_raw
    elif pod_raw is None:
        pod_doc = {"kind": "Pod", "spec": {"containers": [{"name": "lameduck"}]}}
    else:
        raise top.fail("pod", "expected a file name or a Pod/Deployment mapping")
    try:
        pod = pod_timers(pod_doc, top.get("container"))
    except BudgetError as e:
        raise ScenarioError(f"{source}: pod: {e}") from None
    spec = pod_doc.get("spec", {}) if isinstance(pod_doc, Mapping) else {}
    # the lameduck config: a file, the embedded default, and inline changes over it
    cfg_path = top.get("config")
    over = top.get("lameduck") or {}
    if not isinstance(over, Mapping):
        raise top.fail("lameduck", "expected a mapping of config sections")
    if cfg_path is not None and not isinstance(cfg_path, str):
        raise top.fail("config", f"expected a file name, got {cfg_path!r}")
    try:
        if cfg_path is None:
            cfg_data = default_config().model_dump(mode="json", exclude_none=True)
        else:
            # parsed as `lameduck run` parses it (a duplicate key is refused)
            path = base / cfg_path
            cfg_data = parse_config_text(_read(path, "config", source),
                                         f"{source}: config: {path}")
        merged = _deep_merge(dict(cfg_data), over)
        config = load_config_text(yaml.safe_dump(merged), f"{source}: lameduck")
    except ConfigError as e:
        raise ScenarioError(str(e)) from None
    if config.drain.idle_close is IdleClose.ON_RESPONSE:
        # The walk (sim/walk.py) runs the default's rules over arrays; a result for the other
        # setting would be the default's, mislabelled.
        raise ScenarioError(f"{source}: lameduck: drain.idle_close: on_response is not "
                            f"simulated (the walk models immediate); simulate with immediate")
    # the load balancer: lameduck budget's --lb-* values and what it does between checks
    f = top.sub("lb")
    lb = Lb(
        kind=f.choice("kind", LbKind, LbKind.ENDPOINTS),
        interval=f.duration("interval", 2.0), fall=f.count("fall", 3), rise=f.count("rise", 2),
        buffer=f.duration("buffer", 5.0), idle=f.duration("idle", 60.0),
        client_idle=f.duration("client_idle", 30.0),
        propagation=f.dist("propagation", Dist(1.0, 4.0)), nodes=f.count("nodes", 1),
        balance=f.choice("balance", Balance, Balance.RANDOM),
        retries=f.count("retries", 0, lo=0),
        phase=None if f.get("phase") is None else f.duration("phase", None))
    if lb.interval <= 0:
        raise f.fail("interval", "must be > 0")
    f.done()
    # the fleet
    f = top.sub("fleet")
    replicas = f.count("replicas", spec.get("replicas") if isinstance(
        spec.get("replicas"), int) and spec.get("replicas") > 0 else None)
    capacity = f.number("capacity", 100.0, lo=1e-9)
    f.done()
    # the clients
    raw_clients = top.get("clients")
    if not isinstance(raw_clients, list) or not raw_clients:
        raise top.fail("clients", "required: a list of client classes ({count, protocol, ...})")
    clients = []
    for i, raw in enumerate(raw_clients):
        c = _Fields(raw, f"clients[{i}]", source)
        protocol = c.get("protocol", "http1")
        protos = {"http1": Proto.H1, "http2": Proto.H2, "websocket": Proto.WS,
                  "once": Proto.ONCE}
        if protocol not in protos:
            raise c.fail("protocol", f"expected one of {', '.join(protos)}, got {protocol!r}")
        proto = protos[protocol]
        rate = c.number("rate", 0.0 if proto is Proto.WS else 1.0)
        if proto is not Proto.WS and rate <= 0:
            raise c.fail("rate", f"must be > 0 for {protocol} clients (requests per second)")
        retry = c.sub("retry")
        clients.append(ClientClass(
            name=str(c.get("name", f"{protocol}-{i}")), count=c.count("count", None),
            protocol=proto, rate=rate, duration=c.dist("duration", Dist(0.02, 0.5)),
            reconnect=c.choice("reconnect", Reconnect, Reconnect.IMMEDIATE),
            retry_refused=retry.flag("refused", False), retry_reset=retry.flag("reset", False)))
        retry.done()
        c.done()
    # what happens: a rolling update or one drain
    rollout = drain = None
    if top.get("rollout") is not None and top.get("drain") is not None:
        raise top.fail("drain", "give either rollout or drain, not both")
    if top.get("rollout") is not None:
        f = top.sub("rollout")
        strat = spec.get("strategy", {}) if isinstance(spec.get("strategy"), Mapping) else {}
        ru = strat.get("rollingUpdate", {}) if isinstance(strat.get("rollingUpdate"),
                                                          Mapping) else {}
        surge = _scale(f.get("max_surge", ru.get("maxSurge", "25%")), replicas, "max_surge",
                       True, f)
        unavailable = _scale(f.get("max_unavailable", ru.get("maxUnavailable", "25%")),
                             replicas, "max_unavailable", False, f)
        if surge == 0 and unavailable == 0:
            raise f.fail("max_unavailable", "may not be 0 when max_surge is 0 (Kubernetes "
                         "refuses it: the rollout could never start)")
        rollout = Rollout(f.duration("at", 30.0), surge, unavailable,
                          f.dist("readiness", Dist(5.0, 5.0)))
        f.done()
    elif top.get("drain") is not None:
        f = top.sub("drain")
        drain = SingleDrain(f.duration("at", 10.0), f.count("instances", 1))
        if drain.instances > replicas:
            raise f.fail("instances", f"must be <= fleet.replicas ({replicas}), "
                         f"got {drain.instances}")
        f.done()
    else:
        raise top.fail("rollout", "required: a rollout ({at, max_surge, ...}) or a drain "
                       "({at, instances})")
    happens = rollout.at if rollout is not None else drain.at if drain is not None else 0.0
    duration = top.duration("duration", None)
    if duration <= happens:
        raise top.fail("duration", f"must be longer than the moment the drain starts "
                       f"({happens:g}s), got {duration:g}s")
    sample = top.duration("sample", 0.1)
    if sample <= 0:
        raise top.fail("sample", "must be > 0")
    resolution = top.duration("resolution", 0.005)
    if not 0 < resolution <= sample:
        raise top.fail("resolution", f"must be > 0 and <= sample ({sample:g}s)")
    routes = [r.timeout for ls in config.listeners for r in ls.routes if r.timeout > 0]
    if top.get("max_request") is not None:
        max_request = top.duration("max_request", None)
    elif routes:
        max_request = max(routes)  # the longest a request may take, as lameduck budget reads it
    else:  # as lameduck budget refuses to guess (--max-request)
        raise top.fail("max_request", "required: no route has a timeout, so nothing says how "
                       "long a request may take")
    sc = Scenario(
        name=str(top.get("name", Path(source).stem)), config=config, pod=pod,
        prestop=_prestop_model(pod), lb=lb, replicas=replicas, capacity=capacity,
        clients=tuple(clients), rollout=rollout, drain=drain, duration=duration,
        warmup=top.duration("warmup", 5.0), seed=top.count("seed", 1, lo=0), sample=sample,
        resolution=resolution,
        max_request=max_request,
        exit_margin=top.duration("exit_margin", 5.0), source=source)
    top.done()
    return sc
