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


def _keys(name: str) -> dict[str, list[str]]:
    """Every value of every key of a unit, in order (systemd merges repeated list keys such as
    SystemCallFilter=, where configparser keeps only the last)."""
    keys: dict[str, list[str]] = {}
    for line in (DEPLOY / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def test_service_raises_the_descriptor_limit() -> None:
    """systemd's default soft limit, 1024, would hold (1024 - 32) / 2 = 496 clients; the unit
    sets the hard limit and lameduck raises its soft limit to it (server/limits.py)."""
    from lameduck.listeners.base import downstream_cap

    [limit] = _keys("lameduck.service")["LimitNOFILE"]
    soft, _, hard = limit.partition(":")
    assert downstream_cap(int(hard or soft)) >= 100_000


def test_service_reloads_by_sighup_into_a_new_main_pid() -> None:
    """`lameduck run` hot-restarts on SIGHUP into a new process that sends READY=1 with its
    MAINPID: systemd takes that only with NotifyAccess=all."""
    svc = _keys("lameduck.service")
    assert svc["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert svc["NotifyAccess"] == ["all"]
    assert svc["ExecStart"][0].split()[1] == "run"


def test_service_exit_codes() -> None:
    """3 (the deadline cut requests) ends a stop as asked: success, said in docs/systemd.md;
    2 (invalid config) is not restarted into a loop."""
    svc = _keys("lameduck.service")
    assert "3" in svc["SuccessExitStatus"][0].split()
    assert "2" in svc["RestartPreventExitStatus"][0].split()
    assert "SuccessExitStatus=3" in (DEPLOY.parents[1] / "docs" / "systemd.md").read_text()


HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
    "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "RestrictNamespaces": "yes",
    "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes", "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "", "AmbientCapabilities": "",
}


def test_service_is_hardened() -> None:
    svc = _keys("lameduck.service")
    assert {k: svc.get(k, [None])[-1] for k in HARDENING} == HARDENING
    assert svc["SystemCallFilter"][0] == "@system-service"
    # no capability: then no listener may need one (a port below 1024 needs
    # CAP_NET_BIND_SERVICE, or the socket unit binding it)
    cfg = load_config(DEPLOY / "lameduck.yaml")
    assert all(ls.address.port >= 1024 for ls in cfg.listeners)


def test_systemd_analyze_security_rates_the_service_ok(tmp_path: Path) -> None:
    """`systemd-analyze security` rated the unit 8.3 EXPOSED before it was hardened; 1.4 now
    (systemd 252). --threshold is the exposure x 10."""
    import shutil
    import subprocess

    import pytest

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    for name in ("lameduck.service", "lameduck.socket"):
        shutil.copy(DEPLOY / name, tmp_path / name)
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", "--threshold=20",
                          "lameduck.service"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, check=False)
    if "--offline" in out.stderr and "unrecognized" in out.stderr:
        pytest.skip("systemd-analyze before 250 has no --offline")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
