"""An HTTP listener's UDP socket for HTTP/3 (``listeners[].http3``): QUIC datagrams routed
to their connections by destination connection id (RFC 9000 §5.2), new connections taken
from Initial packets (§17.2.2), Version Negotiation for a version not spoken (§6).

The socket is bound to the TCP listener's address and port (Alt-Svc ``h3=":PORT"`` names
the same port, RFC 7838 §3). It stops taking new connections when the listener stops
accepting, and closes once its last QUIC connection has ended. Each connection is an
``http3.downstream.H3Downstream`` among the listener's connections: drained, cut and
counted with the others.

Per datagram: one header parse and one dict lookup before the connection's own work.

Hot restart. The new process takes this socket over like the TCP one, and from its "drain"
on only the newest process reads it; an older one still sends from it (the same address and
port its clients know). Every connection id a process issues begins with its generation
(the hot restart epoch, one byte: ``H3Server``'s ``cid_prefix``), so a packet for a
connection of an older process is known by its first byte. The reader hands such a packet,
with its client's address, to that process over a Unix seqpacket socket (a socketpair each
process makes at its handover and gives its successor, which passes it on to its own), until
sending fails because that process has exited; an older process whose newer ones have all
exited reads the socket again, forwarding to the older ones still draining. As Envoy
forwards QUIC packets to the process
it replaces during a hot restart; counted in ``http.<listener>.http3.packets_forwarded``.

Workers. With ``workers`` > 1 the main process holds one UDP socket per worker, all in one
SO_REUSEPORT group on the port, and every connection id's second byte names the worker that
issued it. A classic BPF program on the group (``steering_program``, SO_ATTACH_REUSEPORT_CBPF,
socket(7)) hands each datagram to the socket of the worker its destination id names, as
Envoy steers QUIC packets to its workers; a client's first Initial, whose id the client drew,
goes where that id's byte points, or where the kernel's hash puts it. Forwarding is by
(generation, worker): a route, ``route(mark, worker)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import select
import socket
import struct
from typing import TYPE_CHECKING, Final

from lameduck.config import ListenerConfig
from lameduck.http3.codec import H3_ALPN, H3Server
from lameduck.http3.downstream import H3Downstream
from lameduck.stats import Http3Stats

try:
    from aioquic.buffer import Buffer
    from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
    from aioquic.quic.connection import NetworkAddress
    from aioquic.quic.crypto import CryptoError, CryptoPair
    from aioquic.quic.packet import (
        QuicErrorCode,
        QuicFrameType,
        QuicPacketType,
        encode_quic_version_negotiation,
        pull_quic_header,
    )
    from aioquic.quic.packet_builder import QuicPacketBuilder
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


# Forwarded datagrams ride a Unix socket whose buffer holds a burst of them: one that does
# not fit is dropped, as the network drops (QUIC retransmits what was lost, RFC 9002).
FORWARD_BUFFER: Final = 1 << 20
# Packet types whose destination connection id is one the server issued (RFC 9000 §17.2.4,
# §17.3.1); an Initial or 0-RTT packet carries the id the client chose.
_OURS: Final = (QuicPacketType.ONE_RTT, QuicPacketType.HANDSHAKE)


def server_initial_keys(header: object) -> CryptoPair:
    """The server's Initial keys of a connection whose client's first Initial named
    ``header``'s destination id (RFC 9001 §5.2: drawn from that id alone)."""
    crypto = CryptoPair()
    crypto.setup_initial(cid=header.destination_cid, is_client=False,  # type: ignore[attr-defined]
                         version=header.version)  # type: ignore[attr-defined]
    return crypto


def opens_connection(data: bytes, header: object, offset: int) -> bool:
    """Whether the Initial packet at the start of ``data`` (its header parsed, its packet
    number at ``offset``) is a client's first flight: Initial packets are protected with keys
    drawn from the destination id of the client's first one (RFC 9001 §5.2), so one that
    names an id the server chose since (RFC 9000 §7.2) does not open under keys drawn from
    that id."""
    try:
        server_initial_keys(header).decrypt_packet(data[:header.packet_length], offset, 0)  # type: ignore[attr-defined]
    except CryptoError:
        return False
    return True


