"""Clients that survive an instance going away: reconnect with jitter through the load
balancer, present the resume token and the last acknowledged seq, replay what never
committed. They need the ``client`` extra (httpx, websockets): ``pip install
'lameduck[client]'``."""

from lameduck.extras import missing_extra

try:  # the optional dependencies: lameduck[client]
    import httpx  # noqa: F401
    import websockets  # noqa: F401
except ModuleNotFoundError as e:
    raise missing_extra("client", "lameduck.client", e) from e

from lameduck.client.http import DEFAULT_TIMEOUT, GaveUp, ResumableClient, ResumeGap
from lameduck.client.websocket import ResumableWebSocket, SessionError
from lameduck.drain.backoff import Backoff

__all__ = ["DEFAULT_TIMEOUT", "Backoff", "GaveUp", "ResumableClient", "ResumableWebSocket",
           "ResumeGap", "SessionError"]
