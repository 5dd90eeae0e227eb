"""The consumer drain across a SIGTERM, against a real redis-server: consumer processes of
examples/redis_streams_consumer.py in one group; no message lost, none processed twice.

"Processed" is counted in Redis (HINCRBY ``<stream>:processed`` on the message's id), so a
message done twice shows as a 2 whoever did it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.procs import _env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "redis_streams_consumer.py"
STREAM, GROUP = "jobs", "workers"
PROCESSED = f"{STREAM}:processed"


class Consumer:
    """One example consumer process; stdout is its JSON summary, stderr goes to a file."""

    def __init__(self, url: str, name: str, workdir: Path, **opts: Any) -> None:
        self.name = name
        self.err_path = workdir / f"{name}.stderr"
        args = [sys.executable, str(EXAMPLE), "--redis", url, "--stream", STREAM,
                "--group", GROUP, "--name", name]
        for k, v in opts.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        with self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=_env())
        self.signalled_at: float | None = None

    def sigterm(self) -> None:
        self.signalled_at = time.monotonic()
        os.kill(self.proc.pid, signal.SIGTERM)

    def summary(self, timeout: float) -> dict[str, Any]:
        """Wait (at most ``timeout`` s) for the exit; the exit must be 0 with one JSON line."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.name} did not exit within {timeout}s:\n{self.stderr()}")
        assert self.proc.returncode == 0, f"{self.name} rc {self.proc.returncode}:\n{self.stderr()}"
        assert "Traceback" not in self.stderr(), self.stderr()
        lines = out.decode().strip().splitlines()
        assert len(lines) == 1, lines
        return json.loads(lines[0])

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def rds(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def consumer(redis_server: Any, tmp_path: Path) -> Iterator[Callable[..., Consumer]]:
    """``consumer(name, **options)`` starts an example consumer; all are SIGKILLed by pid at
    teardown if still running."""
    started: list[Consumer] = []

    def make(name: str, **opts: Any) -> Consumer:
        c = Consumer(redis_server.url, name, tmp_path, **opts)
        started.append(c)
        return c

    yield make
    for c in started:
        c.kill()


def produce(r: redis.Redis, n: int) -> None:
    """``n`` messages with ids 0..n-1, and the group that will read them from the start."""
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(STREAM, {"id": str(i)})
    pipe.execute()


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(0.02)


def pending(r: redis.Redis) -> int:
    return int(r.xpending(STREAM, GROUP)["pending"])


def pending_of(r: redis.Redis, name: str) -> int | None:
    """Entries pending in ``name``'s name; None if the consumer is not in the group."""
    for c in r.xinfo_consumers(STREAM, GROUP):
        if c["name"] == name:
            return int(c["pending"])
    return None


def all_done(r: redis.Redis, n: int) -> Callable[[], bool]:
    return lambda: r.hlen(PROCESSED) == n and pending(r) == 0


def assert_exactly_once(r: redis.Redis, n: int) -> None:
    counts = r.hgetall(PROCESSED)
    assert sorted(counts, key=int) == [str(i) for i in range(n)], "a message was lost"
    twice = {k: v for k, v in counts.items() if v != "1"}
    assert not twice, f"processed more than once: {twice}"
    assert pending(r) == 0
    group = r.xinfo_groups(STREAM)[0]
    assert group["pending"] == 0 and group["entries-read"] == n and group["lag"] == 0


def test_two_consumers_one_drained_mid_stream(rds: redis.Redis,
                                              consumer: Callable[..., Consumer]) -> None:
    """2000 messages, two consumers; SIGTERM one while both are busy. It finishes its batch,
    acks it, deletes itself from the group and exits 0 before its deadline; the other does
    the rest. Every message exactly once, nothing pending."""
    n, deadline = 2000, 10.0
    produce(rds, n)
    opts = {"batch": 10, "work_ms": 2, "deadline": deadline, "min_idle_ms": 5000,
            "claim_every": 1}
    a, b = consumer("a", **opts), consumer("b", **opts)
    # SIGTERM a with a batch in hand, once a quarter of the stream is done.
    wait_until(lambda: rds.hlen(PROCESSED) >= n // 4 and (pending_of(rds, "a") or 0) > 0,
               60, "a quarter processed, consumer a holding a batch")
    a.sigterm()
    sa = a.summary(timeout=deadline + 10)
    assert sa["took_s"] < deadline
    assert 0 < sa["processed"] == sa["acked"]
    assert sa["left_pending"] == 0 and sa["cut"] == 0
    assert pending_of(rds, "a") is None  # released: nothing pending, so deleted

    wait_until(all_done(rds, n), 90, "the other consumer finishes the stream")
    b.sigterm()
    sb = b.summary(timeout=deadline + 10)
    assert sb["processed"] == sb["acked"] and sb["left_pending"] == 0
    assert sa["processed"] + sb["processed"] == n
    assert_exactly_once(rds, n)
    assert rds.xinfo_consumers(STREAM, GROUP) == []


def test_deadline_leaves_unstarted_messages_for_the_other_consumer(
        rds: redis.Redis, consumer: Callable[..., Consumer]) -> None:
    """A batch of 20 slow messages, and a deadline that fits only a few of them: the drained
    consumer acks what it did, leaves the rest pending in its name (so it is not deleted),
    and exits in time; the other claims those (XAUTOCLAIM, past min-idle) and does them
    once."""
    n, deadline, min_idle_ms = 60, 3.0, 4000
    produce(rds, n)
    a = consumer("a", batch=20, work_ms=300, item_budget_ms=1000, deadline=deadline,
                 margin=0.5, min_idle_ms=min_idle_ms, claim_every=0.5)
    wait_until(lambda: rds.hlen(PROCESSED) >= 1, 30, "the first message started")
    a.sigterm()
    sa = a.summary(timeout=deadline + 10)
    assert sa["took_s"] < deadline
    assert 0 < sa["processed"] == sa["acked"] < 20
    assert sa["cut"] == 0
    assert sa["left_pending"] == 20 - sa["processed"]
    assert pending_of(rds, "a") == sa["left_pending"]  # kept: deleting it would drop them
    assert rds.hlen(PROCESSED) == sa["processed"]

    b = consumer("b", batch=20, work_ms=5, min_idle_ms=min_idle_ms, claim_every=0.5)
    wait_until(all_done(rds, n), 60, "the other consumer claims and finishes")
    b.sigterm()
    sb = b.summary(timeout=15)
    assert sb["claimed"] == sa["left_pending"]
    assert sa["processed"] + sb["processed"] == n
    assert_exactly_once(rds, n)
    assert pending_of(rds, "a") == 0 and pending_of(rds, "b") is None


def test_sigterm_mid_work_finishes_and_acks_that_message(
        rds: redis.Redis, consumer: Callable[..., Consumer]) -> None:
    """SIGTERM while a 3 s message is in progress: the consumer waits for it, acks it and
    fetches nothing more; the next consumer gets only the messages never delivered."""
    n, deadline = 3, 15.0
    produce(rds, n)
    a = consumer("a", batch=1, work_ms=3000, deadline=deadline)
    wait_until(lambda: rds.hlen(PROCESSED) >= 1, 30, "the first message started")
    a.sigterm()
    sa = a.summary(timeout=deadline + 10)
    assert sa["processed"] == sa["acked"] == 1
    assert sa["left_pending"] == 0 and sa["cut"] == 0
    assert 1.0 < sa["took_s"] < deadline  # it waited for the work instead of cutting it
    assert pending(rds) == 0 and pending_of(rds, "a") is None
    assert rds.xinfo_groups(STREAM)[0]["entries-read"] == 1  # nothing fetched after SIGTERM
    assert rds.hgetall(PROCESSED) == {"0": "1"}

    b = consumer("b", batch=10, work_ms=0)
    wait_until(all_done(rds, n), 30, "the rest is consumed")
    b.sigterm()
    sb = b.summary(timeout=15)
    assert sb["processed"] == n - 1 and sb["claimed"] == 0
    assert_exactly_once(rds, n)
