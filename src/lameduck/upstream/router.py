"""Routes: (optional Host, path prefix) -> cluster. First match wins, as in Envoy's route table."""

from __future__ import annotations

from lameduck.upstream.cluster import Cluster


class Route:
    __slots__ = ("cluster", "host", "per_try_idle_timeout", "prefix", "timeout")

    def __init__(self, prefix: str, cluster: Cluster, host: str | None, timeout: float,
                 per_try_idle_timeout: float = 0.0) -> None:
        self.prefix = prefix.encode()
        self.cluster = cluster
        self.host = host.lower().encode() if host else None
        # From the request's end to the response's (Envoy's route timeout); 0 = none.
        self.timeout = timeout
        # No upstream byte for this long cuts the try (Envoy's per_try_idle_timeout); 0 = none.
        self.per_try_idle_timeout = per_try_idle_timeout


class Router:
    __slots__ = ("by_host", "routes")

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        # Without a Host rule the request's Host is never looked at: not normalized either
        # (two method calls per request saved in the common one-table setup).
        self.by_host = any(route.host is not None for route in routes)

    def match(self, host: bytes | None, path: bytes) -> Route | None:
        """``host`` as sent (port and case ignored), validated (``fields.valid_authority``);
        ``path`` in origin form. A list of authorities (a gRPC client's static address list) is
        routed by its first element's host: a route's host is one host, never a list."""
        if host is not None and self.by_host:
            host = host.lower()
            # [v6]:port keeps the brackets; name:port loses the port; a host never holds a comma
            if host[:1] == b"[":
                host = host[: host.find(b"]") + 1]
            else:
                host = host.partition(b":")[0].partition(b",")[0]
        for route in self.routes:
            if route.host is not None and route.host != host:
                continue
            if path.startswith(route.prefix):
                return route
        return None