def generation_mark(generation: int) -> int:
    """The first byte of every connection id a process of this hot restart epoch issues."""
    return generation & 0xFF


def route(mark: int, worker: int) -> int:
    """Where a connection id's first two bytes send its packets: the process generation and
    the worker in it (a process without workers is worker 0)."""
    return mark << 8 | (worker & 0xFF)


# setsockopt option (asm-generic/socket.h; not in Python's socket module)
SO_ATTACH_REUSEPORT_CBPF: Final = 51
# The most workers a connection id's worker byte can name.
MAX_QUIC_WORKERS: Final = 256


def steering_program() -> bytes:
    """A classic BPF program for an SO_REUSEPORT group of UDP sockets: the index of the
    socket a QUIC datagram goes to is the second byte of its destination connection id, read
    at offset 2 of a short header (RFC 9000 §17.3: one byte, then the id) and at offset 7 of a
    long one (§17.2: one byte, the version, the id's length, then the id) when that id has two
    bytes or more. The kernel runs it on the UDP payload; an index past the group's last
    socket, or the program's "none" (0xffffffff), falls back to its hash of the addresses.
    A datagram too short to hold the byte it reads ends the program with 0: the group's
    first socket (no QUIC packet is that short)."""
    def ins(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)
    ld_b_abs, ret_a, ret_k = 0x30, 0x16, 0x06  # BPF_LD|BPF_B|BPF_ABS, BPF_RET|BPF_A, |BPF_K
    jset_k, jge_k = 0x45, 0x35  # BPF_JMP|BPF_JSET|BPF_K, BPF_JMP|BPF_JGE|BPF_K
    return b"".join((
        ins(ld_b_abs, 0, 0, 0),      # 0: A = the first byte
        ins(jset_k, 2, 0, 0x80),     # 1: long header? to 4
        ins(ld_b_abs, 0, 0, 2),      # 2: short: A = the id's second byte
        ins(ret_a, 0, 0, 0),         # 3
        ins(ld_b_abs, 0, 0, 5),      # 4: long: A = the id's length
        ins(jge_k, 0, 2, 2),         # 5: two bytes or more? else to 8
        ins(ld_b_abs, 0, 0, 7),      # 6: A = the id's second byte
        ins(ret_a, 0, 0, 0),         # 7
        ins(ret_k, 0, 0, 0xFFFFFFFF),  # 8: the kernel's hash decides
    ))


def steer_by_worker(sock: socket.socket) -> None:
    """Attach ``steering_program`` to the SO_REUSEPORT group ``sock`` is in (the group's,
    not the socket's: every socket of the group, and every later one, is steered by it).
    OSError where the kernel does not have it."""
    code = steering_program()
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, fprog)


def pack_forwarded(addr: NetworkAddress, data: bytes) -> bytes:
    """A datagram and its client's address, as one Unix datagram: the address as text
    (host, port and, for IPv6, flow info and scope id, as asyncio reported it, which aioquic
    compares a path's address with), one length byte before it."""
    text = "|".join(str(part) for part in addr).encode()
    return bytes((len(text),)) + text + data


def unpack_forwarded(msg: bytes) -> tuple[NetworkAddress, bytes]:
    n = msg[0]
    parts = msg[1:1 + n].decode().split("|")
    addr: NetworkAddress = (parts[0], *map(int, parts[1:]))  # type: ignore[assignment]
    return addr, msg[1 + n:]


