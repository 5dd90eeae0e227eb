"""The fleet store: Redis, shared by every instance. Each decision is one Lua script, so it is
atomic on the server; the commit script is ``seq.verdict`` written in Lua (the contract tests
run both stores through the same cases). Keys expire with Redis' own TTLs."""

from __future__ import annotations

import uuid
from typing import Any

from lameduck.drain.commit import SeqGap
from lameduck.extras import missing_extra
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

# KEYS[1] session hash; ARGV: seq, has_state, state, has_result, result, ttl_ms.
# Returns {0, seq} applied, {1, last, result} replay, {2, last} gap.
COMMIT = """
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
local seq = tonumber(ARGV[1])
if seq <= last then
  return {1, last, redis.call('HGET', KEYS[1], 'result')}
end
if seq ~= last + 1 then
  return {2, last}
end
redis.call('HSET', KEYS[1], 'seq', seq)
if ARGV[2] == '1' then redis.call('HSET', KEYS[1], 'state', ARGV[3]) end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[5])
else
  redis.call('HDEL', KEYS[1], 'result')
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {0, seq}
"""

# KEYS[1] key hash; ARGV: fingerprint, lock_ms, owner. {0} new, {1} running, {2} mismatch,
# {3, response} done.
CLAIM = """
local fp = redis.call('HGET', KEYS[1], 'fp')
if not fp then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'done', '0', 'owner', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {0}
end
if fp ~= ARGV[1] then return {2} end
if redis.call('HGET', KEYS[1], 'done') == '1' then
  return {3, redis.call('HGET', KEYS[1], 'response')}
end
return {1}
"""

# KEYS[1] key hash; ARGV: owner, lock_ms. 1 renewed, 0 lost.
RENEW = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', KEYS[1], 'done') == '0'
then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] key hash; ARGV: owner, response, ttl_ms. Only the claim's own request.
FINISH = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', KEYS[1], 'done') == '0'
then
  redis.call('HSET', KEYS[1], 'done', '1', 'response', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
"""

RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] and redis.call('HGET', KEYS[1], 'done') == '0'
then
  redis.call('DEL', KEYS[1])
end
return 0
"""

_CLAIMS = (Claim.NEW, Claim.RUNNING, Claim.MISMATCH, Claim.DONE)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisStore(SessionStore):
    """``RedisStore("redis://127.0.0.1:6379/0")`` or ``RedisStore(client=redis.asyncio.Redis)``;
    keys are ``<prefix>s:<token>`` and ``<prefix>k:<idempotency key>``. ``wait``: how long a
    request waits for a pooled connection, a connect and an answer before it fails."""

    def __init__(self, url: str | None = None, session_ttl: float = SESSION_TTL,
                 prefix: str = "lameduck:", client: Any = None, max_connections: int = 50,
                 wait: float = 5.0) -> None:
        if client is None:
            if url is None:
                raise ValueError("RedisStore needs a URL or a client")
            try:
                import redis.asyncio as aioredis  # the optional dependency: lameduck[resume]
            except ModuleNotFoundError as e:
                raise missing_extra("resume", "RedisStore", e) from e
            # A bounded pool that waits for a free connection (up to ``wait`` s): redis-py's
            # default pool fails a request outright past 100 connections, which a burst of
            # reconnecting sessions reaches at once.
            pool = aioredis.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=wait, socket_timeout=wait,
                socket_connect_timeout=wait)
            client = aioredis.Redis(connection_pool=pool)
        self.redis = client
        self.session_ttl = session_ttl
        self.prefix = prefix
        self._commit = client.register_script(COMMIT)
        self._claim = client.register_script(CLAIM)
        self._finish = client.register_script(FINISH)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)

    def _skey(self, token: str) -> str:
        return f"{self.prefix}s:{token}"

    def _kkey(self, key: str) -> str:
        return f"{self.prefix}k:{key}"

    async def load(self, token: str) -> Session:
        seq, state, result = await self.redis.hmget(self._skey(token), "seq", "state", "result")
        if seq is None:
            return Session(token)
        return Session(token, int(seq), state, result)

    async def commit(self, token: str, seq: int, state: bytes | None = None,
                     result: bytes | None = None, ttl: float | None = None) -> Committed:
        out = await self._commit(
            keys=[self._skey(token)],
            args=[seq, int(state is not None), state or b"", int(result is not None),
                  result or b"", _ms(self.session_ttl if ttl is None else ttl)])
        code, last = int(out[0]), int(out[1])
        if code == 0:
            return Committed(True, last, result)
        if code == 1:
            return Committed(False, last, out[2] if len(out) > 2 else None)
        raise SeqGap(token, last, seq)

    async def claim_key(self, key: str, fingerprint: str, lock_ttl: float = LOCK_TTL) -> KeyClaim:
        owner = uuid.uuid4().hex
        out = await self._claim(keys=[self._kkey(key)],
                                args=[fingerprint, _ms(lock_ttl), owner])
        claim = _CLAIMS[int(out[0])]
        return KeyClaim(claim, out[1] if claim is Claim.DONE and len(out) > 1 else None,
                        owner if claim is Claim.NEW else "")

    async def renew_key(self, key: str, owner: str, lock_ttl: float = LOCK_TTL) -> bool:
        return int(await self._renew(keys=[self._kkey(key)], args=[owner, _ms(lock_ttl)])) == 1

    async def finish_key(self, key: str, owner: str, response: bytes,
                         ttl: float = KEY_TTL) -> None:
        await self._finish(keys=[self._kkey(key)], args=[owner, response, _ms(ttl)])

    async def release_key(self, key: str, owner: str) -> None:
        await self._release(keys=[self._kkey(key)], args=[owner])

    async def close(self) -> None:
        await self.redis.aclose()
        await self.redis.connection_pool.disconnect()
