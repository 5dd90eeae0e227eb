"""TLS on a listener: the server context, the handshake, and the protocol chosen by ALPN after it.

A plain listener tells HTTP/1.1 from h2c prior knowledge by the first bytes (Envoy's codec_type
AUTO); a TLS listener is told by ALPN (``h2`` or ``http/1.1``; no ALPN means HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING

from lameduck.config import ListenerConfig
from lameduck.http1.downstream import H1Downstream
from lameduck.http2.downstream import H2Downstream
from lameduck.proxy.tlsstream import TlsStream

if TYPE_CHECKING:
    from lameduck.listeners.http import HttpListener

log = logging.getLogger("lameduck.listener")


def server_context(cfg: ListenerConfig) -> ssl.SSLContext | None:
    tls = cfg.tls
    if tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # RFC 9113 §9.2: HTTP/2 needs 1.2 or later
    ctx.load_cert_chain(tls.certificate, tls.key)
    ctx.set_alpn_protocols(list(tls.alpn))
    ctx.options |= ssl.OP_NO_COMPRESSION
    # No TLS 1.2 renegotiation: RFC 9113 §9.2.1 forbids it on HTTP/2, and HAProxy and nginx
    # refuse a client's on any connection. OpenSSL answers a client's with a no_renegotiation
    # alert (RFC 5246 §7.2.2); OpenSSL 1.1.1 would otherwise go through with it.
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    return ctx


# A TLS connection that sends nothing is closed this long after its accept, and its handshake
# must end by then too: the loop's own default ssl_handshake_timeout.
HANDSHAKE_TIMEOUT = 60.0


class TlsAccept(asyncio.Protocol):
    """A TLS connection from its accept to the end of its handshake, which its ``TlsStream``
    runs, then handed to the codec that ALPN chose. It lives for the handshake: nothing of it
    stays on the hot path.

    Why not the loop's own TLS server (or ``loop.start_tls``, whose per-record costs
    lameduck.proxy.tlsstream describes): there a connection is seen only once its handshake is
    done, and one that fails is never seen at all. But a client mid-handshake has requests on
    the way: a TLS 1.3 client sends its first requests right behind its Finished (RFC 8446
    §2), before the server has read it, and nothing can turn them away yet (no response, no
    GOAWAY). So the listener counts the connection from its first bytes (``handshakes``, and
    the ledger's ``fresh`` from the accept): the exit waits for it, and the deadline counts it
    as cut. Before its first bytes it is ``silent``: idle, like an HTTP/1.1 connection that
    has sent nothing, and the exit closes it once G has passed since its accept (a TCP health
    check or a port scan does not hold a SIGTERM until the deadline)."""

    __slots__ = ("accepted_at", "listener", "stream", "timer", "transport")

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.accepted_at = listener.loop.time()  # an exit waits G from here for its bytes
        self.transport: asyncio.Transport | None = None
        self.stream: TlsStream | None = None  # from the first bytes: the handshake under way
        self.timer: asyncio.TimerHandle | None = None  # HANDSHAKE_TIMEOUT from the accept

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Counted as an open connection, silent until its first bytes."""
        t: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = t
        ls = self.listener
        ls.silent.add(self)
        ls.process.ledger.accepted()
        self.timer = ls.loop.call_later(HANDSHAKE_TIMEOUT, self.abort)

    def data_received(self, data: bytes) -> None:
        """The first bytes (a ClientHello, or part of one): the handshake is under way from
        here, in a ``TlsStream`` that becomes the socket's protocol. The timer set at the
        accept keeps running: the handshake must end by then too."""
        ls = self.listener
        if self.stream is not None or self not in ls.silent:  # pragma: no cover
            raise RuntimeError("TlsAccept got data outside its handshake")
        t = self.transport
        assert t is not None and ls.ssl is not None
        ls.silent.discard(self)
        ls.handshakes.add(self)
        stream = self.stream = TlsStream(t, ls.ssl, self._handshaken)
        t.set_protocol(stream)
        ls.handshake_done()  # a worker tells its main process now, not at its next status
        stream.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed before its first bytes (the stream takes the socket over then)."""
        self._end()

    def _end(self) -> None:
        """Off the listener's silent connections or handshakes, once, however it ended."""
        ls = self.listener
        if self in ls.handshakes:
            ls.handshakes.discard(self)
        elif self in ls.silent:
            ls.silent.discard(self)
        else:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        ls.process.ledger.heard()  # the codec counts it again from its connection_made
        self.transport = None
        self.stream = None
        ls.handshake_done()

    def _handshaken(self, stream: TlsStream, exc: BaseException | None) -> None:
        """The handshake is over: the codec ALPN chose takes the connection, or (failed,
        timed out, the client gone) it is not served."""
        ls = self.listener
        self._end()
        if exc is not None:
            log.debug("listener %s: TLS handshake failed: %r", ls.name, exc)
            stream.close()  # a failed handshake's alert is sent before the socket closes
            return
        if stream.is_closing():
            return
        alpn = stream.sslobj.selected_alpn_protocol()
        proto: asyncio.Protocol = (
            H2Downstream(ls) if alpn == "h2"  # type: ignore[arg-type]
            else H1Downstream(ls))  # type: ignore[arg-type]
        ls.stats.downstream_cx_ssl_total += 1
        stream.start(proto)

    def abort(self) -> None:
        """The process ends with this connection silent or its handshake under way (counted
        as cut by the caller), or it stayed silent for HANDSHAKE_TIMEOUT: reset it, and off
        the listener's sets now, not when the reset is reported: the exit's last sweep, which
        may come before that, must not count it again."""
        if self.transport is not None:
            self.transport.abort()
        self._end()
