"""How each connection of a draining instance leaves it: the rules of ``ConnectionDrain``
(drain/connection.py) run over arrays of connections, one request at a time.

A keep-alive client alternates a think time and a request. From the moment the walk starts
(the drain event reached the connection, or it was accepted during the drain) each request's
response asks the listener's rule whether it drains the connection — ``responses_drain``, the
vectorised ``response_drains`` — and the proactive moment (drawn by ``proactive_moments``) drains
it otherwise:

- HTTP/1.1: a draining response carries ``Connection: close``, the client leaves after it; a
  connection drained proactively is closed once G has passed if it is idle, else its next
  response closes it (``ConnectionDrain.on_timer`` / ``on_response``).
- HTTP/2: GOAWAY goes out with the draining response or at the proactive moment; the client
  opens a new connection from then on.
- WebSocket (a long-lived stream): no response can drain it; its proactive moment ends it.
- One request per connection: the client closes after its response.

A request that starts once the process takes no new work (T of a shutdown) is answered going
away (503, ``Connection: close``). What does not leave by itself is left ``OPEN``: the process's
exit, or its deadline, closes it. tests/unit/test_sim_walk.py drives a real ``ConnectionDrain``
with the same draws and checks the same leave time and cause for every connection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np
import numpy.typing as npt

from lameduck.drain.event import DrainEvent, Strategy
from lameduck.drain.listener import ListenerDrain
from lameduck.drain.process import ProcessDrain
from lameduck.sim.draws import Bools, Floats, Ints, responses_drain


class Proto(IntEnum):
    H1 = 0
    H2 = 1
    WS = 2  # a WebSocket or another long-lived stream
    ONCE = 3  # one request per connection


# A bound on the rounds of requests walked, whatever the draws: every connection leaves by
# the deadline, so it is never reached in practice; it keeps a bad scenario from hanging.
MAX_ROUNDS = 1_000_000


class How(IntEnum):
    """Why a connection left (or will leave) its instance."""

    OPEN = 0  # not by itself: the exit or the deadline decides
    RESPONSE = 1  # drained by a response
    PROACTIVE = 2  # drained at its proactive moment
    GOING_AWAY = 3  # a request after T: 503 going away
    DONE = 4  # a one-request connection finished
    EXIT = 5  # closed idle at the process's exit
    CUT = 6  # in flight at the deadline or at SIGKILL: reset


@dataclass(frozen=True, slots=True)
class Rules:
    """What a connection of one listener consults, read off the core's objects."""

    events: tuple[DrainEvent, ...]
    hc_failed: bool
    grace: float
    refuse_from: float  # requests from then on are refused (going away); inf: never

    @classmethod
    def of(cls, listener: ListenerDrain, process: ProcessDrain) -> Rules:
        shutdown = process.shutdown
        return cls(listener.events, listener.hc_failed, listener.grace,
                   math.inf if shutdown is None else shutdown.ends_at)


class Source(Protocol):
    """The draws of the walk: round ``rnd`` of the connections ``idx``."""

    def think(self, idx: Ints, rnd: int) -> Floats: ...

    def duration(self, idx: Ints, rnd: int) -> Floats: ...

    def uniform(self, idx: Ints, rnd: int, event: int) -> Floats: ...


@dataclass(frozen=True, slots=True)
class Walked:
    leave: Floats  # when the client stops using the connection (inf: OPEN)
    how: npt.NDArray[np.int8]  # How codes
    busy_from: Floats  # the start of the request answered at ``leave`` (nan: none)


def walk(rules: Rules, src: Source, t0: Floats, busy: Bools, proto: Ints,
         moment: Floats) -> Walked:
    """Walk each connection from ``t0`` (``busy``: a request is under way then) until it leaves."""
    n = t0.size
    leave = np.full(n, np.inf)
    how = np.zeros(n, dtype=np.int8)
    busy_from = np.full(n, np.nan)
    ws = proto == Proto.WS
    has = ws & np.isfinite(moment)
    leave[has] = moment[has]
    how[has] = How.PROACTIVE
    once = np.flatnonzero(proto == Proto.ONCE)
    if once.size:
        end = t0[once] + src.duration(once, 0)
        leave[once] = end
        how[once] = How.DONE
        busy_from[once] = t0[once]
    idx = np.flatnonzero((proto == Proto.H1) | (proto == Proto.H2))
    if idx.size == 0:
        return Walked(leave, how, busy_from)
    grace = rules.grace
    ramps = list(enumerate(rules.events))
    any_immediate = any(e.strategy is Strategy.IMMEDIATE for e in rules.events)
    arr = np.where(busy[idx], t0[idx], t0[idx] + src.think(idx, 0))
    rnd = 0
    while idx.size and rnd < MAX_ROUNDS:
        resp = arr + src.duration(idx, rnd)
        m = moment[idx]
        h1 = proto[idx] == Proto.H1
        never = ~np.isfinite(arr)  # a client that sends nothing more
        gap_close = ~never & h1 & (m + grace <= arr)
        goaway = ~never & ~h1 & (m <= resp)
        rest = ~(never | gap_close | goaway)
        refused = rest & (arr >= rules.refuse_from)
        rest &= ~refused
        if rules.hc_failed or any_immediate:
            drains = rest.copy()
        else:
            drains = rest & h1 & (resp >= m)
            for j, event in ramps:
                drains |= rest & responses_drain(event, resp, src.uniform(idx, rnd, j))
        sel = idx[gap_close]
        leave[sel] = m[gap_close] + grace
        how[sel] = How.PROACTIVE
        sel = idx[goaway]
        leave[sel] = m[goaway]
        how[sel] = How.PROACTIVE
        sel = idx[refused]
        leave[sel] = arr[refused]
        how[sel] = How.GOING_AWAY
        busy_from[sel] = arr[refused]
        sel = idx[drains]
        leave[sel] = resp[drains]
        how[sel] = How.RESPONSE
        busy_from[sel] = arr[drains]
        keep = rest & ~drains
        idx = idx[keep]
        rnd += 1
        if idx.size:
            arr = resp[keep] + src.think(idx, rnd)
    return Walked(leave, how, busy_from)