def refusal(header: object) -> bytes:
    """A server's Initial packet with CONNECTION_CLOSE(CONNECTION_REFUSED), for a client's
    first Initial that this socket will not take (RFC 9000 §5.2.2: a server that refuses a
    connection SHOULD say so in an Initial): the client stops at once and tries elsewhere,
    as after a refused TCP connect, instead of resending until its own timeout. Sealed with
    the Initial keys of the client's own destination id (RFC 9001 §5.2); smaller than the
    client's padded Initial, so it amplifies nothing."""
    builder = QuicPacketBuilder(host_cid=os.urandom(8),
                                peer_cid=header.source_cid,  # type: ignore[attr-defined]
                                version=header.version,  # type: ignore[attr-defined]
                                is_client=False, max_datagram_size=SMALLEST_MAX_DATAGRAM_SIZE)
    builder.start_packet(QuicPacketType.INITIAL, server_initial_keys(header))
    reason = b"not accepting new connections"
    buf = builder.start_frame(QuicFrameType.TRANSPORT_CLOSE, capacity=len(reason) + 16)
    buf.push_uint_var(QuicErrorCode.CONNECTION_REFUSED)
    buf.push_uint_var(0)  # no frame type to blame
    buf.push_uint_var(len(reason))
    buf.push_bytes(reason)
    datagrams, _ = builder.flush()
    return datagrams[0]


def forward_pair() -> tuple[socket.socket, socket.socket]:
    """(the end a process reads forwarded datagrams from, the end its successor sends to).
    SOCK_SEQPACKET: datagrams kept whole as with SOCK_DGRAM, and the reading end sees end of
    file once every copy of the sending end has closed (unix(7)): no newer process is left
    to forward, so the socket is read here again."""
    inbox, outlet = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (inbox, outlet):
        s.setblocking(False)
    with contextlib.suppress(OSError):
        outlet.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, FORWARD_BUFFER)
        inbox.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, FORWARD_BUFFER)
    return inbox, outlet


def still_read(out: socket.socket) -> bool:
    """Whether a forwarding socket's reader lives: once every copy of the reading end has
    closed (that process, or worker, has exited), poll says the peer hung up (unix(7)).
    Routes to exited processes are dropped before each handover, so they do not pile up
    over a chain of restarts."""
    p = select.poll()
    p.register(out, select.POLLOUT)
    return not any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))


