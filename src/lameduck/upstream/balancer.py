"""Load balancers over a list of endpoints: pure, no asyncio, no I/O.

The caller passes the hosts eligible right now (ready, healthy, not ejected); a balancer only
chooses among them. ``exclude`` names a host to avoid, so that a retry goes to another endpoint;
it is never returned, and when nothing else is left ``pick`` returns None (the caller decides
whether to retry the same host). Hosts are compared and keyed by identity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Host(Protocol):
    @property
    def weight(self) -> int:
        """>= 1: normal share; 0: never picked."""
        ...

    @property
    def rq_active(self) -> int:
        """Requests in flight to this host."""
        ...


H = TypeVar("H", bound=Host)


class RoundRobin:
    """Equal weights: plain rotation (one index modulo the length, cheap on the request path).

    Unequal weights: nginx's smooth weighted round robin. Each pick adds every host's weight to
    its ``current``, chooses the largest (the first one on ties), and takes the total off the
    chosen one; picks are spread (5,1,1 gives a a b a c a a, not a a a a a b c). ``current``
    lives in a dict keyed by host and is rebuilt from the hosts passed each time, so a host
    that leaves the list keeps no influence. A host skipped as ``exclude`` keeps its
    ``current`` unchanged, as nginx does for a peer it skips.
    """

    __slots__ = ("_current", "_index")

    def __init__(self) -> None:
        self._index = 0
        self._current: dict[Host, int] = {}

    def pick(self, hosts: Sequence[H], exclude: H | None = None) -> H | None:
        n = len(hosts)
        if n == 0:
            return None
        w0 = hosts[0].weight
        for h in hosts:
            if h.weight != w0:
                return self._smooth(hosts, exclude)
        if w0 <= 0:
            return None
        if self._current:
            self._current = {}  # weights became equal: a later weighted phase starts afresh
        i = self._index
        for _ in range(n):
            i %= n
            h = hosts[i]
            i += 1
            if h is not exclude:
                self._index = i
                return h
        return None

    def _smooth(self, hosts: Sequence[H], exclude: H | None) -> H | None:
        old = self._current
        new: dict[Host, int] = {}
        total = 0
        best: H | None = None
        best_current = 0
        for h in hosts:
            w = h.weight
            if w <= 0:
                continue
            c = old.get(h, 0)
            if h is exclude:
                new[h] = c
                continue
            c += w
            new[h] = c
            total += w
            if best is None or c > best_current:
                best, best_current = h, c
        if best is not None:
            new[best] = best_current - total
        self._current = new
        return best


class LeastRequest:
    """Power of ``choices`` (default two, Envoy's LEAST_REQUEST ``choice_count``) random
    choices: sample distinct hosts with ``rng`` and keep the one with the fewest requests in
    flight per unit of weight, ``rq_active / weight`` (compared exactly, by cross
    multiplication); ties go to the first sampled. Weight-0 hosts are never picked.

    Envoy samples with replacement and, with unequal weights, switches to a weighted scheduler;
    here the samples are distinct and weights only scale the load compared.
    """

    __slots__ = ("_choices", "_rng")

    def __init__(self, rng: Callable[[], float], choices: int = 2) -> None:
        if choices < 1:
            raise ValueError("choices must be >= 1")
        self._rng = rng
        self._choices = choices

    def pick(self, hosts: Sequence[H], exclude: H | None = None) -> H | None:
        cands = [h for h in hosts if h.weight > 0 and h is not exclude]
        m = len(cands)
        if m <= 1:
            return cands[0] if cands else None
        rng = self._rng
        best: H | None = None
        for s in range(min(self._choices, m)):
            # partial Fisher-Yates: cands[s] becomes a uniform draw from those not yet drawn
            r = s + min(int(rng() * (m - s)), m - s - 1)
            cands[s], cands[r] = cands[r], cands[s]
            h = cands[s]
            if best is None or h.rq_active * best.weight < best.rq_active * h.weight:
                best = h
        return best
