"""HTTP/2 for lameduck: lean sans-IO connections — the server (``connection``, whose frame
layer ``H2Connection`` the client shares) and the client for upstreams (``client``) — their
HPACK codec (``codec``) and frame layout (``frames``); the asyncio shell lives in
``downstream``."""

from .client import H2Client
from .connection import MAX_STREAM_ID, PREFACE, H2Limits, H2Server
from .events import (
    ConnectionError,
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersTooLarge,
    RequestReceived,
    ResponseReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from .frames import ErrorCode

__all__ = [
    "MAX_STREAM_ID", "PREFACE", "ConnectionError", "DataReceived", "ErrorCode", "Event",
    "GoAwayReceived", "H2Client", "H2Limits", "H2Server", "HeadersTooLarge", "RequestReceived",
    "ResponseReceived", "StreamReset", "TrailersReceived", "WindowOpened",
]
