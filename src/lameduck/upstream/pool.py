"""A keep-alive connection pool per endpoint.

The pool knows nothing of HTTP: it gets a connection factory from the wiring in ``server.py``
(DESIGN.md §4: upstream/ must not import the codecs). Idle connections are reused last-in,
first-out, so a steady load keeps a small hot set and the surplus ages out by idle timeout
instead of being churned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol


class PooledConnection(Protocol):
    """What the pool needs of a connection."""

    idle_since: float

    @property
    def reusable(self) -> bool: ...

    def close(self) -> None: ...


class SharedConnection(Protocol):
    """A multiplexed connection (HTTP/2): shared by many exchanges at once, never idle-listed."""

    idle_since: float

    @property
    def busy(self) -> int: ...

    def close(self) -> None: ...


class Endpoint:
    """One upstream address, its pool of idle connections and its shared (HTTP/2) ones."""

    __slots__ = ("address", "host", "idle", "max_idle", "port", "shared")

    def __init__(self, host: str, port: int, max_idle: int) -> None:
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.max_idle = max_idle
        self.idle: list[PooledConnection] = []
        self.shared: list[SharedConnection] = []  # open, in the order they were opened

    def acquire(self) -> PooledConnection | None:
        """The most recently used live idle connection, or None (the caller connects)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.reusable:
                return conn
        return None

    def release(self, conn: PooledConnection, now: float) -> bool:
        """Give a finished connection back; False means the caller must close it."""
        if not conn.reusable or len(self.idle) >= self.max_idle:
            return False
        conn.idle_since = now
        self.idle.append(conn)
        return True

    def forget(self, conn: PooledConnection) -> None:
        """A pooled connection closed on its own (upstream FIN, idle timeout)."""
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    def forget_shared(self, conn: SharedConnection) -> None:
        """A shared connection closed (either side)."""
        with contextlib.suppress(ValueError):
            self.shared.remove(conn)

    def expire(self, now: float, idle_timeout: float) -> int:
        """Close connections idle longer than the timeout (oldest are at the front)."""
        n = 0
        idle = self.idle
        while idle and now - idle[0].idle_since >= idle_timeout:
            idle.pop(0).close()
            n += 1
        for conn in list(self.shared):
            if not conn.busy and now - conn.idle_since >= idle_timeout:
                conn.close()
                n += 1
        return n

    def close_all(self) -> None:
        """Close what no exchange is using (a shared connection with streams stays)."""
        while self.idle:
            self.idle.pop().close()
        for conn in list(self.shared):
            if not conn.busy:
                conn.close()


Connector = Callable[[Endpoint], Awaitable[PooledConnection]]
