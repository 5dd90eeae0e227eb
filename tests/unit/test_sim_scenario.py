"""Scenario files: what they read from the pod spec and the lameduck config (as ``lameduck
budget`` does), and errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lameduck.drain.prestop import PrestopStrategy
from lameduck.sim.scenario import ScenarioError, load_scenario, scenario_from

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "fleet": {"replicas": 4},
    "clients": [{"count": 10}],
    "drain": {"at": "5s"},
    "duration": "30s",
}


def load(**over: Any) -> Any:
    return scenario_from({**BASE, **over}, ROOT, "s.yaml")


@pytest.mark.parametrize(("over", "message"), [
    ({"fleet": {"replicas": 0}}, "s.yaml: fleet.replicas: expected a whole number >= 1, got 0"),
    ({"fleet": {"replicas": 4, "cpu": 2}}, "s.yaml: fleet.cpu: unknown key"),
    ({"clients": [{"count": 10, "protocol": "http3"}]},
     "s.yaml: clients[0].protocol: expected one of http1, http2, websocket, once, got 'http3'"),
    ({"clients": [{"count": 10, "duration": {"median": "1s", "p99": "10ms"}}]},
     "s.yaml: clients[0].duration.p99: must be >= median"),
    ({"clients": [{"count": 10, "reconnect": "never"}]},
     "s.yaml: clients[0].reconnect: expected one of immediate, backoff, next_request"),
    ({"clients": []}, "s.yaml: clients: required"),
    ({"lb": {"kind": "dns"}}, "s.yaml: lb.kind: expected one of endpoints, health_check"),
    ({"lb": {"interval": "2 seconds"}}, "s.yaml: lb.interval:"),
    ({"drain": None}, "s.yaml: rollout: required"),
    ({"rollout": {"at": "5s"}}, "s.yaml: drain: give either rollout or drain, not both"),
    ({"drain": None, "rollout": {"at": "5s", "max_surge": 0, "max_unavailable": 0}},
     "s.yaml: rollout.max_unavailable: may not be 0 when max_surge is 0"),
    ({"drain": {"at": "5s", "instances": 9}}, "s.yaml: drain.instances: must be <= fleet"),
    ({"duration": "3s"}, "s.yaml: duration: must be longer than the moment the drain starts"),
    ({"lameduck": {"drain": {"tme": "5s"}}}, "drain.tme"),
    ({"lameduck": {"shutdown": {"deadline": "5s"}}}, "shutdown.deadline: must be >= "
                                                     "drain.time"),
    ({"lameduck": {"drain": {"idle_close": "on_response"}}},
     "s.yaml: lameduck: drain.idle_close: on_response is not simulated"),
    ({"pod": {"kind": "Pod", "spec": {"terminationGracePeriodSeconds": -1,
                                      "containers": [{"name": "x"}]}}},
     "s.yaml: pod: spec.terminationGracePeriodSeconds"),
])
def test_errors_name_the_field(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as e:
        load(**over)
    assert message in str(e.value)


def test_reads_what_lameduck_budget_reads() -> None:
    sc = load(pod="deploy/kubernetes/deployment.yaml", config="deploy/kubernetes/lameduck.yaml",
              fleet={"capacity": 50}, drain=None,
              rollout={"at": "5s", "readiness": {"median": "3s", "p99": "9s"}})
    assert sc.replicas == 3  # the Deployment's replicas
    assert (sc.rollout.max_surge, sc.rollout.max_unavailable) == (1, 0)  # its strategy
    assert sc.pod.grace_period == 45
    assert sc.prestop.strategy is PrestopStrategy.HOLD_HEALTH
    assert (sc.prestop.drain_timeout, sc.prestop.lb_buffer) == (9.0, 11.0)
    assert sc.config.drain.time == 15.0 and sc.max_request == 5.0
    # inline changes merged over the config file
    sc = load(config="deploy/kubernetes/lameduck.yaml",
              lameduck={"drain": {"strategy": "immediate"}})
    assert sc.config.drain.strategy.value == "immediate" and sc.config.drain.time == 15.0


def test_percentages_round_as_kubernetes_does() -> None:
    sc = load(fleet={"replicas": 10}, drain=None,
              rollout={"at": "5s", "max_surge": "25%", "max_unavailable": "25%"})
    assert (sc.rollout.max_surge, sc.rollout.max_unavailable) == (3, 2)  # up, down


def test_shipped_examples_load() -> None:
    files = sorted((ROOT / "examples" / "simulate").glob("*.yaml"))
    assert files
    for f in files:
        assert load_scenario(f).duration > 0


def test_a_duplicate_key_in_the_config_file_is_refused_as_lameduck_run_refuses_it(
        tmp_path: Path) -> None:
    cfg = tmp_path / "lameduck.yaml"
    cfg.write_text("drain:\n  time: 10s\ndrain:\n  time: 30s\n")
    with pytest.raises(ScenarioError) as e:
        scenario_from({**BASE, "config": "lameduck.yaml"}, tmp_path, "s.yaml")
    assert str(e.value).startswith(f"s.yaml: config: {cfg}: ")
    assert "duplicate key 'drain'" in str(e.value)


def test_a_duplicate_key_in_the_inline_lameduck_section_is_refused(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("fleet: {replicas: 4}\nclients: [{count: 10}]\ndrain: {at: 5s}\n"
                  "duration: 30s\nlameduck:\n  shutdown: {deadline: 20s}\n"
                  "  shutdown: {deadline: 40s}\n")
    with pytest.raises(ScenarioError) as e:
        load_scenario(sc)
    assert str(e.value) == (f"{sc}: scenario: {sc}: line 7, column 3: invalid YAML: "
                            "duplicate key 'shutdown'")
