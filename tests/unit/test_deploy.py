"""The example deployments stay consistent with the config they run: the systemd units
(deploy/systemd/) and the Kubernetes manifests (deploy/kubernetes/)."""

from __future__ import annotations

import configparser
import ipaddress
from pathlib import Path
from typing import Any

import pytest

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
    assert str(cfg.admin.address) in ld["lifecycle"]["preStop"]["exec"]["command"]


def _kube_docs(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _pod_spec(path: Path) -> dict[str, Any]:
    [dep] = [d for d in _kube_docs(path) if d["kind"] == "Deployment"]
    spec: dict[str, Any] = dep["spec"]["template"]["spec"]
    return spec


def test_kubernetes_readiness_is_an_http_get_of_the_listeners_health_check_path() -> None:
    """The kubelet asks the listener's health_check_path on the pod IP: 200 while live, 503
    once the health check fails (as /ready, which is on the loopback admin API it cannot
    reach)."""
    cfg = load_config(KUBE / "lameduck.yaml")
    [ld] = [c for c in _pod_spec(KUBE / "deployment.yaml")["containers"]
            if c["name"] == "lameduck"]
    probe = ld["readinessProbe"]
    assert set(probe) & {"exec", "httpGet", "tcpSocket", "grpc"} == {"httpGet"}
    ports = {p["name"]: p["containerPort"] for p in ld["ports"]}
    port = probe["httpGet"]["port"]
    port = ports[port] if isinstance(port, str) else port
    [listener] = [ls for ls in cfg.listeners if ls.address.port == port]
    assert str(listener.address.host) == "0.0.0.0"  # reachable on the pod IP
    assert probe["httpGet"]["path"] == listener.health_check_path


def test_kubernetes_app_prestop_is_the_sleep_action_outliving_lameduck() -> None:
    """The sleep action (no `sleep` binary needed in the app's image), long enough for the app
    to answer what lameduck sends until lameduck's own hook is over."""
    from lameduck.orchestrate import budget as bud

    spec = _pod_spec(KUBE / "deployment.yaml")
    [app] = [c for c in spec["containers"] if c["name"] == "app"]
    assert "exec" not in app["lifecycle"]["preStop"]
    seconds = app["lifecycle"]["preStop"]["sleep"]["seconds"]
    lameduck_hook = bud.pod_timers({"kind": "Pod", "spec": spec}).prestop.seconds
    assert lameduck_hook < seconds <= spec["terminationGracePeriodSeconds"]


# Pod Security Standards, "restricted" (kubernetes.io/docs/concepts/security/pod-security-standards)
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("manifest", ["deployment.yaml", "sidecar/deployment.yaml"])
def test_kubernetes_pods_are_restricted_and_sized(manifest: str) -> None:
    spec = _pod_spec(KUBE / manifest)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in _all_containers(spec):
        assert RESTRICTED_CONTAINER.items() <= c["securityContext"].items(), c["name"]
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert "memory" in c["resources"]["limits"], c["name"]
    [ld] = [c for c in _all_containers(spec) if c["name"] == "lameduck"]
    assert ld["securityContext"]["readOnlyRootFilesystem"] is True
    # what lameduck writes (the admin address file, hot-restart sockets) goes to /tmp
    mounts = {m["mountPath"]: m["name"] for m in ld["volumeMounts"]}
    [tmp] = [v for v in spec["volumes"] if v["name"] == mounts["/tmp"]]
    assert "emptyDir" in tmp
    # the image's user, so a non-root check does not need to read the image
    import re

    [user] = re.findall(r"^USER (\d+)", (KUBE.parents[1] / "Dockerfile").read_text(), re.M)
    assert spec["securityContext"]["runAsUser"] == int(user)


def test_kubernetes_disruption_budget_covers_the_deployment() -> None:
    import yaml

    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    kinds = {d["kind"]: d for r in kust["resources"] for d in _kube_docs(KUBE / r)}
    pdb, dep = kinds["PodDisruptionBudget"], kinds["Deployment"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] < dep["spec"]["replicas"]


def test_native_sidecar_variant_is_an_outbound_proxy_that_stops_last() -> None:
    """A native sidecar gets SIGTERM after the app has exited: right for an outbound proxy
    (the app's calls while it drains go through), wrong for an inbound one. The grace period
    covers the app's preStop, lameduck's whole deadline after the app has gone, and a margin."""
    side = KUBE / "sidecar"
    cfg = load_config(side / "lameduck.yaml")
    spec = _pod_spec(side / "deployment.yaml")
    [ld] = spec["initContainers"]
    assert ld["name"] == "lameduck" and ld["restartPolicy"] == "Always"
    assert "lifecycle" not in ld  # no LB to wait for: no preStop hook
    assert all(c["name"] != "lameduck" for c in spec["containers"])
    assert [ls.direction.value for ls in cfg.listeners] == ["outbound"]
    assert all(ipaddress.ip_address(ls.address.host).is_loopback for ls in cfg.listeners)
    assert cfg.shutdown.stop_accepting.value == "immediately"  # its one client has exited
    [app] = spec["containers"]
    app_prestop = app["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert app_prestop + cfg.shutdown.deadline + 5 <= spec["terminationGracePeriodSeconds"]
    # the ConfigMap the pod mounts is the one the kustomization generates from this config
    import yaml

    kust = yaml.safe_load((side / "kustomization.yaml").read_text())
    [gen] = kust["configMapGenerator"]
    [vol] = [v for v in spec["volumes"] if "configMap" in v]
    assert gen["name"] == vol["configMap"]["name"] and gen["files"] == ["lameduck.yaml"]


# kubernetes-validate's schemas for this version: the sleep action (1.29 alpha, on by default
# since 1.30 beta) and native sidecars (restartPolicy in initContainers: 1.29 beta, 1.33 stable)
# are both in the 1.33 API.
KUBE_VERSION = "1.33.0"


def _manifests() -> list[Path]:
    """Every Kubernetes object the kustomizations apply (not the kustomizations themselves,
    which are kustomize's input, nor the lameduck configs they turn into ConfigMaps)."""
    import yaml

    out = []
    for kust in sorted(KUBE.rglob("kustomization.yaml")):
        out += [kust.parent / r for r in yaml.safe_load(kust.read_text())["resources"]]
    return out


def test_every_kubernetes_manifest_is_applied_by_a_kustomization() -> None:
    listed = set(_manifests())
    on_disk = {p for p in KUBE.rglob("*.yaml")
               if p.name != "kustomization.yaml" and p.name != "lameduck.yaml"}
    assert on_disk == listed


@pytest.mark.parametrize("manifest", _manifests(), ids=lambda p: str(p.relative_to(KUBE)))
def test_kubernetes_validate_strict(manifest: Path) -> None:
    """`kubernetes-validate --strict` (a test dependency, pyproject.toml): every field is one
    the Kubernetes API schema knows; a misspelt or misplaced one fails."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which("kubernetes-validate", path=str(Path(sys.executable).parent))
    assert exe is not None, "kubernetes-validate is a test dependency: make test installs it"
    out = subprocess.run([exe, "--strict", "-k", KUBE_VERSION, str(manifest)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "INFO" in out.stdout and "ERROR" not in out.stdout, out.stdout


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
