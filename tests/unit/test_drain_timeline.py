"""The drain timeline recorder on a fake clock: the sampling grid, the bound, the deltas."""

from __future__ import annotations

import json

import pytest

from lameduck.drain.timeline import (
    COLUMNS,
    Reading,
    Timeline,
    build_report,
    file_name,
    iso_utc,
    proactive_window,
)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def advance(self, dt: float) -> float:
        self.now += dt
        return self.now


def test_next_at_follows_the_grid_from_the_start() -> None:
    tl = Timeline(1000.0, Reading())
    assert tl.next_at(1000.0) == pytest.approx(1000.1)
    assert tl.next_at(1000.05) == pytest.approx(1000.1)
    # a late timer does not drift the grid
    assert tl.next_at(1000.137) == pytest.approx(1000.2)
    # nor does an early one sample its moment twice (uvloop's timers keep milliseconds: one
    # set for 1000.1 may run at 1000.0996, and was set again for 1000.1)
    assert tl.next_at(1000.0996) == pytest.approx(1000.2)
    assert tl.next_at(1000.094) == pytest.approx(1000.1)


def test_gauges_as_read_counters_as_deltas() -> None:
    clock = FakeClock()
    base = Reading(drained_by_response=7, refused=1)  # counted before this drain
    tl = Timeline(clock.now, base)
    tl.sample(clock.advance(0.1), Reading(3, 5, 1, drained_by_response=9, refused=1))
    tl.sample(clock.advance(0.1), Reading(2, 4, 0, drained_by_response=9, proactive=2,
                                          refused=4))
    tl.finish(clock.advance(0.05), Reading(0, 0, 0, drained_by_response=9, proactive=2,
                                           at_end=3, refused=4, cut=1))
    assert tl.rows == [
        [0.1, 3, 5, 1, 2, 0, 0, 0, 0],
        [0.2, 2, 4, 0, 0, 2, 0, 3, 0],
        [0.25, 0, 0, 0, 0, 0, 3, 0, 1],
    ]
    assert len(tl.rows[0]) == len(COLUMNS)
    assert tl.totals() == {"drained_by_response": 2, "proactive": 2, "at_end": 3,
                           "refused": 3, "cut": 1}
    assert tl.ended == pytest.approx(1000.25)


def test_bounded_skips_then_the_final_sample_keeps_the_sums() -> None:
    clock = FakeClock()
    tl = Timeline(clock.now, Reading(), max_samples=10)
    for i in range(1, 51):
        tl.sample(clock.advance(0.1), Reading(requests=1, proactive=i))
    assert len(tl.rows) == 10
    assert tl.skipped == 40
    tl.finish(clock.advance(0.1), Reading(at_end=2, proactive=50))
    assert len(tl.rows) == 11  # the end is always kept
    assert tl.rows[-1][0] == pytest.approx(5.1)
    # the skipped samples' closes land in the final row: nothing is lost from the totals
    assert tl.totals()["proactive"] == 50
    assert tl.totals()["at_end"] == 2


def test_nothing_after_the_end() -> None:
    clock = FakeClock()
    tl = Timeline(clock.now, Reading())
    tl.finish(clock.advance(0.3), Reading(cut=1))
    tl.sample(clock.advance(0.1), Reading(cut=5))
    tl.finish(clock.advance(0.1), Reading(cut=9))
    assert tl.rows == [[0.3, 0, 0, 0, 0, 0, 0, 0, 1]]


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Timeline(0.0, Reading(), period=0)
    with pytest.raises(ValueError):
        Timeline(0.0, Reading(), max_samples=0)


def test_proactive_window_and_its_empty_case() -> None:
    assert proactive_window(3.0, 0.2) == [2.0, 2.8]
    assert proactive_window(3.0, 1.0) is None  # G >= T/3: no window
    assert proactive_window(0.0, 0.0) is None


def test_names_and_timestamps() -> None:
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert file_name(1.5, 42) == "drain-19700101T000001.500Z-42.json"


def test_report_is_json_with_settings_and_samples() -> None:
    clock = FakeClock()
    tl = Timeline(clock.now, Reading())
    tl.sample(clock.advance(0.1), Reading(1, 1, 0))
    tl.finish(clock.advance(0.1), Reading(at_end=1))
    rep = build_report(tl, started_wall=1.5, pid=42, cause="shutdown", strategy="gradual",
                       time=3.0, grace=0.2, deadline=5.0, min_drain=0.0,
                       counts={"completed": 1}, shutdown=True)
    again = json.loads(json.dumps(rep, allow_nan=False))
    assert again["started"] == "1970-01-01T00:00:01.500Z"
    assert again["duration"] == pytest.approx(0.2)
    assert again["config"] == {"time": 3.0, "connection_grace": 0.2, "strategy": "gradual",
                               "deadline": 5.0, "min_drain": 0.0,
                               "proactive_window": [2.0, 2.8], "idle_close": "immediate"}
    assert again["timeline"]["columns"] == list(COLUMNS)
    assert len(again["timeline"]["samples"]) == 2


def test_an_end_in_the_same_millisecond_as_a_sample_is_one_row() -> None:
    """The final sample falls on the last periodic one: merged, so times strictly increase and
    the deltas still add up."""
    tl = Timeline(1000.0, Reading())
    tl.sample(1000.1, Reading(requests=2, proactive=1))
    tl.finish(1000.1, Reading(requests=0, proactive=1, at_end=1))
    assert tl.rows == [[0.1, 0, 0, 0, 0, 1, 1, 0, 0]]
    assert tl.totals() == {"drained_by_response": 0, "proactive": 1, "at_end": 1,
                           "refused": 0, "cut": 0}
