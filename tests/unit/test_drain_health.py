"""Endpoint health: HAProxy rise/fall checks, agent-check replies, Envoy outlier ejection, on a
fake clock (plain floats)."""

from __future__ import annotations

import pytest

from lameduck.drain.endpoint import AdminState
from lameduck.drain.health import (
    AgentReport,
    HealthCheck,
    OutlierDetector,
    agent_weight,
    parse_agent,
)

# --------------------------------------------------------------------------- rise / fall


def test_fall_consecutive_failures_make_it_unhealthy() -> None:
    hc = HealthCheck(rise=2, fall=3)
    assert [hc.failure(), hc.failure()] == [False, False]
    assert hc.healthy
    assert hc.failure() is True
    assert not hc.healthy
    assert hc.failure() is False  # already down: no change


def test_a_success_resets_the_failure_streak() -> None:
    hc = HealthCheck(rise=2, fall=3)
    hc.failure()
    hc.failure()
    assert hc.success() is False  # healthy stays healthy
    assert [hc.failure(), hc.failure()] == [False, False]
    assert hc.healthy
    assert hc.failure() is True


def test_rise_consecutive_successes_make_it_healthy() -> None:
    hc = HealthCheck(rise=3, fall=1, healthy=False)
    assert [hc.success(), hc.success()] == [False, False]
    assert not hc.healthy
    assert hc.success() is True
    assert hc.healthy
    assert hc.success() is False


def test_a_failure_resets_the_success_streak() -> None:
    hc = HealthCheck(rise=2, fall=5, healthy=False)
    hc.success()
    assert hc.failure() is False
    assert hc.success() is False
    assert not hc.healthy
    assert hc.success() is True


def test_after_a_transition_the_streak_starts_over() -> None:
    hc = HealthCheck(rise=2, fall=2)
    hc.failure()
    assert hc.failure() is True
    assert hc.success() is False  # the failures that took it down do not count towards rise
    assert hc.success() is True
    assert hc.failure() is False  # nor the successes towards fall
    assert hc.failure() is True


def test_rise_and_fall_of_one_flip_at_once() -> None:
    hc = HealthCheck(rise=1, fall=1)
    assert hc.failure() is True
    assert hc.success() is True


def test_immediate_failure_skips_fall() -> None:
    hc = HealthCheck(rise=2, fall=10)
    assert hc.failure(immediate=True) is True
    assert not hc.healthy
    assert hc.failure(immediate=True) is False  # already down


@pytest.mark.parametrize(("rise", "fall"), [(0, 1), (1, 0), (-1, 3)])
def test_rise_and_fall_must_be_positive(rise: int, fall: int) -> None:
    with pytest.raises(ValueError):
        HealthCheck(rise, fall)


# --------------------------------------------------------------------------- agent check


@pytest.mark.parametrize(
    ("line", "admin"),
    [("ready", AdminState.READY), ("drain", AdminState.DRAIN), ("maint", AdminState.MAINT)],
)
def test_admin_words(line: str, admin: AdminState) -> None:
    assert parse_agent(line) == AgentReport(admin=admin)


@pytest.mark.parametrize(
    ("line", "up"),
    [("up", True), ("down", False), ("fail", False), ("failed", False), ("stopped", False)],
)
def test_health_words(line: str, up: bool) -> None:
    assert parse_agent(line) == AgentReport(up=up)


def test_weight_and_maxconn_words() -> None:
    assert parse_agent("75%") == AgentReport(weight_percent=75)
    assert parse_agent("weight:75%") == AgentReport(weight_percent=75)
    assert parse_agent("0%") == AgentReport(weight_percent=0)
    assert parse_agent("150%") == AgentReport(weight_percent=150)  # HAProxy: relative, not capped
    assert parse_agent("99999999%") == AgentReport(weight_percent=25600)
    assert parse_agent("maxconn:30") == AgentReport(maxconn=30)
    assert parse_agent("maxconn:0") == AgentReport(maxconn=0)


def test_a_combined_line() -> None:
    assert parse_agent(b"drain 50%,maxconn:10 # deploy\r\n") == AgentReport(
        admin=AdminState.DRAIN, weight_percent=50, maxconn=10, description="deploy"
    )
    assert parse_agent("75%,maxconn:30,maint,down\n") == AgentReport(
        admin=AdminState.MAINT, up=False, weight_percent=75, maxconn=30
    )


def test_case_insensitive() -> None:
    assert parse_agent("DRAIN Up MaxConn:7 WEIGHT:20%") == AgentReport(
        admin=AdminState.DRAIN, up=True, weight_percent=20, maxconn=7
    )


def test_separators_spaces_tabs_commas_in_any_run() -> None:
    assert parse_agent(" ,\tready,, \t10%\t") == AgentReport(
        admin=AdminState.READY, weight_percent=10
    )


