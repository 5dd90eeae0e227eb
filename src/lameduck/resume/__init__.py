"""Resume after an instance goes away: a session store with commit-once, and the ASGI
middleware that applies it (``from lameduck.resume import ResumeMiddleware``)."""

from lameduck.resume.drain import Drain
from lameduck.resume.middleware import ResumeMiddleware, ResumeSession
from lameduck.resume.seq import SeqGap
from lameduck.resume.store import Claim, Committed, KeyClaim, Session, SessionStore, open_store

__all__ = ["Claim", "Committed", "Drain", "KeyClaim", "ResumeMiddleware", "ResumeSession",
           "SeqGap", "Session", "SessionStore", "open_store"]
