"""``lameduck simulate --solve``: the smallest drain time (and min_drain) that keeps a described
fleet's rollout at zero failed requests and its reconnect peak under a given rate, and the
grace period that follows from it.

``lameduck budget --solve`` gives the timer chain's lower bounds from the inequalities; this
runs the simulation to find where the load itself puts them: it starts from budget's values,
searches drain.time down (or up) in whole seconds, then shutdown.min_drain between 0 and T, on
the same random generator each time. It assumes a longer drain never does worse (closes spread
over more time, the LB has longer to notice), which is what a search in halves needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lameduck.config import format_duration
from lameduck.orchestrate import budget as bud
from lameduck.sim.fleet import Result, simulate
from lameduck.sim.report import summary
from lameduck.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Trial:
    time: float
    min_drain: float | None
    failed: int
    peak: int
    ok: bool


def budget_of(sc: Scenario) -> bud.Budget:
    lb = sc.lb
    return bud.budget_from(sc.config, sc.pod, max_request=sc.max_request,
                           exit_margin=sc.exit_margin, lb_interval=lb.interval,
                           lb_fall=lb.fall, lb_rise=lb.rise, lb_buffer=lb.buffer,
                           lb_idle=lb.idle, client_idle=lb.client_idle)


def _variant(sc: Scenario, time: float, min_drain: float | None) -> Scenario:
    deadline = max(sc.config.shutdown.deadline, time + sc.max_request)
    shutdown: dict[str, Any] = {"deadline": format_duration(deadline)}
    shutdown["min_drain"] = None if min_drain is None else format_duration(min_drain)
    hot = max(sc.config.hot_restart.parent_shutdown_time, time)
    return sc.with_lameduck(drain={"time": format_duration(time)}, shutdown=shutdown,
                            hot_restart={"parent_shutdown_time": format_duration(hot)})


def solve(sc: Scenario, max_peak: int, seed: int | None = None, limit: float = 600.0,
          say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Search; ``max_peak``: reconnects per 100 ms the fleet must stay under (inclusive)."""
    trials: list[Trial] = []

    def run(time: float, min_drain: float | None) -> bool:
        res: Result = simulate(_variant(sc, time, min_drain), seed)
        s = summary(res)
        peak = s["reconnects_per_100ms"]["peak"]
        ok = s["failed"] == 0 and peak <= max_peak
        trials.append(Trial(time, min_drain, s["failed"], peak, ok))
        if say is not None:
            say(f"drain.time {time:g}s min_drain {min_drain}: failed {s['failed']}, "
                f"reconnect peak {peak}/100ms: {'ok' if ok else 'no'}")
        return ok

    budget = budget_of(sc)
    from_budget = bud.solve(budget)
    start = max(1.0, math.ceil(from_budget.drain_time))
    hi = start
    while not run(hi, None):  # up until one holds
        if hi >= limit:
            return {"found": False, "limit": limit, "trials": [asdict(t) for t in trials],
                    "budget": _budget_dict(from_budget)}
        hi = min(limit, hi * 2)
    lo = 0.0  # the largest known to fail (0: none tried)
    while hi - lo > 1.0:
        mid = float(math.floor((lo + hi) / 2))
        if mid <= lo:
            break
        if run(mid, None):
            hi = mid
        else:
            lo = mid
    time = hi
    md_lo, md_hi = -1.0, time  # min_drain = T is what unset means while accepting until T
    while md_hi - md_lo > 0.5:
        mid = round((md_lo + md_hi) / 2 * 2) / 2  # half seconds
        if mid <= md_lo or mid >= md_hi:
            break
        if run(time, max(mid, 0.0)):
            md_hi = mid
        else:
            md_lo = mid
    min_drain = max(md_hi, 0.0)
    deadline = _variant(sc, time, min_drain).config.shutdown.deadline
    grace = max(math.ceil(budget.prestop + deadline + sc.exit_margin), 1)
    return {
        "found": True,
        "max_reconnects_per_100ms": max_peak,
        "pod": {"spec": {"terminationGracePeriodSeconds": grace}},
        "lameduck": {"drain": {"time": format_duration(time)},
                     "shutdown": {"deadline": format_duration(deadline),
                                  "min_drain": format_duration(min_drain)}},
        "min_drain_over_T": round(min_drain / time, 3) if time else None,
        "budget": _budget_dict(from_budget),
        "trials": [asdict(t) for t in trials],
    }


def _budget_dict(b: bud.Budget) -> dict[str, Any]:
    return {"drain.time": b.drain_time, "shutdown.deadline": b.shutdown_deadline,
            "shutdown.min_drain": b.min_drain,
            "terminationGracePeriodSeconds": b.grace_period}
