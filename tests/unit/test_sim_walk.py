"""The simulator's walk leaves each connection when, and how, a real ``ConnectionDrain`` driven
with the same draws says it leaves: the walk is the core's rules over arrays, not a copy of
them written from memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lameduck.drain.connection import ConnAction, ConnectionDrain
from lameduck.drain.event import Strategy
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.process import DrainSettings, ProcessDrain, ShutdownSettings
from lameduck.sim.draws import Floats, Ints, proactive_moments
from lameduck.sim.walk import How, Proto, Rules, walk

ROUNDS = 400


class Matrix:
    """Pre-drawn numbers, one column per round: the walk and the reference read the same."""

    def __init__(self, rng: np.random.Generator, n: int, think: float, dur: float) -> None:
        self.th = rng.exponential(think, (n, ROUNDS))
        self.du = rng.exponential(dur, (n, ROUNDS))
        self.un = rng.random((n, ROUNDS))

    def think(self, idx: Ints, rnd: int) -> Floats:
        return self.th[idx, rnd]

    def duration(self, idx: Ints, rnd: int) -> Floats:
        return self.du[idx, rnd]

    def uniform(self, idx: Ints, rnd: int, event: int) -> Floats:
        return self.un[idx, rnd]


def reference(conn: ConnectionDrain, settings: DrainSettings, start: float, src: Matrix, i: int,
              t0: float, busy: bool, proto: Proto) -> tuple[float, How]:
    """Drive one real ConnectionDrain request by request, as the proxy's shell does; a process
    of its own says whether a request is still taken (its ledger only moves forward in time)."""
    pd = ProcessDrain(settings, ShutdownSettings(deadline=settings.time + 5))
    pd.start_shutdown(start)
    if proto is Proto.WS:
        at = conn.next_deadline()
        return (math.inf, How.OPEN) if at is None else (at, How.PROACTIVE)
    arr = t0 if busy else t0 + src.th[i, 0]
    rnd = 0
    while True:
        resp = arr + src.du[i, rnd]
        while (at := conn.next_deadline()) is not None and at <= (resp if proto is Proto.H2
                                                                 else arr):
            action = conn.on_timer(at, idle=bool(at < arr))
            if action is ConnAction.CLOSE or (proto is Proto.H2 and action is ConnAction.DRAIN):
                return at, How.PROACTIVE
        pd.tick(arr)
        if not pd.ledger.begin():
            return arr, How.GOING_AWAY
        while (at := conn.next_deadline()) is not None and at <= resp:
            conn.on_timer(at, idle=False)
        pd.ledger.end()
        if conn.on_response(resp, lambda u=float(src.un[i, rnd]): u):
            return resp, How.RESPONSE
        rnd += 1
        arr = resp + src.th[i, rnd]


@pytest.mark.parametrize(("strategy", "time", "grace", "hc"), [
    (Strategy.GRADUAL, 20.0, 5.0, False),
    (Strategy.GRADUAL, 2.0, 0.2, False),
    (Strategy.GRADUAL, 3.0, 1.0, False),  # G == T/3: no proactive window
    (Strategy.IMMEDIATE, 10.0, 1.0, False),
    (Strategy.GRADUAL, 10.0, 1.0, True),  # health check failed: every response drains
])
def test_walk_leaves_as_the_core_does(strategy: Strategy, time: float, grace: float,
                                      hc: bool) -> None:
    rng = np.random.default_rng(7)
    n = 600
    start = 50.0
    settings = DrainSettings(time, strategy, grace)
    pd = ProcessDrain(settings, ShutdownSettings(deadline=time + 5))
    listener = pd.add_listener(ListenerDrain("ingress"))
    accepted = start + rng.uniform(-30.0, time, n)
    early = accepted <= start
    conns: list[ConnectionDrain | None] = [None] * n
    u_moment = rng.random(n)
    for i in np.flatnonzero(early):  # open before the drain: the event reaches them
        conns[i] = ConnectionDrain(listener, float(accepted[i]), lambda: 0.0)
    if hc:
        pd.healthcheck_fail()
    event, _ = pd.start_shutdown(start)
    for i in range(n):
        def rng_i(x: float = float(u_moment[i])) -> float:
            return x

        if conns[i] is None:  # accepted during the drain: replayed at accept
            conns[i] = ConnectionDrain(listener, float(accepted[i]), rng_i)
        else:
            conns[i].on_drain_event(event, rng_i)
    moment = proactive_moments(event, accepted, u_moment)
    proto = rng.choice([Proto.H1, Proto.H2, Proto.WS], n, p=[0.6, 0.3, 0.1])
    t0 = np.maximum(accepted, start)
    busy = ~early | (rng.random(n) < 0.3)  # accepted during the drain: its request is on
    src = Matrix(rng, n, think=time / 8, dur=time / 40)
    got = walk(Rules.of(listener, pd), src, t0, busy, proto, moment)
    hows = {h: 0 for h in How}
    for i in range(n):
        c = conns[i]
        assert c is not None
        assert c.proactive_at == (None if moment[i] == np.inf else moment[i])
        want = reference(c, settings, start, src, i, float(t0[i]), bool(busy[i]), Proto(proto[i]))
        assert (float(got.leave[i]), How(got.how[i])) == want, i
        hows[want[1]] += 1
    print(hows)
    assert hows[How.RESPONSE] > 0 and (hows[How.PROACTIVE] > 0) == (time / 3 > grace)
