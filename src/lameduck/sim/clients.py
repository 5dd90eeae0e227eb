"""The clients: one row per client in flat arrays (numpy), built from the scenario's classes.

A keep-alive client (HTTP/1.1 or HTTP/2) alternates an exponential think time (mean 1/rate) and
a request whose duration is lognormal (a median and a long tail); by Little's law it keeps
E[d] / (1/rate + E[d]) requests in flight. A WebSocket client holds its connection and sends no
request a drain could answer. A one-request client opens a connection per request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lameduck.sim.draws import Floats, Ints, lognormal_mean, lognormal_sigma
from lameduck.sim.scenario import ClientClass, Reconnect
from lameduck.sim.walk import Proto

# Clients.reconnect holds these codes (the arrays hold numbers, not enum members)
RECONNECT_IMMEDIATE, RECONNECT_BACKOFF, RECONNECT_NEXT_REQUEST = 0, 1, 2
RECONNECT_CODES = {Reconnect.IMMEDIATE: RECONNECT_IMMEDIATE, Reconnect.BACKOFF: RECONNECT_BACKOFF,
                   Reconnect.NEXT_REQUEST: RECONNECT_NEXT_REQUEST}


@dataclass(slots=True)
class Clients:
    """Per client: what it is (its class's numbers) and where it is (its connection)."""

    cls: Ints
    proto: Ints
    think: Floats  # mean think time (inf: sends nothing)
    mu: Floats  # lognormal parameters of its request durations
    sigma: Floats
    load: Floats  # requests in flight it keeps on its instance while connected
    rps: Floats  # requests per second it sends there while connected
    reconnect: Ints
    retry_refused: np.ndarray
    retry_reset: np.ndarray
    node: Ints  # the load-balancer node it goes through
    inst: Ints  # its instance (-1: none)
    acc: Floats  # when that connection was accepted
    epoch: Ints  # bumped whenever its scheduled close changes; stale closes are dropped
    moment: Floats  # its connection's proactive moment (inf: none)
    how: Ints  # how it will leave (walk.How)
    leave: Floats
    busy_from: Floats
    connected_once: np.ndarray

    @property
    def n(self) -> int:
        return int(self.cls.size)


def build(classes: tuple[ClientClass, ...], nodes: int) -> Clients:
    counts = [c.count for c in classes]
    cls = np.repeat(np.arange(len(classes)), counts)
    n = cls.size

    def per(values: list[float]) -> Floats:
        return np.asarray(values, dtype=np.float64)[cls]

    protos, thinks, mus, sigmas, loads, rpss = [], [], [], [], [], []
    for c in classes:
        med, p99 = c.duration.median, c.duration.p99
        mean = lognormal_mean(med, p99)
        think = math.inf if c.rate <= 0 else 1.0 / c.rate
        protos.append(int(c.protocol))
        thinks.append(think)
        mus.append(math.log(med) if med > 0 else -math.inf)
        sigmas.append(lognormal_sigma(med, p99))
        if c.protocol is Proto.WS:
            loads.append(0.0)
            rpss.append(0.0)
        elif c.protocol is Proto.ONCE:
            loads.append(1.0)
            rpss.append(1.0 / mean if mean > 0 else 0.0)
        else:
            loads.append(mean / (think + mean))
            rpss.append(1.0 / (think + mean))
    return Clients(
        cls=cls, proto=np.asarray(protos, dtype=np.int64)[cls], think=per(thinks), mu=per(mus),
        sigma=per(sigmas), load=per(loads), rps=per(rpss),
        reconnect=np.asarray([RECONNECT_CODES[c.reconnect] for c in classes],
                             dtype=np.int64)[cls],
        retry_refused=np.asarray([c.retry_refused for c in classes], dtype=bool)[cls],
        retry_reset=np.asarray([c.retry_reset for c in classes], dtype=bool)[cls],
        node=np.arange(n, dtype=np.int64) % nodes, inst=np.full(n, -1, dtype=np.int64),
        acc=np.zeros(n), epoch=np.zeros(n, dtype=np.int64), moment=np.full(n, np.inf),
        how=np.zeros(n, dtype=np.int64), leave=np.full(n, np.inf), busy_from=np.full(n, np.nan),
        connected_once=np.zeros(n, dtype=bool))


class ClassSource:
    """The walk's draws for the clients ``ids``, from their classes' distributions."""

    def __init__(self, rng: np.random.Generator, clients: Clients, ids: Ints) -> None:
        self.rng = rng
        self.think_mean = clients.think[ids]
        self.mu = clients.mu[ids]
        self.sigma = clients.sigma[ids]

    def think(self, idx: Ints, rnd: int) -> Floats:
        return self.rng.exponential(1.0, idx.size) * self.think_mean[idx]

    def duration(self, idx: Ints, rnd: int) -> Floats:
        return np.exp(self.mu[idx] + self.sigma[idx] * self.rng.standard_normal(idx.size))

    def uniform(self, idx: Ints, rnd: int, event: int) -> Floats:
        return self.rng.random(idx.size)
