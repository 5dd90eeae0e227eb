"""``lameduck.resume.ResumeMiddleware`` under real ASGI servers (uvicorn, hypercorn, granian)
with the demo app: commit-once over HTTP and WebSocket, Idempotency-Key, and the drain
(going away, close 1001, the deadline's cut that commits nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.apps import load_session
from tests.procs import wait_until

SERVERS = ["uvicorn", "hypercorn", "granian"]


def work(app: Any, token: str, seq: int | str, ms: int = 0, **kw: Any) -> httpx.Response:
    return httpx.post(app.url(f"/work?ms={ms}"), timeout=20,
                      headers={"Resume-Token": token, "Resume-Seq": str(seq)}, **kw)


def claimed(db: Path, key: str) -> bool:
    """The key's "running" mark is in the SQLite store (the first request got it)."""
    with contextlib.closing(sqlite3.connect(db, timeout=5)) as c:
        try:
            return c.execute("SELECT 1 FROM lameduck_keys WHERE key = ?", (key,)).fetchone() \
                is not None
        except sqlite3.OperationalError:  # not created yet
            return False


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["r"] = fn()
        except Exception as e:
            out["e"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, out


@pytest.mark.parametrize("server", SERVERS)
def test_commit_once_replay_and_gap(resume_app: Any, server: str) -> None:
    a = resume_app(server)
    r = work(a, "t7", 1)
    assert r.status_code == 200 and r.headers["resume-last-seq"] == "1"
    assert r.json() == {"instance": "a", "token": "t7", "seq": 1, "count": 1, "sum": 1}
    again = work(a, "t7", 1)  # a replay: the stored answer, the app not run again
    assert again.status_code == 200 and again.headers["resume-replayed"] == "true"
    assert again.json() == r.json()
    gap = work(a, "t7", 3)
    assert gap.status_code == 409 and gap.headers["resume-last-seq"] == "1"
    assert gap.json()["error"] == "seq_gap" and "replay from 2" in gap.json()["detail"]
    r2 = work(a, "t7", 2)
    assert r2.json()["count"] == 2 and r2.json()["sum"] == 3
    for bad in ("0", "-1", "x", ""):
        b = work(a, "t7", bad)
        assert b.status_code == 400, bad
    missing = httpx.post(a.url("/work"), headers={"Resume-Token": "t7"}, timeout=10)
    assert missing.status_code == 400 and "Resume-Seq" in missing.text
    assert work(a, "t7", 3).json()["count"] == 3  # nothing above counted twice


@pytest.mark.parametrize("server", SERVERS)
def test_idempotency_key(resume_app: Any, server: str, tmp_path: Path) -> None:
    a = resume_app(server)
    c = httpx.Client(timeout=20)
    first = c.post(a.url("/pay"), content=b"100 EUR", headers={"Idempotency-Key": '"k1"'})
    assert first.status_code == 201
    repeat = c.post(a.url("/pay"), content=b"100 EUR", headers={"Idempotency-Key": '"k1"'})
    assert repeat.status_code == 201 and repeat.json() == first.json()
    assert repeat.headers["idempotent-replayed"] == "true"
    other = c.post(a.url("/pay"), content=b"200 EUR", headers={"Idempotency-Key": '"k1"'})
    assert other.status_code == 422
    # still running: 409, then the original's answer once it is done
    t, out = in_thread(lambda: httpx.post(a.url("/pay?ms=1500"), content=b"x", timeout=20,
                                          headers={"Idempotency-Key": "k2"}))
    assert wait_until(lambda: claimed(tmp_path / "sessions.db", "k2"), 10)
    busy = c.post(a.url("/pay?ms=1500"), content=b"x", headers={"Idempotency-Key": "k2"})
    t.join(20)
    assert busy.status_code == 409
    assert out["r"].status_code == 201
    done = c.post(a.url("/pay?ms=1500"), content=b"x", headers={"Idempotency-Key": "k2"})
    assert done.json() == out["r"].json()
    assert done.json()["charge"] == first.json()["charge"] + 1  # the 409 and replays ran nothing
    assert c.post(a.url("/pay"), headers={"Idempotency-Key": ""}).status_code == 400


async def _ws_session(url: str) -> list[Any]:
    got: list[Any] = []
    async with connect(url) as ws:
        await ws.send(json.dumps({"resume": {"token": "w1", "seq": 0}}))
        got.append(json.loads(await ws.recv()))
        for seq in (1, 2):
            await ws.send(json.dumps({"seq": seq, "data": seq}))
            got.append(json.loads(await ws.recv()))
    async with connect(url) as ws:  # a new connection resumes where the store says
        await ws.send(json.dumps({"resume": {"token": "w1", "seq": 1}}))
        got.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"seq": 2, "data": 2}))  # committed already: a replay
        got.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"seq": 4, "data": 4}))  # a gap
        got.append(json.loads(await ws.recv()))
    return got


