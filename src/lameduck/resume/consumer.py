"""Drain for queue consumers: stop fetching, finish the batch in hand, ack, release, exit.

Rules kept here (a consumer is a connection no router can see):
- The stop signal (SIGTERM) ends fetching at once; the deadline runs from the signal.
- A message of the batch in hand is started only if it can finish (``item_budget``) before
  the deadline less ``margin``, and, with a lease, before the lease less ``margin``: after
  the lease another consumer may claim it, and two consumers would process it.
- What was processed is acked. What was not started is not acked and stays pending for
  another consumer: never lost, never processed twice.
- A message still in progress at the deadline less ``margin`` is cut and not acked (it will
  be redone): the alternative is a SIGKILL in the middle of it, and no ack either.
- The lease is released last (a stream consumer deleted only once nothing is pending in its
  name), then the runner returns, before the deadline.

``ConsumerDrain`` (lameduck/drain/consumer.py) makes the decisions and does no I/O: the
caller passes the time.
``ConsumerRunner`` is the asyncio shell; ``RedisStreamConsumer`` the Redis Streams adapter,
the only part that needs redis-py (imported by the caller, not here).
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lameduck.drain.consumer import ConsumerDrain, ConsumerTimes, Phase

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)

M = TypeVar("M")
T = TypeVar("T")


# -- the asyncio shell -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerSummary:
    """What the consumer did; ``left_pending`` were fetched but not acked (for another consumer
    to claim), ``cut`` of them were stopped mid-work at the deadline and may be redone."""

    processed: int
    acked: int
    left_pending: int
    cut: int
    took_s: float | None  # from the stop signal to the return; None if never signalled


class ConsumerRunner(Generic[M]):
    """Runs ``fetch`` -> ``process`` each -> ``ack`` the batch, until stopped, then ``release``.

    ``fetch`` must return within a short time (a Redis BLOCK of a second or so) even when
    there is nothing to fetch: a fetch in flight at the signal is waited for (its batch is the
    batch in hand), not cancelled, unless the deadline comes first. An exception from
    ``process`` acks what was done, releases, and propagates: the failed message stays
    pending.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[Sequence[M]]],
        process: Callable[[M], Awaitable[object]],
        ack: Callable[[Sequence[M]], Awaitable[object]],
        release: Callable[[], Awaitable[object]],
        drain: ConsumerDrain | None = None,
        *,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._process = process
        self._ack = ack
        self._release = release
        self.drain = drain or ConsumerDrain()
        self._signals = tuple(signals)
        self._clock = clock
        self._stopped: asyncio.Future[None] | None = None
        self.fetched = self.processed = self.acked = self.cut = 0

    def stop(self) -> None:
        """What SIGTERM does; call it yourself with ``signals=()``."""
        self.drain.stop(self._clock())
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)

    def summary(self) -> ConsumerSummary:
        took = None if self.drain.stopped_at is None else self._clock() - self.drain.stopped_at
        return ConsumerSummary(self.processed, self.acked, self.fetched - self.acked, self.cut,
                               took)

    async def run(self) -> ConsumerSummary:
        if self.drain.phase is Phase.STOPPED:
            raise RuntimeError("this consumer drain has already finished")
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        if self.drain.phase is not Phase.RUNNING:
            self._stopped.set_result(None)
        installed: list[signal.Signals] = []
        try:
            for sig in self._signals:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            try:
                while self.drain.should_fetch():
                    fetched_at = self._clock()
                    done, batch = await self._bounded(self._fetch(), self.drain.work_left)
                    if not done:
                        break
                    if batch:
                        self.fetched += len(batch)
                        await self._run_batch(batch, fetched_at)
            finally:
                try:
                    done, _ = await self._bounded(self._release(), self.drain.remaining)
                    if not done:
                        log.warning("consumer release cut at the deadline")
                finally:
                    self.drain.finish()
        finally:
            # Only now: a SIGTERM during the release must not kill the process.
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self.summary()

    async def _run_batch(self, batch: Sequence[M], fetched_at: float) -> None:
        done: list[M] = []
        try:
            for msg in batch:
                if not self.drain.may_start(self._clock(), fetched_at):
                    break
                finished, _ = await self._bounded(self._process(msg), self.drain.work_left)
                if not finished:
                    self.cut += 1
                    break
                done.append(msg)
                self.processed += 1
        finally:
            if done:
                acked, _ = await self._bounded(self._ack(done), self.drain.remaining)
                if acked:
                    self.acked += len(done)
                else:
                    log.warning("ack of %d processed messages cut at the deadline", len(done))

    async def _bounded(
        self, aw: Awaitable[T], left: Callable[[float], float]
    ) -> tuple[bool, T | None]:
        """Await ``aw`` without limit while running; once stopping, for ``left(now)`` seconds
        at most, then cancel it. (False, None) if it was cut."""
        assert self._stopped is not None
        task = asyncio.ensure_future(aw)
        try:
            if self.drain.phase is Phase.RUNNING:
                either: set[asyncio.Future[Any]] = {task, self._stopped}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                limit = left(self._clock())
                if limit > 0:
                    await asyncio.wait({task}, timeout=limit)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        except BaseException:
            task.cancel()
            raise
        if task.cancelled():
            return False, None
        return True, task.result()  # re-raises what the awaitable raised


async def run_consumer(
    fetch: Callable[[], Awaitable[Sequence[M]]],
    process: Callable[[M], Awaitable[object]],
    ack: Callable[[Sequence[M]], Awaitable[object]],
    release: Callable[[], Awaitable[object]],
    drain: ConsumerDrain | None = None,
    *,
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    clock: Callable[[], float] = time.monotonic,
) -> ConsumerSummary:
    """Consume until SIGTERM/SIGINT, then drain (see ``ConsumerRunner``)."""
    runner = ConsumerRunner(fetch, process, ack, release, drain, signals=signals, clock=clock)
    return await runner.run()


