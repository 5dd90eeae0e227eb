"""An HTTP listener: owns the listening socket and the set of its downstream connections.

It is the ``ListenerContext`` the HTTP/1 codec talks to, and the node that fans a drain event
out to its connections (the drain core's ``ListenerDrain`` holds the decision; this holds the
sockets).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
from collections.abc import Callable
from typing import Any

from lameduck.config import ListenerConfig
from lameduck.drain import ListenerDrain, ProcessDrain
from lameduck.drain.probers import ProbeSettings, ProbeTracker
from lameduck.http1.downstream import H1Downstream
from lameduck.http1.upstream import H1Upstream
from lameduck.http2.connection import H2Limits
from lameduck.http2.downstream import H2Downstream
from lameduck.listeners.base import BACKLOG, Listener, Overflow
from lameduck.listeners.tls import TlsAccept, server_context
from lameduck.proxy.accesslog import open_access_log
from lameduck.stats import DrainStats, Http2Stats, Http3Stats, HttpStats
from lameduck.upstream.cluster import Cluster
from lameduck.upstream.connector import UpstreamConn
from lameduck.upstream.pool import Endpoint
from lameduck.upstream.router import Router

log = logging.getLogger("lameduck.listener")


def _timeout(seconds: float) -> float:
    """Config says 0 = none."""
    return seconds if seconds > 0 else math.inf


async def _connect(
    loop: asyncio.AbstractEventLoop, cluster: Cluster, endpoint: Endpoint
) -> H1Upstream:
    stats = cluster.stats

    def closed(conn: H1Upstream) -> None:
        stats.upstream_cx_active -= 1
        endpoint.cx_active -= 1
        endpoint.conns.discard(conn)
        if not conn.closed_here:
            stats.upstream_cx_destroy_remote += 1
        endpoint.forget(conn)

    def opened(conn: H1Upstream) -> None:
        stats.upstream_cx_total += 1
        stats.upstream_cx_active += 1
        endpoint.cx_total += 1
        endpoint.cx_active += 1
        endpoint.conns.add(conn)

    def factory() -> H1Upstream:
        # The callbacks exist before the connection can be lost: an upstream that closes
        # right after accepting may do so before this coroutine resumes.
        proto = H1Upstream(endpoint, loop)
        proto.on_opened = opened
        proto.on_closed.append(closed)
        return proto

    began = loop.time()
    try:
        _, proto = await asyncio.wait_for(
            loop.create_connection(factory, endpoint.host, endpoint.port),
            cluster.connect_timeout,
        )
        stats.upstream_cx_connect_ms.record((loop.time() - began) * 1000.0)
    except TimeoutError:
        stats.upstream_cx_connect_timeout += 1
        endpoint.cx_connect_fail += 1
        raise
    except OSError:
        endpoint.cx_connect_fail += 1
        raise
    if not proto.alive:
        raise ConnectionResetError("upstream closed the connection at once")
    return proto


def open_upstream(
    loop: asyncio.AbstractEventLoop, cluster: Cluster, endpoint: Endpoint
) -> asyncio.Future[H1Upstream]:
    """The connection factory the pool and codec use (wired here, so upstream/ stays codec-free)."""
    return asyncio.ensure_future(_connect(loop, cluster, endpoint))


class HttpListener(Listener):
    """One configured HTTP listener."""

    def __init__(
        self,
        cfg: ListenerConfig,
        loop: asyncio.AbstractEventLoop,
        process: ProcessDrain,
        drain: ListenerDrain,
        router: Router,
        stats: HttpStats,
        drain_stats: DrainStats,
        on_change: Callable[[], None],
        rng: Callable[[], float] = random.random,
        h2stats: Http2Stats | None = None,
        h3stats: Http3Stats | None = None,
    ) -> None:
        super().__init__(cfg, loop, process, drain, on_change)
        self.router = router
        self.stats = stats
        self.h2stats = h2stats if h2stats is not None else Http2Stats()
        self.drain_stats = drain_stats
        self.rng = rng
        self.connections: set[Any] = set()  # H1Downstream, H2Downstream, H3Downstream
        self.h3stats = h3stats if h3stats is not None else Http3Stats()
        # hot restart: this process's epoch (it marks the QUIC connection ids issued here),
        # the UDP socket the previous process read (and the rest of its SO_REUSEPORT group,
        # read here too), and where to forward the packets of each older process (and worker)
        # still draining (by listeners.quic.route); with workers, this worker's index and the
        # end its successor forwards to; set before ``start``
        self.generation = 0
        self.quic_socket: socket.socket | None = None
        self.quic_extra: list[socket.socket] = []
        self.quic_forward: dict[int, socket.socket] = {}
        self.quic_worker = 0
        self.quic_inbox: socket.socket | None = None
        hc = cfg.health_check_path
        self.health_check_path = hc.encode() if hc else None
        lp = cfg.lb_probes
        self.probes = ProbeTracker(ProbeSettings(lp.fall, lp.interval, lp.quiet,
                                                 lp.max_peers)) if hc else None
        self.request_headers_timeout = _timeout(cfg.request_headers_timeout)
        self.idle_timeout = _timeout(cfg.idle_timeout)
        self.max_connection_duration = _timeout(cfg.max_connection_duration)
        self.send_timeout = _timeout(cfg.send_timeout)
        self.request_body_timeout = _timeout(cfg.request_body_timeout)
        al = cfg.access_log
        self.access_log = None if al is None else open_access_log(al.path, al.format, loop)
        self.generate_request_id = cfg.generate_request_id
        self.suppress_envoy_headers = cfg.suppress_envoy_headers
        self.max_requests_per_connection = cfg.max_requests_per_connection
        self.max_request_headers = cfg.max_request_headers_kb * 1024
        self.connect_allow = frozenset((a.host.lower(), a.port) for a in cfg.connect.allow)
        self.connect_timeout = cfg.connect.connect_timeout
        self.ssl = server_context(cfg)
        self.scheme = b"https" if self.ssl is not None else b"http"
        h2 = cfg.http2
        self.h2_limits = H2Limits(
            max_concurrent_streams=h2.max_concurrent_streams,
            initial_window_size=h2.initial_stream_window_size,
            connection_window=h2.initial_connection_window_size,
            max_header_list_size=self.max_request_headers,
            max_resets_per_window=h2.max_resets, reset_window=h2.flood_window,
            max_pings_per_window=h2.max_pings, max_settings_per_window=h2.max_settings,
            max_empty_frames_per_window=h2.max_empty_frames, control_window=h2.flood_window,
        )

    # -- ListenerContext --------------------------------------------------------------------
    def connect(self, cluster: Cluster, endpoint: Endpoint) -> asyncio.Future[UpstreamConn]:
        if cluster.connector is not None:
            return cluster.connector(endpoint)  # type: ignore[no-any-return]
        return open_upstream(self.loop, cluster, endpoint)  # type: ignore[return-value]

    def on_connection_closed(self, conn: H1Downstream) -> None:
        self._on_change()

    def on_request_done(self) -> None:
        self._on_change()

    def upgrade_h2(self, conn: H1Downstream, data: bytes) -> bool:
        """A connection opened with the HTTP/2 prior-knowledge preface (Envoy's codec_type
        AUTO): an HTTP/2 protocol takes the socket over, with the drain state it had."""
        t = conn.transport
        if t is None:
            return False
        conn.hand_over()
        self.connections.discard(conn)
        self.stats.downstream_cx_http1_active -= 1
        h2 = H2Downstream(self)  # type: ignore[arg-type]
        # Accepted once: still unheard until its first request (the ledger's fresh count),
        # now that one's to settle
        h2.unseen, conn.unseen = conn.unseen, False
        t.set_protocol(h2)
        h2.adopt(t, conn.drain, data, fresh=False)
        return True

    def connect_target(self, authority: bytes | None) -> tuple[str, int] | None:
        """The (host, port) of a CONNECT's authority if the allow-list has it, else None."""
        if not authority or not self.connect_allow:
            return None
        try:
            text = authority.decode("ascii").lower()
        except UnicodeDecodeError:
            return None
        if text.startswith("["):
            host, sep, port = text[1:].partition("]:")
        else:
            host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            return None
        target = (host, int(port))
        return target if target in self.connect_allow else None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve on ``sock`` (bound here if None)."""
        if sock is None:
            sock = self.bind()
        self.sockname = sock.getsockname()
        if self.cfg.http3 is not None:
            await self._start_quic()  # first: every TCP connection reads its Alt-Svc
        Listener.running.add(self)
        if self.ssl is not None:
            # accepted plain, the handshake is TlsAccept's: counted from the accept
            self.server = await self.loop.create_server(
                lambda: TlsAccept(self) if self.has_room() else Overflow(self),
                sock=sock, backlog=BACKLOG)
        else:
            self.server = await self.loop.create_server(
                lambda: H1Downstream(self) if self.has_room() else Overflow(self), sock=sock,
                backlog=BACKLOG)

    async def _start_quic(self) -> None:
        """HTTP/3 on a UDP socket at the TCP listener's address and port (bound by then:
        port 0 has become a real one). A failure to bind fails the start-up: ListenError."""
        from lameduck.listeners.quic import QuicEndpoint, bind_udp, quic_configuration

        udp = self.quic_socket if self.quic_socket is not None else bind_udp(
            self, self.sockname[1])
        extra, forward, inbox = self.quic_extra, self.quic_forward, self.quic_inbox
        self.quic_socket, self.quic_extra, self.quic_forward, self.quic_inbox = None, [], {}, None
        endpoint: QuicEndpoint | None = None
        try:
            endpoint = QuicEndpoint(self, quic_configuration(self.cfg), udp, self.generation,
                                    forward, self.h3stats, self.quic_worker, extra, inbox)
            await self.loop.create_datagram_endpoint(lambda: endpoint, sock=udp)
        except BaseException:
            udp.close()
            if endpoint is not None:
                endpoint.close()  # its copy of the socket, the extras, forward, inbox
            else:
                for s in (*extra, *forward.values(), *([inbox] if inbox else [])):
                    s.close()
            raise
        self.quic = endpoint
        h3 = self.cfg.http3
        assert h3 is not None
        self.alt_svc = b'h3=":%d"; ma=%d' % (self.sockname[1], int(h3.alt_svc_max_age))

    def stop_accepting(self, handed_over: bool = False) -> None:
        """The TCP socket closes; the UDP one takes no new QUIC connections and closes once
        its last one has ended."""
        super().stop_accepting(handed_over)
        if self.quic is not None:
            self.quic.stop_accepting()
