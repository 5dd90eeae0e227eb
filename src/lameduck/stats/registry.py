"""The stats registry: knows where the scopes live and turns them into a snapshot on demand.

Nothing here runs per request. A snapshot is a plain sorted list of `Stat` values, so the snapshots
of several worker processes can be summed by name (`merge`) before rendering. A histogram's
`Stat` has its count as ``value`` and its buckets and sum in ``hist``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from typing import Final, Literal, NamedTuple, TypeVar

from lameduck.stats.histogram import Histogram, HistogramValue
from lameduck.stats.scopes import stat_fields

__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "Stat", "StatKind", "StatsRegistry", "merge", "of_type",
           "used_only"]

StatKind = Literal["counter", "gauge", "histogram"]
COUNTER: Final = "counter"
GAUGE: Final = "gauge"
HISTOGRAM: Final = "histogram"

S = TypeVar("S")


class Stat(NamedTuple):
    """One stat's value at snapshot time; `name` is the full dotted Envoy-style name."""

    name: str
    value: int  # a histogram's: how many values it holds
    kind: StatKind
    hist: HistogramValue | None = None  # a histogram's buckets and sum


class StatsRegistry:
    """Scopes registered under a dotted prefix, plus computed gauges, read only when rendering."""

    def __init__(self) -> None:
        # prefix -> (scope object, ((full name, attribute, kind), ...))
        self._scopes: dict[str, tuple[object, tuple[tuple[str, str, StatKind], ...]]] = {}
        self._gauge_fns: dict[str, Callable[[], int]] = {}
        self._counter_fns: dict[str, Callable[[], int]] = {}
        self._names: set[str] = set()
        # Counters of the processes before this one (hot restart): added when rendering, so
        # counters do not reset across a restart.
        self.carried: dict[str, int] = {}
        # What /reset_counters took away, per counter: subtracted when rendering, so a counter
        # kept elsewhere (the drain ledger's) or carried from a parent reads 0 after a reset.
        self.zeroed: dict[str, int] = {}
        # Names seen non-zero by any snapshot: Envoy's "used" flag, which a reset keeps.
        self.used: set[str] = set()

    def add(self, prefix: str, scope: S) -> S:
        """Register a scope (e.g. an HttpStats under "http.ingress"); returns it for chaining."""
        if not prefix or prefix.startswith(".") or prefix.endswith("."):
            raise ValueError(f"invalid stats prefix {prefix!r}")
        if prefix in self._scopes:
            raise ValueError(f"stats prefix {prefix!r} is already registered")
        if not is_dataclass(scope) or isinstance(scope, type):
            raise TypeError(f"a stats scope must be a dataclass instance, got {scope!r}")
        attrs = stat_fields(scope)
        gauges: frozenset[str] = getattr(scope, "GAUGES", frozenset())
        histograms: frozenset[str] = getattr(scope, "HISTOGRAMS", frozenset())
        known = {f.name for f in fields(scope)}  # (published or not: see ``stat_fields``)
        for what, names in (("GAUGES", gauges), ("HISTOGRAMS", histograms)):
            if not names <= known:
                raise ValueError(
                    f"{type(scope).__name__}.{what} names unknown fields: {names - known}"
                )
        entries: tuple[tuple[str, str, StatKind], ...] = tuple(
            (f"{prefix}.{attr}", attr,
             GAUGE if attr in gauges else HISTOGRAM if attr in histograms else COUNTER)
            for attr in attrs
        )
        self._claim([name for name, _, _ in entries])
        self._scopes[prefix] = (scope, entries)
        return scope

    def remove(self, prefix: str) -> None:
        """Forget a scope (a listener or cluster gone for good); unknown prefixes are ignored."""
        found = self._scopes.pop(prefix, None)
        if found is not None:
            self._names.difference_update(name for name, _, _ in found[1])

    def add_gauge_fn(self, name: str, fn: Callable[[], int]) -> None:
        """Register a gauge computed at snapshot time (uptime, pool sizes, ...)."""
        self._claim([name])
        self._gauge_fns[name] = fn

    def add_counter_fn(self, name: str, fn: Callable[[], int]) -> None:
        """Register a counter kept outside any scope (a count the main process keeps of its
        workers): carried across a hot restart and zeroed by /reset_counters as any other."""
        self._claim([name])
        self._counter_fns[name] = fn

    def remove_gauge_fn(self, name: str) -> None:
        """Forget a computed gauge; unknown names are ignored."""
        if self._gauge_fns.pop(name, None) is not None:
            self._names.discard(name)

    def snapshot(self) -> list[Stat]:
        """Every stat's current value, sorted by name."""
        carried = self.carried
        out: list[Stat] = []
        for scope, entries in self._scopes.values():
            for name, attr, kind in entries:
                value = getattr(scope, attr)
                if kind == HISTOGRAM:
                    assert isinstance(value, Histogram)
                    out.append(Stat(name, value.count, kind, value.value()))
                else:
                    out.append(Stat(name, value + (carried.get(name, 0) if kind == COUNTER
                                                   else 0), kind))
        out.extend(Stat(name, int(fn()), GAUGE) for name, fn in self._gauge_fns.items())
        out.extend(Stat(name, int(fn()) + carried.get(name, 0), COUNTER)
                   for name, fn in self._counter_fns.items())
        if self.zeroed:
            out = [_less(stat, self.zeroed) for stat in out]
        out.sort()
        self.used.update(stat.name for stat in out if stat.value)
        return out

    def reset_counters(self) -> None:
        """Envoy's /reset_counters: every counter reads 0 from now on, gauges untouched. The
        scopes are not written (the hot path and the drain ledger own them): the values at
        reset are remembered and subtracted."""
        self.zeroed = {}
        self.zeroed = {s.name: s.value for s in self.snapshot() if s.kind == COUNTER}

    def counters(self) -> dict[str, int]:
        """Every counter's value (carried ones included): what a successor carries on.

        Not the histograms: like Envoy's hot restart, which merges the parent's counters and
        gauges into the child but not its histograms, a successor's distributions start
        empty."""
        return {s.name: s.value for s in self.snapshot() if s.kind == COUNTER}

    def _claim(self, names: list[str]) -> None:
        taken = self._names.intersection(names)
        if taken:
            raise ValueError(f"stat names already registered: {', '.join(sorted(taken))}")
        self._names.update(names)


