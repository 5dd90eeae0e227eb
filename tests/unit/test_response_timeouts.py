"""The two upstream timeouts of one request, decided with no socket: the route timeout (the
response whole by then) and the per-try idle timeout (no upstream byte for that long), both
counted from the request's end; exact times, as the codecs' one timer would fire."""

from __future__ import annotations

from typing import Any

from lameduck.upstream.connector import ExchangeSink, ResponseTimeouts, UpstreamError


class Sink(ExchangeSink):
    """What the exchange was told."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[Any, ...]] = []

    def on_upstream_error(self, status: int, after_head: bool, idle: bool = False) -> None:
        self.told.append(("error", status, after_head))

    def on_upstream_idle(self, after_head: bool) -> None:
        self.told.append(("idle", after_head))


def fire(rt: ResponseTimeouts, now: float, head_seen: bool = False) -> tuple[float, list[Any]]:
    sink, cuts = Sink(), []
    nxt = rt.expire(now, sink, head_seen, lambda: cuts.append(now))
    return nxt, sink.told + [("cut", c) for c in cuts]


def test_none_set_no_timer() -> None:
    assert ResponseTimeouts().start(10.0, 0.0, 0.0) == 0.0


def test_route_timeout_alone_fires_at_its_deadline() -> None:
    rt = ResponseTimeouts()
    assert rt.start(10.0, 5.0, 0.0) == 15.0
    rt.touch(12.0)  # bytes do not move a route timeout
    assert fire(rt, 14.999) == (15.0, [])
    assert fire(rt, 15.0, head_seen=True) == (
        0.0, [("error", UpstreamError.TIMEOUT, True), ("cut", 15.0)])


def test_idle_timeout_starts_again_at_each_byte() -> None:
    rt = ResponseTimeouts()
    assert rt.start(10.0, 0.0, 2.0) == 12.0
    rt.touch(11.5)
    assert fire(rt, 12.0) == (13.5, [])  # not idle yet: check again 2 s after that byte
    assert fire(rt, 13.5) == (0.0, [("idle", False), ("cut", 13.5)])


def test_both_the_earlier_wins_and_the_deadline_caps_the_idle_checks() -> None:
    rt = ResponseTimeouts()
    assert rt.start(10.0, 3.0, 2.0) == 12.0  # idle first
    rt.touch(11.8)
    assert fire(rt, 12.0) == (13.0, [])  # the next idle check (13.8) is past the deadline
    rt.touch(12.9)
    assert fire(rt, 13.0) == (0.0, [("error", UpstreamError.TIMEOUT, False), ("cut", 13.0)])


def test_idle_shorter_than_the_rest_of_the_route_timeout_fires_first() -> None:
    rt = ResponseTimeouts()
    assert rt.start(0.0, 10.0, 1.0) == 1.0
    rt.touch(0.5)
    assert fire(rt, 1.0) == (1.5, [])
    assert fire(rt, 1.5, head_seen=True) == (0.0, [("idle", True), ("cut", 1.5)])
