"""HTTP/3 for lameduck (RFC 9114): the sans-IO server codec (``codec``) over aioquic's QUIC,
and the connection around it (``downstream``) that ``listeners.quic`` serves on a listener's
UDP socket. Needs the ``http3`` extra (pip install 'lameduck[http3]'); docs/http3.md."""

from .codec import (
    GOAWAY_ALL,
    H3_ALPN,
    H3_MESSAGE_ERROR,
    H3_NO_ERROR,
    H3_REQUEST_CANCELLED,
    H3_REQUEST_REJECTED,
    BodyReceived,
    ConnectionClosed,
    ConnectionIdIssued,
    Event,
    H3Server,
    RequestReceived,
    StreamRefused,
    StreamReset,
    TrailersReceived,
)

__all__ = [
    "GOAWAY_ALL", "H3_ALPN", "H3_MESSAGE_ERROR", "H3_NO_ERROR", "H3_REQUEST_CANCELLED",
    "H3_REQUEST_REJECTED", "BodyReceived", "ConnectionClosed", "ConnectionIdIssued", "Event",
    "H3Server",
    "RequestReceived", "StreamRefused", "StreamReset", "TrailersReceived",
]
