"""The consumer drain's decisions on a fake clock, and its asyncio runner against an
in-memory queue (a broker with a pending list, as Redis Streams keeps one)."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lameduck.drain.consumer import TRANSITIONS, ConsumerDrain, ConsumerTimes, Event, Phase
from lameduck.resume.consumer import ConsumerRunner, _messages, _read_entries

SRC = Path(__file__).resolve().parents[2] / "src"
MODULE = SRC / "lameduck" / "resume" / "consumer.py"

T = TypeVar("T")


# -- the state machine -----------------------------------------------------------------------


def test_transition_table_is_complete_but_for_finishing_twice() -> None:
    missing = {(p, e) for p in Phase for e in Event} - set(TRANSITIONS)
    assert missing == {(Phase.STOPPED, Event.FINISH)}


def test_phases_in_order() -> None:
    d = ConsumerDrain(ConsumerTimes(deadline=10, margin=1))
    assert d.phase is Phase.RUNNING and d.should_fetch()
    assert d.stop(100.0) is True
    assert d.phase is Phase.STOPPING and not d.should_fetch()
    d.finish()
    assert d.phase is Phase.STOPPED and not d.should_fetch()
    with pytest.raises(RuntimeError):
        d.finish()
    assert d.stop(200.0) is False  # a late signal changes nothing
    assert d.phase is Phase.STOPPED and d.stopped_at == 100.0


def test_second_signal_keeps_the_first_deadline() -> None:
    d = ConsumerDrain(ConsumerTimes(deadline=10, margin=1))
    d.stop(100.0)
    assert d.stop(105.0) is False
    assert d.deadline == 110.0


def test_finish_without_a_signal() -> None:
    d = ConsumerDrain()
    d.finish()  # the fetch failed: the runner still releases and stops
    assert d.phase is Phase.STOPPED and d.deadline == math.inf


def test_remaining_and_work_left() -> None:
    d = ConsumerDrain(ConsumerTimes(deadline=10, margin=1.5))
    assert d.remaining(0.0) == math.inf and d.work_left(0.0) == math.inf
    d.stop(100.0)
    assert d.remaining(100.0) == 10.0
    assert d.remaining(107.0) == 3.0
    assert d.remaining(111.0) == 0.0
    assert d.work_left(100.0) == 8.5
    assert d.work_left(108.5) == 0.0
    assert d.work_left(109.0) == 0.0
    d.finish()
    assert d.work_left(100.0) == 0.0


# (times, stopped at, now, fetched at) -> may start the next message?
MAY_START = [
    # running, no lease: always
    (ConsumerTimes(10, 1, 2), None, 1e9, None, True),
    (ConsumerTimes(10, 1, 2), None, 1e9, 0.0, True),
    # running with a lease of 30 s: start + budget (2) must be <= fetched + 30 - margin (1)
    (ConsumerTimes(10, 1, 2, 30), None, 127.0, 100.0, True),
    (ConsumerTimes(10, 1, 2, 30), None, 127.001, 100.0, False),
    # no fetch time given: the lease is not checked
    (ConsumerTimes(10, 1, 2, 30), None, 1e9, None, True),
    # stopping: start + budget <= stopped + deadline - margin = 109
    (ConsumerTimes(10, 1, 2), 100.0, 100.0, 99.0, True),
    (ConsumerTimes(10, 1, 2), 100.0, 107.0, 99.0, True),
    (ConsumerTimes(10, 1, 2), 100.0, 107.5, 99.0, False),
    (ConsumerTimes(10, 1, 0), 100.0, 109.0, 99.0, True),
    (ConsumerTimes(10, 1, 0), 100.0, 109.1, 99.0, False),
    # stopping with a lease: the earlier of the two cutoffs
    (ConsumerTimes(10, 1, 2, 5), 100.0, 101.0, 99.0, True),  # lease cutoff 103
    (ConsumerTimes(10, 1, 2, 5), 100.0, 101.5, 99.0, False),
    (ConsumerTimes(10, 1, 2, 60), 100.0, 107.0, 99.0, True),  # deadline cutoff 109
    (ConsumerTimes(10, 1, 2, 60), 100.0, 107.5, 99.0, False),
]


@pytest.mark.parametrize(("times", "stopped", "now", "fetched", "expected"), MAY_START)
def test_may_start(times: ConsumerTimes, stopped: float | None, now: float,
                   fetched: float | None, expected: bool) -> None:
    d = ConsumerDrain(times)
    if stopped is not None:
        d.stop(stopped)
    assert d.may_start(now, fetched) is expected


def test_nothing_starts_once_stopped() -> None:
    d = ConsumerDrain(ConsumerTimes(10, 1))
    d.finish()
    assert not d.may_start(0.0)


@pytest.mark.parametrize("kw", [
    {"deadline": 0},
    {"deadline": -1},
    {"deadline": 5, "margin": 5},
    {"margin": -0.1},
    {"item_budget": -1},
    {"margin": 1, "item_budget": 2, "lease": 3},
])
def test_times_reject_nonsense(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConsumerTimes(**kw)


def play(times: ConsumerTimes, batch: int, work: float, signal_at: float,
         fetched_at: float = 0.0) -> list[float]:
    """The batch in hand on a fake clock: each message takes ``work``; SIGTERM at
    ``signal_at``. The start times of the messages that were started."""
    d = ConsumerDrain(times)
    now, started = fetched_at, []
    for _ in range(batch):
        if now >= signal_at:
            d.stop(signal_at)
        if not d.may_start(now, fetched_at):
            break
        started.append(now)
        now += work
    return started


def test_play_finishes_the_batch_when_time_allows() -> None:
    assert play(ConsumerTimes(30, 1, 1), batch=5, work=1, signal_at=0.5) == [0, 1, 2, 3, 4]


def test_play_stops_starting_before_the_deadline() -> None:
    # SIGTERM at 0.5: deadline 4.5, margin 1 -> a 1 s message may start until 2.5.
    assert play(ConsumerTimes(4, 1, 1), batch=10, work=1, signal_at=0.5) == [0, 1, 2]


def test_play_stops_starting_before_the_lease_runs_out() -> None:
    # No signal; lease 5 s from the fetch, margin 1 -> a 1 s message may start until 3.
    assert play(ConsumerTimes(30, 1, 1, 5), batch=10, work=1, signal_at=math.inf) == [0, 1, 2, 3]


@given(
    deadline=st.floats(0.5, 60), margin_frac=st.floats(0, 0.9), budget=st.floats(0, 10),
    lease=st.none() | st.floats(0.1, 120), work_frac=st.floats(0.01, 1),
    signal_at=st.floats(0, 100), batch=st.integers(1, 50),
)
def test_started_work_always_ends_inside_deadline_and_lease(
    deadline: float, margin_frac: float, budget: float, lease: float | None,
    work_frac: float, signal_at: float, batch: int,
) -> None:
    """Whatever the times: a message that takes no more than its budget, once started, ends
    (and leaves ``margin`` for the ack) before the deadline and before its lease runs out."""
    margin = deadline * margin_frac
    if lease is not None and lease <= margin + budget:
        lease = margin + budget + 0.1
    times = ConsumerTimes(deadline, margin, budget, lease)
    work = max(budget * work_frac, 1e-3)
    for start in play(times, batch, work, signal_at):
        end = start + min(work, budget) if budget else start
        if start >= signal_at:
            assert end <= signal_at + deadline - margin + 1e-9
        if lease is not None:
            assert end <= lease - margin + 1e-9


# -- the runner against an in-memory queue ---------------------------------------------------


class Broker:
    """A queue with a pending list: fetched entries stay pending until acked."""

    def __init__(self, n: int, batch: int) -> None:
        self.queue = list(range(n))
        self.batch = batch
        self.pending: set[int] = set()
        self.acked: list[int] = []
        self.processed: list[int] = []
        self.released = 0
        self.log: list[str] = []

    async def fetch(self) -> list[int]:
        await asyncio.sleep(0)
        got, self.queue = self.queue[:self.batch], self.queue[self.batch:]
        self.pending.update(got)
        self.log.append(f"fetch {len(got)}")
        if not got:
            await asyncio.sleep(0.01)  # an idle BLOCK
        return got

    async def ack(self, msgs: Sequence[int]) -> None:
        assert set(msgs) <= self.pending
        self.pending -= set(msgs)
        self.acked.extend(msgs)
        self.log.append(f"ack {list(msgs)}")

    async def release(self) -> None:
        self.released += 1
        self.log.append("release")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_stop_mid_message_finishes_the_batch_acks_then_releases() -> None:
    broker = Broker(100, batch=4)
    runner: ConsumerRunner[int] = ConsumerRunner(
        broker.fetch, lambda m: process(m), broker.ack, broker.release,
        ConsumerDrain(ConsumerTimes(deadline=10, margin=1)), signals=())

    async def process(m: int) -> None:
        broker.processed.append(m)
        if m == 5:
            runner.stop()  # SIGTERM while message 5 is in progress
        await asyncio.sleep(0.01)

    s = run(runner.run())
    assert broker.processed == list(range(8))  # the batch in hand (4..7) was finished
    assert broker.acked == list(range(8)) and not broker.pending
    assert broker.log[-2:] == ["ack [4, 5, 6, 7]", "release"]
    assert broker.log.count("fetch 4") == 2 and broker.released == 1
    assert s.processed == 8 and s.acked == 8 and s.left_pending == 0 and s.cut == 0
    assert runner.drain.phase is Phase.STOPPED


def test_the_deadline_cuts_a_message_and_leaves_the_rest_pending() -> None:
    broker = Broker(10, batch=5)
    runner: ConsumerRunner[int] = ConsumerRunner(
        broker.fetch, lambda m: process(m), broker.ack, broker.release,
        ConsumerDrain(ConsumerTimes(deadline=0.6, margin=0.2)), signals=())

    async def process(m: int) -> None:
        broker.processed.append(m)
        if m == 0:
            runner.stop()
            return
        await asyncio.sleep(30)  # far past the deadline

    s = run(runner.run())
    assert broker.processed == [0, 1]
    assert broker.acked == [0]  # 1 was cut: not acked, pending like 2..4
    assert broker.pending == {1, 2, 3, 4} and broker.released == 1
    assert s.cut == 1 and s.left_pending == 4
    assert s.took_s is not None and s.took_s < 0.6 + 1


def test_a_failing_message_stays_pending_and_the_error_propagates() -> None:
    broker = Broker(10, batch=5)

    async def process(m: int) -> None:
        if m == 2:
            raise KeyError(m)
        broker.processed.append(m)

    runner: ConsumerRunner[int] = ConsumerRunner(
        broker.fetch, process, broker.ack, broker.release, ConsumerDrain(), signals=())
    with pytest.raises(KeyError):
        run(runner.run())
    assert broker.acked == [0, 1] and broker.pending == {2, 3, 4}
    assert broker.released == 1 and runner.drain.phase is Phase.STOPPED


def test_a_fetch_in_flight_at_the_signal_is_the_batch_in_hand() -> None:
    fetches = 0
    processed: list[int] = []
    acked: list[int] = []

    async def fetch() -> list[int]:
        nonlocal fetches
        fetches += 1
        runner.stop()  # the signal comes while the fetch is out
        await asyncio.sleep(0.05)
        return [1, 2, 3]

    async def process(m: int) -> None:
        processed.append(m)

    async def ack(ms: Sequence[int]) -> None:
        acked.extend(ms)

    async def release() -> None:
        pass

    runner: ConsumerRunner[int] = ConsumerRunner(fetch, process, ack, release, signals=())
    run(runner.run())
    assert fetches == 1 and processed == [1, 2, 3] and acked == [1, 2, 3]


def test_the_lease_stops_a_slow_batch_while_running() -> None:
    """On a fake clock each message takes 1 s; the lease is 5 s with a 1 s margin: messages
    0..3 of the first batch start, 4..9 are left for a claim."""
    clock = [0.0]
    broker = Broker(20, batch=10)

    async def process(m: int) -> None:
        broker.processed.append(m)
        clock[0] += 1

    async def fetch() -> list[int]:
        if broker.log:
            runner.stop()
            return []
        return await broker.fetch()

    runner: ConsumerRunner[int] = ConsumerRunner(
        fetch, process, broker.ack, broker.release,
        ConsumerDrain(ConsumerTimes(30, 1, 1, lease=5)), signals=(), clock=lambda: clock[0])
    s = run(runner.run())
    assert broker.processed == [0, 1, 2, 3] and broker.acked == [0, 1, 2, 3]
    assert broker.pending == set(range(4, 10))
    assert s.left_pending == 6 and s.cut == 0


def test_run_twice_is_refused() -> None:
    broker = Broker(0, batch=1)

    async def process(m: int) -> None:
        broker.processed.append(m)

    runner: ConsumerRunner[int] = ConsumerRunner(
        broker.fetch, process, broker.ack, broker.release, signals=())
    runner.stop()
    run(runner.run())
    with pytest.raises(RuntimeError):
        run(runner.run())


# -- the Redis reply shapes, without Redis ---------------------------------------------------


def test_reply_shapes() -> None:
    resp2 = [["s", [("1-0", {"id": "a"}), ("2-0", {"id": "b"})]]]
    unified = {"s": [("1-0", {"id": "a"}), ("2-0", {"id": "b"})]}
    legacy3 = {"s": [[("1-0", {"id": "a"}), ("2-0", {"id": "b"})]]}
    for reply in (resp2, unified, legacy3):
        assert [m.id for m in _messages(_read_entries(reply))] == ["1-0", "2-0"]
    assert _read_entries([]) == [] and _read_entries({}) == [] and _read_entries(None) == []
    raw = [[b"3-0", [b"id", b"c", b"k", b"v"]], (None, None), ("4-0", None)]
    assert [(m.id, dict(m.fields)) for m in _messages(raw)] == [("3-0", {"id": "c", "k": "v"})]


# -- what the module needs --------------------------------------------------------------


def test_imports_without_redis() -> None:
    """Loaded as a file, so what the package's ``__init__`` imports does not count."""
    code = ("import sys; sys.modules['redis'] = None\n"
            "import importlib.util as u\n"
            f"spec = u.spec_from_file_location('consumer', {str(MODULE)!r})\n"
            "m = sys.modules['consumer'] = u.module_from_spec(spec)\n"
            "spec.loader.exec_module(m)\n"
            "print(m.ConsumerDrain().phase.value)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "running"