def test_the_last_word_of_a_kind_wins() -> None:
    assert parse_agent("drain ready 10% 20% maxconn:1 maxconn:2 down up") == AgentReport(
        admin=AdminState.READY, up=True, weight_percent=20, maxconn=2
    )


def test_the_line_ends_at_the_first_cr_or_lf() -> None:
    assert parse_agent("drain\r\nmaint") == AgentReport(admin=AdminState.DRAIN)
    assert parse_agent("drain\nmaint\r\n") == AgentReport(admin=AdminState.DRAIN)
    assert parse_agent(b"up\r") == AgentReport(up=True)


def test_description_after_a_sharp() -> None:
    assert parse_agent("down #  disk full, sorry") == AgentReport(
        up=False, description="disk full, sorry"
    )
    assert parse_agent("maint,#deploy 42") == AgentReport(
        admin=AdminState.MAINT, description="deploy 42"
    )
    # words after the sharp are description, not commands
    assert parse_agent("# drain maint") == AgentReport(description="drain maint")
    assert parse_agent("#") == AgentReport()
    # a sharp inside a word does not start a description
    assert parse_agent("up#x") == AgentReport(unknown=("up#x",))


def test_unknown_words_are_listed_and_ignored() -> None:
    r = parse_agent("hello drain 75%x maxconn:-1 maxconn: -5% % weight:% maxconn:3x upp 7")
    assert r.admin is AdminState.DRAIN
    assert (r.up, r.weight_percent, r.maxconn) == (None, None, None)
    assert r.unknown == (
        "hello",
        "75%x",
        "maxconn:-1",
        "maxconn:",
        "-5%",
        "%",
        "weight:%",
        "maxconn:3x",
        "upp",
        "7",
    )


def test_a_line_without_a_known_word_is_still_a_report() -> None:
    assert parse_agent("") == AgentReport()
    assert parse_agent(b"\r\n") == AgentReport()
    assert parse_agent("  ,, ") == AgentReport()
    assert parse_agent("junk") == AgentReport(unknown=("junk",))


def test_bytes_that_are_not_utf8_do_not_raise() -> None:
    r = parse_agent(b"drain \xff\xfe # caf\xc3\xa9")
    assert r.admin is AdminState.DRAIN
    assert r.description == "café"
    assert len(r.unknown) == 1


def test_agent_weight_is_haproxys_scaled_and_capped_weight() -> None:
    assert agent_weight(100, 75) == 75
    assert agent_weight(10, 33) == 3  # integer division
    assert agent_weight(200, 150) == 256  # capped at 256
    assert agent_weight(1, 0) == 0
    assert agent_weight(1, 100) == 1
    assert agent_weight(1, 50) == 1  # a nonzero percent never rounds an endpoint out
    assert agent_weight(4, 1) == 1


# --------------------------------------------------------------------------- outlier detection

BASE = 30.0
MAX = 300.0


def detector(
    c5xx: int = 5, cgw: int = 0, pct: int = 100, n_hosts: int = 10, **kw: object
) -> OutlierDetector[str]:
    od: OutlierDetector[str] = OutlierDetector(c5xx, cgw, BASE, MAX, pct, **kw)  # type: ignore[arg-type]
    for i in range(n_hosts):
        od.add(f"h{i}")
    return od


def fail(
    od: OutlierDetector[str], host: str, n: int, now: float, gateway: bool = False
) -> list[bool]:
    return [od.failure(host, now, gateway) for _ in range(n)]


def test_consecutive_5xx_ejects_on_the_nth() -> None:
    od = detector(c5xx=3)
    assert fail(od, "h0", 3, 0.0) == [False, False, True]
    assert od.is_ejected("h0")
    assert not od.is_ejected("h1")
    assert od.ejections_active == 1
    assert od.ejections_enforced_total == 1
    assert od.ejections_detected_consecutive_5xx == 1
    assert od.ejections_enforced_consecutive_5xx == 1
    assert od.ejections_detected_consecutive_gateway_failure == 0


def test_a_success_resets_the_streaks() -> None:
    od = detector(c5xx=3, cgw=3)
    fail(od, "h0", 2, 0.0, gateway=True)
    od.success("h0", 0.0)
    assert fail(od, "h0", 2, 0.0, gateway=True) == [False, False]
    assert not od.is_ejected("h0")
    assert od.failure("h0", 0.0, gateway=True) is True


