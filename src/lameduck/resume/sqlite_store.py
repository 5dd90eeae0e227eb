"""The embedded default store: one SQLite file in WAL mode, safe for several processes on one
host. Each commit is one ``BEGIN IMMEDIATE`` transaction (the write lock is taken before the
read), so two instances committing the same seq cannot both apply it. Calls run on one thread
per store, off the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from lameduck.drain.commit import SeqGap, Verdict, verdict
from lameduck.resume.store import (
    KEY_TTL,
    LOCK_TTL,
    SESSION_TTL,
    Claim,
    Committed,
    KeyClaim,
    Session,
    SessionStore,
)

T = TypeVar("T")

PURGE_EVERY = 1000

SCHEMA = """
CREATE TABLE IF NOT EXISTS lameduck_sessions (
    token TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state BLOB,
    result BLOB,
    expires REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lameduck_keys (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    owner TEXT NOT NULL,
    done INTEGER NOT NULL,
    response BLOB,
    expires REAL NOT NULL
);
"""


class SQLiteStore(SessionStore):
    def __init__(self, path: str, session_ttl: float = SESSION_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.session_ttl = session_ttl
        self.clock = clock
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="lameduck-sqlite")
        self._db: sqlite3.Connection | None = None
        self._writes = 0  # every PURGE_EVERY writes, expired rows are deleted

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=10.0)
            # Switching a new file to WAL takes a lock that the busy timeout does not wait
            # for: several processes opening one fresh file at once retry it.
            for attempt in range(100):
                try:
                    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                        db.execute("PRAGMA journal_mode=WAL")
                    db.executescript(SCHEMA)
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 99:
                        db.close()
                        raise
                    time.sleep(0.01 + 0.001 * attempt)
            db.execute("PRAGMA synchronous=NORMAL")
            self._db = db
        return self._db

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # (SQLite may have rolled back by itself)
                db.execute("ROLLBACK")
            raise
        return out

    # -- sessions ----------------------------------------------------------------------------
    async def load(self, token: str) -> Session:
        return await self._run(self._load, token)

    def _load(self, token: str) -> Session:
        row = self._conn().execute(
            "SELECT seq, state, result FROM lameduck_sessions WHERE token = ? AND expires > ?",
            (token, self.clock())).fetchone()
        if row is None:
            return Session(token)
        return Session(token, row[0], row[1], row[2])

    async def commit(self, token: str, seq: int, state: bytes | None = None,
                     result: bytes | None = None, ttl: float | None = None) -> Committed:
        return await self._run(self._commit, token, seq, state, result, ttl)

    def _commit(self, token: str, seq: int, state: bytes | None, result: bytes | None,
                ttl: float | None) -> Committed:
        self._writes += 1
        if self._writes % PURGE_EVERY == 0:
            self._purge()
        def tx(db: sqlite3.Connection) -> Committed:
            now = self.clock()
            row = db.execute("SELECT seq, state, result, expires FROM lameduck_sessions "
                             "WHERE token = ?", (token,)).fetchone()
            live = row is not None and row[3] > now
            last = row[0] if live else 0
            v = verdict(last, seq)
            if v is Verdict.REPLAY:
                return Committed(False, last, row[2] if live else None)
            if v is Verdict.GAP:
                raise SeqGap(token, last, seq)
            keep = row[1] if live else None
            db.execute("INSERT OR REPLACE INTO lameduck_sessions (token, seq, state, result, "
                       "expires) VALUES (?, ?, ?, ?, ?)",
                       (token, seq, keep if state is None else state, result,
                        now + (self.session_ttl if ttl is None else ttl)))
            return Committed(True, seq, result)
        return self._tx(tx)

    # -- idempotency keys --------------------------------------------------------------------
    async def claim_key(self, key: str, fingerprint: str, lock_ttl: float = LOCK_TTL) -> KeyClaim:
        return await self._run(self._claim, key, fingerprint, lock_ttl)

    def _claim(self, key: str, fingerprint: str, lock_ttl: float) -> KeyClaim:
        def tx(db: sqlite3.Connection) -> KeyClaim:
            now = self.clock()
            row = db.execute("SELECT fingerprint, done, response, expires FROM lameduck_keys "
                             "WHERE key = ?", (key,)).fetchone()
            if row is not None and row[3] > now:
                if row[0] != fingerprint:
                    return KeyClaim(Claim.MISMATCH)
                return KeyClaim(Claim.DONE, row[2]) if row[1] else KeyClaim(Claim.RUNNING)
            owner = uuid.uuid4().hex
            db.execute("INSERT OR REPLACE INTO lameduck_keys (key, fingerprint, owner, done, "
                       "response, expires) VALUES (?, ?, ?, 0, NULL, ?)",
                       (key, fingerprint, owner, now + lock_ttl))
            return KeyClaim(Claim.NEW, owner=owner)
        return self._tx(tx)

    async def renew_key(self, key: str, owner: str, lock_ttl: float = LOCK_TTL) -> bool:
        return await self._run(self._renew, key, owner, lock_ttl)

    def _renew(self, key: str, owner: str, lock_ttl: float) -> bool:
        now = self.clock()
        return self._conn().execute(
            "UPDATE lameduck_keys SET expires = ? "
            "WHERE key = ? AND owner = ? AND done = 0 AND expires > ?",
            (now + lock_ttl, key, owner, now)).rowcount == 1

    async def finish_key(self, key: str, owner: str, response: bytes,
                         ttl: float = KEY_TTL) -> None:
        await self._run(self._finish, key, owner, response, ttl)

    def _finish(self, key: str, owner: str, response: bytes, ttl: float) -> None:
        now = self.clock()
        self._conn().execute(
            "UPDATE lameduck_keys SET done = 1, response = ?, expires = ? "
            "WHERE key = ? AND owner = ? AND done = 0 AND expires > ?",
            (response, now + ttl, key, owner, now))

    async def release_key(self, key: str, owner: str) -> None:
        await self._run(self._release, key, owner)

    def _release(self, key: str, owner: str) -> None:
        self._conn().execute(
            "DELETE FROM lameduck_keys WHERE key = ? AND owner = ? AND done = 0",
            (key, owner))

    async def purge(self) -> int:
        """Delete expired rows (reads already ignore them); the count deleted."""
        return await self._run(self._purge)

    def _purge(self) -> int:
        now = self.clock()
        db = self._conn()
        n = db.execute("DELETE FROM lameduck_sessions WHERE expires <= ?", (now,)).rowcount
        return n + db.execute("DELETE FROM lameduck_keys WHERE expires <= ?", (now,)).rowcount

    async def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None
        await self._run(shut)
        self._pool.shutdown(wait=True)