@pytest.mark.parametrize("server", SERVERS)
def test_websocket_hello_commit_replay(resume_app: Any, server: str, tmp_path: Path) -> None:
    a = resume_app(server)
    got = asyncio.run(asyncio.wait_for(_ws_session(a.ws_url()), 20))
    assert got[0] == {"resumed": {"seq": 0}}
    assert got[1]["ack"] == 1 and got[1]["result"]["count"] == 1 and not got[1]["replayed"]
    assert got[2]["ack"] == 2 and got[2]["result"]["count"] == 2
    assert got[3] == {"resumed": {"seq": 2}}
    assert got[4]["ack"] == 2 and got[4]["replayed"] and got[4]["result"]["count"] == 2
    assert got[5] == {"error": "seq_gap", "seq": 4, "last_seq": 2}
    s = load_session(f"sqlite://{tmp_path / 'sessions.db'}", "w1")
    assert s.last_seq == 2 and json.loads(s.state) == {"count": 2, "sum": 3}


@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
def test_sigterm_drains_in_flight_then_exits(resume_app: Any, server: str,
                                            tmp_path: Path) -> None:
    a = resume_app(server, grace=5)
    assert work(a, "d1", 1).status_code == 200
    t, out = in_thread(lambda: work(a, "d1", 2, ms=1500))
    time.sleep(0.4)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = httpx.get(a.url("/"), timeout=5)
    assert refused.status_code == 503 and refused.text == "going away\n"
    assert refused.headers["retry-after"] == "5"
    health = httpx.get(a.url("/health"), timeout=5)
    assert health.status_code == 503
    assert health.headers["x-envoy-immediate-health-check-fail"] == "true"
    t.join(20)
    assert out["r"].status_code == 200 and out["r"].json()["seq"] == 2  # finished, committed
    a.wait(15)
    took = time.monotonic() - t0
    print(f"{server}: drain with a 1.1 s request in flight exited after {took:.2f} s")
    assert took < 5  # it went when the work was done, not at the 5 s deadline
    assert load_session(f"sqlite://{tmp_path / 'sessions.db'}", "d1").last_seq == 2


def test_deadline_cuts_and_commits_nothing(resume_app: Any, tmp_path: Path) -> None:
    a = resume_app("uvicorn", grace=0.5)
    assert work(a, "slow", 1).status_code == 200
    t, out = in_thread(lambda: work(a, "slow", 2, ms=4000))
    k, kout = in_thread(lambda: httpx.post(a.url("/pay?ms=4000"), content=b"x", timeout=20,
                                           headers={"Idempotency-Key": "cut-key"}))
    time.sleep(0.5)
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    t.join(20)
    k.join(20)
    cut = out["r"]
    assert cut.status_code == 503 and cut.text == "going away\n"  # the client replays it
    assert kout["r"].status_code == 503
    a.wait(10)
    took = time.monotonic() - t0
    print(f"cut after {took:.2f} s (grace 0.5 s)")
    assert took < 3.5  # the 4 s requests did not hold the exit
    url = f"sqlite://{tmp_path / 'sessions.db'}"
    assert load_session(url, "slow").last_seq == 1  # seq 2 never committed
    b = resume_app("uvicorn", name="b")  # another instance: the replay commits it, once
    assert work(b, "slow", 2).json() == {"instance": "b", "token": "slow", "seq": 2,
                                         "count": 2, "sum": 3}
    # the cut request's key was released: the retry runs (not a 409 for a minute)
    assert httpx.post(b.url("/pay"), content=b"x", headers={"Idempotency-Key": "cut-key"},
                      timeout=10).status_code == 201


async def _close_code_on_drain(a: Any, trigger: Any) -> tuple[int | None, float]:
    async with connect(a.ws_url()) as ws:
        await ws.send(json.dumps({"resume": {"token": "z", "seq": 0}}))
        assert json.loads(await ws.recv()) == {"resumed": {"seq": 0}}
        t0 = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, trigger)
        try:
            while True:
                await ws.recv()
        except ConnectionClosed as e:
            return (e.rcvd.code if e.rcvd else None), time.monotonic() - t0


