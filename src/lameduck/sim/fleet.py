"""The fleet: pods running lameduck's drain core, clients connected to them through a load
balancer, and the rolling update (or the one drain) that takes them down; run in virtual time.

Each pod holds a real ``ProcessDrain`` with its ``ListenerDrain`` (and, with a ``lameduck
prestop`` hook, a real ``Prestop`` FSM): SIGTERM is ``start_shutdown``, accepting is the
listener's ``stop_at``, the exit is whatever ``shutdown_step`` answers, a request after T is
refused by the ledger. How each connection leaves is ``walk`` (the connection rules over
arrays). Around them: clients (clients.py), the load balancer (lb.py) and the deployment
controller (rollout.py). docs/simulate.md says what is modelled and what is not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lameduck.config import drain_settings
from lameduck.drain.backoff import Backoff
from lameduck.drain.event import DrainEvent
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.prestop import Prestop, PrestopAction, PrestopState
from lameduck.drain.process import ProcessDrain, Step
from lameduck.sim import rollout as controller
from lameduck.sim.clients import (
    RECONNECT_BACKOFF,
    RECONNECT_IMMEDIATE,
    RECONNECT_NEXT_REQUEST,
    ClassSource,
    Clients,
    build,
)
from lameduck.sim.draws import Floats, Ints, backoff_delays, lognormal, proactive_moments
from lameduck.sim.engine import Batches, Engine
from lameduck.sim.lb import LbView
from lameduck.sim.scenario import Balance, Dist, LbKind, Scenario
from lameduck.sim.walk import How, Proto, Rules, walk

BIN = 0.1  # the histograms' step: reconnects and closes per 100 ms
CAUSES = ("refused", "unremoved", "going_away", "cut", "killed", "overload", "no_endpoint")
BACKOFF = Backoff()


class Pod:
    __slots__ = ("deleted_at", "exit_at", "exit_step", "gone", "health_down", "idx",
                 "listener", "mark_at", "new", "pd", "prestop", "ready_at", "sigterm_at",
                 "step_at")

    def __init__(self, idx: int, new: bool, pd: ProcessDrain,
                 listener: ListenerDrain) -> None:
        self.idx = idx
        self.new = new
        self.pd = pd
        self.listener = listener
        self.ready_at: float | None = None
        self.deleted_at: float | None = None
        self.sigterm_at: float | None = None
        self.exit_at: float | None = None
        self.exit_step = ""
        self.gone = False
        self.prestop: Prestop | None = None
        self.health_down: float | None = None
        self.step_at = math.inf
        self.mark_at = math.inf  # the shutdown deadline a check is booked at


@dataclass
class Result:
    """What a run measured; report.py turns it into JSON, CSV and numbers."""

    scenario: Scenario
    wall: float = 0.0
    events: int = 0  # heap events plus connection events (connects and closes)
    reconnects: Floats = field(default_factory=lambda: np.zeros(0))
    closes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [How, bin]
    failures: dict[str, Floats] = field(default_factory=dict)  # cause -> per bin
    retried: dict[str, int] = field(default_factory=dict)
    lb_retries: int = 0
    requests: float = 0.0
    sample_t: Floats = field(default_factory=lambda: np.zeros(0))
    load: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # [sample, pod]
    serving: Ints = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    fleet_load: Floats = field(default_factory=lambda: np.zeros(0))  # offered / serving cap
    drains: list[dict[str, Any]] = field(default_factory=list)
    rollout_end: float | None = None
    # with ``record``: every close (time, How code, pod) and every connect (time, pod; -1
    # refused or unrouted), for tests and the cross-check
    close_log: tuple[Floats, Ints, Ints] | None = None
    connect_log: tuple[Floats, Ints] | None = None


class Simulation:
    def __init__(self, sc: Scenario, seed: int | None = None, record: bool = False) -> None:
        self.sc = sc
        self.record = record
        self._close_parts: list[tuple[Floats, Ints, Ints]] = []
        self._connect_parts: list[tuple[Floats, Ints]] = []
        self.rng = np.random.default_rng(sc.seed if seed is None else seed)
        self.eng = Engine()
        self.leaves = Batches()
        self.connects = Batches()
        self.drain_settings, self.shutdown_settings = drain_settings(sc.config)
        cap = sc.replicas * 2 + 2 if sc.rollout is not None else sc.replicas
        self.cap = cap
        self.pods: list[Pod] = []
        self.conns = np.zeros(cap, dtype=np.int64)
        self.offered = np.zeros(cap)
        self.rps = np.zeros(cap)
        self.alive = np.zeros(cap, dtype=bool)
        self.ready = np.zeros(cap, dtype=bool)
        self.stop_at = np.full(cap, np.inf)  # each listener's ``stop_at`` (inf: accepting)
        self.draining = np.zeros(cap, dtype=bool)  # a drain event or health-check fail on it
        lb = sc.lb
        self.lb = LbView(lb.nodes, cap, lb.balance)
        self.phase = (np.full((lb.nodes, cap), lb.phase % lb.interval) if lb.phase is not None
                      else self.rng.uniform(0.0, lb.interval, (lb.nodes, cap)))
        self.cl: Clients = build(sc.clients, lb.nodes)
        self.retrying = np.zeros(self.cl.n, dtype=bool)
        nbins = math.ceil(sc.duration / BIN) + 1
        self.nbins = nbins
        self.res = Result(sc, reconnects=np.zeros(nbins), closes=np.zeros((len(How), nbins)),
                          failures={c: np.zeros(nbins) for c in CAUSES},
                          retried=dict.fromkeys(CAUSES, 0))
        self._samples: list[np.ndarray] = []
        self._sample_t: list[float] = []
        self._serving: list[int] = []
        self._fleet: list[float] = []
        self._tick_at = math.inf
        self._last_tick = -math.inf
        self.rolling = False

    # -- the run ---------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> Result:
        wall = time.perf_counter()
        sc = self.sc
        for _ in range(sc.replicas):
            pod = self._create(new=False)
            self._ready(pod, 0.0, route_at_once=True)
        ids = np.arange(self.cl.n)
        self.connects.push(self.rng.uniform(0.0, sc.warmup, ids.size), ids)
        self._arm()
        self.eng.at(0.0, self._sample)
        if sc.rollout is not None:
            self.eng.at(sc.rollout.at, self._rollout_start)
        elif sc.drain is not None:
            for k in range(sc.drain.instances):
                self.eng.at(sc.drain.at, self._delete, self.pods[k])
        self.eng.run(sc.duration, progress)
        res = self.res
        res.events = self.eng.events + self.leaves.items + self.connects.items
        res.sample_t = np.asarray(self._sample_t)
        res.load = (np.vstack(self._samples) if self._samples
                    else np.zeros((0, len(self.pods)), dtype=np.float32))[:, :len(self.pods)]
        res.serving = np.asarray(self._serving, dtype=np.int64)
        res.fleet_load = np.asarray(self._fleet)
        if self.record:
            cs, cn = self._close_parts, self._connect_parts
            res.close_log = (np.concatenate([c[0] for c in cs]) if cs else np.zeros(0),
                             np.concatenate([c[1] for c in cs]) if cs else np.zeros(0, int),
                             np.concatenate([c[2] for c in cs]) if cs else np.zeros(0, int))
            res.connect_log = (np.concatenate([c[0] for c in cn]) if cn else np.zeros(0),
                               np.concatenate([c[1] for c in cn]) if cn else np.zeros(0, int))
        for pod in self.pods:
            if pod.deleted_at is not None:
                res.drains.append({
                    "pod": pod.idx, "deleted": pod.deleted_at, "sigterm": pod.sigterm_at,
                    "exit": pod.exit_at, "step": pod.exit_step or "running",
                    "drain_seconds": None if pod.exit_at is None or pod.sigterm_at is None
                    else pod.exit_at - pod.sigterm_at})
        res.wall = time.perf_counter() - wall
        return res

    def _bin(self, t: float | Floats) -> Any:
        return np.minimum((np.asarray(t) / BIN).astype(np.int64), self.nbins - 1)

    def _fail(self, cause: str, t: float | Floats, n: int = 1) -> None:
        if np.ndim(t) == 0:
            self.res.failures[cause][self._bin(t)] += n
        else:
            np.add.at(self.res.failures[cause], self._bin(t), 1)

    def _draw(self, dist: Dist, n: int) -> Floats:
        return lognormal(self.rng, dist.median, dist.p99, n)

    # -- pods ------------------------------------------------------------------------------
    def _create(self, new: bool) -> Pod:
        k = len(self.pods)
        if k >= self.cap:
            raise RuntimeError("more pods than the simulation made room for")
        pd = ProcessDrain(self.drain_settings, self.shutdown_settings)
        listener = pd.add_listener(ListenerDrain("ingress"))
        pod = Pod(k, new, pd, listener)
        self.pods.append(pod)
        self.alive[k] = True
        return pod

    def _ready(self, pod: Pod, t: float, route_at_once: bool = False) -> None:
        if pod.gone or pod.deleted_at is not None:
            return
        pod.pd.initialized()
        pod.ready_at = t
        k = pod.idx
        self.ready[k] = True
        lb = self.sc.lb
        for node in range(lb.nodes):
            if route_at_once:
                self.lb.set(node, k, True)
            elif lb.kind is LbKind.ENDPOINTS:
                self.eng.at(t + float(self._draw(lb.propagation, 1)[0]), self._route, k, node,
                            True)
            else:  # health checks: `rise` good ones in a row
                first = t + (self.phase[node, k] - t) % lb.interval
                self.eng.at(first + (lb.rise - 1) * lb.interval, self._route, k, node, True)
        if self.rolling:
            self._reconcile(t)

    def _route(self, k: int, node: int, on: bool) -> None:
        pod = self.pods[k]
        if on and (pod.gone or pod.deleted_at is not None):
            return
        self.lb.set(node, k, on)

    def _delete(self, pod: Pod) -> None:
        """The pod is deleted: out of the Endpoints, preStop, then SIGTERM; SIGKILL at the
        grace period (Kubernetes' pod termination)."""
        t = self.eng.now
        if pod.deleted_at is not None:
            return
        pod.deleted_at = t
        k = pod.idx
        self.ready[k] = False
        lb = self.sc.lb
        if lb.kind is LbKind.ENDPOINTS:
            delays = self._draw(lb.propagation, lb.nodes)
            for node in range(lb.nodes):
                self.eng.at(t + float(delays[node]), self._route, k, node, False)
        model = self.sc.prestop
        if model.strategy is None:
            self.eng.at(t + model.seconds, self._sigterm, pod)
        else:
            pod.prestop = Prestop(model.strategy, model.drain_timeout, model.lb_buffer)
            self._prestop_do(pod, t, pod.prestop.start(t))
        self.eng.at(t + self.sc.pod.grace_period, self._kill, pod)

    def _prestop_do(self, pod: Pod, t: float, actions: list[PrestopAction]) -> None:
        for action in actions:
            if action is PrestopAction.DRAIN_LISTENERS:
                event, _ = pod.pd.drain_listeners(t, graceful=True, skip_exit=True,
                                                  inbound_only=False)
                self._event_reaches(pod, t, event)
            else:
                pod.pd.healthcheck_fail()
                self.draining[pod.idx] = True
                self._health_fails(pod, t)
                self._rewalk(pod, t)
        ps = pod.prestop
        assert ps is not None
        if ps.done:
            if pod.sigterm_at is None:
                pod.pd.prestop_done()
                self._sigterm(pod)
            return
        at = ps.next_deadline()
        if at is not None:
            self.eng.at(at, self._prestop_tick, pod)

    def _prestop_tick(self, pod: Pod) -> None:
        ps = pod.prestop
        if pod.gone or ps is None or ps.done:
            return
        t = self.eng.now
        k = pod.idx
        in_flight = 0 if self.conns[k] == 0 else max(1, round(float(self.offered[k])))
        self._prestop_do(pod, t, ps.tick(t, in_flight))

    def _sigterm(self, pod: Pod) -> None:
        if pod.gone or pod.sigterm_at is not None:
            return
        t = self.eng.now
        pod.sigterm_at = t
        event, _ = pod.pd.start_shutdown(t)
        self._event_reaches(pod, t, event)
        self._health_fails(pod, t)
        # the first check at the signal; each WAIT books the next at the core's next deadline
        self.eng.at(t, self._step, pod)

    def _health_fails(self, pod: Pod, t: float) -> None:
        """Its health check answers 503 (or its port is closed) from ``t``: an LB that checks
        it takes it out at the ``fall``-th failed check."""
        lb = self.sc.lb
        if lb.kind is not LbKind.HEALTH_CHECK or pod.health_down is not None:
            return
        pod.health_down = t
        k = pod.idx
        for node in range(lb.nodes):
            first = t + (self.phase[node, k] - t) % lb.interval
            self.eng.at(first + (lb.fall - 1) * lb.interval, self._route, k, node, False)

    def _on(self, pod: Pod) -> Ints:
        return np.flatnonzero(self.cl.inst == pod.idx)

    def _event_reaches(self, pod: Pod, t: float, event: DrainEvent) -> None:
        """A drain event reaches every connection open on the pod: each draws its proactive
        moment (the earliest of its events wins), then walks from now."""
        self.stop_at[pod.idx] = (math.inf if pod.listener.stop_at is None
                                 else pod.listener.stop_at)
        self.draining[pod.idx] = True
        c = self._on(pod)
        cl = self.cl
        m = proactive_moments(event, cl.acc[c], self.rng.random(c.size))
        cl.moment[c] = np.minimum(cl.moment[c], m)
        self._rewalk(pod, t, c)

    def _rewalk(self, pod: Pod, t: float, c: Ints | None = None) -> None:
        cl = self.cl
        if c is None:
            c = self._on(pod)
        c = c[cl.proto[c] != Proto.ONCE]  # their one request ends as it was going to
        if c.size == 0:
            return
        busy = self.rng.random(c.size) < cl.load[c]
        self._walk(pod, c, np.full(c.size, t), busy)

    def _walk(self, pod: Pod, c: Ints, t0: Floats, busy: np.ndarray) -> None:
        cl = self.cl
        got = walk(Rules.of(pod.listener, pod.pd), ClassSource(self.rng, cl, c), t0, busy,
                   cl.proto[c], cl.moment[c])
        cl.epoch[c] += 1
        cl.leave[c] = got.leave
        cl.how[c] = got.how
        cl.busy_from[c] = got.busy_from
        fin = np.isfinite(got.leave)
        self.leaves.push(got.leave[fin], c[fin], cl.epoch[c[fin]])
        self._arm()

    def _busy(self, c: Ints, t: float) -> np.ndarray:
        """Which of the connections ``c`` have a request under way at ``t`` (exact once the
        pod takes no new work: their last request is the one they leave after)."""
        cl = self.cl
        h = cl.how[c]
        return (((h == How.RESPONSE) | (h == How.DONE)) & (cl.busy_from[c] <= t)
                & (cl.leave[c] > t))

    def _in_flight(self, pod: Pod, t: float) -> tuple[int, float]:
        """Requests under way on the pod at ``t``, and when the last of them ends."""
        c = self._on(pod)
        busy = self._busy(c, t)
        n = int(busy.sum())
        return n, (float(self.cl.leave[c][busy].max()) if n else t)

    def _step(self, pod: Pod) -> None:
        """Ask the core whether the process exits now (``ProcessDrain.shutdown_step``)."""
        if pod.gone:
            return
        t = self.eng.now
        k = pod.idx
        conns = int(self.conns[k])
        active, last = self._in_flight(pod, t) if conns else (0, t)
        pod.pd.ledger.active = active
        step = pod.pd.shutdown_step(t, conns)
        if step is Step.WAIT:
            mark = pod.pd.next_deadline(t)
            if mark is not None and mark != pod.mark_at:
                pod.mark_at = mark
                self.eng.at(mark, self._step, pod)
            ev = pod.pd.shutdown
            if active and ev is not None and t >= ev.ends_at and last < pod.step_at:
                pod.step_at = last
                self.eng.at(last + 1e-9, self._step, pod)
            return
        self._exit(pod, t, "cut" if step is Step.CUT else "")

    def _exit(self, pod: Pod, t: float, cause: str) -> None:
        pod.gone = True
        pod.exit_at = t
        pod.exit_step = cause or "exit"
        k = pod.idx
        self.alive[k] = False
        self.ready[k] = False
        self.stop_at[k] = t
        cl = self.cl
        c = self._on(pod)
        busy = self._busy(c, t)
        if cause:
            cut = c[busy]
            retry = cl.retry_reset[cut]
            self.res.retried[cause] += int(retry.sum())
            self._fail(cause, t, int((~retry).sum()))
        cl.how[c] = np.where(busy & bool(cause), How.CUT, How.EXIT)
        cl.epoch[c] += 1
        cl.leave[c] = t
        self.leaves.push(np.full(c.size, t), c, cl.epoch[c])
        self._health_fails(pod, t)
        self._arm()

    def _kill(self, pod: Pod) -> None:
        if not pod.gone:
            self._exit(pod, self.eng.now, "killed")

    # -- the rolling update ----------------------------------------------------------------
    def _rollout_start(self) -> None:
        self.rolling = True
        self._reconcile(self.eng.now)

    def _reconcile(self, t: float) -> None:
        ro = self.sc.rollout
        assert ro is not None
        new = [p for p in self.pods if p.new and p.deleted_at is None]
        old = [p for p in self.pods if not p.new and p.deleted_at is None]
        new_ready = sum(1 for p in new if p.ready_at is not None)
        create, kill = controller.step(self.sc.replicas, ro.max_surge, ro.max_unavailable,
                                       len(new), new_ready, len(old))
        if create:
            delays = self._draw(ro.readiness, create)
            for d in delays:
                pod = self._create(new=True)
                self.eng.at(t + float(d), self._ready, pod, t + float(d))
        for pod in old[:kill]:
            self._delete(pod)
        if kill:  # the controller syncs again: what was deleted makes room for new pods
            self._reconcile(t)
            return
        if not old and new_ready == self.sc.replicas and self.res.rollout_end is None:
            self.res.rollout_end = t

    # -- connections -----------------------------------------------------------------------
    def _arm(self) -> None:
        head = min(self.leaves.head(), self.connects.head())
        if head == math.inf:
            return
        when = max(head, self._last_tick + self.sc.resolution)
        if when < self._tick_at:
            self._tick_at = when
            self.eng.at(when, self._tick, when)

    def _tick(self, when: float) -> None:
        if when != self._tick_at:
            return
        self._tick_at = math.inf
        self._last_tick = when
        got = self.leaves.take(when)
        if got is not None:
            self._leaves(got[0], got[1][0], got[1][1])
        got = self.connects.take(when)
        if got is not None:
            self._connects(when, got[0], got[1][0])
        self._arm()

    def _leaves(self, times: Floats, ids: Ints, epochs: Ints) -> None:
        cl = self.cl
        ok = (cl.epoch[ids] == epochs) & (cl.inst[ids] >= 0)
        times, ids = times[ok], ids[ok]
        if ids.size == 0:
            return
        k = cl.inst[ids]
        h = cl.how[ids]
        np.subtract.at(self.conns, k, 1)
        np.subtract.at(self.offered, k, cl.load[ids])
        np.subtract.at(self.rps, k, cl.rps[ids])
        np.add.at(self.res.closes, (h, self._bin(times)), 1)
        if self.record:
            self._close_parts.append((times, h.copy(), k.copy()))
        cl.inst[ids] = -1
        cl.moment[ids] = np.inf
        delay = np.zeros(ids.size)
        rec = cl.reconnect[ids]
        once = cl.proto[ids] == Proto.ONCE
        nxt = once | (rec == RECONNECT_NEXT_REQUEST)
        delay[nxt] = self.rng.exponential(1.0, int(nxt.sum())) * cl.think[ids[nxt]]
        bo = ~once & (rec == RECONNECT_BACKOFF)
        delay[bo] = backoff_delays(BACKOFF, np.zeros(int(bo.sum()), dtype=np.int64),
                                   self.rng.random(int(bo.sum())))
        # a request answered "going away": the walk decided it from Rules.refuse_from, the
        # core's shutdown.ends_at (T), the instant ProcessDrain.tick stops the ledger accepting
        ga = h == How.GOING_AWAY
        if ga.any():
            retry = ga & cl.retry_refused[ids]
            self.res.retried["going_away"] += int(retry.sum())
            self._fail("going_away", times[ga & ~retry])
            delay[retry] = 0.0
        self.connects.push(times + delay, ids)
        # the last connection gone: the moment an idle process may exit (after min_drain);
        # after T the step is asked when its last request ends (``_step`` schedules it)
        for kk in np.unique(k[self.conns[k] == 0]):
            pod = self.pods[int(kk)]
            if pod.gone:
                continue
            if pod.sigterm_at is not None:
                self._step(pod)
            elif pod.prestop is not None and pod.prestop.state is PrestopState.DRAINING:
                self._prestop_tick(pod)

    def _connects(self, now: float, times: Floats, ids: Ints) -> None:
        cl = self.cl
        ids_ok = cl.inst[ids] < 0
        times, ids = times[ids_ok], ids[ids_ok]
        if ids.size == 0:
            return
        again = cl.connected_once[ids]
        np.add.at(self.res.reconnects, self._bin(times[again]), 1)
        cl.connected_once[ids] = True
        nodes = cl.node[ids]
        target = self._choose(nodes)
        lb = self.sc.lb
        for _ in range(lb.retries):  # the LB tries another instance (HAProxy's redispatch)
            bad = np.flatnonzero((target >= 0) & ~self._takes(target, now))
            if bad.size == 0:
                break
            self.res.lb_retries += bad.size
            target[bad] = self._choose(nodes[bad])
        none = target < 0
        good = ~none & self._takes(target, now)
        if self.record:
            self._connect_parts.append((times, np.where(good, target, -1)))
        failed = ~good
        if failed.any():
            cause = np.where(none, 0, np.where(self.alive[np.maximum(target, 0)], 1, 2))
            names = ("no_endpoint", "refused", "unremoved")
            f_ids = ids[failed]
            retry = cl.retry_refused[f_ids] & ~self.retrying[f_ids]
            for code, name in enumerate(names):
                sel = cause[failed] == code
                self.res.retried[name] += int((sel & retry).sum())
                self._fail(name, times[failed][sel & ~retry])
            self.retrying[f_ids] = retry
            wait = np.where(retry, self.sc.resolution,
                            self.rng.exponential(1.0, f_ids.size) * np.minimum(
                                cl.think[f_ids], 1.0))
            self.connects.push(times[failed] + np.maximum(wait, self.sc.resolution), f_ids)
        ids, times, target = ids[good], times[good], target[good]
        if ids.size == 0:
            return
        self.retrying[ids] = False
        cl.inst[ids] = target
        cl.acc[ids] = times
        cl.moment[ids] = np.inf
        cl.how[ids] = How.OPEN
        cl.leave[ids] = np.inf
        cl.epoch[ids] += 1
        np.add.at(self.conns, target, 1)
        np.add.at(self.offered, target, cl.load[ids])
        np.add.at(self.rps, target, cl.rps[ids])
        once = cl.proto[ids] == Proto.ONCE
        draining = self.draining[target]
        plain_once = once & ~draining
        if plain_once.any():  # its one request, then it closes
            o = ids[plain_once]
            d = np.exp(cl.mu[o] + cl.sigma[o] * self.rng.standard_normal(o.size))
            cl.how[o] = How.DONE
            cl.busy_from[o] = times[plain_once]
            cl.leave[o] = times[plain_once] + d
            self.leaves.push(cl.leave[o], o, cl.epoch[o])
        for k in np.unique(target[draining]):
            pod = self.pods[int(k)]
            sel = draining & (target == k)
            c, t0 = ids[sel], times[sel]
            m = np.full(c.size, np.inf)
            for event in pod.listener.events:  # replayed at accept, as ConnectionDrain does
                m = np.minimum(m, proactive_moments(event, t0, self.rng.random(c.size)))
            cl.moment[c] = m
            busy = (cl.reconnect[c] != RECONNECT_IMMEDIATE) | (cl.proto[c] == Proto.ONCE)
            self._walk(pod, c, t0, busy)
        self._arm()

    def _choose(self, nodes: Ints) -> Ints:
        if self.sc.lb.balance is Balance.RANDOM:
            return self.lb.choose_random(nodes, self.rng)
        target = np.full(nodes.size, -1, dtype=np.int64)
        for node in np.unique(nodes):
            sel = np.flatnonzero(nodes == node)
            got = self.lb.choose(int(node), sel.size, self.conns)
            if got is not None:
                target[sel] = got
        return target

    def _takes(self, target: Ints, now: float) -> np.ndarray:
        k = np.maximum(target, 0)
        return self.alive[k] & (now < self.stop_at[k])

    # -- the timelines ---------------------------------------------------------------------
    def _sample(self) -> None:
        t = self.eng.now
        sc = self.sc
        n = len(self.pods)
        load = np.where(self.alive[:n], self.offered[:n] / sc.capacity, np.nan)
        row = np.full(self.cap, np.nan, dtype=np.float32)
        row[:n] = load
        self._samples.append(row)
        self._sample_t.append(t)
        serving = self.alive[:n] & self.ready[:n]
        self._serving.append(int(serving.sum()))
        total_cap = max(int(serving.sum()), 1) * sc.capacity
        self._fleet.append(float(self.offered[:n].sum() / total_cap))
        off = self.offered[:n]
        over = self.alive[:n] & (off > sc.capacity)
        if over.any():
            lost = float((self.rps[:n][over] * (1.0 - sc.capacity / off[over])).sum())
            self.res.failures["overload"][self._bin(t)] += lost * sc.sample
        self.res.requests += float(self.rps[:n].sum()) * sc.sample
        if t + sc.sample <= sc.duration:
            self.eng.at(t + sc.sample, self._sample)


def simulate(sc: Scenario, seed: int | None = None,
             progress: Callable[[float], None] | None = None, record: bool = False) -> Result:
    return Simulation(sc, seed, record).run(progress)