def test_gateway_detector_counts_gateway_failures_only() -> None:
    od = detector(c5xx=0, cgw=3)
    # a plain 5xx breaks the gateway streak (Envoy), even with the 5xx detector off
    fail(od, "h0", 2, 0.0, gateway=True)
    assert od.failure("h0", 0.0, gateway=False) is False
    assert fail(od, "h0", 2, 0.0, gateway=True) == [False, False]
    assert od.failure("h0", 0.0, gateway=True) is True
    assert od.ejections_detected_consecutive_gateway_failure == 1
    assert od.ejections_enforced_consecutive_gateway_failure == 1
    assert od.ejections_enforced_consecutive_5xx == 0


def test_gateway_failures_also_count_as_5xx() -> None:
    od = detector(c5xx=3, cgw=0)
    assert fail(od, "h0", 3, 0.0, gateway=True) == [False, False, True]
    assert od.ejections_enforced_consecutive_5xx == 1


def test_gateway_detector_wins_when_both_trigger() -> None:
    od = detector(c5xx=2, cgw=2)
    assert fail(od, "h0", 2, 0.0, gateway=True) == [False, True]
    assert od.ejections_detected_consecutive_gateway_failure == 1
    assert od.ejections_detected_consecutive_5xx == 0  # already ejected: not detected again
    assert od.ejections_enforced_total == 1


def test_zero_counts_disable_detection() -> None:
    od = detector(c5xx=0, cgw=0)
    assert not any(fail(od, "h0", 100, 0.0, gateway=True))
    assert od.ejections_enforced_total == 0


def test_failures_of_an_ejected_host_do_nothing() -> None:
    od = detector(c5xx=1)
    assert od.failure("h0", 0.0, False) is True
    assert fail(od, "h0", 5, 1.0) == [False] * 5
    assert od.ejections_detected_consecutive_5xx == 1
    assert od.next_uneject() == BASE  # not extended


def test_unknown_hosts_are_ignored() -> None:
    od = detector(c5xx=1)
    assert od.failure("nope", 0.0, True) is False
    od.success("nope", 0.0)
    assert not od.is_ejected("nope")


def test_uneject_timing() -> None:
    od = detector(c5xx=1)
    od.failure("h0", 10.0, False)
    assert od.next_uneject() == 10.0 + BASE
    assert od.uneject_due(10.0 + BASE - 0.001) == []
    assert od.is_ejected("h0")
    assert od.uneject_due(10.0 + BASE) == ["h0"]
    assert not od.is_ejected("h0")
    assert od.ejections_active == 0
    assert od.next_uneject() is None
    assert od.uneject_due(1000.0) == []


def test_uneject_due_returns_earliest_first_and_only_the_due() -> None:
    od = detector(c5xx=1)
    od.failure("h2", 5.0, False)
    od.failure("h1", 0.0, False)
    od.failure("h3", 50.0, False)
    assert od.next_uneject() == BASE
    assert od.uneject_due(5.0 + BASE) == ["h1", "h2"]
    assert od.is_ejected("h3")
    assert od.next_uneject() == 50.0 + BASE


def test_unejection_resets_the_streaks() -> None:
    od = detector(c5xx=3, cgw=2)
    assert fail(od, "h0", 2, 0.0, gateway=True) == [False, True]  # the 5xx streak is at 2
    od.uneject_due(BASE)
    assert fail(od, "h0", 2, BASE) == [False, False]  # it was reset: 2 more are not enough
    assert od.failure("h0", BASE, False) is True


def eject_cycle(od: OutlierDetector[str], host: str, at: float) -> float:
    """Eject ``host`` at ``at`` (c5xx=1), return the ejection length, and uneject it."""
    assert od.failure(host, at, False) is True
    until = od.next_uneject()
    assert until is not None
    assert od.uneject_due(until) == [host]
    return until - at


def test_ejection_time_grows_with_the_multiplier_and_is_capped() -> None:
    od = detector(c5xx=1)
    t = 0.0
    lengths = []
    for _ in range(12):
        length = eject_cycle(od, "h0", t)
        lengths.append(length)
        t += length  # fails again the moment it is back: no time to decay
    assert lengths == [BASE * k for k in range(1, 11)] + [MAX, MAX]


def test_the_multiplier_decays_one_per_base_time_not_ejected() -> None:
    od = detector(c5xx=1)
    t = 0.0
    for _ in range(3):  # k = 1, 2, 3
        t += eject_cycle(od, "h0", t)
    # healthy for 2 whole base periods (and a bit): k 3 → 1, then +1 → 2
    assert eject_cycle(od, "h0", t + 2 * BASE + 1.0) == 2 * BASE
    t = t + 2 * BASE + 1.0 + 2 * BASE
    # just under one base period: no decay, k 2 → 3
    assert eject_cycle(od, "h0", t + BASE - 0.5) == 3 * BASE