@pytest.mark.parametrize("server", SERVERS)
def test_websocket_told_1001_when_draining(resume_app: Any, server: str) -> None:
    a = resume_app(server, grace=5, stagger=0.5)
    if server == "granian":  # its signals stay in Rust: the drain path starts the drain
        def trigger() -> None:
            assert httpx.post(a.url("/_drain"), timeout=5).status_code == 202
    else:
        def trigger() -> None:
            a.signal(signal.SIGTERM)
    code, took = asyncio.run(asyncio.wait_for(_close_code_on_drain(a, trigger), 20))
    print(f"{server}: close {code} after {took:.2f} s (stagger 0.5 s)")
    assert code == 1001
    assert took < 4
    if server == "granian":
        assert httpx.get(a.url("/"), timeout=5).status_code == 503
        a.signal(signal.SIGTERM)
    assert a.wait(15) is not None


def test_store_down_is_503_not_a_crash(resume_app: Any) -> None:
    from tests.procs import refusing_port
    a = resume_app("uvicorn", store=f"redis://127.0.0.1:{refusing_port()}/0")
    r = work(a, "t", 1)
    assert r.status_code == 503 and "session store unavailable" in r.text
    assert httpx.get(a.url("/"), timeout=5).status_code == 200  # the rest still serves


async def _two_connections_one_token(url: str) -> list[Any]:
    """Both connections loaded the session at 0; the second replays seq 1 (the first
    committed it) and then sends seq 2, which must build on seq 1's state."""
    got: list[Any] = []
    async with connect(url) as one, connect(url) as two:
        for ws in (one, two):
            await ws.send(json.dumps({"resume": {"token": "both", "seq": 0}}))
            got.append(json.loads(await ws.recv()))
        await one.send(json.dumps({"seq": 1, "data": 1}))
        got.append(json.loads(await one.recv()))
        await two.send(json.dumps({"seq": 1, "data": 1}))
        got.append(json.loads(await two.recv()))
        await two.send(json.dumps({"seq": 2, "data": 2}))
        got.append(json.loads(await two.recv()))
    return got


def test_websocket_replay_then_next_builds_on_the_stored_state(resume_app: Any) -> None:
    a = resume_app("uvicorn")
    got = asyncio.run(asyncio.wait_for(_two_connections_one_token(a.ws_url()), 20))
    assert got[0] == got[1] == {"resumed": {"seq": 0}}
    assert got[2]["ack"] == 1 and not got[2]["replayed"]
    assert got[3]["ack"] == 1 and got[3]["replayed"]
    assert got[4]["ack"] == 2 and got[4]["result"] == {"instance": "a", "count": 2, "sum": 3}


async def _plain_and_header(a: Any) -> list[Any]:
    got: list[Any] = []
    async with connect(a.ws_url()) as plain:  # no hello: nothing to commit to
        await plain.send(json.dumps({"seq": 1, "data": 1}))
        got.append(json.loads(await plain.recv()))
    async with connect(a.ws_url(), additional_headers={"Resume-Token": "hdr"}) as ws:
        got.append(json.loads(await ws.recv()))  # the handshake's token is answered too
        await ws.send(json.dumps({"seq": 1, "data": 5}))
        got.append(json.loads(await ws.recv()))
    return got


def test_websocket_without_hello_and_with_header(resume_app: Any) -> None:
    a = resume_app("uvicorn")
    got = asyncio.run(asyncio.wait_for(_plain_and_header(a), 20))
    assert got[0] == {"error": "no_session", "seq": 1, "last_seq": None}
    assert got[1] == {"resumed": {"seq": 0}}
    assert got[2]["ack"] == 1 and got[2]["result"]["sum"] == 1


def test_drain_path_refuses_forwarded_requests(resume_app: Any) -> None:
    a = resume_app("uvicorn")
    r = httpx.post(a.url("/_drain"), headers={"X-Forwarded-For": "203.0.113.9"}, timeout=5)
    assert r.status_code == 403
    assert httpx.get(a.url("/"), timeout=5).status_code == 200  # not draining


def test_long_idempotent_request_keeps_its_key(resume_app: Any, tmp_path: Path) -> None:
    """A request running past the lock's life renews its mark: a retry meanwhile gets 409,
    not a second run."""
    a = resume_app("uvicorn", lock_ttl=1.0)
    t, out = in_thread(lambda: httpx.post(a.url("/pay?ms=3500"), content=b"x", timeout=20,
                                          headers={"Idempotency-Key": "long"}))
    assert wait_until(lambda: claimed(tmp_path / "sessions.db", "long"), 10)
    time.sleep(2.0)  # twice the lock's life
    retry = httpx.post(a.url("/pay?ms=3500"), content=b"x", timeout=20,
                       headers={"Idempotency-Key": "long"})
    t.join(20)
    assert retry.status_code == 409
    assert out["r"].status_code == 201
    again = httpx.post(a.url("/pay?ms=3500"), content=b"x", timeout=20,
                       headers={"Idempotency-Key": "long"})
    assert again.json() == out["r"].json()
