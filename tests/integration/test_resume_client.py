"""``lameduck.client``'s clients against real servers: going away is retried through the
balancer and commits once, a gap is an error that says where the server is, and a server
that never comes back ends in GaveUp, not a hang."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from lameduck.client import (
    DEFAULT_TIMEOUT,
    Backoff,
    GaveUp,
    ResumableClient,
    ResumableWebSocket,
    ResumeGap,
    SessionError,
)
from tests.apps import load_session
from tests.procs import base_config, refusing_port

FAST = Backoff(first=0.05, base=0.05, cap=0.2, max_attempts=8)


def test_going_away_is_retried_elsewhere_and_commits_once(resume_app, lameduck, origin_port,
                                                          tmp_path) -> None:
    """A drains (it still listens and answers 503 going away); lameduck, told nothing, keeps
    sending half the requests there. The client goes back until B takes each seq."""
    a = resume_app("uvicorn", "a", grace=30)
    b = resume_app("uvicorn", "b")
    assert httpx.post(a.url("/_drain"), timeout=5).status_code == 202
    assert httpx.get(a.url("/work"), timeout=5).status_code == 503
    ld = lameduck(base_config(origin_port, cluster={"endpoints": [a.addr, b.addr]}))

    async def main() -> tuple[list[httpx.Response], int]:
        async with ResumableClient(token="rc", backoff=FAST, timeout=10) as c:
            rs = [await c.post(ld.url("/work")) for _ in range(12)]
            return rs, c.retries
    rs, retries = asyncio.run(main())
    assert [r.json()["seq"] for r in rs] == list(range(1, 13))
    assert {r.json()["instance"] for r in rs} == {"b"}
    assert retries >= 3  # round robin sent some to A (12 requests: about 6 of them)

    got = load_session(f"sqlite://{tmp_path / 'sessions.db'}", "rc")
    assert got.last_seq == 12 and json.loads(got.state or b"{}") == {"count": 12, "sum": 78}


def test_a_request_longer_than_httpx_default_timeout_is_not_lost(resume_app) -> None:
    """httpx gives up reading after 5 s by default; a unit of work that takes 6 s must still
    commit, with no retry (a read timeout is not retried: the work may still be running)."""
    a = resume_app("uvicorn")

    async def main() -> tuple[httpx.Response, int, float]:
        async with ResumableClient(a.url(""), token="long", backoff=FAST) as c:
            assert c.http.timeout == DEFAULT_TIMEOUT
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            r = await c.post("/work?ms=6000")
            return r, c.retries, loop.time() - t0
    r, retries, took = asyncio.run(main())
    assert r.status_code == 200, r.text
    assert r.json()["seq"] == 1 and retries == 0
    assert took >= 5.5  # it really outlived httpx's 5 s


def test_gap_is_an_error_naming_the_server_seq(resume_app) -> None:
    a = resume_app("uvicorn")

    async def main() -> None:
        async with ResumableClient(a.url(""), token="g", last_acked=5, backoff=FAST) as c:
            with pytest.raises(ResumeGap) as e:
                await c.post("/work")
            assert (e.value.last, e.value.seq) == (0, 6)
    asyncio.run(main())


def test_no_server_ends_in_gave_up() -> None:
    port = refusing_port()

    async def main() -> None:
        async with ResumableClient(f"http://127.0.0.1:{port}", backoff=Backoff(
                first=0.01, base=0.01, cap=0.02, max_attempts=3)) as c:
            with pytest.raises(GaveUp) as e:
                await c.post("/work")
            assert isinstance(e.value.__cause__, httpx.ConnectError)
            assert c.retries == 3
        ws = ResumableWebSocket(f"ws://127.0.0.1:{port}/ws", backoff=Backoff(
            first=0.01, base=0.01, cap=0.02, max_attempts=3))
        with pytest.raises(GaveUp):
            await asyncio.wait_for(ws.start(), 10)
        assert len(ws.reconnect_times) == 3
    asyncio.run(main())


def test_only_committed_answers_move_the_seq(resume_app) -> None:
    """The app's 500 is returned and its seq sent again next time; the app's own 409 is an
    answer (committed), not a gap; a client behind the server adopts the server's seq."""
    a = resume_app("uvicorn")

    async def main() -> None:
        async with ResumableClient(a.url(""), token="m", backoff=FAST) as c:
            failed = await c.post("/fail")
            assert failed.status_code == 500 and c.last_acked == 0
            ok = await c.post("/work")
            assert ok.json()["seq"] == 1 and c.last_acked == 1
            conflict = await c.post("/conflict")
            assert conflict.status_code == 409 and c.last_acked == 2
            a1, a2 = await asyncio.gather(c.post("/work"), c.post("/work"))
            assert sorted([a1.json()["seq"], a2.json()["seq"]]) == [3, 4]
            assert max(a1.json()["count"], a2.json()["count"]) == 3  # 1, 3, 4 did work
        async with ResumableClient(a.url(""), token="m", backoff=FAST) as behind:
            old = await behind.post("/work")  # seq 1: long committed; the server is at 4
            assert old.headers["resume-replayed"] == "true"
            assert behind.last_acked == 4
            assert (await behind.post("/work")).json()["seq"] == 5
    asyncio.run(main())


def test_websocket_client_fails_calls_instead_of_hanging(resume_app) -> None:
    a = resume_app("uvicorn")

    async def main() -> None:
        ws = await ResumableWebSocket(a.ws_url(), token="crashy", backoff=FAST).start()
        assert (await ws.call(1))["count"] == 1
        # the app dies on it each time (uvicorn cuts the connection): replayed, but not for
        # ever: with no acknowledgement in between, the backoff runs out
        with pytest.raises((GaveUp, SessionError)):
            await asyncio.wait_for(ws.call("crash"), 20)
        assert 1 < ws.connects <= FAST.max_attempts + 1
        with pytest.raises((GaveUp, SessionError)):  # and the client says so from then on
            await ws.call(2)
        await ws.close()

        lost = ResumableWebSocket(a.ws_url(), token="never-seen", backoff=FAST)
        lost.last_acked = 5  # the server has no such session (say it expired)
        with pytest.raises(ResumeGap):
            await asyncio.wait_for(lost.start(), 10)

        idle = await ResumableWebSocket(a.ws_url(), token="idle", backoff=FAST).start()
        call = asyncio.ensure_future(idle.call("crash"))  # pending when closed
        await asyncio.sleep(0)
        await idle.close()
        with pytest.raises((ConnectionError, SessionError)):
            await asyncio.wait_for(call, 10)
    asyncio.run(main())
