"""Latency histograms with Envoy's fixed default bucket bounds, cheap to record.

Recording is a search of a constant tuple and two adds (the bucket's count, the sum): no
allocation, no lock. Count, quantiles and the Prometheus buckets are derived only when someone
asks for /stats. Fixed bounds (rather than Envoy's log-linear circllhist) make the Prometheus
``_bucket`` series exact and let the snapshots of several processes be summed bucket by bucket;
quantiles are interpolated linearly inside a bucket, as Prometheus' ``histogram_quantile`` does.
"""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["BUCKETS", "QUANTILES", "Histogram", "HistogramValue", "quantile"]

# Envoy's default histogram bucket bounds, in the unit recorded (milliseconds here): the
# `histogram_bucket_settings` default of the bootstrap's stats_config.
BUCKETS: Final[tuple[float, ...]] = (
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
    30000.0, 60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
)
_LAST: Final = len(BUCKETS)  # the bucket above every bound
# The quantiles Envoy's /stats prints for every histogram (P0 ... P100), as fractions.
QUANTILES: Final[tuple[float, ...]] = (0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 1.0)


class HistogramValue(NamedTuple):
    """A histogram at snapshot time: per-bucket counts (the last one above every bound) and
    the sum of the recorded values."""

    counts: tuple[int, ...]
    sum: float

    @property
    def total(self) -> int:
        """How many values were recorded (not ``count``: a tuple's method of that name)."""
        return sum(self.counts)

    def quantiles(self) -> list[float]:
        """Envoy's printed quantiles (QUANTILES), interpolated within the buckets."""
        return [quantile(self.counts, q) for q in QUANTILES]

    def __add__(self, other: object) -> HistogramValue:  # type: ignore[override]
        """Bucket-wise sum: the same fixed bounds everywhere make processes' histograms add."""
        if not isinstance(other, HistogramValue):
            return NotImplemented
        return HistogramValue(tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
                              self.sum + other.sum)


class Histogram:
    """One latency distribution, recorded on the hot path with ``record(ms)``."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        # counts[i]: values <= BUCKETS[i] and above BUCKETS[i-1]; the last: above every bound
        self.counts: list[int] = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0

    def record(self, value: float) -> None:
        """Count one value (ms); a value equal to a bound falls in that bound's bucket, as a
        Prometheus ``le`` bucket holds it (``bisect_left``). Compiled, a walk up the bounds
        with native float compares: a request's latency is in the first few buckets, and a
        call of ``bisect_left`` by name cost 1,300 instructions a value."""
        i = 0
        n = _LAST
        while i < n and BUCKETS[i] < value:
            i += 1
        self.counts[i] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def value(self) -> HistogramValue:
        return HistogramValue(tuple(self.counts), self.sum)

    def __eq__(self, other: object) -> bool:
        """Equal contents: scopes (dataclasses) compare field by field."""
        if not isinstance(other, Histogram):
            return NotImplemented
        return self.counts == other.counts and self.sum == other.sum

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Histogram(count={self.count}, sum={self.sum:g})"


def quantile(counts: tuple[int, ...] | list[int], q: float) -> float:
    """The ``q`` quantile (0..1) of bucketed counts, interpolated linearly inside the bucket
    that holds it (the first bucket starts at 0; above the last bound, the last bound is all
    that is known). NaN when nothing was recorded, as Envoy prints an empty interval."""
    total = sum(counts)
    if total == 0:
        return float("nan")
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n == 0 or seen + n < rank:
            seen += n
            continue
        lower = BUCKETS[i - 1] if i > 0 else 0.0
        if i == len(BUCKETS):
            return lower
        return lower + (BUCKETS[i] - lower) * (rank - seen) / n
    return BUCKETS[-1]  # pragma: no cover - rank <= total always finds a bucket