def test_decay_counts_from_the_end_of_the_ejection_however_late_uneject_is_called() -> None:
    od = detector(c5xx=1)
    t = eject_cycle(od, "h0", 0.0)  # k = 1, back at 30
    assert od.failure("h0", t, False) is True  # k = 2, until 90
    assert od.uneject_due(t + 2 * BASE + 2 * BASE) == ["h0"]  # told 60 s late
    # healthy since 90, not since 150: two periods decay k 2 → 0, then +1
    assert od.failure("h0", t + 4 * BASE, False) is True
    assert od.next_uneject() == t + 4 * BASE + BASE


def test_the_multiplier_never_decays_below_zero() -> None:
    od = detector(c5xx=1)
    t = eject_cycle(od, "h0", 0.0)
    assert eject_cycle(od, "h0", t + 100 * BASE) == BASE


def test_the_multiplier_cap_bounds_the_decay_time() -> None:
    od = detector(c5xx=1)
    t = 0.0
    for _ in range(50):  # k stops at 11 (k * base < max + base)
        t += eject_cycle(od, "h0", t)
    # 11 → 1 after ten base periods: the next ejection is 2 * base, not 41 * base
    assert eject_cycle(od, "h0", t + 10 * BASE) == 2 * BASE


def test_max_ejection_percent_refuses_and_counts_overflow() -> None:
    od = detector(c5xx=1, pct=20, n_hosts=10, always_eject_one_host=False)
    assert od.failure("h0", 0.0, False) is True  # 10% <= 20%
    assert od.failure("h1", 0.0, False) is True  # 20% <= 20%
    assert od.failure("h2", 0.0, False) is False  # 30% > 20%
    assert not od.is_ejected("h2")
    assert od.ejections_overflow == 1
    assert od.ejections_detected_consecutive_5xx == 3
    assert od.ejections_enforced_consecutive_5xx == 2
    assert od.ejections_active == 2


def test_at_least_one_host_may_always_be_ejected() -> None:
    od = detector(c5xx=1, pct=10, n_hosts=3)  # 1/3 > 10%, but none is ejected yet
    assert od.failure("h0", 0.0, False) is True
    assert od.failure("h1", 0.0, False) is False
    assert od.ejections_overflow == 1
    od.uneject_due(BASE)
    assert od.failure("h1", BASE, False) is True  # the only ejection again


def test_without_the_one_host_rule_a_small_percent_ejects_nothing() -> None:
    od = detector(c5xx=1, pct=10, n_hosts=3, always_eject_one_host=False)
    assert od.failure("h0", 0.0, False) is False
    assert od.ejections_overflow == 1
    od0 = detector(c5xx=1, pct=0, n_hosts=1)
    assert od0.failure("h0", 0.0, False) is True  # the rule beats even 0%


def test_an_overflowed_detection_resets_its_streak() -> None:
    od = detector(c5xx=2, pct=10, n_hosts=2, always_eject_one_host=False)
    assert fail(od, "h0", 2, 0.0) == [False, False]
    assert od.ejections_overflow == 1
    assert od.failure("h0", 0.0, False) is False  # the streak starts over: 1 of 2
    assert od.ejections_overflow == 1


def test_an_overflowed_gateway_detection_resets_its_streak() -> None:
    od = detector(c5xx=0, cgw=2, pct=10, n_hosts=2, always_eject_one_host=False)
    assert fail(od, "h0", 3, 0.0, gateway=True) == [False, False, False]
    assert od.ejections_detected_consecutive_gateway_failure == 1  # the 3rd is 1 of 2 again
    assert od.failure("h0", 0.0, True) is False
    assert od.ejections_detected_consecutive_gateway_failure == 2
    assert od.ejections_overflow == 2


def test_remove_and_add_change_the_percentage_base() -> None:
    od = detector(c5xx=1, pct=50, n_hosts=2, always_eject_one_host=False)
    assert od.failure("h0", 0.0, False) is True
    assert od.failure("h1", 0.0, False) is False  # 2/2 > 50%
    od.add("h2")
    od.add("h3")
    assert len(od) == 4
    assert od.failure("h1", 0.0, False) is True  # 2/4
    od.remove("h0")  # ejected and removed: no longer counted
    assert od.ejections_active == 1
    assert not od.is_ejected("h0")
    assert od.uneject_due(1000.0) == ["h1"]
    od.remove("h0")  # twice is harmless
    assert od.ejections_active == 0


@pytest.mark.parametrize(
    "args",
    [
        (-1, 0, BASE, MAX, 10),
        (0, -1, BASE, MAX, 10),
        (5, 5, 0.0, MAX, 10),
        (5, 5, BASE, BASE - 1, 10),
        (5, 5, BASE, MAX, 101),
        (5, 5, BASE, MAX, -1),
    ],
)
def test_detector_config_is_validated(args: tuple[int, int, float, float, int]) -> None:
    with pytest.raises(ValueError):
        OutlierDetector(*args)
