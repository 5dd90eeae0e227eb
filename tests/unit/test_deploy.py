"""The example systemd units stay consistent with the config they run (deploy/systemd/)."""

from __future__ import annotations

import configparser
from pathlib import Path

from lameduck.config import load_config
from lameduck.config.durations import parse_duration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "systemd"


def _unit(name: str) -> configparser.ConfigParser:
    p = configparser.ConfigParser(strict=False, interpolation=None)
    p.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    p.read(DEPLOY / name)
    return p


def test_service_outlives_the_shutdown_deadline() -> None:
    cfg = load_config(DEPLOY / "lameduck.yaml")
    svc = _unit("lameduck.service")["Service"]
    assert svc["Type"] == "notify"
    assert svc["KillSignal"] == "SIGTERM"
    stop = parse_duration(svc["TimeoutStopSec"])
    # systemd must not SIGKILL a process still inside its own deadline (plus time to flush)
    assert stop >= cfg.shutdown.deadline + 5, (stop, cfg.shutdown.deadline)
    assert cfg.shutdown.deadline >= cfg.drain.time


def test_socket_names_a_listener_at_its_address() -> None:
    cfg = load_config(DEPLOY / "lameduck.yaml")
    sock = _unit("lameduck.socket")["Socket"]
    listener = next(ls for ls in cfg.listeners if ls.name == sock["FileDescriptorName"])
    assert str(listener.address) == sock["ListenStream"]


KUBE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def test_kubernetes_example_passes_the_budget_and_solve_changes_nothing() -> None:
    import yaml

    from lameduck.orchestrate import budget as bud

    cfg = load_config(KUBE / "lameduck.yaml")
    doc = yaml.safe_load((KUBE / "deployment.yaml").read_text())
    pod = bud.pod_timers(doc)
    b = bud.budget_from(cfg, pod)
    failed = [q.line() for q in bud.check(b) if not q.holds]
    assert not failed, failed
    assert bud.solve(b) == b  # already the smallest consistent values
    spec = doc["spec"]["template"]["spec"]
    [ld] = [c for c in spec["containers"] if c["name"] == "lameduck"]
    assert ld["lifecycle"]["preStop"]["exec"]["command"][:2] == ["lameduck", "prestop"]
    assert "/ready" in " ".join(ld["readinessProbe"]["exec"]["command"])
    assert str(cfg.admin.address) in " ".join(ld["readinessProbe"]["exec"]["command"])