def live_routes(forward: dict[int, socket.socket]) -> dict[int, socket.socket]:
    """``forward`` without the routes whose reader has exited (those sockets closed)."""
    live = {}
    for r, out in forward.items():
        if still_read(out):
            live[r] = out
        else:
            out.close()
    return live


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
    """The UDP socket on the listener's host and ``port`` (its TCP port), when no previous
    process hands one over. SO_REUSEPORT: a listener renamed over a hot restart binds the
    port beside the old process's socket, which drains its own connections there."""
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

    def __init__(self, listener: HttpListener, configuration: QuicConfiguration,
                 sock: socket.socket, generation: int = 0,
                 forward: dict[int, socket.socket] | None = None,
                 stats: Http3Stats | None = None, worker: int = 0,
                 extra: list[socket.socket] | None = None,
                 inbox: socket.socket | None = None) -> None:
        """``sock``: the UDP socket (kept as a copy of its own: what a successor is handed,
        and what this process sends from once it no longer reads); ``generation``: this
        process's hot restart epoch; ``forward``: the older processes (and their workers)
        still draining, by ``route``, each the socket to send their packets to; ``worker``:
        this worker's index; ``extra``: more sockets of the port's SO_REUSEPORT group read
        here (a group made for more workers than read it now); ``inbox``: in a worker, the
        end its successor's packets for it arrive on, made by the main process."""
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
        self.sock: socket.socket | None = sock.dup()
        self.sock.setblocking(False)
        self.mark = generation_mark(generation)
        self.prefix = bytes((self.mark, worker & 0xFF))
        self.route = route(self.mark, worker)
        self.forward = dict(forward or {})
        self.stats = stats if stats is not None else Http3Stats()
        self.inbox: socket.socket | None = inbox  # forwarded to us, once handed over
        self.outlet: socket.socket | None = None  # its other end, until the successor has it
        self.extra: list[socket.socket] = list(extra or [])
        self._extra_read = False

    # -- asyncio ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._read_extra(True)

    def _read_extra(self, on: bool) -> None:
        if on == self._extra_read:
            return
        self._extra_read = on
        loop = self.listener.loop
        for s in self.extra:
            if on:
                loop.add_reader(s.fileno(), self._extra_readable, s)
            else:
                loop.remove_reader(s.fileno())

    def _extra_readable(self, sock: socket.socket) -> None:
        for _ in range(64):  # a bounded batch, as the transport reads
            try:
                data, addr = sock.recvfrom(65536)
            except OSError:  # nothing more now
                return
            self.datagram_received(data, addr)

    def datagram_received(self, data: bytes, addr: NetworkAddress) -> None:  # type: ignore[override]
        buf = Buffer(data=data)
        try:
            header = pull_quic_header(buf, host_cid_length=self.cid_length)
        except ValueError:
            return  # not QUIC
        dcid = header.destination_cid
        conn = self.conns.get(dcid)
        if conn is not None:
            conn.datagram_received(data, addr)
            return
        # (handed over, a process is sent only its own packets: nothing here is forwarded)
        if (self.forward and len(dcid) > 1 and dcid[0] != self.mark
                and (dcid[0] << 8 | dcid[1]) in self.forward and (header.packet_type in _OURS
                     # a handshake under way there: the client's Initial names the id the
                     # server chose, its Handshake packet often in the same datagram
                     or (header.packet_type == QuicPacketType.INITIAL
                         and header.version in self.versions
                         and not opens_connection(data, header, buf.tell())))):
            self._forward(dcid[0] << 8 | dcid[1], data, addr)
            return
        self._new(data, addr, header, buf.tell())

    def _forward(self, to: int, data: bytes, addr: NetworkAddress) -> None:
        """A packet for a connection of an older process: to that process, while it lives."""
        out = self.forward.get(to)
        if out is None:
            return  # no process of that generation: a connection long gone
        try:
            out.send(pack_forwarded(addr, data), socket.MSG_NOSIGNAL)
        except BlockingIOError:
            self.stats.packets_forward_dropped += 1
            return
        except OSError:  # it has exited (EPIPE): nobody to forward to any more
            del self.forward[to]
            out.close()
            if not self.accepting and self._done():
                self.close()
            return
        self.stats.packets_forwarded += 1

    def error_received(self, exc: Exception) -> None:
        log.debug("listener %s: UDP error: %s", self.listener.name, exc)

    def _new(self, data: bytes, addr: NetworkAddress, header: object, offset: int) -> None:
        """A datagram for no connection of ours: a new connection's Initial, or dropped.
        Only a client's first flight opens one (``opens_connection``): an Initial addressed
        to an id some other process chose (read here during a hot restart's handover, when
        both processes read the socket) would make a connection that can never decrypt a
        packet, and keep a draining process alive until its idle timeout."""
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
        if (ptype != QuicPacketType.INITIAL or len(data) < SMALLEST_MAX_DATAGRAM_SIZE
                or not opens_connection(data, header, offset)):
            return
        listener = self.listener
        if not self.accepting or not listener.has_room():
            # as a refused TCP connect: the client tries elsewhere (or TCP) at once
            if self.accepting:
                listener.overflowed()
            self.stats.connections_refused += 1
            with contextlib.suppress(ValueError, AssertionError):  # a header not sealable
                self.sendto(refusal(header), addr)
            return
        dcid: bytes = header.destination_cid  # type: ignore[attr-defined]
        h3 = H3Server(self.configuration, dcid, self.max_streams, self.max_field_section,
                      self.prefix, self.stats)
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
        elif self.sock is not None:  # handed over: we send, the successor reads
            with contextlib.suppress(OSError):  # a full buffer: lost, as on the network
                self.sock.sendto(data, addr)

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
        if not self.accepting and self._done():
            self.close()

    def _done(self) -> bool:
        """Nothing left for this endpoint to do: no connection of its own, and no older
        process it forwards to (or would forward to, reading the socket again once every
        newer process has exited: so with workers, each worker's sockets stay read)."""
        return not self.conns and not self.forward

    # -- hot restart --------------------------------------------------------------------------
    def handover(self) -> tuple[socket.socket, dict[int, socket.socket]]:
        """What a successor is handed: the UDP socket, and where to forward the packets of
        each process still draining (this one's, made now, and the older ones it knows)."""
        assert self.sock is not None
        for s in (self.inbox, self.outlet):  # an earlier successor that never took over
            if s is not None:
                s.close()
        self.inbox, self.outlet = forward_pair()
        self.forward = live_routes(self.forward)
        return self.sock, {**self.forward, self.route: self.outlet}

    def handed_over(self) -> None:
        """The successor reads the UDP socket from now on: stop reading it (the same socket,
        so what we left unread is its to forward), read what it forwards instead. Our
        datagrams still go out from the socket."""
        inbox = self.inbox
        if inbox is None or self.sock is None:
            return
        # The older processes' sockets are kept (the successor forwards to them now, from its
        # own copies): should every newer process exit, this one reads the UDP socket again
        # and forwards to them, so two older ones never read it at once; and each of them
        # sees end of file only once no newer process is left.
        if self.outlet is not None:
            self.outlet.close()  # the successor's copy is the only one: our exit shows
            self.outlet = None
        if self.transport is not None:
            self.transport.close()  # closes its descriptor; self.sock keeps the socket
            self.transport = None
        self._read_extra(False)
        self.listener.loop.add_reader(inbox.fileno(), self._inbox_readable)
        if self._done():
            self.close()

    def _inbox_readable(self) -> None:
        inbox = self.inbox
        for _ in range(256):  # a bounded batch: the loop's other work goes on between
            if inbox is None:
                return
            try:
                msg = inbox.recv(65536)
            except OSError:  # nothing more now (BlockingIOError), or the socket failed
                return
            if not msg:  # end of file: no newer process forwards to us any more
                self._read_again()
                return
            try:
                addr, data = unpack_forwarded(msg)
            except (ValueError, IndexError, UnicodeDecodeError):
                continue
            self.datagram_received(data, addr)
            inbox = self.inbox  # closed by the last connection's end

    def _read_again(self) -> None:
        """Every newer process has exited (stopped, or died) while we still have connections:
        nobody reads the UDP socket, so we do, from our copy, rather than let them end at
        their idle timeout. We take no new connections (``accepting`` stays off)."""
        inbox = self.inbox
        if inbox is not None:
            self.listener.loop.remove_reader(inbox.fileno())
            inbox.close()
            self.inbox = None
        if self.sock is None:
            return
        log.warning("listener %s: no newer process reads the UDP socket any more; this one "
                    "reads it again for its %d HTTP/3 connection id(s)", self.listener.name,
                    len(self.conns))
        self.listener.loop.create_task(self._resume_reading())

    async def _resume_reading(self) -> None:
        if self.sock is None:
            return
        sock = self.sock.dup()
        try:
            await self.listener.loop.create_datagram_endpoint(lambda: self, sock=sock)
        except OSError as e:
            sock.close()
            log.warning("listener %s: cannot read the UDP socket again: %s",
                        self.listener.name, e)
            return
        if self.sock is None and self.transport is not None:  # closed meanwhile
            self.transport.close()
            self.transport = None
            self._read_extra(False)

    # -- lifecycle ----------------------------------------------------------------------------
    def stop_accepting(self) -> None:
        """No new connections; the socket closes once the last one has ended (and no older
        process is left to forward to)."""
        self.accepting = False
        if self._done():
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self._read_extra(False)
        for extra in self.extra:
            extra.close()
        self.extra = []
        if self.inbox is not None:
            self.listener.loop.remove_reader(self.inbox.fileno())  # (if it was read)
            self.inbox.close()
            self.inbox = None
        for s in (self.outlet, self.sock, *self.forward.values()):
            if s is not None:
                s.close()
        self.outlet = self.sock = None
        self.forward.clear()
