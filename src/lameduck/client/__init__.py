"""Clients that survive an instance going away: reconnect with jitter through the load
balancer, present the resume token and the last acknowledged seq, replay what never
committed."""

from lameduck.client.http import DEFAULT_TIMEOUT, GaveUp, ResumableClient, ResumeGap
from lameduck.client.websocket import ResumableWebSocket, SessionError
from lameduck.drain.backoff import Backoff

__all__ = ["DEFAULT_TIMEOUT", "Backoff", "GaveUp", "ResumableClient", "ResumableWebSocket",
           "ResumeGap", "SessionError"]
