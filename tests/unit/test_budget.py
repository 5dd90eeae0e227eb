"""`lameduck budget` (orchestrate/budget.py): each link of the timer chain with exact numbers, the
solver's proposals passing the check, and the pod spec's preStop read in all its forms."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from lameduck.config import load_config_text
from lameduck.orchestrate.budget import (
    PRESTOP_DEFAULTS,
    Budget,
    BudgetError,
    budget_from,
    check,
    pod_timers,
    proposal,
    solve,
)

# Every link holds, with no slack anywhere: the edges of each inequality.
GOOD = Budget(grace_period=40, prestop=5, drain_time=10, shutdown_deadline=30, min_drain=6,
              exit_margin=5, lb_interval=2, lb_fall=3, lb_buffer=5, lb_idle=60,
              client_idle=30, listener_idle=75, max_request=20)


def by_name(b: Budget) -> dict[str, Any]:
    return {q.name: q for q in check(b)}


def broken(b: Budget) -> list[str]:
    return [q.name for q in check(b) if not q.holds]


def test_good_budget_holds_at_the_edges() -> None:
    qs = by_name(GOOD)
    assert list(qs) == ["grace", "keepalive-client", "keepalive-lb", "deadline", "lb-detection"]
    assert broken(GOOD) == []
    assert (qs["grace"].lhs, qs["grace"].rhs) == (40, 40)
    assert (qs["deadline"].lhs, qs["deadline"].rhs) == (30, 30)
    assert (qs["lb-detection"].lhs, qs["lb-detection"].rhs) == (11, 11)


def test_prestop_pitfall_breaks_grace() -> None:
    # The classic preStop pitfall: 60 s grace, 55 s preStop sleep, 10 s stop gets SIGKILLed.
    b = replace(GOOD, grace_period=60, prestop=55, shutdown_deadline=10, drain_time=5,
                max_request=5, min_drain=0)
    assert broken(b) == ["grace"]
    q = by_name(b)["grace"]
    assert q.lhs == 70 and q.rhs == 60
    assert q.line() == ("FAIL grace: preStop (55s) + shutdown.deadline (10s) + exit margin (5s)"
                        " = 70s <= terminationGracePeriodSeconds (60s)")
    assert "60 s grace, 55 s hook, 10 s stop" in q.reason


@pytest.mark.parametrize(("change", "name"), [
    ({"grace_period": 39}, "grace"),
    ({"client_idle": 60}, "keepalive-client"),  # equal idles race: strictly less
    ({"lb_idle": 75, "client_idle": 30}, "keepalive-lb"),
    ({"max_request": 20.5}, "deadline"),
    ({"lb_fall": 4}, "lb-detection"),
    ({"min_drain": 5.9}, "lb-detection"),
    ({"accept_until_drain_end": False}, "lb-detection"),  # listeners closed at SIGTERM
])
def test_each_link_can_break(change: dict[str, Any], name: str) -> None:
    assert broken(replace(GOOD, **change)) == [name]


def test_hold_counts_min_drain_only_up_to_drain_time() -> None:
    # From drain.time on no new work is taken, so min_drain beyond T buys no hold.
    b = replace(GOOD, min_drain=30, drain_time=4, max_request=20, shutdown_deadline=30)
    assert b.hold == 5 + 4
    assert broken(b) == ["lb-detection"]


def test_listener_idle_zero_is_no_limit() -> None:
    q = by_name(replace(GOOD, listener_idle=0, lb_idle=3600))["keepalive-lb"]
    assert q.holds and q.rhs == math.inf
    assert "listener idle_timeout (no limit)" in q.line()


def test_solve_prestop_pitfall_raises_only_the_grace() -> None:
    b = replace(GOOD, grace_period=60, prestop=55, shutdown_deadline=10, drain_time=5,
                max_request=5, min_drain=0)
    s = solve(b)
    assert broken(s) == []
    assert s == replace(b, grace_period=70)


def test_solve_is_the_usual_grace_formula_from_nothing() -> None:
    # No preStop, 0 s drain: the usual grace-period formula,
    # G = max_request + LB detection + LB_BUFFER + drain + margin.
    b = Budget(grace_period=30, prestop=0, drain_time=0, shutdown_deadline=0, exit_margin=5,
               lb_interval=2, lb_fall=3, lb_buffer=5, max_request=15, lb_idle=60,
               client_idle=30, listener_idle=60)
    s = solve(b)
    assert broken(s) == []
    # min_drain stays unset: lameduck then serves until drain.time, which grew to 11 s.
    assert s.min_drain is None and s.effective_min_drain == 11
    assert (s.drain_time, s.shutdown_deadline) == (11, 11 + 15)
    # max_request + LB detection + LB_BUFFER + the user's drain (0s) + margin; drain.time grows
    # to hold the LB part after SIGTERM, as there is no preStop to hold it.
    assert s.grace_period == 15 + 6 + 5 + 0 + 5
    assert s.lb_idle == 60 and s.listener_idle == 61


def test_solve_idles_and_stop_accepting() -> None:
    b = replace(GOOD, client_idle=90, accept_until_drain_end=False)
    s = solve(b)
    assert broken(s) == []
    assert s.lb_idle == 91 and s.listener_idle == 92 and s.accept_until_drain_end


def test_solve_keeps_what_already_fits_and_rounds_grace_up() -> None:
    assert solve(GOOD) == GOOD
    s = solve(replace(GOOD, prestop=5.5, grace_period=1))
    assert s.grace_period == 41 and broken(s) == []


def test_unset_min_drain_serves_until_drain_time() -> None:
    """The default: an idle lameduck still serves until T after SIGTERM, so T counts in full
    towards the LB's detection time; set lower, only min_drain does."""
    b = replace(GOOD, min_drain=None, drain_time=10)
    assert b.serving_after_sigterm == 10
    assert replace(b, min_drain=3).serving_after_sigterm == 3
    assert replace(b, accept_until_drain_end=False).serving_after_sigterm == 0


