"""What every listener has: a listening socket, its connections, and its drain fan-out.

The drain core's ``ListenerDrain`` holds the decisions; this holds the sockets. A connection
of any kind offers ``on_drain_event``, ``no_new_work``, ``cut``, ``close_at_end``,
``transport`` and ``gone`` (the server drives them at T, at the deadline and at the exit).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import socket
import struct
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from lameduck.config import ListenerConfig
from lameduck.drain import DrainEvent, ListenerDrain, ProcessDrain
from lameduck.drain.probers import ProbeTracker
from lameduck.stats import DrainStats, ListenerStats

log = logging.getLogger("lameduck.listener")

# Descriptors kept back from the downstream cap: listening sockets, the admin, log files,
# the hot-restart socket, health checks.
FD_RESERVE = 32
# The accept queue (listen(2) backlog), also when the loop's create_server listens again
# (its default is 100: a burst of connections beyond it waits for SYN retransmits).
BACKLOG = 1024
# At most one "connection cap reached" line per listener this often (seconds).
OVERFLOW_LOG_INTERVAL = 10.0


def downstream_cap(nofile: int | None = None) -> int:
    """How many downstream connections the process holds at once: half the descriptors
    RLIMIT_NOFILE leaves after a reserve, since each proxied connection may need an upstream
    one too (HAProxy derives its default maxconn from ``ulimit-n`` the same way). Past it a
    connection is closed at once and counted, instead of accept(2) failing with EMFILE —
    which libuv (uvloop) hides by accepting and closing queued connections uncounted, and
    asyncio logs with a traceback — and upstream connects of the connections already held
    failing for want of a descriptor."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, (nofile - FD_RESERVE) // 2)


class Overflow(asyncio.Protocol):
    """What a connection past the cap gets: closed at once (abort: nothing is read or
    written), counted, and logged at most once per OVERFLOW_LOG_INTERVAL."""

    __slots__ = ("listener",)

    def __init__(self, listener: Listener) -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.listener.overflowed()
        transport.abort()  # type: ignore[attr-defined]


