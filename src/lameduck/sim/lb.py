"""The load balancer's view: which instances each LB node routes new connections to, and how
it picks one (random, round robin, least connections — HAProxy's ``balance`` and Envoy's
``lb_policy``). It balances connections (layer 4: a Kubernetes Service, HAProxy ``mode tcp``):
a client's requests stay on the instance its connection reached."""

from __future__ import annotations

import numpy as np

from lameduck.sim.draws import Ints
from lameduck.sim.scenario import Balance


class LbView:
    def __init__(self, nodes: int, capacity: int, balance: Balance) -> None:
        self.routable = np.zeros((nodes, capacity), dtype=bool)
        self.balance = balance
        self._rr = np.zeros(nodes, dtype=np.int64)
        self._cum: Ints | None = None  # running count of routable instances, node by node

    def set(self, node: int, k: int, on: bool) -> None:
        if self.routable[node, k] != on:
            self.routable[node, k] = on
            self._cum = None

    def choose_random(self, nodes: Ints, rng: np.random.Generator) -> Ints:
        """One instance per connection, uniform over what its node routes to (-1: nothing):
        every node at once."""
        if self._cum is None:
            self._cum = np.cumsum(self.routable.ravel())
        cum = self._cum
        width = self.routable.shape[1]
        before = np.concatenate([[0], cum[width - 1::width]])  # routable before each node's row
        have = before[1:] - before[:-1]
        n_have = have[nodes]
        pick = before[nodes] + np.floor(rng.random(nodes.size) * n_have).astype(np.int64)
        pos = np.searchsorted(cum, pick + 1)  # the (pick+1)-th routable cell
        return np.where(n_have > 0, pos % width, -1)

    def choose(self, node: int, m: int, conns: Ints) -> Ints | None:
        """Instances for ``m`` new connections through ``node`` (round robin or least
        connections; ``choose_random`` for random); None when it routes nowhere."""
        cands = np.flatnonzero(self.routable[node])
        if cands.size == 0:
            return None
        if self.balance is Balance.ROUND_ROBIN:
            start = self._rr[node]
            self._rr[node] = start + m
            return cands[(start + np.arange(m)) % cands.size]
        return cands[least_conn(conns[cands], m)]


def least_conn(counts: Ints, m: int) -> Ints:
    """Indexes into ``counts`` for ``m`` connections, each to the least loaded at its turn
    (ties to the lowest index): water-filling, the same result as one argmin per connection."""
    order = np.argsort(counts, kind="stable")
    cs = counts[order].astype(np.int64)
    prefix = np.cumsum(cs)
    k_all = np.arange(1, cs.size + 1)
    need = k_all * cs - prefix  # raising the k lowest to the k-th's level costs this
    k = int(np.searchsorted(need, m, side="right"))  # the largest k with need[k-1] <= m
    k = max(k, 1)
    total = m + int(prefix[k - 1])
    level, extra = divmod(total, k)
    add = level - cs[:k]
    add[np.argsort(order[:k], kind="stable")[:extra]] += 1  # the last round: lowest index
    add = np.maximum(add, 0)
    # the order each one is taken in: lower counts first, round by round
    reps = np.repeat(order[:k], add)
    starts = np.cumsum(add) - add
    rounds = np.repeat(cs[:k], add) + np.arange(reps.size) - np.repeat(starts, add)
    return reps[np.lexsort((reps, rounds))]