def test_completed_lameduck_prestop_lets_an_idle_process_exit() -> None:
    """After `lameduck prestop` the LB has already let go: unset min_drain means 0, and the
    preStop itself must hold the LB's detection time."""
    b = replace(GOOD, min_drain=None, lameduck_prestop=True, prestop=2, lb_interval=2,
                lb_fall=3, lb_buffer=5)
    assert b.serving_after_sigterm == 0
    assert "lb-detection" in broken(b)
    s = solve(b)
    assert broken(s) == [] and s.min_drain == 11 - 2


@pytest.mark.parametrize("b", [
    Budget(grace_period=0, prestop=0.1, drain_time=0.2, shutdown_deadline=0.3, exit_margin=0.7,
           lb_interval=0.3, lb_fall=7, lb_buffer=0.1, max_request=0.3, client_idle=0.5,
           lb_idle=0.5, listener_idle=0.4),
    Budget(grace_period=5, prestop=100, drain_time=1, shutdown_deadline=1, min_drain=0,
           max_request=0, lb_idle=10, client_idle=1, listener_idle=0),
])
def test_solve_always_passes_check(b: Budget) -> None:
    assert broken(solve(b)) == []


# --- the pod spec --------------------------------------------------------------------------------


def pod(prestop: Any = None, grace: Any = 60, name: str = "lameduck",
        extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "x"}
    if prestop is not None:
        c["lifecycle"] = {"preStop": prestop}
    spec: dict[str, Any] = {"containers": [*(extra or []), c]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec}


def exec_(*cmd: str) -> dict[str, Any]:
    return {"exec": {"command": list(cmd)}}


@pytest.mark.parametrize(("hook", "seconds"), [
    (exec_("sleep", "55"), 55),
    (exec_("/bin/sleep", "1.5"), 1.5),
    (exec_("sleep", "2m"), 120),
    (exec_("sh", "-c", "sleep 15"), 15),
    (exec_("/bin/sh", "-c", "echo bye; sleep 5 && sleep 2"), 7),
    (exec_("sh", "-c", "exec lameduck prestop --drain-timeout=20s --lb-buffer 3s"), 23),
    (exec_("lameduck", "prestop", "--drain-timeout", "12s"),
     12 + PRESTOP_DEFAULTS["--lb-buffer"]),
    (exec_("lameduck", "prestop"), sum(PRESTOP_DEFAULTS.values())),
    ({"sleep": {"seconds": 9}}, 9),
    ({"httpGet": {"path": "/drain", "port": 9901}}, 0),
])
def test_prestop_forms(hook: dict[str, Any], seconds: float) -> None:
    t = pod_timers(pod(hook))
    assert t.prestop.seconds == seconds
    assert t.grace_period == 60 and t.container == "lameduck"


