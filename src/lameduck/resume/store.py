"""One interface for the session store, two backends: SQLite (``sqlite_store``, the embedded
default) and Redis (``redis_store``, shared by a fleet). Per resume token it keeps the last
committed sequence number, an optional small state blob and the last commit's result; per
``Idempotency-Key`` the request's fingerprint and, once done, its response."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum


@dataclass(slots=True)
class Session:
    """A resume token's committed state as loaded (``last_seq`` 0: nothing committed yet)."""

    token: str
    last_seq: int = 0
    state: bytes | None = None
    result: bytes | None = None


@dataclass(slots=True, frozen=True)
class Committed:
    """What a commit did: ``applied`` (seq was the next one) or a replay (seq <= last), with
    the stored result of the last commit either way."""

    applied: bool
    last_seq: int
    result: bytes | None


class Claim(Enum):
    NEW = "new"            # the caller runs the request and must finish or release the key
    RUNNING = "running"    # the original is still running: 409
    MISMATCH = "mismatch"  # the key was used for a different request: 422
    DONE = "done"          # the stored response is the answer


@dataclass(slots=True, frozen=True)
class KeyClaim:
    """``owner`` (NEW only): the claim's own id; only it may renew, finish or release the
    key, so a request whose mark expired cannot finish or drop its successor's claim."""

    claim: Claim
    response: bytes | None = None
    owner: str = ""


# The defaults: a session lives a day after its last commit; an idempotency key's stored
# response a day; its "running" mark 60 s, so a process that died holding it does not block
# the key for good.
SESSION_TTL = 86400.0
KEY_TTL = 86400.0
LOCK_TTL = 60.0


class SessionStore(ABC):
    """Async, safe for several processes sharing one store (the point of it)."""

    session_ttl: float = SESSION_TTL

    @abstractmethod
    async def load(self, token: str) -> Session:
        """The session of ``token``, or an empty one (``last_seq`` 0)."""

    @abstractmethod
    async def commit(self, token: str, seq: int, state: bytes | None = None,
                     result: bytes | None = None, ttl: float | None = None) -> Committed:
        """Atomically: apply ``seq`` iff it is last + 1 (storing ``state`` unless it is None,
        and ``result``), or report a replay; raise ``SeqGap`` for a gap. Refreshes the TTL."""

    @abstractmethod
    async def claim_key(self, key: str, fingerprint: str, lock_ttl: float = LOCK_TTL) -> KeyClaim:
        """Take ``key`` for a new request, or say why not (running, mismatch, done)."""

    @abstractmethod
    async def renew_key(self, key: str, owner: str, lock_ttl: float = LOCK_TTL) -> bool:
        """Extend the "running" mark while the request runs; False if the claim was lost
        (it expired and another request took the key)."""

    @abstractmethod
    async def finish_key(self, key: str, owner: str, response: bytes,
                         ttl: float = KEY_TTL) -> None:
        """Store the response of the request that claimed ``key`` (only its ``owner``)."""

    @abstractmethod
    async def release_key(self, key: str, owner: str) -> None:
        """Drop an unfinished claim (the request failed or was cut): a retry may run it."""

    @abstractmethod
    async def close(self) -> None:
        ...

    async def __aenter__(self) -> SessionStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def open_store(url: str, **kw: float) -> SessionStore:
    """``sqlite:///path/to/file.db`` (or a plain path) or ``redis://host:port/db``."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from lameduck.resume.redis_store import RedisStore
        return RedisStore(url, **kw)
    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url
    if not path:
        raise ValueError(f"store URL {url!r}: expected sqlite:///path or redis://host:port/db")
    from lameduck.resume.sqlite_store import SQLiteStore
    return SQLiteStore(path, **kw)
