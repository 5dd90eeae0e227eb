"""lameduck.stats.histogram: Envoy's fixed bucket bounds, edges, and quantile interpolation."""

from __future__ import annotations

import bisect
import math

import pytest

from lameduck.stats import BUCKETS, QUANTILES, Histogram, HistogramValue, quantile


def test_envoy_default_bounds() -> None:
    assert BUCKETS == (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                       60000, 300000, 600000, 1800000, 3600000)
    assert QUANTILES == (0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1)


@pytest.mark.parametrize(("value", "index"), [
    (0.0, 0), (0.5, 0), (0.50001, 1), (1.0, 1), (120.0, 7), (250.0, 7), (250.1, 8),
    (3600000.0, 18), (3600000.5, 19), (1e12, 19),
])
def test_a_bound_belongs_to_its_le_bucket(value: float, index: int) -> None:
    h = Histogram()
    h.record(value)
    assert h.counts.index(1) == index
    assert h.count == 1 and h.sum == value


def test_count_sum_and_snapshot_is_a_copy() -> None:
    h = Histogram()
    for ms in (1.0, 2.0, 3.0):
        h.record(ms)
    v = h.value()
    h.record(4.0)
    assert (v.total, v.sum) == (3, 6.0)
    assert (h.count, h.sum) == (4, 10.0)
    assert len(v.counts) == len(BUCKETS) + 1


def test_quantiles_interpolate_inside_the_bucket() -> None:
    h = Histogram()
    for _ in range(4):
        h.record(120.0)  # all in (100, 250]
    q = h.value().quantiles()
    assert q[0] == 100.0  # P0: the bucket's lower edge
    assert q[2] == pytest.approx(175.0)  # P50: half way through the bucket
    assert q[1] == pytest.approx(137.5)
    assert q[-1] == 250.0  # P100: its upper edge
    assert all(100.0 <= x <= 250.0 for x in q)
    assert q == sorted(q)


def test_quantile_across_buckets_and_edges() -> None:
    counts = [0] * (len(BUCKETS) + 1)
    counts[0] = 1  # (0, 0.5]
    counts[2] = 3  # (1, 5]
    assert quantile(counts, 0.0) == 0.0
    assert quantile(counts, 0.25) == 0.5  # the first value's bucket, at its top
    assert quantile(counts, 0.5) == pytest.approx(1 + 4 * (2 - 1) / 3)
    assert quantile(counts, 1.0) == 5.0
    over = [0] * (len(BUCKETS) + 1)
    over[-1] = 2  # above every bound: the last bound is all that is known
    assert quantile(over, 0.5) == BUCKETS[-1]
    assert math.isnan(quantile([0] * (len(BUCKETS) + 1), 0.5))


def test_values_add_bucket_by_bucket() -> None:
    a, b = Histogram(), Histogram()
    a.record(3.0)
    b.record(300.0)
    total = a.value() + b.value()
    assert isinstance(total, HistogramValue)
    assert (total.total, total.sum) == (2, 303.0)
    assert a == a and a != b


def test_record_puts_every_value_where_bisect_left_does() -> None:
    """The walk up the bounds is bisect_left's answer for every value, bounds and NaN-free
    extremes included."""
    values = [0.0, -1.0, 1e12, *BUCKETS, *(b - 1e-9 for b in BUCKETS),
              *(b + 1e-9 for b in BUCKETS), *(i * 0.37 for i in range(4000))]
    for v in values:
        h = Histogram()
        h.record(v)
        assert h.counts.index(1) == bisect.bisect_left(BUCKETS, v), v
