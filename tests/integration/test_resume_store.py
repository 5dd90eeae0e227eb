"""The session store contract, run against both backends: SQLite (a file in WAL mode) and a
real redis-server. Same cases, same answers: commit-once, replays, gaps, TTLs, idempotency
keys, and races between stores and between processes sharing one backing store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lameduck.drain.commit import SeqGap
from lameduck.resume.store import Claim, SessionStore, open_store
from tests.procs import _env


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path / 'sessions.db'}"
    else:
        yield request.getfixturevalue("redis_server").url


def run(url: str, body: Callable[..., Any], n: int = 1) -> Any:
    """``body(*stores)`` with ``n`` separate store objects on the same backing store."""
    async def main() -> Any:
        stores = [open_store(url) for _ in range(n)]
        try:
            return await body(*stores)
        finally:
            for s in stores:
                await s.close()
    return asyncio.run(main())


def test_commit_once_replay_and_gap(store_url: str) -> None:
    async def body(s: SessionStore) -> None:
        fresh = await s.load("t1")
        assert (fresh.last_seq, fresh.state, fresh.result) == (0, None, None)
        c = await s.commit("t1", 1, state=b"s1", result=b"r1")
        assert (c.applied, c.last_seq, c.result) == (True, 1, b"r1")
        again = await s.commit("t1", 1, state=b"other", result=b"other")
        assert (again.applied, again.last_seq, again.result) == (False, 1, b"r1")
        loaded = await s.load("t1")
        assert (loaded.last_seq, loaded.state, loaded.result) == (1, b"s1", b"r1")
        with pytest.raises(SeqGap) as e:
            await s.commit("t1", 3, state=b"s3")
        assert (e.value.last, e.value.seq) == (1, 3)
        assert "replay from 2" in str(e.value)
        assert (await s.load("t1")).last_seq == 1  # a gap changes nothing
        c2 = await s.commit("t1", 2, result=None)  # state None: kept; result None: cleared
        assert (c2.applied, c2.last_seq) == (True, 2)
        loaded = await s.load("t1")
        assert (loaded.last_seq, loaded.state, loaded.result) == (2, b"s1", None)
        old = await s.commit("t1", 1)  # older than the last: still a no-op
        assert (old.applied, old.last_seq) == (False, 2)
        assert (await s.load("t2")).last_seq == 0  # tokens are separate
        assert (await s.commit("t2", 1, state=b"")).applied
        assert (await s.load("t2")).state == b""  # empty, not missing
    run(store_url, body)


def test_binary_state_and_result_round_trip(store_url: str) -> None:
    blob = bytes(range(256)) * 16

    async def body(s: SessionStore) -> None:
        await s.commit("bin", 1, state=blob, result=blob[::-1])
        got = await s.load("bin")
        assert got.state == blob and got.result == blob[::-1]
    run(store_url, body)


def test_session_ttl_expires(store_url: str) -> None:
    async def body(s: SessionStore) -> None:
        await s.commit("short", 1, state=b"x", ttl=2.0)
        await s.commit("long", 1, state=b"y")
        assert (await s.load("short")).last_seq == 1
        await asyncio.sleep(2.5)
        assert (await s.load("short")).last_seq == 0  # gone: starts over
        assert (await s.commit("short", 1)).applied
        assert (await s.load("long")).last_seq == 1
    run(store_url, body)


def test_same_seq_from_two_stores_applies_once(store_url: str) -> None:
    async def body(a: SessionStore, b: SessionStore) -> list[bool]:
        outs = await asyncio.gather(*(s.commit("race", 1, state=str(i).encode())
                                      for i, s in enumerate([a, b] * 20)))
        return [c.applied for c in outs]
    applied = run(store_url, body, n=2)
    assert applied.count(True) == 1 and len(applied) == 40


def test_processes_racing_on_one_token_never_lose_or_double(store_url: str) -> None:
    """Three processes each try 60 times to commit the next seq of one token: every applied
    commit is a distinct seq, and the stored seq is their number."""
    script = """
import asyncio, json, sys
from lameduck.drain.commit import SeqGap
from lameduck.resume.store import open_store
async def main():
    s = open_store(sys.argv[1]); mine = []
    for _ in range(60):
        last = (await s.load("shared")).last_seq
        try:
            c = await s.commit("shared", last + 1, state=str(last + 1).encode())
        except SeqGap:
            continue
        if c.applied:
            mine.append(c.last_seq)
    await s.close(); print(json.dumps(mine))
