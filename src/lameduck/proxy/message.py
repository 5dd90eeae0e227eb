"""The message between the layers: a request head as a codec read it, and as the exchange
sends it on. No wire text crosses here.

Each downstream codec translates its bytes into a ``RequestHead`` (HTTP/1.1: the request line
and fields; HTTP/2: the pseudo-fields and fields), ``proxy.admission.prepare`` turns it into
the head sent upstream, and each upstream codec formats that once (HTTP/1.1 text, or HTTP/2
HEADERS). hypercorn's ``Request`` event and mitmproxy's ``RequestHeaders`` play the same part;
so does h11's ``Request``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from lameduck.upstream.connector import Fields

if TYPE_CHECKING:
    from lameduck.proxy.admission import Client

HTTP10: Final = 10
HTTP11: Final = 11
HTTP2: Final = 20
HTTP3: Final = 30  # RFC 9114 (lameduck.http3, listeners[].http3)
# An opaque byte stream (a TCP listener's connection): no HTTP version, method or status; the
# access log writes "-" for its protocol, as Envoy's does for a TCP proxy.
STREAM: Final = 1
# Envoy's router adds it to a response it proxies: the ms the upstream took (Envoy's HTTP
# header docs, "x-envoy-upstream-service-time"); off with suppress_envoy_headers.
SERVICE_TIME: Final = b"x-envoy-upstream-service-time"
# Its line for the first ms values, made once: most responses take a few ms, and a format
# per response cost more than the rest of the line's insertion.
SERVICE_TIME_LINES: Final = tuple(b"\r\n%s: %d" % (SERVICE_TIME, ms) for ms in range(256))


def service_time_line(ms: int) -> bytes:
    """CR LF and the field line for ``ms``, to go before a head's blank line."""
    if ms < 256:
        return SERVICE_TIME_LINES[ms]
    return b"\r\n%s: %d" % (SERVICE_TIME, ms)


class RequestHead:
    """A request head, protocol-neutral.

    ``fields`` are the message's fields in their order, names as received (HTTP/1.1 keeps their
    case, HTTP/2's are lower-case), never the pseudo-fields. ``authority`` is the target's
    authority when the request line or ``:authority`` carried one, else None (then the Host
    field, if any, names it). ``path`` is the origin-form target with its query (``*`` for a
    server-wide OPTIONS, empty for CONNECT).

    What a codec knows of the framing: ``has_body`` (content follows: a length above 0, a
    chunked body, DATA frames) and ``protocol`` (HTTP/2's ``:protocol``, RFC 8441).

    A prepared head (``admission.prepare``) also says how to send it: ``chunked`` (content of
    unknown length: an HTTP/1.1 upstream frames it in chunks), ``websocket`` (relayed as an
    RFC 6455 upgrade), ``te_trailers`` (the client takes trailers, so ``TE: trailers`` goes
    upstream), and carries the facts the exchange books: ``retryable``, ``expect``, ``grpc``,
    ``request_id``, ``forwarded_for`` (X-Forwarded-For as sent) and, when admission refused
    it, the local answer (``refused``).
    """

    def __init__(self, method: bytes, authority: bytes | None, path: bytes, fields: Fields,
                 version: int, has_body: bool = False, protocol: bytes | None = None) -> None:
        self.method = method
        self.authority = authority
        self.path = path
        self.fields = fields
        self.version = version  # HTTP10, HTTP11, HTTP2 or HTTP3
        self.has_body = has_body
        self.protocol = protocol
        self.chunked = False
        self.websocket = False
        self.te_trailers = False
        self.retryable = False
        self.expect = False
        self.grpc = False
        self.request_id = b""
        self.forwarded_for = b""
        # The connection whose X-Forwarded-For and -Proto pair ends ``fields`` (an
        # ``admission.Client``; None when the client sent an X-Forwarded-For of its own).
        self.client: Client | None = None
        self.refused: LocalAnswer | None = None


class LocalAnswer:
    """Admission's answer from here: a status and its body; ``malformed``: the request itself
    was at fault (Envoy's DPE), so an HTTP/1.1 connection is not reused after it."""

    def __init__(self, status: int, body: bytes, malformed: bool = False) -> None:
        self.status = status
        self.body = body
        self.malformed = malformed
