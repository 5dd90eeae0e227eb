"""The simulated fleet against arithmetic that must hold exactly, and the drain core's own
promises seen from the simulator: ten instances at 60 % that lose one run the nine others at
2/3; the proactive closes fall uniformly over [2T/3, T - G); the deployment controller steps as
Kubernetes' does; the defaults lose nothing where ``min_drain: 0s`` behind a slow LB does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lameduck.sim import rollout
from lameduck.sim.fleet import simulate
from lameduck.sim.ks import ks_1samp, uniform_cdf
from lameduck.sim.scenario import Scenario, scenario_from
from lameduck.sim.walk import How


def scenario(**over: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "t",
        "pod": {"kind": "Pod", "spec": {"containers": [{"name": "lameduck"}]}},
        "lb": {"kind": "endpoints", "propagation": "1s", "balance": "least_conn"},
        "fleet": {"replicas": 10, "capacity": 90},
        # think 1 s, requests 250 ms: each client keeps 0.25 / 1.25 = 0.2 in flight
        "clients": [{"count": 2700, "protocol": "http1", "rate": 1.0, "duration": "250ms"}],
        "drain": {"at": "20s", "instances": 1},
        "duration": "60s",
    }
    data.update(over)
    return scenario_from(data, Path("."), "test")


def test_ten_at_60_percent_that_lose_one_run_nine_at_two_thirds() -> None:
    res = simulate(scenario())
    t = res.sample_t
    before = np.flatnonzero((t > 6.0) & (t < 20.0))
    # 270 clients x 0.2 in flight / 90 = 60 % on every instance, and on the fleet
    assert np.allclose(res.load[before][:, :10], 0.6, rtol=1e-6, atol=0)
    assert res.fleet_load[before] == pytest.approx(0.6, rel=1e-12)
    # from the deletion on the same offered load has nine instances' capacity: 2/3
    after = np.flatnonzero(t >= 20.0)
    assert res.fleet_load[after] == pytest.approx(2 / 3, rel=1e-12)
    # once the drained pod has exited its 270 clients are spread, 30 more on each of nine
    gone = res.drains[0]["exit"]
    assert gone is not None and 40.0 <= gone <= 45.0  # T = 20 s, deadline 25 s
    settled = np.flatnonzero(t > gone + 1.0)
    assert np.isnan(res.load[settled][:, 0]).all()
    assert np.allclose(res.load[settled][:, 1:10], 2 / 3, rtol=1e-6, atol=0)
    assert sum(int(v.sum()) for v in res.failures.values()) == 0


def test_proactive_closes_are_uniform_over_their_window() -> None:
    """Idle HTTP/2 clients: each is drained at its proactive moment (GOAWAY), drawn by the
    core's rule; the moments must be uniform over [start + 2T/3, start + T - G)."""
    sc = scenario(clients=[{"count": 3000, "protocol": "http2", "rate": 0.001,
                            "duration": "1ms"}],
                  fleet={"replicas": 3, "capacity": 1000}, duration="50s")
    res = simulate(sc, record=True)
    assert res.close_log is not None
    times, hows, pods = res.close_log
    pro = times[(hows == How.PROACTIVE) & (pods == 0)]
    lo, hi = 20.0 + 20.0 * 2 / 3, 20.0 + 20.0 - 5.0
    assert pro.size > 900 and pro.min() >= lo and pro.max() < hi
    d, p = ks_1samp(pro, uniform_cdf(lo, hi))
    print(f"\n{pro.size} proactive closes, KS D={d:.4f} p={p:.3f}")
    assert p > 0.01
    # and they are not uniform over a wrong window: the test can fail
    assert ks_1samp(pro, uniform_cdf(lo, hi + 2.0))[1] < 0.01


@pytest.mark.parametrize(("state", "want"), [
    ((10, 3, 0, 0, 0, 10), (3, 0)),  # maxSurge 3: three new, none down yet
    ((10, 3, 0, 3, 1, 10), (0, 1)),  # one new ready: one old may go
    ((10, 3, 0, 3, 1, 9), (1, 0)),  # ... then room for one more new pod
    ((10, 0, 2, 0, 0, 10), (0, 2)),  # no surge: two old down first
    ((10, 0, 2, 0, 0, 8), (2, 0)),
    ((4, 1, 1, 4, 4, 1), (0, 1)),  # the last old pod
])
def test_rollout_steps_as_the_deployment_controller(state: tuple[int, ...],
                                                    want: tuple[int, int]) -> None:
    assert rollout.step(*state) == want


def test_rolling_update_replaces_every_pod() -> None:
    sc = scenario(rollout={"at": "10s", "max_surge": "25%", "max_unavailable": 0,
                           "readiness": "2s"}, drain=None, duration="3m",
                  fleet={"replicas": 8, "capacity": 1000},
                  clients=[{"count": 400, "protocol": "http1", "rate": 2.0,
                            "duration": "10ms"}])
    res = simulate(sc)
    assert len(res.drains) == 8 and all(d["step"] == "exit" for d in res.drains)
    assert res.rollout_end is not None
    # maxSurge 2 of 8, maxUnavailable 0: never more than 2 old pods draining at once
    starts = sorted(d["deleted"] for d in res.drains)
    assert starts[2] > starts[0]
    assert res.serving.min() >= 8 - 0
    assert sum(int(v.sum()) for v in res.failures.values()) == 0


def test_min_drain_zero_behind_a_slow_lb_is_refused_where_the_default_is_not() -> None:
    """An idle instance that exits early (min_drain 0) while the LB still routes to it: new
    connections are refused; the default serves until T and loses none."""
    base = dict(lb={"kind": "health_check", "interval": "2s", "fall": 3,
                    "balance": "round_robin"},
                fleet={"replicas": 2, "capacity": 1000},
                clients=[{"count": 20, "protocol": "once", "rate": 5.0, "duration": "5ms"}],
                drain={"at": "10s", "instances": 1}, duration="30s")
    default = simulate(scenario(**base))
    early = simulate(scenario(**base, lameduck={"shutdown": {"min_drain": "0s"}}))
    assert sum(int(v.sum()) for v in default.failures.values()) == 0
    refused = int(early.failures["unremoved"].sum() + early.failures["refused"].sum())
    assert refused > 20, early.failures
    # the same with clients that retry a refused connect once: retried, on the other instance
    retry = simulate(scenario(**{**base, "clients": [{**base["clients"][0],
                                                      "retry": {"refused": True}}]},
                              lameduck={"shutdown": {"min_drain": "0s"}}))
    assert retry.retried["unremoved"] + retry.retried["refused"] > 0
