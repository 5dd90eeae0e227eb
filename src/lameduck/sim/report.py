"""A run's numbers: the summary (JSON) and the timelines (CSV), for one scenario or several
compared."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from typing import IO, Any

import numpy as np

from lameduck.sim.fleet import BIN, CAUSES, Result
from lameduck.sim.walk import How

CLOSE_KINDS = [h for h in How if h is not How.OPEN]


def _window(res: Result) -> tuple[int, int]:
    """The bins from the first drain to the last exit (or the end): where the means are taken."""
    sc = res.scenario
    start = sc.rollout.at if sc.rollout is not None else sc.drain.at if sc.drain else 0.0
    ends = [d["exit"] for d in res.drains if d["exit"] is not None]
    end = max(ends) if ends and len(ends) == len(res.drains) else sc.duration
    return int(start / BIN), max(math.ceil(end / BIN), int(start / BIN) + 1)


def summary(res: Result) -> dict[str, Any]:
    sc = res.scenario
    failures = {c: round(float(res.failures[c].sum())) for c in CAUSES}
    lo, hi = _window(res)
    rc = res.reconnects
    peak_bin = int(rc.argmax()) if rc.size else 0
    load = res.load
    peak: dict[str, Any] = {"value": None, "pod": None, "at": None}
    if load.size and np.isfinite(load).any():
        flat = int(np.nanargmax(load))
        i, k = divmod(flat, load.shape[1])
        peak = {"value": round(float(load[i, k]), 6), "pod": k,
                "at": round(float(res.sample_t[i]), 3)}
    durations = [d["drain_seconds"] for d in res.drains if d["drain_seconds"] is not None]
    cfg = sc.config
    return {
        "scenario": sc.name,
        "seed": sc.seed,
        "virtual_seconds": sc.duration,
        "wall_seconds": round(res.wall, 3),
        "events": res.events,
        "events_per_second": round(res.events / res.wall) if res.wall > 0 else None,
        "settings": {
            "drain.time": cfg.drain.time, "drain.strategy": cfg.drain.strategy.value,
            "drain.connection_grace": cfg.drain.connection_grace,
            "shutdown.deadline": cfg.shutdown.deadline,
            "shutdown.min_drain": cfg.shutdown.min_drain,
            "shutdown.stop_accepting": cfg.shutdown.stop_accepting.value,
            "terminationGracePeriodSeconds": sc.pod.grace_period,
            "preStop": sc.pod.prestop.source, "replicas": sc.replicas,
            "clients": sum(c.count for c in sc.clients), "lb": sc.lb.kind.value,
        },
        "requests": round(res.requests),
        "failed": sum(failures.values()),
        "failures": failures,
        "retried": res.retried,
        "lb_retries": res.lb_retries,
        "reconnects_per_100ms": {
            "peak": int(rc.max()) if rc.size else 0,
            "peak_at": round(peak_bin * BIN, 1),
            "mean": round(float(rc[lo:hi].mean()), 3) if hi > lo else 0.0,
            "window": [round(lo * BIN, 1), round(hi * BIN, 1)],
            "total": int(rc.sum()),
        },
        "closes": {h.name.lower(): int(res.closes[h].sum()) for h in CLOSE_KINDS},
        "peak_load": peak,
        "fleet_load_peak": round(float(res.fleet_load.max()), 6) if res.fleet_load.size
        else None,
        "drain_seconds": {
            "count": len(durations),
            "min": round(min(durations), 3) if durations else None,
            "median": round(float(np.median(durations)), 3) if durations else None,
            "max": round(max(durations), 3) if durations else None,
        },
        "drains": res.drains,
        "rollout_end": None if res.rollout_end is None else round(res.rollout_end, 3),
    }


def write_json(results: Sequence[Result], out: IO[str]) -> None:
    data: Any = summary(results[0]) if len(results) == 1 else {
        "compare": [summary(r) for r in results]}
    json.dump(data, out, indent=2, default=_plain)
    out.write("\n")


def _plain(x: object) -> object:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON: {type(x).__name__}")


def _columns(res: Result) -> tuple[list[str], np.ndarray]:
    """One row per 100 ms: reconnects, closes by kind, failures by cause, and the load."""
    n = res.reconnects.size
    t = np.arange(n) * BIN
    cols = {"t": t, "reconnects": res.reconnects}
    for h in CLOSE_KINDS:
        cols[f"closes_{h.name.lower()}"] = res.closes[h]
    for c in CAUSES:
        cols[f"failed_{c}"] = res.failures[c]
    idx = np.clip(np.searchsorted(res.sample_t, t + 1e-9, side="right") - 1, 0,
                  max(res.sample_t.size - 1, 0))
    if res.sample_t.size:
        load = res.load[idx]
        with np.errstate(all="ignore"):
            cols["serving"] = res.serving[idx]
            cols["load_max"] = np.nanmax(np.where(np.isfinite(load), load, -np.inf), axis=1)
            cols["load_mean"] = np.nanmean(load, axis=1)
            cols["fleet_load"] = res.fleet_load[idx]
    return list(cols), np.column_stack(list(cols.values()))


def write_csv(results: Sequence[Result], out: IO[str]) -> None:
    """The timelines; compared scenarios get a ``scenario`` column."""
    w = csv.writer(out)
    header_done = False
    for res in results:
        names, rows = _columns(res)
        if not header_done:
            w.writerow(["scenario", *names])
            header_done = True
        for row in rows:
            w.writerow([res.scenario.name, *(_cell(v) for v in row)])


def _cell(v: float) -> str:
    if not math.isfinite(v):
        return ""
    return str(int(v)) if v == int(v) else f"{v:.6g}"


def write_instances_csv(res: Result, out: IO[str]) -> None:
    """Every instance's load (requests in flight / capacity) at every sample; empty: not
    running."""
    w = csv.writer(out)
    w.writerow(["t", *(f"pod{k}" for k in range(res.load.shape[1]))])
    for t, row in zip(res.sample_t, res.load, strict=True):
        w.writerow([f"{t:.3f}", *(_cell(float(v)) for v in row)])


def text(results: Sequence[Result]) -> str:
    """The figures side by side, one column per scenario."""
    sums = [summary(r) for r in results]
    rows: list[tuple[str, list[str]]] = [
        ("strategy / T / G", [f"{s['settings']['drain.strategy']} / "
                              f"{s['settings']['drain.time']:g}s / "
                              f"{s['settings']['drain.connection_grace']:g}s" for s in sums]),
        ("min_drain", [str(s["settings"]["shutdown.min_drain"]) for s in sums]),
        ("requests", [str(s["requests"]) for s in sums]),
        ("failed", [str(s["failed"]) for s in sums]),
    ]
    for c in CAUSES:
        rows.append((f"  {c}", [str(s["failures"][c]) for s in sums]))
    rows += [
        ("retried", [str(sum(s["retried"].values())) for s in sums]),
        ("reconnects/100ms peak", [f"{s['reconnects_per_100ms']['peak']} at "
                                   f"{s['reconnects_per_100ms']['peak_at']}s" for s in sums]),
        ("reconnects/100ms mean", [str(s["reconnects_per_100ms"]["mean"]) for s in sums]),
        ("peak instance load", [f"{s['peak_load']['value']:.1%}" if s["peak_load"]["value"]
                                is not None else "-" for s in sums]),
        ("peak fleet load", [f"{s['fleet_load_peak']:.1%}" if s["fleet_load_peak"]
                             is not None else "-" for s in sums]),
        ("drain seconds (median)", [str(s["drain_seconds"]["median"]) for s in sums]),
        ("rollout done at", [str(s["rollout_end"]) for s in sums]),
        ("wall s / events/s", [f"{s['wall_seconds']} / {s['events_per_second']}"
                               for s in sums]),
    ]
    head = ("", [s["scenario"] for s in sums])
    width = max(len(r[0]) for r in [head, *rows])
    cols = [max(len(r[1][i]) for r in [head, *rows]) for i in range(len(sums))]
    lines = []
    for label, vals in [head, *rows]:
        lines.append(label.ljust(width) + "  " + "  ".join(
            v.rjust(w) for v, w in zip(vals, cols, strict=True)))
    return "\n".join(lines)
