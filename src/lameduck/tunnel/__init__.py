"""Tunnels: WebSocket (HTTP/1 Upgrade, HTTP/2 extended CONNECT) and CONNECT relays.

``websocket`` tracks frames in relayed bytes so a drain can close a WebSocket at frame
boundaries; the drain decision itself is ``lameduck.drain.tunnel`` (sans-IO, clock passed in).
"""

from lameduck.tunnel.websocket import (
    GOING_AWAY,
    PROTOCOL_ERROR,
    FrameTracker,
    accept_key,
    close_frame,
)

__all__ = ["GOING_AWAY", "PROTOCOL_ERROR", "FrameTracker", "accept_key", "close_frame"]
