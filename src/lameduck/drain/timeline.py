"""A drain's timeline, sampled while it runs, and the report kept at its end.

Pure: the shell reads its gauges and counters on a 100 ms timer and hands them in with the
loop's clock; nothing here reads a clock or a socket. In-flight values are kept as they are;
closes, refused and cut are kept as deltas since the previous sample, so a bar per sample is
what happened in that 100 ms and the deltas of a whole timeline add up to the drain's totals.

Bounded: at most ``max_samples`` periodic samples (6,000 = ten minutes at 100 ms, longer than
any sensible deadline); after that periodic samples are skipped (and counted), and the final
sample taken at the drain's end is always kept, so the deltas still add up.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

PERIOD = 0.1  # seconds between samples
MAX_SAMPLES = 6000
# A loop timer may fire this much before its moment (uvloop keeps its clock in milliseconds, so
# one set for 100.0 ms may run at 99.6): a sample that close to a grid moment is that moment's.
EARLY = 0.005
KEEP_REPORTS = 5  # finished reports a process keeps for GET /drain_report

# The columns of a sample row, in order (the JSON carries them once, as ``columns``).
GAUGES = ("requests", "connections", "upgrades")
COUNTERS = ("drained_by_response", "proactive", "at_end", "refused", "cut")
COLUMNS = ("t", *GAUGES, *COUNTERS)


@dataclass(frozen=True, slots=True)
class Reading:
    """One look at the process: gauges (in flight now) and counters (totals so far)."""

    requests: int = 0
    connections: int = 0
    upgrades: int = 0  # WebSocket upgrades and CONNECT tunnels, relayed TCP connections
    drained_by_response: int = 0
    proactive: int = 0
    at_end: int = 0
    refused: int = 0
    cut: int = 0

    def counters(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTERS)

    def gauges(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in GAUGES)


class Timeline:
    """Samples of one drain: ``[t, requests, connections, upgrades, Δby_response,
    Δproactive, Δat_end, Δrefused, Δcut]`` per row, ``t`` in seconds since the drain began."""

    def __init__(self, start: float, base: Reading, period: float = PERIOD,
                 max_samples: int = MAX_SAMPLES) -> None:
        if period <= 0 or max_samples < 1:
            raise ValueError("period must be > 0 and max_samples >= 1")
        self.start = start
        self.period = period
        self.max_samples = max_samples
        self.base = base
        self._last = base.counters()
        self.rows: list[list[float | int]] = []
        self.skipped = 0  # periodic samples not kept once max_samples were
        self.ended: float | None = None

    def next_at(self, now: float) -> float:
        """The next sampling moment on the grid start + k·period, strictly after ``now`` and
        after a moment ``now`` is at most EARLY before (a timer that fired early: without
        this it was set again for the same moment, and that moment sampled twice)."""
        k = int((now - self.start + EARLY) / self.period) + 1
        return self.start + k * self.period

    def sample(self, now: float, reading: Reading) -> None:
        """A periodic sample; past the bound it is counted as skipped (its deltas are carried
        into the next kept sample)."""
        if self.ended is not None:
            return
        if len(self.rows) >= self.max_samples:
            self.skipped += 1
            return
        self._append(now, reading)

    def finish(self, now: float, reading: Reading) -> None:
        """The drain ended: one last sample, always kept (closes at the end land here)."""
        if self.ended is not None:
            return
        self._append(now, reading)
        self.ended = now

    def _append(self, now: float, reading: Reading) -> None:
        counters = reading.counters()
        deltas = [c - p for c, p in zip(counters, self._last, strict=True)]
        self._last = counters
        t = round(now - self.start, 3)
        rows = self.rows
        if rows and rows[-1][0] >= t:
            # the end in the same millisecond as the last sample: one row, times stay strictly
            # increasing (the gauges as read now, the deltas added)
            last = rows[-1]
            n = 1 + len(GAUGES)
            rows[-1] = [last[0], *reading.gauges(),
                        *(int(a) + b for a, b in zip(last[n:], deltas, strict=True))]
            return
        rows.append([t, *reading.gauges(), *deltas])

    def totals(self) -> dict[str, int]:
        """Each counter's sum over the samples: what the drain added."""
        sums = dict.fromkeys(COUNTERS, 0)
        for row in self.rows:
            for i, name in enumerate(COUNTERS):
                sums[name] += int(row[1 + len(GAUGES) + i])
        return sums


def iso_utc(wall: float) -> str:
    """Wall-clock seconds as ISO-8601 UTC with milliseconds (what an incident log quotes)."""
    dt = datetime.datetime.fromtimestamp(wall, datetime.UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def file_name(wall: float, pid: int) -> str:
    """``drain-20261201T190152.123Z-4242.json``: sorts by start; the pid tells two processes'
    drains apart (a hot restart's parent and child share a report_dir)."""
    stamp = iso_utc(wall).replace("-", "").replace(":", "")
    return f"drain-{stamp}-{pid}.json"


def proactive_window(time: float, grace: float) -> list[float] | None:
    """[2T/3, T - G) in seconds since the start; None when empty (docs/drain.md)."""
    lo, hi = 2.0 * time / 3.0, time - grace
    return [round(lo, 3), round(hi, 3)] if hi > lo else None


def build_report(tl: Timeline, *, started_wall: float, pid: int, cause: str, strategy: str,
                 time: float, grace: float, deadline: float | None, min_drain: float | None,
                 counts: dict[str, int], shutdown: bool,
                 idle_close: str = "immediate") -> dict[str, Any]:
    """The JSON kept, served and written at a drain's end: what happened (``counts``, the
    log line's), when, under which settings, and the timeline to draw it from."""
    ended = tl.ended if tl.ended is not None else tl.start
    return {
        "version": 1,
        "pid": pid,
        "cause": cause,
        "shutdown": shutdown,
        "started": iso_utc(started_wall),
        "started_unix": round(started_wall, 3),
        "duration": round(ended - tl.start, 3),
        "config": {
            "time": time,
            "connection_grace": grace,
            "strategy": strategy,
            "deadline": deadline,
            "min_drain": min_drain,
            "proactive_window": proactive_window(time, grace),
            "idle_close": idle_close,
        },
        "counts": counts,
        "timeline": {
            "period": tl.period,
            "max_samples": tl.max_samples,
            "skipped": tl.skipped,
            "columns": list(COLUMNS),
            "samples": tl.rows,
        },
    }