def test_httpget_and_unknown_shell_commands_get_a_note() -> None:
    assert "--prestop" in pod_timers(pod({"httpGet": {"port": 1}})).prestop.notes[0]
    t = pod_timers(pod(exec_("sh", "-c", "curl -X POST localhost:9901/x; sleep 3")))
    assert t.prestop.seconds == 3 and "`curl` counted as 0s" in t.prestop.notes[0]


def test_deployment_and_defaults() -> None:
    p = pod(exec_("sleep", "5"), grace=None)
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "spec": {"replicas": 2, "template": {"spec": p["spec"]}}}
    t = pod_timers(dep)
    assert (t.grace_period, t.prestop.seconds) == (30, 5)  # Kubernetes' default grace


def test_container_choice() -> None:
    app = {"name": "app", "lifecycle": {"preStop": exec_("sleep", "3")}}
    # No container named lameduck: the first one with a preStop.
    assert pod_timers(pod(None, name="side", extra=[app])).prestop.seconds == 3
    # Named lameduck wins; --container overrides.
    assert pod_timers(pod(exec_("sleep", "8"), extra=[app])).prestop.seconds == 8
    assert pod_timers(pod(exec_("sleep", "8"), extra=[app]), "app").prestop.seconds == 3
    none = pod_timers(pod(None, name="side"))
    assert none.prestop.seconds == 0 and none.container is None and none.notes


@pytest.mark.parametrize(("doc", "words"), [
    ("text", "expected a YAML mapping"),
    ({"kind": "Pod"}, "spec: missing"),
    ({"kind": "Service", "spec": {}}, "kind: 'Service' has no pod spec"),
    ({"kind": "Deployment", "spec": {"template": {}}}, "spec.template.spec: missing"),
    (pod(grace="60s"), "spec.terminationGracePeriodSeconds: expected a whole number"),
    (pod(grace=-1), "terminationGracePeriodSeconds"),
    ({"kind": "Pod", "spec": {"containers": []}}, "spec.containers: missing or empty"),
    (pod(exec_("sleep", "soon")), "cannot read `sleep soon`"),
    (pod(exec_("sleep")), "`sleep` without a duration"),
    (pod(exec_("/app/drain")), "containers[0].lifecycle.preStop.exec.command: cannot tell"),
    (pod({"exec": {"command": "sleep 5"}}), "exec.command: expected a list of strings"),
    (pod({"sleep": {"seconds": "5"}}), "preStop.sleep.seconds"),
    (pod(exec_("lameduck", "prestop", "--drain-timeout", "soon")), "--drain-timeout"),
])
def test_pod_errors_name_the_field(doc: Any, words: str) -> None:
    with pytest.raises(BudgetError) as e:
        pod_timers(doc)
    assert words in str(e.value)


def test_unknown_container_is_named() -> None:
    with pytest.raises(BudgetError, match="no container named 'nope'"):
        pod_timers(pod(exec_("sleep", "1")), "nope")


# --- from a config -------------------------------------------------------------------------------

CFG = """
drain: {time: 5s}
shutdown: {deadline: 10s, stop_accepting: immediately}
listeners:
  - {name: a, address: 127.0.0.1:10000, idle_timeout: 75s,
     routes: [{prefix: /, cluster: c, timeout: 5s}, {prefix: /up, cluster: c, timeout: 8s}]}
  - {name: b, address: 127.0.0.1:10001, idle_timeout: 0s,
     routes: [{cluster: c, timeout: 15s}]}
clusters: [{name: c, endpoints: [127.0.0.1:8080]}]
"""


def test_budget_from_config() -> None:
    cfg = load_config_text(CFG)
    b = budget_from(cfg, pod_timers(pod(exec_("sleep", "55"))), lb_idle=60)
    assert (b.grace_period, b.prestop, b.drain_time, b.shutdown_deadline) == (60, 55, 5, 10)
    assert b.max_request == 15  # the longest route timeout, listener b's
    assert b.listener_idle == 75  # 0s is no limit
    assert not b.accept_until_drain_end
    assert budget_from(cfg, pod_timers(pod()), max_request=2, prestop=1).prestop == 1


