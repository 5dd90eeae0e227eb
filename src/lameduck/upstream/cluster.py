"""A cluster: named group of endpoints, a balancer over them, and its stats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lameduck.stats import ClusterStats
from lameduck.upstream.pool import Endpoint


class Cluster:
    """Static endpoints balanced round robin (health and admin states come later, issue 5)."""

    __slots__ = ("connect_timeout", "connector", "endpoints", "idle_timeout", "name",
                 "next_index", "stats")

    def __init__(
        self,
        name: str,
        endpoints: list[Endpoint],
        connect_timeout: float,
        idle_timeout: float,
    ) -> None:
        if not endpoints:
            raise ValueError(f"cluster {name!r} has no endpoints")
        self.name = name
        self.endpoints = endpoints
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.stats = ClusterStats()
        self.next_index = 0
        # How exchanges get an upstream of a multiplexed (HTTP/2) cluster, set by the wiring
        # (upstream/ does not import the codecs); None: a keep-alive HTTP/1.1 pool.
        self.connector: Callable[[Endpoint], Any] | None = None

    def pick(self) -> Endpoint:
        eps = self.endpoints
        i = self.next_index
        self.next_index = (i + 1) % len(eps)
        return eps[i]

    def expire_idle(self, now: float) -> None:
        """Close pooled connections idle longer than ``idle_timeout`` (0 = keep them)."""
        if self.idle_timeout <= 0:
            return
        for ep in self.endpoints:
            self.stats.upstream_cx_idle_timeout += ep.expire(now, self.idle_timeout)

    def close_idle(self) -> None:
        for ep in self.endpoints:
            ep.close_all()
