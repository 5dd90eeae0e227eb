"""The discrete-event engine: a heap of timed events on a virtual clock, and a queue of batched
connection events (many connects or closes pushed at once as sorted arrays).

Virtual time only: nothing here reads a clock or sleeps. Events at the same moment run in the
order they were scheduled, so a run is a function of the scenario and its random generator.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


class Engine:
    """``at(t, fn, *args)`` schedules; ``run(until)`` calls them in time order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0  # events run so far
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def run(self, until: float, step: Callable[[float], None] | None = None,
            every: int = 4096) -> None:
        """Run every event due by ``until``; ``step(now)`` is called every ``every`` events
        (a progress bar)."""
        heap = self._heap
        n = 0
        while heap and heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)
            n += 1
            if step is not None and n % every == 0:
                step(t)
        self.events += n
        self.now = max(self.now, until)


class Batches:
    """Items due at given times, pushed as arrays and taken by time.

    A calendar queue: items go to buckets ``width`` seconds wide; taking everything due by
    ``t`` empties the buckets before ``t``'s and filters that one, so a step touches only what
    is due in it however many batches are pending.
    """

    def __init__(self, width: float = 0.1) -> None:
        self.width = width
        self._buckets: dict[int, list[Any]] = {}  # bucket -> [min time, [(times, cols)...]]
        self._heap: list[int] = []
        self.items = 0  # items taken so far

    def push(self, times: npt.NDArray[np.float64], *cols: Array) -> None:
        if times.size == 0:
            return
        b = np.floor(times / self.width).astype(np.int64)
        if b.size == 1 or b.min() == b.max():
            self._add(int(b[0]), times, list(cols))
            return
        order = np.argsort(b, kind="stable")
        b, times = b[order], times[order]
        cols = tuple(c[order] for c in cols)
        cuts = np.flatnonzero(b[1:] != b[:-1]) + 1
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [b.size]])
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            self._add(int(b[lo]), times[lo:hi], [c[lo:hi] for c in cols])

    def _add(self, bucket: int, times: npt.NDArray[np.float64], cols: list[Array]) -> None:
        entry = self._buckets.get(bucket)
        low = float(times.min())
        if entry is None:
            self._buckets[bucket] = [low, [(times, cols)]]
            heapq.heappush(self._heap, bucket)
        else:
            entry[0] = min(entry[0], low)
            entry[1].append((times, cols))

    def head(self) -> float:
        return self._buckets[self._heap[0]][0] if self._heap else float("inf")

    def take(self, t: float) -> tuple[npt.NDArray[np.float64], list[Array]] | None:
        """Everything due by ``t`` (in no particular order); None when nothing is."""
        parts: list[tuple[Array, list[Array]]] = []
        last = math.floor(t / self.width)
        while self._heap and self._heap[0] <= last and self._buckets[self._heap[0]][0] <= t:
            bucket = heapq.heappop(self._heap)
            _, chunks = self._buckets.pop(bucket)
            if bucket < last:
                parts.extend(chunks)
                continue
            times = np.concatenate([c[0] for c in chunks])
            cols = [np.concatenate([c[1][i] for c in chunks]) for i in range(len(chunks[0][1]))]
            due = times <= t
            parts.append((times[due], [c[due] for c in cols]))
            if not due.all():
                rest = ~due
                self._add(bucket, times[rest], [c[rest] for c in cols])
            break
        if not parts:
            return None
        if len(parts) == 1:
            times, cols = parts[0]
        else:
            times = np.concatenate([p[0] for p in parts])
            cols = [np.concatenate([p[1][i] for p in parts]) for i in range(len(parts[0][1]))]
        self.items += times.size
        return times, cols