def test_unbounded_route_needs_max_request() -> None:
    cfg = load_config_text(CFG.replace("timeout: 8s", "timeout: 0s"))
    with pytest.raises(BudgetError, match=r"listeners\[0\]\.routes\[1\]\.timeout.*--max-request"):
        budget_from(cfg, pod_timers(pod()))


def test_proposal_snippets() -> None:
    cfg = load_config_text(CFG)
    old = budget_from(cfg, pod_timers(pod(exec_("sleep", "1"), grace=30)), lb_idle=80,
                      client_idle=30)
    p = proposal(cfg, old, solve(old))
    # 1s hook + 11s of LB detection inside a 25s deadline + 5s margin. min_drain stays unset:
    # accepting until drain.time, lameduck then serves until it.
    assert p["pod"] == {"spec": {"terminationGracePeriodSeconds": 31}}
    assert p["lameduck"]["shutdown"] == {"deadline": "25s", "stop_accepting": "at_drain_end"}
    assert p["lameduck"]["drain"] == {"time": "10s"}
    assert p["lameduck"]["listeners"] == [{"name": "a", "idle_timeout": "81s"}]
    assert "load_balancer" not in p


# --- balancer presets (orchestrate/lbpresets.py) --------------------------------------------------


def test_presets_carry_the_vendors_defaults_with_their_sources() -> None:
    from lameduck.orchestrate.lbpresets import LB_PRESETS

    got = {name: (p.interval, p.fall, p.rise, p.deregistration_delay)
           for name, p in LB_PRESETS.items()}
    assert got == {
        "haproxy": (2.0, 3, 2, None),  # inter 2000 ms, fall 3, rise 2
        "envoy": (None, 1, None, None),  # interval REQUIRED; a 503 fails a host at once
        "aws-alb": (30.0, 2, 5, 300.0),  # CreateTargetGroup and TargetGroupAttribute defaults
        "aws-nlb": (30.0, 2, 5, 300.0),
        "kube-proxy": (0.0, 1, None, None),  # no health check, no documented bound
    }
    for p in LB_PRESETS.values():
        assert p.sources and all(s.startswith("https://") for s in p.sources), p.name
    assert any("connection_termination" in n for n in LB_PRESETS["aws-nlb"].notes)
    assert any("--lb-buffer" in n for n in LB_PRESETS["kube-proxy"].notes)


def test_preset_values_give_way_to_flags() -> None:
    from lameduck.orchestrate.lbpresets import lb_settings

    # no preset: budget's defaults before presets (HAProxy's), and no deregistration delay
    assert lb_settings(None) == ({"lb_interval": 2.0, "lb_fall": 3, "lb_rise": 2}, None)
    assert lb_settings("aws-alb") == ({"lb_interval": 30.0, "lb_fall": 2, "lb_rise": 5}, 300.0)
    assert lb_settings("aws-alb", interval=10, deregistration_delay=30) == (
        {"lb_interval": 10, "lb_fall": 2, "lb_rise": 5}, 30)
    assert lb_settings("envoy", interval=5) == ({"lb_interval": 5, "lb_fall": 1,
                                                 "lb_rise": 2}, None)
    with pytest.raises(BudgetError, match=r"--lb envoy: .*no default.*--lb-interval"):
        lb_settings("envoy")
    with pytest.raises(BudgetError, match="'f5' is not one of"):
        lb_settings("f5")


def test_alb_defaults_need_a_longer_hold_than_the_kubernetes_example() -> None:
    """30 s x 2 failures + 5 s buffer = 65 s of detection: a 20 s preStop and a 15 s drain do
    not hold that long."""
    from lameduck.orchestrate.lbpresets import lb_settings

    lb, _ = lb_settings("aws-alb")
    b = replace(GOOD, **lb)
    assert b.lb_detection == 60
    assert broken(b) == ["lb-detection"]
    assert broken(replace(GOOD, **lb_settings("kube-proxy")[0])) == []


