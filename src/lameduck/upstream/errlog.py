"""Upstream errors in the process log, rate-limited per endpoint and cause.

A dead origin fails every request sent to it: one WARNING per failure would bury every other
line (and cost a write per request). So the first failure of an (endpoint, cause) is logged at
once, the next ones within ``interval`` are only counted, and when the window ends a single
line says how many more there were; a window with none lets the next failure be logged at once
again. The clock and the timer are the cluster's (``loop.time``, ``loop.call_at``), so a test
drives it on a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("lameduck.upstream")

DEFAULT_INTERVAL = 10.0
"""Seconds between two lines about the same endpoint and cause; ``--upstream-error-log-every``
sets it for the process (``set_interval``)."""

_interval = DEFAULT_INTERVAL


def set_interval(seconds: float) -> None:
    """The process-wide window (the command line's); 0 logs every failure."""
    global _interval
    _interval = seconds


def interval() -> float:
    return _interval


class _Window:
    __slots__ = ("more", "since")

    def __init__(self, since: float) -> None:
        self.since = since  # when the last line about it was written
        self.more = 0  # failures counted since, not logged


class ErrorLog:
    """One cluster's upstream-error lines: at most one per (endpoint, cause) per ``every``
    seconds, the rest counted in the next line ("N more since")."""

    __slots__ = ("clock", "cluster", "every", "logger", "schedule", "windows")

    def __init__(self, cluster: str, clock: Callable[[], float],
                 schedule: Callable[[float, Callable[[], None]], Any] | None,
                 every: float | None = None, logger: logging.Logger = log) -> None:
        self.cluster = cluster
        self.clock = clock
        self.schedule = schedule  # None (no loop): the count waits for the next failure
        self.every = interval() if every is None else every
        self.logger = logger
        self.windows: dict[tuple[str, str], _Window] = {}

    def failed(self, endpoint: str, cause: str) -> None:
        """An upstream failure: logged now, or counted for the line that ends its window."""
        key = (endpoint, cause)
        w = self.windows.get(key)
        now = self.clock()
        if w is not None and now < w.since + self.every:
            w.more += 1
            return
        if w is not None and w.more:  # no timer ran (no loop): the count goes with this one
            self._write(endpoint, cause, f" ({w.more} more since {now - w.since:.1f}s ago)")
        else:
            self._write(endpoint, cause, "")
        if self.every <= 0:
            return
        self.windows[key] = _Window(now)
        if self.schedule is not None:
            self.schedule(now + self.every, lambda: self._window_end(key))

    def _window_end(self, key: tuple[str, str]) -> None:
        """The window ended: the failures it counted in one line, and a new window after it;
        none counted: the entry goes, and the next failure is logged at once."""
        w = self.windows.get(key)
        if w is None:
            return
        if not w.more:
            del self.windows[key]
            return
        endpoint, cause = key
        now = self.clock()
        self._write(endpoint, cause, f": {w.more} more in the last {now - w.since:.1f}s")
        self.windows[key] = _Window(now)
        if self.schedule is not None:
            self.schedule(now + self.every, lambda: self._window_end(key))

    def _write(self, endpoint: str, cause: str, tail: str) -> None:
        self.logger.warning("upstream %s: cluster %s endpoint %s%s", cause, self.cluster,
                            endpoint, tail)