asyncio.run(main())
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, store_url], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    seqs: list[int] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            seqs += json.loads(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    async def body(s: SessionStore) -> Any:
        return await s.load("shared")
    final = run(store_url, body)
    assert sorted(seqs) == list(range(1, len(seqs) + 1))  # each seq applied exactly once
    assert final.last_seq == len(seqs) and final.state == str(len(seqs)).encode()
    assert len(seqs) >= 60  # each process applied at least its uncontended share


def test_idempotency_key_claims(store_url: str) -> None:
    async def body(s: SessionStore) -> None:
        first = await s.claim_key("k1", "fp-a")
        assert first.claim is Claim.NEW and first.owner
        assert (await s.claim_key("k1", "fp-a")).claim is Claim.RUNNING
        assert (await s.claim_key("k1", "fp-b")).claim is Claim.MISMATCH
        await s.finish_key("k1", "not-the-owner", b"not mine")  # another's finish: ignored
        assert (await s.claim_key("k1", "fp-a")).claim is Claim.RUNNING
        await s.finish_key("k1", first.owner, b"the response")
        done = await s.claim_key("k1", "fp-a")
        assert (done.claim, done.response, done.owner) == (Claim.DONE, b"the response", "")
        assert (await s.claim_key("k1", "fp-b")).claim is Claim.MISMATCH
        await s.release_key("k1", first.owner)  # done: a release does not drop the response
        assert (await s.claim_key("k1", "fp-a")).claim is Claim.DONE
        # a released claim (the request failed or was cut) may run again
        k2 = await s.claim_key("k2", "fp")
        assert k2.claim is Claim.NEW
        await s.release_key("k2", k2.owner)
        again = await s.claim_key("k2", "fp")
        assert again.claim is Claim.NEW and again.owner != k2.owner
    run(store_url, body)


def test_idempotency_lock_and_response_expire(store_url: str) -> None:
    async def body(s: SessionStore) -> None:
        dead = await s.claim_key("dead", "fp", lock_ttl=2.0)
        assert dead.claim is Claim.NEW
        kept = await s.claim_key("kept", "fp")
        await s.finish_key("kept", kept.owner, b"r", ttl=2.0)
        live = await s.claim_key("live", "fp", lock_ttl=2.0)
        assert (await s.claim_key("dead", "fp")).claim is Claim.RUNNING
        assert (await s.claim_key("kept", "fp")).claim is Claim.DONE
        for _ in range(5):  # the running request renews its mark past the lock's life
            await asyncio.sleep(0.5)
            assert await s.renew_key("live", live.owner, lock_ttl=2.0)
        assert not await s.renew_key("live", "not-the-owner", lock_ttl=2.0)
        # the process holding "dead" died: its mark expired, a retry may run
        retry = await s.claim_key("dead", "fp")
        assert retry.claim is Claim.NEW
        assert (await s.claim_key("kept", "fp")).claim is Claim.NEW
        assert (await s.claim_key("live", "fp")).claim is Claim.RUNNING
        # the first claim's late finish or release cannot touch the retry's claim
        assert not await s.renew_key("dead", dead.owner)
        await s.finish_key("dead", dead.owner, b"late")
        await s.release_key("dead", dead.owner)
        assert (await s.claim_key("dead", "fp")).claim is Claim.RUNNING
        await s.finish_key("dead", retry.owner, b"the retry's")
        assert (await s.claim_key("dead", "fp")).response == b"the retry's"
    run(store_url, body)


def test_racing_claims_one_winner(store_url: str) -> None:
    async def body(a: SessionStore, b: SessionStore) -> list[Claim]:
        outs = await asyncio.gather(*(s.claim_key("hot", "fp") for s in [a, b] * 10))
        return [o.claim for o in outs]
    claims = run(store_url, body, n=2)
    assert claims.count(Claim.NEW) == 1 and claims.count(Claim.RUNNING) == 19


def test_open_store_rejects_empty_url() -> None:
    with pytest.raises(ValueError, match="sqlite:///path"):
        open_store("sqlite://")
