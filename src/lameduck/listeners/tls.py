"""TLS on a listener: the server context, the handshake, and the protocol chosen by ALPN after it.

A plain listener tells HTTP/1.1 from h2c prior knowledge by the first bytes (Envoy's codec_type
AUTO); a TLS listener is told by ALPN (``h2`` or ``http/1.1``; no ALPN means HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast

from lameduck.config import ListenerConfig
from lameduck.http1.downstream import H1Downstream
from lameduck.http2.downstream import H2Downstream

if TYPE_CHECKING:
    from lameduck.listeners.http import HttpListener

log = logging.getLogger("lameduck.listener")


class DirectSSLObject(ssl.SSLObject):
    """An ``ssl.SSLObject`` whose ``read``, ``write`` and ``pending`` are the C methods of the
    ``_ssl`` object it wraps. uvloop's SSLProtocol looks these three up once, after
    ``wrap_bio`` (its sslproto.pyx caches ``_sslobj_read`` and friends), and calls them for
    every record: on the stock class each call runs a Python frame of ssl.py that only forwards
    its arguments (``read(len, buffer)`` to ``_sslobj.read(len, buffer)``). Same results and
    exceptions for the positional calls uvloop makes (``read(n)``, ``read(n, buffer)``,
    ``write(data)``, ``pending()``); the C ``read`` takes no keywords and no ``buffer=None``,
    which nothing here passes."""

    @classmethod
    def _create(cls, *args: Any, **kwargs: Any) -> DirectSSLObject:  # type: ignore[override]
        self = super()._create(*args, **kwargs)  # type: ignore[misc]
        raw = self._sslobj
        # instance attributes shadow the class's forwarding methods
        self.__dict__.update(read=raw.read, write=raw.write, pending=raw.pending)
        return cast(DirectSSLObject, self)


def server_context(cfg: ListenerConfig) -> ssl.SSLContext | None:
    tls = cfg.tls
    if tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # RFC 9113 §9.2: HTTP/2 needs 1.2 or later
    ctx.load_cert_chain(tls.certificate, tls.key)
    ctx.set_alpn_protocols(list(tls.alpn))
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.sslobject_class = DirectSSLObject
    return ctx


# A TLS connection that sends nothing is closed this long after its accept, and its handshake
# must end by then too: the loop's own default ssl_handshake_timeout, as before the handshake
# waited for the first bytes.
HANDSHAKE_TIMEOUT = 60.0


class TlsAccept(asyncio.Protocol):
    """A TLS connection from its accept to the end of its handshake, which runs here
    (``loop.start_tls``), then handed to the codec that ALPN chose. It lives for the
    handshake: nothing of it stays on the hot path.

    Why not the loop's own TLS server: there a connection is seen only once its handshake is
    done, and one that fails is never seen at all. But a client mid-handshake has requests on
    the way: a TLS 1.3 client sends its first requests right behind its Finished (RFC 8446
    §2), before the server has read it, and nothing can turn them away yet (no response, no
    GOAWAY). So the listener counts the connection from its first bytes (``handshakes``, and
    the ledger's ``fresh`` from the accept): the exit waits for it, and the deadline counts it
    as cut. Before its first bytes it is ``silent``: idle, like an HTTP/1.1 connection that
    has sent nothing, and the exit closes it once G has passed since its accept (a TCP health
    check or a port scan does not hold a SIGTERM until the deadline)."""

    __slots__ = ("accepted_at", "handshake", "listener", "timer", "transport")

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener
        self.accepted_at = listener.loop.time()  # an exit waits G from here for its bytes
        self.transport: asyncio.Transport | None = None
        self.handshake: Coroutine[Any, Any, asyncio.Transport | None] | None = None
        self.timer: asyncio.TimerHandle | None = None

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
        here. ``start_tls`` runs up to its wait at once, in this callback: it pauses reading
        and makes its SSL protocol the transport's, whose ``connection_made`` it schedules;
        the bytes read here go to that protocol right after (``_replay``), before the loop
        reads another."""
        ls = self.listener
        if self.handshake is not None or self not in ls.silent:  # pragma: no cover
            raise RuntimeError("TlsAccept got data outside its handshake")
        t = self.transport
        assert t is not None
        ls.silent.discard(self)
        ls.handshakes.add(self)
        left = HANDSHAKE_TIMEOUT
        if self.timer is not None:
            left = max(self.timer.when() - ls.loop.time(), 0.001)
            self.timer.cancel()
            self.timer = None
        coro = ls.loop.start_tls(t, self, ls.ssl, server_side=True,  # type: ignore[arg-type]
                                 ssl_handshake_timeout=left)
        self.handshake = coro
        self._resume(None)
        if self.handshake is not None:
            ls.loop.call_soon(self._replay, data)
        ls.handshake_done()  # a worker tells its main process now, not at its next status

    def _replay(self, data: bytes) -> None:
        """The first bytes to the SSL protocol (a buffered protocol, in asyncio and uvloop
        alike), now that its ``connection_made`` has run."""
        t = self.transport
        if self.handshake is None or t is None or t.is_closing():
            return  # ended already
        proto: Any = t.get_protocol()
        view = memoryview(data)
        while view:
            buf = proto.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            proto.buffer_updated(n)
            view = view[n:]

    def _resume(self, _: object) -> None:
        """Drive ``start_tls``: it waits on one future (its handshake), then returns the TLS
        transport or raises."""
        coro = self.handshake
        if coro is None:
            return  # cut at the exit (``abort``): it ended here already
        try:
            waiting = coro.send(None)
        except StopIteration as done:
            self._handshaken(done.value)
            return
        except Exception as e:  # a failed or timed-out handshake, a client gone: not served
            log.debug("listener %s: TLS handshake failed: %r", self.listener.name, e)
            t = self.transport
            self._end()
            if t is not None:
                t.abort()
            return
        assert asyncio.isfuture(waiting), waiting
        waiting.add_done_callback(self._resume)

    def connection_lost(self, exc: Exception | None) -> None:
        """Closed before its first bytes (the handshake takes the transport over then)."""
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
        self.handshake = None
        ls.handshake_done()

    def _handshaken(self, tls: asyncio.Transport | None) -> None:
        """The handshake is done: the codec ALPN chose takes the connection."""
        ls = self.listener
        self._end()
        if tls is None or tls.is_closing():
            return
        ssl_obj = tls.get_extra_info("ssl_object")
        alpn = ssl_obj.selected_alpn_protocol() if ssl_obj is not None else None
        proto: asyncio.Protocol = (
            H2Downstream(ls) if alpn == "h2"  # type: ignore[arg-type]
            else H1Downstream(ls))  # type: ignore[arg-type]
        ls.stats.downstream_cx_ssl_total += 1
        tls.set_protocol(proto)
        proto.connection_made(tls)

    def abort(self) -> None:
        """The process ends with this connection silent or its handshake under way (counted
        as cut by the caller), or it stayed silent for HANDSHAKE_TIMEOUT: reset it, and off
        the listener's sets now, not when the reset is reported: the exit's last sweep, which
        may come before that, must not count it again."""
        if self.transport is not None:
            self.transport.abort()
        self._end()
