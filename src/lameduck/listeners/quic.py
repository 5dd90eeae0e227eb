"""An HTTP listener's UDP socket for HTTP/3 (``listeners[].http3``): QUIC datagrams routed
to their connections by destination connection id (RFC 9000 §5.2), new connections taken
from Initial packets (§17.2.2), Version Negotiation for a version not spoken (§6).

The socket is bound to the TCP listener's address and port (Alt-Svc ``h3=":PORT"`` names
the same port, RFC 7838 §3). It stops taking new connections when the listener stops
accepting, and closes once its last QUIC connection has ended. Each connection is an
``http3.downstream.H3Downstream`` among the listener's connections: drained, cut and
counted with the others.

Per datagram: one header parse and one dict lookup before the connection's own work.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Final

from lameduck.config import ListenerConfig
from lameduck.http3.codec import H3_ALPN, H3Server
from lameduck.http3.downstream import H3Downstream

try:
    from aioquic.buffer import Buffer
    from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
    from aioquic.quic.connection import NetworkAddress
    from aioquic.quic.packet import (
        QuicPacketType,
        encode_quic_version_negotiation,
        pull_quic_header,
    )
except ModuleNotFoundError as e:  # pragma: no cover - the codec's import said it first
    from lameduck.extras import missing_extra

    raise missing_extra("http3", "listeners[].http3", e) from e

if TYPE_CHECKING:
    from lameduck.listeners.http import HttpListener

log = logging.getLogger("lameduck.listener")


# The QUIC idle timeout of a listener with ``idle_timeout: 0`` (no idle timeout on TCP):
# aioquic has no "none" (its idle timer always runs), so an idle QUIC connection ends after
# this (docs/http3.md, Limits).
QUIC_IDLE_TIMEOUT_WHEN_OFF: Final = 3600.0


def quic_configuration(cfg: ListenerConfig) -> QuicConfiguration:
    """A server's QUIC configuration from the listener's: its certificate, ALPN h3, its
    idle timeout (RFC 9000 §10.1 max_idle_timeout), and the HTTP/2 listener's flow-control
    windows as QUIC's initial ones (§18.2 initial_max_stream_data_bidi_remote,
    initial_max_data)."""
    assert cfg.tls is not None
    h2 = cfg.http2
    idle = cfg.idle_timeout if cfg.idle_timeout > 0 else QUIC_IDLE_TIMEOUT_WHEN_OFF
    qc = QuicConfiguration(is_client=False, alpn_protocols=list(H3_ALPN), idle_timeout=idle,
                           max_stream_data=h2.initial_stream_window_size,
                           max_data=h2.initial_connection_window_size)
    qc.load_cert_chain(cfg.tls.certificate, cfg.tls.key)
    return qc


def bind_udp(listener: HttpListener, port: int) -> socket.socket:
    """The UDP socket on the listener's host and ``port`` (its TCP port). SO_REUSEPORT: a
    hot restart's new process binds it while the old one still drains on its own."""
    from lameduck.listeners.base import ListenError

    host = listener.cfg.address.host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ListenError(listener.name, f"{host}:{port}/udp (http3)", e) from e
    sock.setblocking(False)
    return sock


class QuicEndpoint(asyncio.DatagramProtocol):
    """One listener's UDP socket and the QUIC connections on it, by connection id."""

    def __init__(self, listener: HttpListener, configuration: QuicConfiguration) -> None:
        self.listener = listener
        self.configuration = configuration
        self.cid_length = configuration.connection_id_length
        self.versions = configuration.supported_versions
        h2 = listener.cfg.http2
        self.max_streams = h2.max_concurrent_streams
        self.max_field_section = listener.max_request_headers
        self.conns: dict[bytes, H3Downstream] = {}
        self.transport: asyncio.DatagramTransport | None = None
        self.accepting = True

    # -- asyncio ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: NetworkAddress) -> None:  # type: ignore[override]
        try:
            header = pull_quic_header(Buffer(data=data), host_cid_length=self.cid_length)
        except ValueError:
            return  # not QUIC
        conn = self.conns.get(header.destination_cid)
        if conn is not None:
            conn.datagram_received(data, addr)
            return
        self._new(data, addr, header)

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: UDP error: %s", self.listener.name, exc)

    def _new(self, data: bytes, addr: NetworkAddress, header: object) -> None:
        """A datagram for no connection of ours: a new connection's Initial, or dropped."""
        ptype = header.packet_type  # type: ignore[attr-defined]
        version = header.version  # type: ignore[attr-defined]
        if (ptype != QuicPacketType.VERSION_NEGOTIATION and version is not None
                and version not in self.versions):
            if self.transport is not None:
                self.transport.sendto(encode_quic_version_negotiation(
                    source_cid=header.destination_cid,  # type: ignore[attr-defined]
                    destination_cid=header.source_cid,  # type: ignore[attr-defined]
                    supported_versions=self.versions), addr)
            return
        if ptype != QuicPacketType.INITIAL or len(data) < SMALLEST_MAX_DATAGRAM_SIZE:
            return
        listener = self.listener
        if not self.accepting:
            return  # as a closed TCP port: the client tries elsewhere (or TCP)
        if not listener.has_room():
            listener.overflowed()
            return
        dcid: bytes = header.destination_cid  # type: ignore[attr-defined]
        h3 = H3Server(self.configuration, dcid, self.max_streams, self.max_field_section)
        conn = H3Downstream(listener, self, h3, addr)
        self.conns[dcid] = conn
        self.conns[h3.quic.host_cid] = conn
        conn.cids.update((dcid, h3.quic.host_cid))
        conn.start()
        conn.datagram_received(data, addr)

    # -- what a connection asks (``http3.downstream.QuicEndpointPort``) --------------------------
    def sendto(self, data: bytes, addr: NetworkAddress) -> None:
        t = self.transport
        if t is not None:
            t.sendto(data, addr)

    def cid_issued(self, cid: bytes, conn: H3Downstream) -> None:
        self.conns[cid] = conn
        conn.cids.add(cid)

    def cid_retired(self, cid: bytes) -> None:
        conn = self.conns.pop(cid, None)
        if conn is not None:
            conn.cids.discard(cid)

    def forget(self, conn: H3Downstream) -> None:
        """``conn`` ended: its connection ids are nobody's now."""
        for cid in conn.cids:
            if self.conns.get(cid) is conn:
                del self.conns[cid]
        conn.cids.clear()
        if not self.accepting and not self.conns:
            self.close()

    # -- lifecycle ----------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """No new connections; the socket closes once the last one has ended."""
        self.accepting = False
        if not self.conns:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