# -- Redis Streams ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamMessage:
    id: str
    fields: Mapping[str, str]


# Delete the consumer only if nothing is pending in its name, in one step: DELCONSUMER drops
# the consumer's pending entries from the group, and nobody would ever get them again.
_RELEASE = """
local s = redis.call('XPENDING', KEYS[1], ARGV[1])
local n = 0
if s[4] then
  for _, c in ipairs(s[4]) do
    if c[1] == ARGV[2] then n = tonumber(c[2]) end
  end
end
if n == 0 then redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2]) end
return n
"""


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _messages(entries: Any) -> list[StreamMessage]:
    """Stream entries as redis-py returns them; deleted ones (no fields) are skipped (Redis 7
    has already removed them from the pending list)."""
    out: list[StreamMessage] = []
    for entry in entries or ():
        if entry is None or entry[0] is None or entry[1] is None:
            continue
        raw = entry[1]
        if not isinstance(raw, Mapping):
            raw = dict(zip(raw[::2], raw[1::2], strict=True))
        out.append(StreamMessage(_str(entry[0]), {_str(k): _str(v) for k, v in raw.items()}))
    return out


def _read_entries(reply: Any) -> Any:
    """The entries of a one-stream XREADGROUP reply, in any of redis-py's shapes."""
    if not reply:
        return []
    pairs = reply.items() if isinstance(reply, Mapping) else reply
    for _stream, entries in pairs:
        # RESP3 with legacy responses nests the entry list once more.
        if entries and isinstance(entries[0], list) and entries[0] and \
                isinstance(entries[0][0], tuple | list):
            entries = entries[0]
        return entries
    return []


class RedisStreamConsumer:
    """One consumer of a Redis Streams consumer group, in the shape ``ConsumerRunner`` wants.

    ``fetch`` first claims (XAUTOCLAIM) entries idle longer than ``min_idle_ms`` — left by a
    consumer that died or drained out of time — at startup and every ``claim_every`` seconds,
    then reads new ones (XREADGROUP ``>``, COUNT ``count``, BLOCK ``block_ms``: short, so the
    drain is noticed). ``ack`` is one XACK per batch. ``release`` deletes the consumer only if
    nothing is pending in its name. Every consumer of a group must use the same
    ``min_idle_ms``: it is the lease (``lease``) this consumer keeps its batches under.
    """

    def __init__(
        self,
        client: Redis,
        stream: str,
        group: str,
        name: str,
        *,
        count: int = 10,
        block_ms: int = 1000,
        min_idle_ms: int = 60_000,
        claim_every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if count < 1 or block_ms < 1 or min_idle_ms < 1 or claim_every <= 0:
            raise ValueError("count, block_ms, min_idle_ms and claim_every must be positive")
        self.client = client
        self.stream, self.group, self.name = stream, group, name
        self.count, self.block_ms = count, block_ms
        self.min_idle_ms, self.claim_every = min_idle_ms, claim_every
        self._clock = clock
        self._claim_due = -math.inf  # claim at the first fetch
        self._cursor = "0-0"
        self.claimed = 0

    @property
    def lease(self) -> float:
        """Seconds a fetched entry stays ours: after that another consumer's XAUTOCLAIM may
        take it."""
        return self.min_idle_ms / 1000

    def times(self, deadline: float = 25.0, margin: float = 1.0,
              item_budget: float = 0.0) -> ConsumerTimes:
        return ConsumerTimes(deadline, margin, item_budget, self.lease)

    async def ensure_group(self, start_id: str = "0") -> None:
        """Create the group (and the stream) unless it exists; ``0`` delivers the backlog."""
        from redis.exceptions import ResponseError

        try:
            await self.client.xgroup_create(self.stream, self.group, id=start_id, mkstream=True)
        except ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    async def fetch(self) -> list[StreamMessage]:
        now = self._clock()
        while now >= self._claim_due:
            reply = await self.client.xautoclaim(self.stream, self.group, self.name,
                                                 self.min_idle_ms, self._cursor,
                                                 count=self.count)
            self._cursor = _str(reply[0])
            if self._cursor == "0-0":  # the whole pending list was scanned
                self._claim_due = now + self.claim_every
            claimed = _messages(reply[1])
            if claimed:
                self.claimed += len(claimed)
                return claimed
        read = await self.client.xreadgroup(self.group, self.name, {self.stream: ">"},
                                            count=self.count, block=self.block_ms)
        return _messages(_read_entries(read))

    async def ack(self, messages: Sequence[StreamMessage]) -> int:
        if not messages:
            return 0
        return int(await self.client.xack(self.stream, self.group, *(m.id for m in messages)))

    async def release(self) -> int:
        """Delete this consumer from the group if nothing is pending in its name; the number
        left pending (others claim them after ``min_idle_ms``)."""
        return int(await self.client.eval(_RELEASE, 1, self.stream, self.group, self.name))

    async def run(self, process: Callable[[StreamMessage], Awaitable[object]],
                  drain: ConsumerDrain, **kw: Any) -> ConsumerSummary:
        """Consume with ``run_consumer``; ``drain`` should carry ``lease`` (see ``times``)."""
        if drain.times.lease is None or drain.times.lease > self.lease:
            raise ValueError("the drain's lease must be set and at most min_idle_ms")
        return await run_consumer(self.fetch, process, self.ack, self.release, drain, **kw)
