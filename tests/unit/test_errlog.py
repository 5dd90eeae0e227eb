"""The upstream-error limiter on a fake clock: one line per endpoint and cause per window, the
rest counted in the line that ends it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from lameduck.upstream.errlog import ErrorLog


class Loop:
    """A clock the test moves and the timers ``call_at`` would have armed."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def clock(self) -> float:
        return self.now

    def call_at(self, at: float, cb: Callable[[], None]) -> None:
        self.timers.append((at, cb))

    def advance(self, to: float) -> None:
        """Move to ``to``, running the timers due on the way, in order."""
        while True:
            due = sorted((t for t in self.timers if t[0] <= to), key=lambda t: t[0])
            if not due:
                break
            at, cb = due[0]
            self.timers.remove(due[0])
            self.now = at
            cb()
        self.now = to


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        assert record.levelno == logging.WARNING
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Lines:
    return Lines()


def make(loop: Loop, lines: Lines, every: float = 10.0,
         timers: bool = True) -> ErrorLog:
    logger = logging.getLogger(f"test.errlog.{id(lines)}")
    logger.propagate = False
    logger.addHandler(lines)
    return ErrorLog("app", loop.clock, loop.call_at if timers else None, every, logger)


def test_first_logged_rest_counted_in_one_line_at_the_window_end(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines)
    for i in range(200):
        loop.advance(100.0 + i * 0.01)
        el.failed("10.0.0.1:80", "connect failure")
    assert lines.lines == ["upstream connect failure: cluster app endpoint 10.0.0.1:80"]
    loop.advance(110.0)
    assert lines.lines[1:] == [
        "upstream connect failure: cluster app endpoint 10.0.0.1:80: 199 more in the last 10.0s"]


def test_a_quiet_window_lets_the_next_failure_through_at_once(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines)
    el.failed("10.0.0.1:80", "reset")
    loop.advance(130.0)  # the window ended with nothing counted: no line, no new window
    assert len(lines.lines) == 1 and not loop.timers
    el.failed("10.0.0.1:80", "reset")
    assert lines.lines == ["upstream reset: cluster app endpoint 10.0.0.1:80"] * 2


def test_steady_failures_make_one_line_per_window(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines)
    for i in range(600):  # ten a second for a minute
        loop.advance(100.0 + i * 0.1)
        el.failed("10.0.0.1:80", "timeout")
    loop.advance(200.0)
    assert len(lines.lines) == 1 + 6, lines.lines  # the first, then one per 10 s window
    counted = sum(int(ln.split(": ")[-1].split()[0]) for ln in lines.lines[1:])
    assert 1 + counted == 600


def test_each_endpoint_and_cause_has_its_own_window(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines)
    for _ in range(3):
        el.failed("10.0.0.1:80", "connect failure")
        el.failed("10.0.0.2:80", "connect failure")
        el.failed("10.0.0.1:80", "reset")
    assert lines.lines == ["upstream connect failure: cluster app endpoint 10.0.0.1:80",
                           "upstream connect failure: cluster app endpoint 10.0.0.2:80",
                           "upstream reset: cluster app endpoint 10.0.0.1:80"]
    loop.advance(110.0)
    assert sorted(lines.lines[3:]) == [
        "upstream connect failure: cluster app endpoint 10.0.0.1:80: 2 more in the last 10.0s",
        "upstream connect failure: cluster app endpoint 10.0.0.2:80: 2 more in the last 10.0s",
        "upstream reset: cluster app endpoint 10.0.0.1:80: 2 more in the last 10.0s"]


def test_without_timers_the_count_goes_with_the_next_line(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines, timers=False)
    el.failed("10.0.0.1:80", "reset")
    el.failed("10.0.0.1:80", "reset")
    loop.advance(112.5)
    el.failed("10.0.0.1:80", "reset")
    assert lines.lines == ["upstream reset: cluster app endpoint 10.0.0.1:80",
                           "upstream reset: cluster app endpoint 10.0.0.1:80 "
                           "(1 more since 12.5s ago)"]


def test_zero_interval_logs_every_failure(lines: Lines) -> None:
    loop = Loop()
    el = make(loop, lines, every=0.0)
    for _ in range(5):
        el.failed("10.0.0.1:80", "reset")
    assert len(lines.lines) == 5 and not loop.timers