def accept_queue(sock: Any) -> int:
    """Connections the kernel has completed and not yet handed to accept(): on a listening
    socket Linux reports that queue's length as ``tcpi_unacked`` (struct tcp_info). Closing
    the socket resets each of them — clients that did everything right, refused."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError):
        return 0  # not TCP, or not Linux: nothing to count
    return struct.unpack_from("I", info, 24)[0] if len(info) >= 28 else 0


class ListenError(OSError):
    """A listener's address could not be bound: ``listener 'ingress' on 127.0.0.1:8080:
    address already in use`` (the errno is kept for code that tests it)."""

    def __init__(self, listener: str, address: str, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        super().__init__(f"listener {listener!r} on {address}: {reason[:1].lower()}{reason[1:]}")
        self.errno = cause.errno
        self.listener = listener
        self.address = address


class Listener:
    """A configured listener's socket lifecycle; subclasses say what serves a connection."""

    drain_stats: DrainStats
    # What its health-check path saw (``drain/probers.py``; None: it has none, as a TCP
    # listener): the probers always; ``traffic`` is the same tracker while a preStop or a
    # shutdown watches for the balancer to let go (``leave: confirm``), else None, so a
    # connection or a request that nobody watches costs nothing.
    probes: ProbeTracker | None = None
    traffic: ProbeTracker | None = None
    # What TCP responses advertise HTTP/3 with (``h3=":PORT"; ma=N``, RFC 7838), on a
    # listener that serves it too (listeners[].http3), else None.
    alt_svc: bytes | None = None
    # Its UDP socket's ``listeners.quic.QuicEndpoint`` when it serves HTTP/3, else None.
    quic: Any = None
    # Every listener of this process (the downstream cap counts their connections together).
    running: weakref.WeakSet[Listener] = weakref.WeakSet()
    cap: int = downstream_cap()

    def __init__(self, cfg: ListenerConfig, loop: asyncio.AbstractEventLoop,
                 process: ProcessDrain, drain: ListenerDrain,
                 on_change: Callable[[], None]) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.loop = loop
        self.process = process
        self.drain = drain
        self.connections: set[Any] = set()
        # Connections accepted whose TLS handshake is under way (``TlsAccept``, from the
        # client's first bytes): not yet in ``connections``, and counted as connections and as
        # busy by every exit decision.
        self.handshakes: set[Any] = set()
        # TLS connections accepted that have sent nothing yet (a TCP health check, a port
        # scan, a client's pre-connect pool): open connections, idle like an HTTP/1.1 one
        # before its first request, so an exit closes them.
        self.silent: set[Any] = set()
        self.server: asyncio.AbstractServer | None = None
        self.sockname: tuple = ()
        self.stop_handle: asyncio.TimerHandle | None = None
        self._on_change = on_change
        # Another holder keeps the listening socket open after we close ours (systemd's
        # socket activation): its queued connections are not reset.
        self.socket_shared = False
        self.socket_shared_by_workers = False
        self.listener_stats = ListenerStats()
        self._overflow_logged = -math.inf
        self._overflow_unlogged = 0

    # -- the downstream connection cap -----------------------------------------------------
    def has_room(self) -> bool:
        """True while the process holds fewer downstream connections than ``cap``."""
        held = 0
        for ln in Listener.running:
            held += len(ln.connections) + len(ln.handshakes) + len(ln.silent)
        return held < Listener.cap

    def overflowed(self) -> None:
        """A connection past the cap was closed: count it; log it, rate-limited."""
        self.listener_stats.downstream_global_cx_overflow += 1
        self._overflow_unlogged += 1
        now = time.monotonic()
        if now - self._overflow_logged >= OVERFLOW_LOG_INTERVAL:
            log.warning("listener %s: %d connection(s) closed at once: the process holds its "
                        "cap of %d downstream connections (RLIMIT_NOFILE %d); raise the hard "
                        "limit (ulimit -Hn, systemd's LimitNOFILE=)",
                        self.name, self._overflow_unlogged, Listener.cap,
                        resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            self._overflow_logged = now
            self._overflow_unlogged = 0

    async def start(self, sock: socket.socket | None = None) -> None:
        raise NotImplementedError

    def handshake_done(self) -> None:
        """A TLS handshake ended (either way), began, or a silent TLS connection closed:
        during a shutdown the exit may be decided now."""
        self._on_change()

    def close_silent(self) -> None:
        """The exit: TLS connections that have sent nothing are closed, not counted (nothing
        of theirs is lost; RFC 9112 §9.6 lets a server close an idle connection)."""
        for acc in list(self.silent):
            acc.abort()

    def cut_handshakes(self) -> int:
        """The deadline (or a quit) with TLS handshakes under way: each is reset and counted
        as a cut (a reset: what its client sent is lost); how many."""
        n = len(self.handshakes)
        for acc in list(self.handshakes):
            acc.abort()
        if n:
            self.process.ledger.cut_unheard(n)
            self.drain_stats.cut_reset += n
        return n

    # -- lifecycle --------------------------------------------------------------------------
    def bind(self, reuse_port: bool = False, port: int | None = None) -> socket.socket:
        """A listening socket at the configured address; ListenError names this listener,
        the address and the cause (an operator reads which port to free, not an errno).
        ``reuse_port``: in an SO_REUSEPORT group (one socket per worker); ``port``: this
        one, not the configured (another socket of the group, bound on port 0)."""
        addr = self.cfg.address
        family = socket.AF_INET6 if ":" in addr.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((addr.host, addr.port if port is None else port))
            sock.listen(BACKLOG)
        except OSError as e:
            sock.close()
            raise ListenError(self.name, str(addr), e) from e
        sock.setblocking(False)
        return sock

    @property
    def accepting(self) -> bool:
        return self.server is not None

    @property
    def port(self) -> int:
        return self.sockname[1]

    def queued(self) -> int:
        """Connections waiting in the accept queue while it accepts: clients about to be
        served, as much as those already accepted."""
        return 0 if self.server is None else sum(accept_queue(s) for s in self.server.sockets)

    def stop_accepting(self, handed_over: bool = False) -> None:
        """Close the listening socket; connections already accepted carry on. Those still in
        the accept queue are reset by the kernel, and counted — unless the socket lives on in
        a successor (``handed_over``, hot restart) or another holder."""
        if self.stop_handle is not None:
            self.stop_handle.cancel()
            self.stop_handle = None
        if self.server is not None:
            queued = 0 if handed_over or self.socket_shared else self.queued()
            self.server.close()
            if queued:
                self.drain_stats.cx_reset_listener_close += queued
                log.warning("listener %s closed with %d connection(s) not yet accepted: reset",
                            self.name, queued)
            self.server = None
            # a worker's listener: its main process says it, once for every worker
            log.log(logging.DEBUG if self.socket_shared_by_workers else logging.INFO,
                    "listener %s stopped accepting", self.name)
            self._on_change()

    def schedule_stop(self) -> None:
        """Follow the drain core's ``stop_at`` for this listener."""
        at = self.drain.stop_at
        if at is None or self.server is None:
            return
        delay = at - self.loop.time()
        if delay <= 0:
            self.stop_accepting()
            return
        if self.stop_handle is not None:
            self.stop_handle.cancel()
        self.stop_handle = self.loop.call_later(delay, self.stop_accepting)

    # -- the health-check path's evidence (leave: confirm) ------------------------------------
    def watch(self, on: bool) -> None:
        """Record every new connection and request per source address (``traffic``) while
        ``on``: a preStop or a shutdown waits for the balancer to let go."""
        self.traffic = self.probes if on else None

    def probes_info(self, now: float) -> dict[str, object]:
        """``/server_info``'s ``lb_probes`` of this listener: its probers and top talkers ({}
        without a health-check path)."""
        probes = self.probes
        return {} if probes is None else {"lb_probes": probes.view(now)}

    def broadcast(self, event: DrainEvent) -> None:
        """A drain event reached this listener: every connection draws its moment."""
        for conn in list(self.connections):
            conn.on_drain_event(event)
        self.schedule_stop()


def probe_trackers(listeners: Iterable[Listener]) -> list[tuple[str, ProbeTracker]]:
    """Each listener with a health-check path, by name, and what its path saw."""
    return [(ls.name, t) for ls in listeners if (t := ls.probes) is not None]
