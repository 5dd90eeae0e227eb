"""`lameduck budget` end to end: the classic preStop pitfall (60 s grace, 55 s preStop sleep,
10 s stop: SIGKILLed, as Kubernetes' Pod termination docs count the hook inside the grace
period) is rejected naming the broken inequality, and the values `--solve` proposes are
accepted when fed back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.procs import _env

EXIT_BROKEN = 1
EXIT_INPUT = 2


def budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lameduck", "budget", *args],
                          capture_output=True, text=True, timeout=30, env=_env(), check=False)


def pitfall_pod(grace: int = 60) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
            "spec": {"terminationGracePeriodSeconds": grace, "containers": [
                {"name": "lameduck", "image": "lameduck",
                 "lifecycle": {"preStop": {"exec": {"command": ["sleep", "55"]}}}}]}}


def pitfall_config() -> dict[str, Any]:
    """A 10 s stop: the deadline; short requests so that only the grace period is wrong."""
    return {"drain": {"time": "5s"}, "shutdown": {"deadline": "10s"},
            "listeners": [{"name": "ingress", "address": "127.0.0.1:10000",
                           "idle_timeout": "75s",
                           "routes": [{"prefix": "/", "cluster": "app", "timeout": "5s"}]}],
            "clusters": [{"name": "app", "endpoints": ["127.0.0.1:8080"]}]}


def write(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def merge(base: dict[str, Any], snippet: dict[str, Any]) -> dict[str, Any]:
    """Apply a --solve snippet: mappings merge, listeners merge by name."""
    out = dict(base)
    for key, value in snippet.items():
        if key == "listeners":
            named = {ls["name"]: ls for ls in value}
            out[key] = [{**ls, **named.get(ls["name"], {})} for ls in base[key]]
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = merge(base[key], value)
        else:
            out[key] = value
    return out


def test_prestop_pitfall_rejected_then_solved(tmp_path: Path) -> None:
    pod = write(tmp_path / "pod.yaml", pitfall_pod())
    cfg = write(tmp_path / "lameduck.yaml", pitfall_config())
    out = budget("--pod", pod, "--config", cfg)
    assert out.returncode == EXIT_BROKEN, out.stderr
    assert ("FAIL grace: preStop (55s) + shutdown.deadline (10s) + exit margin (5s) = 70s <= "
            "terminationGracePeriodSeconds (60s)") in out.stdout
    assert "60 s grace, 55 s hook, 10 s stop gets killed" in out.stdout
    assert "OK   deadline:" in out.stdout and "OK   lb-detection:" in out.stdout
    assert "broken: grace" in out.stderr

    solved = budget("--pod", pod, "--config", cfg, "--solve", "--json")
    assert solved.returncode == EXIT_BROKEN, solved.stderr
    report = json.loads(solved.stdout)
    assert not report["ok"]
    assert [q["name"] for q in report["inequalities"] if not q["holds"]] == ["grace"]
    prop = report["proposal"]
    assert prop["pod"]["spec"]["terminationGracePeriodSeconds"] == 70

    pod2 = write(tmp_path / "pod2.yaml", merge(pitfall_pod(), prop["pod"]))
    cfg2 = write(tmp_path / "lameduck2.yaml", merge(pitfall_config(), prop["lameduck"]))
    again = budget("--pod", pod2, "--config", cfg2)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "FAIL" not in again.stdout


def test_solve_from_the_defaults_is_accepted(tmp_path: Path) -> None:
    """The embedded default config with a 15 s route timeout and a 60 s listener idle timeout,
    behind a Deployment with no preStop: two links break; the text --solve prints is YAML that,
    applied, makes every link hold."""
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {
        "containers": [{"name": "lameduck", "image": "lameduck"}]}}}}
    pod = write(tmp_path / "dep.yaml", dep)
    base = yaml.safe_load(
        (Path(__file__).parents[2] / "src/lameduck/config/default.yaml").read_text())
    base["listeners"][0]["idle_timeout"] = "60s"
    base["listeners"][0]["routes"][0]["timeout"] = "15s"
    cfg = write(tmp_path / "cfg.yaml", base)
    out = budget("--pod", pod, "--config", cfg, "--solve", "--lb-idle", "60s",
                 "--client-idle", "30s")
    assert out.returncode == EXIT_BROKEN
    assert "container 'lameduck' has no preStop hook" in out.stdout
    for name in ("keepalive-lb", "deadline"):
        assert f"FAIL {name}:" in out.stdout
    # Serving until T after SIGTERM by default, lameduck holds the LB's detection time itself.
    assert "OK   lb-detection:" in out.stdout
    prop = yaml.safe_load(out.stdout.split("# --solve")[1].split("\n", 1)[1])
    dep["spec"]["template"].update(merge(dep["spec"]["template"], prop["pod"]))
    pod2 = write(tmp_path / "dep2.yaml", dep)
    cfg2 = write(tmp_path / "cfg2.yaml", merge(base, prop["lameduck"]))
    again = budget("--pod", pod2, "--config", cfg2)
    assert again.returncode == 0, again.stdout + again.stderr


def test_bad_input_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = pitfall_pod()
    bad["spec"]["terminationGracePeriodSeconds"] = "60s"
    pod = write(tmp_path / "pod.yaml", bad)
    out = budget("--pod", pod)
    assert out.returncode == EXIT_INPUT
    assert "spec.terminationGracePeriodSeconds" in out.stderr
    assert budget("--pod", str(tmp_path / "missing.yaml")).returncode == EXIT_INPUT
    # a plain number is seconds, as in the config; over an hour it needs its unit
    flag = budget("--pod", pod, "--lb-idle", "20000")
    assert flag.returncode == EXIT_INPUT and "--lb-idle" in flag.stderr
    assert "write 20000s if you mean it" in flag.stderr
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("drain: {time: soon}\n")
    out = budget("--pod", write(tmp_path / "ok.yaml", pitfall_pod()), "--config", str(cfg))
    assert out.returncode == EXIT_INPUT and "drain.time" in out.stderr


def test_lb_preset_warns_when_the_deregistration_delay_outlives_the_grace_period(
        tmp_path: Path) -> None:
    """`--lb aws-alb`: the target group's defaults (30 s x 2 checks, a 300 s deregistration
    delay) against a 60 s grace period: the hold breaks and the delay is warned about with
    both numbers; a delay set within the grace period is not."""
    pod = write(tmp_path / "pod.yaml", pitfall_pod())
    cfg = write(tmp_path / "lameduck.yaml", pitfall_config())
    out = budget("--pod", pod, "--config", cfg, "--lb", "aws-alb")
    assert out.returncode == EXIT_BROKEN, out.stderr
    assert ("lb: aws-alb: AWS Application Load Balancer target group defaults: interval 30s x "
            "fall 2, deregistration delay 300s") in out.stdout
    assert ("warning: aws-alb deregistration delay (300s) outlives the pod's "
            "terminationGracePeriodSeconds (60s)") in out.stdout
    assert "FAIL lb-detection: LB interval x fall (60s)" in out.stdout

    report = json.loads(budget("--pod", pod, "--config", cfg, "--lb", "aws-alb",
                               "--json").stdout)
    assert report["lb"]["name"] == "aws-alb" and report["deregistration_delay"] == 300
    assert report["lb"]["sources"][0].startswith("https://docs.aws.amazon.com/")
    [warning] = report["warnings"]
    assert "(300s)" in warning and "(60s)" in warning

    short = budget("--pod", pod, "--config", cfg, "--lb", "aws-alb",
                   "--lb-deregistration-delay", "30s", "--lb-interval", "5s", "--json")
    assert json.loads(short.stdout)["warnings"] == []


def test_lb_preset_without_a_documented_interval_exits_2(tmp_path: Path) -> None:
    pod = write(tmp_path / "pod.yaml", pitfall_pod())
    out = budget("--pod", pod, "--lb", "envoy")
    assert out.returncode == EXIT_INPUT
    assert "--lb envoy: the balancer documents no default health-check interval" in out.stderr
    ok = budget("--pod", pod, "--lb", "envoy", "--lb-interval", "1s")
    assert "lb: envoy:" in ok.stdout and "fall 1" in ok.stdout
    assert "warning:" not in ok.stdout

def test_notes_what_leave_confirm_took_in_the_last_drains(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "drain-20261203T100000.000Z-7.json").write_text(json.dumps(
        {"version": 1, "leave": {"by": "prestop", "bound": 30.0, "confirmed_after": 0.61}}))
    pod = write(tmp_path / "pod.yaml", pitfall_pod())
    cfg = write(tmp_path / "lameduck.yaml",
                {**pitfall_config(), "drain": {"time": "5s", "report_dir": str(reports)}})
    out = budget("--pod", pod, "--config", cfg)
    assert ("note: leave: confirm (prestop) in drain-20261203T100000.000Z-7.json: confirmed "
            "after 0.61s (bound 30.0s)") in out.stdout, out.stdout
