"""HTTP/2 for lameduck: a lean sans-IO server connection (``connection``), its HPACK codec
(``codec``) and frame layout (``frames``); the asyncio shell lives in ``downstream``."""

from .connection import MAX_STREAM_ID, PREFACE, H2Limits, H2Server
from .events import (
    ConnectionError,
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersTooLarge,
    RequestReceived,
    StreamReset,
    TrailersReceived,
    WindowOpened,
)
from .frames import ErrorCode

__all__ = [
    "MAX_STREAM_ID", "PREFACE", "ConnectionError", "DataReceived", "ErrorCode", "Event",
    "GoAwayReceived", "H2Limits", "H2Server", "HeadersTooLarge", "RequestReceived",
    "StreamReset", "TrailersReceived", "WindowOpened",
]
