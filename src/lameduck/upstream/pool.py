"""A keep-alive connection pool per endpoint.

The pool knows nothing of HTTP: it gets a connection factory from the wiring in
``server/build.py`` (upstream/ must not import the codecs). Idle connections are reused last-in,
first-out, so a steady load keeps a small hot set and the surplus ages out by idle timeout
instead of being churned.

New connections still being opened to one endpoint are capped (``max_connecting``): a cold
pool (after a hot restart) meets a burst of requests with a few connects at a time, and the
rest wait in line for the first connection that is free — one that finished connecting
frees a slot, one given back to the pool is taken — instead of opening a storm of connects at
once. Only handshakes under way are counted: where they finish at once (loopback), a short
accept queue can still overflow, and the dropped connect is the retry's to save.

Shared (HTTP/2) connections are listed here too (``Endpoint.shared``), but where a new stream
goes and when it is sent is ``upstream.shared``'s: its streams wait in the same line.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

from lameduck.drain.endpoint import EndpointDrain
from lameduck.upstream.connector import UpstreamConn


class Severable(Protocol):
    """Any connection to an endpoint (pooled, shared, a TCP relay)."""

    def sever(self) -> None:
        """Close it now; whatever is in flight on it fails (and is counted so)."""


class SharedConnection(Protocol):
    """A multiplexed connection (HTTP/2): shared by many exchanges at once, never idle-listed."""

    idle_since: float

    @property
    def busy(self) -> int: ...

    def close(self) -> None: ...


class Endpoint:
    """One upstream address: its drain state and health, its pool of idle connections and its
    shared (HTTP/2) ones, every connection open to it (to sever them), and its counters."""

    __slots__ = ("address", "address_bytes", "agent_port", "agent_said", "agent_up", "connecting",
                 "conns", "cx_active", "cx_connect_fail", "cx_total", "drain", "ejected", "hc_ok",
                 "host",
                 "idle", "max_connecting", "max_idle", "maxconn", "port", "rq_active",
                 "rq_error", "rq_success", "rq_timeout", "rq_total", "shared", "waiting",
                 "weight", "weight_config")

    def __init__(self, host: str, port: int, max_idle: int, weight: int = 1,
                 drain: EndpointDrain | None = None, agent_port: int | None = None,
                 max_connecting: int = 0) -> None:
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.address_bytes = self.address.encode()  # as each access-log line writes it
        self.max_idle = max_idle
        self.idle: list[UpstreamConn] = []
        self.shared: list[SharedConnection] = []  # open, in the order they were opened
        self.conns: set[Severable] = set()  # every open connection (and TCP relay)
        self.max_connecting = max_connecting  # new connections being opened at once; 0 = any
        self.connecting = 0
        # Requests in line for a connection (their wake-ups), first come first served.
        self.waiting: deque[Callable[[], None]] = deque()
        self.drain = drain if drain is not None else EndpointDrain()
        self.weight_config = weight
        self.weight = weight  # as an agent's "N%" scaled it
        self.maxconn = 0  # an agent's "maxconn:N"; 0 = no limit
        self.agent_port = agent_port
        self.agent_said = ""  # the agent's last words, as shown by /clusters
        self.hc_ok = True  # the active health check's verdict
        self.agent_up = True  # the agent's up/down
        self.ejected = False  # by outlier detection
        self.rq_active = 0
        self.rq_total = 0
        self.rq_success = 0
        self.rq_error = 0
        self.rq_timeout = 0
        self.cx_total = 0
        self.cx_active = 0
        self.cx_connect_fail = 0

    def update_health(self) -> bool:
        """Fold the three health sources into the drain state's one flag; True if it changed."""
        healthy = self.hc_ok and self.agent_up and not self.ejected
        if healthy == self.drain.healthy:
            return False
        self.drain.healthy = healthy
        return True

    @property
    def health_flags(self) -> str:
        """Envoy's /clusters health_flags words."""
        flags = []
        if not self.hc_ok:
            flags.append("/failed_active_hc")
        if self.ejected:
            flags.append("/failed_outlier_check")
        if not self.agent_up:
            flags.append("/failed_agent_check")
        return "".join(flags) or "healthy"

    def sever(self) -> int:
        """Close every connection to this endpoint, busy or not (drain stop 0, drop at drain
        end): what is in flight on them is cut. Returns how many."""
        conns = list(self.conns)
        self.idle.clear()
        for conn in conns:
            conn.sever()
        return len(conns)

    def acquire(self) -> UpstreamConn | None:
        """The most recently used live idle connection, or None (the caller connects)."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.reusable:
                return conn
        return None

    def may_connect(self) -> bool:
        """May a new connection be opened now: fewer than ``max_connecting`` are being opened
        and nobody is in line before the caller?"""
        return not self.waiting and (not self.max_connecting
                                     or self.connecting < self.max_connecting)

    def may_connect_next(self) -> bool:
        """The same for the first in line (woken by ``next_waiting``)."""
        return not self.max_connecting or self.connecting < self.max_connecting

    def next_waiting(self) -> Callable[[], None] | None:
        """A connection became free (connected, or given back): the first in line's wake-up."""
        return self.waiting.popleft() if self.waiting else None

    def take_line(self) -> list[Callable[[], None]]:
        """Everyone in line, in order, the line emptied (a new connection may have room for
        several: HTTP/2 places each again)."""
        line = list(self.waiting)
        self.waiting.clear()
        return line

    def leave_line(self, wake: Callable[[], None]) -> None:
        """A request in line gave up (timed out, cut, its client gone)."""
        with contextlib.suppress(ValueError):
            self.waiting.remove(wake)

    def release(self, conn: UpstreamConn, now: float) -> bool:
        """Give a finished connection back; False means the caller must close it."""
        if not conn.reusable or len(self.idle) >= self.max_idle:
            return False
        conn.idle_since = now
        self.idle.append(conn)
        return True

    def forget(self, conn: UpstreamConn) -> None:
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


Connector = Callable[[Endpoint], Awaitable[UpstreamConn]]