def test_deregistration_delay_longer_than_the_grace_period_is_warned_with_both_numbers() -> None:
    from lameduck.orchestrate.lbpresets import deregistration_warning

    w = deregistration_warning(300, 45, "aws-alb")
    assert w is not None
    assert w.startswith("aws-alb deregistration delay (300s) outlives the pod's "
                        "terminationGracePeriodSeconds (45s)")
    assert "SIGKILL" in w
    assert deregistration_warning(45, 45) is None  # drained by the time the kubelet kills
    assert deregistration_warning(None, 45) is None  # a balancer without a delay
    assert "(2.5s)" in (deregistration_warning(2.5, 1) or "")

def test_leave_confirm_counts_lb_buffer_as_the_bound() -> None:
    t = pod_timers(pod(exec_("lameduck", "prestop", "--leave", "confirm", "--lb-buffer", "30s",
                             "--drain-timeout", "5s")))
    assert t.prestop.seconds == 35
    assert "--leave confirm (--lb-buffer counted: the bound)" in t.prestop.source


def test_prestop_leave_is_read_as_the_command_reads_it() -> None:
    """The hook's --leave has the command's choices (the one Leave enum): --leave=confirm is
    confirm, and a value the command would refuse is refused here, not taken for timer."""
    t = pod_timers(pod(exec_("lameduck", "prestop", "--leave=confirm", "--lb-buffer=30s")))
    assert "--leave confirm" in t.prestop.source
    t = pod_timers(pod(exec_("lameduck", "prestop", "--leave", "timer")))
    assert "--leave" not in t.prestop.source
    with pytest.raises(BudgetError, match=r"--leave: 'confirmed' is not one of timer, confirm"):
        pod_timers(pod(exec_("lameduck", "prestop", "--leave", "confirmed")))


def test_confirmed_leaves_from_the_drain_reports(tmp_path: Any) -> None:
    import json

    from lameduck.orchestrate.budget import confirmed_leaves

    for i, leave in enumerate([{"by": "prestop", "bound": 30.0, "confirmed_after": 0.8},
                               None,
                               {"by": "shutdown", "bound": 20.0, "confirmed_after": None}]):
        report: dict[str, Any] = {"version": 1}
        if leave is not None:
            report["leave"] = leave
        (tmp_path / f"drain-2026120{i}T000000Z-1.json").write_text(json.dumps(report))
    (tmp_path / "drain-20261209T000000Z-1.json").write_text("{not json")
    got = confirmed_leaves(str(tmp_path))
    assert [(g["by"], g["confirmed_after"]) for g in got] == [("shutdown", None),
                                                             ("prestop", 0.8)]
    assert confirmed_leaves(str(tmp_path / "none")) == []


def test_idle_close_on_response_needs_the_deadline_at_t_plus_g() -> None:
    """drain.idle_close: on_response keeps idle connections until T + G: the deadline must
    not come before (it would close them untold); immediate adds no link."""
    assert "idle-close" not in by_name(replace(GOOD, connection_grace=25))
    b = replace(GOOD, idle_close_on_response=True, connection_grace=5)
    q = by_name(b)["idle-close"]
    assert list(by_name(b)) == ["grace", "keepalive-client", "keepalive-lb", "deadline",
                                "idle-close", "lb-detection"]
    assert (q.lhs, q.rhs, q.holds) == (15, 30, True)
    b = replace(b, connection_grace=20.5)  # T + G = 30.5 > D = 30
    assert broken(b) == ["idle-close"]
    assert by_name(b)["idle-close"].line() == (
        "FAIL idle-close: drain.time (10s) + drain.connection_grace (20.5s) = 30.5s <= "
        "shutdown.deadline (30s)")
    s = solve(b)
    assert broken(s) == [] and s.shutdown_deadline == 30.5
    assert s.grace_period == math.ceil(5 + 30.5 + 5)


def test_budget_from_config_reads_idle_close() -> None:
    cfg = load_config_text(CFG.replace(
        "drain: {time: 5s}",
        "drain: {time: 5s, connection_grace: 6s, idle_close: on_response}"))
    b = budget_from(cfg, pod_timers(pod()), max_request=2)
    assert b.idle_close_on_response and b.connection_grace == 6
    assert "idle-close" in broken(b)  # 5s + 6s > the 10s deadline
    assert not budget_from(load_config_text(CFG), pod_timers(pod()),
                           max_request=2).idle_close_on_response