def _less(stat: Stat, zeroed: dict[str, int]) -> Stat:
    if stat.kind != COUNTER or stat.name not in zeroed:
        return stat
    # never below 0: a parent's carried counters can be replaced by smaller ones
    return Stat(stat.name, max(0, stat.value - zeroed[stat.name]), COUNTER)


def used_only(stats: Iterable[Stat], used: set[str]) -> list[Stat]:
    """Envoy's ``usedonly``: the stats non-zero now or seen non-zero by an earlier snapshot
    (``StatsRegistry.used``), so a reset counter or a gauge back at 0 still shows."""
    return [stat for stat in stats if stat.value or stat.name in used]


def of_type(stats: Iterable[Stat], kind: StatKind | None) -> list[Stat]:
    """Envoy's ``type=Counters|Gauges``: the stats of one kind (None: all)."""
    return [stat for stat in stats if kind is None or stat.kind == kind]


def merge(snapshots: Iterable[Iterable[Stat]]) -> list[Stat]:
    """Sum several processes' snapshots by name (counters and gauges alike, histograms bucket
    by bucket), sorted by name.

    Summing suits per-worker data-plane stats; process-wide gauges such as server.state belong
    to the main process only and should not be reported by workers.
    """
    totals: dict[str, Stat] = {}
    for snapshot in snapshots:
        for stat in snapshot:
            seen = totals.get(stat.name)
            if seen is None:
                totals[stat.name] = stat
            elif seen.kind != stat.kind:
                raise ValueError(
                    f"stat {stat.name!r} is a {seen.kind} in one snapshot, a {stat.kind} in another"
                )
            elif seen.hist is not None and stat.hist is not None:
                totals[stat.name] = Stat(stat.name, seen.value + stat.value, stat.kind,
                                         seen.hist + stat.hist)
            else:
                totals[stat.name] = Stat(stat.name, seen.value + stat.value, stat.kind)
    return sorted(totals.values())
