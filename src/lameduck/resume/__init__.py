"""Resume after an instance goes away: a session store with commit-once, the ASGI middleware
that applies it (``from lameduck.resume import ResumeMiddleware``), and the drain of queue
consumers (``lameduck.resume.consumer``)."""

from lameduck.drain.commit import SeqGap
from lameduck.resume.app_drain import Drain
from lameduck.resume.consumer import (
    ConsumerDrain,
    ConsumerRunner,
    ConsumerSummary,
    ConsumerTimes,
    RedisStreamConsumer,
    StreamMessage,
    run_consumer,
)
from lameduck.resume.middleware import NoSession, ResumeMiddleware, ResumeSession
from lameduck.resume.store import Claim, Committed, KeyClaim, Session, SessionStore, open_store

__all__ = ["Claim", "Committed", "ConsumerDrain", "ConsumerRunner", "ConsumerSummary",
           "ConsumerTimes", "Drain", "KeyClaim", "NoSession", "RedisStreamConsumer",
           "ResumeMiddleware", "ResumeSession", "SeqGap", "Session", "SessionStore",
           "StreamMessage", "open_store", "run_consumer"]
