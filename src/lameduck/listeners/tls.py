"""TLS on a listener: the server context, and the protocol chosen by ALPN after the handshake.

A plain listener tells HTTP/1.1 from h2c prior knowledge by the first bytes (Envoy's codec_type
AUTO); a TLS listener is told by ALPN (``h2`` or ``http/1.1``; no ALPN means HTTP/1.1).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any, cast

from lameduck.config import ListenerConfig
from lameduck.http1.downstream import H1Downstream
from lameduck.http2.downstream import H2Downstream

if TYPE_CHECKING:
    from lameduck.listeners.http import HttpListener


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


class AlpnSwitch(asyncio.Protocol):
    """Stands in until the TLS handshake is done, then hands the connection to the codec that
    ALPN chose. It lives for one callback: nothing of it stays on the hot path."""

    def __init__(self, listener: HttpListener) -> None:
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ssl_obj = transport.get_extra_info("ssl_object")
        alpn = ssl_obj.selected_alpn_protocol() if ssl_obj is not None else None
        proto: asyncio.Protocol = (
            H2Downstream(self.listener) if alpn == "h2"  # type: ignore[arg-type]
            else H1Downstream(self.listener))  # type: ignore[arg-type]
        self.listener.stats.downstream_cx_ssl_total += 1
        transport.set_protocol(proto)
        proto.connection_made(transport)

    def data_received(self, data: bytes) -> None:  # pragma: no cover - replaced at once
        raise RuntimeError("AlpnSwitch got data after the handshake")
