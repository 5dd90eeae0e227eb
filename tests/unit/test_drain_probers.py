"""The confirm leave rule on a fake clock: probers, their falls, and the traffic that must stop."""

from __future__ import annotations

import pytest

from lameduck.drain.prestop import Leave, Prestop, PrestopAction, PrestopState, PrestopStrategy
from lameduck.drain.probers import GONE_INTERVALS, ProbeSettings, ProbeTracker, combine
from lameduck.server.views import prestop_view

LB = "10.0.0.9"
CLIENT = "10.0.0.7"


def probes(t: ProbeTracker, addr: str, times: list[float], status: int,
           new_cx: bool = True) -> None:
    """Probes at ``times``, each on a new connection (HAProxy's httpchk) unless ``new_cx``."""
    for at in times:
        if new_cx:
            t.connection(at, addr)
        t.probe(at, addr, status)


def test_a_single_balancer_is_confirmed_right_after_its_fall_th_failing_answer() -> None:
    t = ProbeTracker(ProbeSettings(fall=3))
    probes(t, LB, [0.0, 1.0, 2.0], 200)
    for at in (0.2, 0.5, 1.5, 2.5):  # it forwards traffic while we are up
        t.connection(at, LB)
        t.request(at, LB)
    t.mark(3.0)
    probes(t, LB, [3.0, 4.0], 503)
    e = t.evidence(4.5)
    assert not e.confirmed
    assert e.detail == f"prober {LB} has 2/3 failing answers"
    probes(t, LB, [5.0], 503)
    e = t.evidence(5.0)
    assert e.confirmed, e.detail
    assert e.detail == f"prober {LB} fell at +2.000s (3/3 failing)"
    # its later probes on new connections are probes, not traffic
    probes(t, LB, [6.0, 7.0], 503)
    assert t.evidence(7.0).confirmed


def test_probes_at_irregular_spacing_learn_the_median_interval() -> None:
    t = ProbeTracker()
    # spread-checks / interval_jitter around 1 s, and one late probe
    probes(t, LB, [0.0, 1.1, 1.9, 3.0, 4.2, 4.9, 6.0, 9.0], 200)
    p = t.probers[LB]
    assert p.learned() == pytest.approx(1.1)  # median of .7 .8 1.1 1.1 1.1 1.2 3.0
    assert t.quiet(9.0) == pytest.approx(2.2)
    configured = ProbeTracker(ProbeSettings(interval=5.0, quiet=0.5))
    probes(configured, LB, [0.0, 1.0, 2.0], 200)
    assert configured.interval(configured.probers[LB]) == 5.0
    assert configured.quiet(2.0) == 0.5


def test_traffic_from_the_prober_after_it_fell_is_waited_out_for_half_an_interval() -> None:
    t = ProbeTracker(ProbeSettings(fall=2, interval=1.0))  # quiet (a stranger's): 2 s
    probes(t, LB, [0.0, 1.0], 503)
    t.connection(1.1, LB)
    t.request(1.1, LB)  # a straggler: dispatched before the balancer marked us down
    e = t.evidence(1.2)
    assert not e.confirmed and e.next_change == pytest.approx(1.6)
    assert e.detail.startswith(f"still arriving from {LB} (1 request, ")
    t.request(1.5, LB)  # and another: still sending, so waited out again
    assert not t.evidence(1.7).confirmed
    assert t.evidence(2.0).confirmed


def test_a_client_that_never_probed_must_be_quiet() -> None:
    t = ProbeTracker(ProbeSettings(fall=1, quiet=3.0))
    probes(t, LB, [0.0, 1.0], 200)
    t.mark(1.5)
    t.connection(1.6, CLIENT)
    for at in (1.6, 1.7, 1.8):
        t.request(at, CLIENT)
    probes(t, LB, [2.0], 503)
    e = t.evidence(2.0)
    assert not e.confirmed
    assert e.detail == f"still arriving from {CLIENT} (3 requests, 1 connection)"
    assert e.next_change == pytest.approx(4.8)
    assert t.evidence(4.8).confirmed


def test_traffic_that_never_stops_leaves_it_to_the_bound() -> None:
    t = ProbeTracker(ProbeSettings(fall=3))
    p = Prestop(PrestopStrategy.HOLD_HEALTH, 10.0, 6.0, leave=Leave.CONFIRM)
    p.start(0.0)
    assert p.tick(0.0, 0) == [PrestopAction.FAIL_HEALTH]
    t.mark(0.0)
    probes(t, LB, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 503)
    at = 0.0
    while at < 6.0:
        t.connection(at, CLIENT)
        t.request(at, CLIENT)
        assert p.tick(at, 0, t.evidence(at)) == []
        at += 0.25
    p.tick(6.0, 0, t.evidence(6.0))
    assert p.done and p.confirmed_after is None
    assert p.transitions[-1].reason == (
        "lb_buffer elapsed before the LB was seen to stop: still arriving from "
        f"{CLIENT} (24 requests, 24 connections)")


def test_a_second_prober_not_yet_fallen_is_waited_for_and_named() -> None:
    other = "10.0.1.4"
    t = ProbeTracker(ProbeSettings(fall=3))
    probes(t, LB, [0.0, 1.0, 2.0], 503)
    probes(t, other, [0.0, 2.0], 200)  # a slower balancer, every 2 s
    probes(t, other, [4.0], 503)
    e = t.evidence(4.0)
    assert not e.confirmed
    assert e.detail == f"prober {other} has 1/3 failing answers"
    assert e.awaited == (f"prober {other} has 1/3 failing answers",)
    p = Prestop(PrestopStrategy.HOLD_HEALTH, 1.0, 5.0, leave=Leave.CONFIRM)
    p.start(0.0)
    p.tick(0.0, 0)
    assert p.tick(4.0, 0, e) == [] and p.awaited == e.awaited
    p.tick(5.0, 0, t.evidence(5.0))  # the bound wins, naming it
    assert p.transitions[-1].reason.endswith(f"prober {other} has 1/3 failing answers")
    assert p.done and p.awaited == ()  # CLOSING is over: nothing is awaited any more
    assert prestop_view(p, 5.0, 0)["awaiting"] == []
    # had it fallen in time, confirmed
    probes(t, other, [6.0, 8.0], 503)
    assert t.evidence(8.0).confirmed


def test_a_prober_that_disappears_is_no_longer_awaited() -> None:
    other = "10.0.1.4"
    t = ProbeTracker(ProbeSettings(fall=2))
    probes(t, LB, [0.0, 1.0, 2.0, 3.0], 200)
    probes(t, other, [0.0, 1.0, 2.0], 200)  # then it stops probing: removed us from its pool
    probes(t, LB, [3.5, 4.0], 503)
    e = t.evidence(4.0)
    assert not e.confirmed and e.detail == f"prober {other} has 0/2 failing answers"
    gone_at = 2.0 + GONE_INTERVALS * 1.0
    assert e.next_change == pytest.approx(gone_at)
    assert t.newly_gone(gone_at - 0.01) == []
    e = t.evidence(gone_at)
    assert e.confirmed and f"prober {other} gone" in e.detail
    assert [p.addr for p in t.newly_gone(gone_at)] == [other]
    assert t.newly_gone(gone_at + 1) == []  # logged once


def test_no_prober_no_proof() -> None:
    t = ProbeTracker()
    t.connection(0.0, CLIENT)
    e = t.evidence(100.0)
    assert not e.confirmed and "no prober seen" in e.detail
    assert not combine(0.0, []).confirmed


def test_ipv6_peers() -> None:
    lb6, client6 = "2001:db8::9", "2001:db8::7"
    t = ProbeTracker(ProbeSettings(fall=1, quiet=1.0))
    probes(t, lb6, [0.0], 200)
    t.connection(0.5, client6)
    t.request(0.5, client6)
    probes(t, lb6, [1.0], 503)
    assert t.evidence(1.0).detail == f"still arriving from {client6} (1 request, 1 connection)"
    assert t.evidence(1.5).confirmed
    assert t.view(1.5)["probers"][0]["address"] == lb6  # type: ignore[index]


def test_max_peers_evicts_the_least_recent_and_still_counts_its_traffic() -> None:
    t = ProbeTracker(ProbeSettings(fall=1, quiet=2.0, max_peers=2))
    t.request(0.0, "10.0.0.1")
    t.request(1.0, "10.0.0.2")
    t.request(1.5, "10.0.0.1")  # most recent again
    t.request(2.0, "10.0.0.3")  # evicts 10.0.0.2
    assert list(t.talkers) == ["10.0.0.1", "10.0.0.3"] and t.evicted == 1
    assert t.evicted_last == 1.0
    t.probe(2.5, LB, 503)  # a prober evicts 10.0.0.1 from the talkers? no: its own table
    assert t.evicted == 1
    e = t.evidence(2.9)
    assert not e.confirmed and "evicted addresses (1 evicted)" in e.detail
    assert t.evidence(3.6).detail == "still arriving from 10.0.0.3 (1 request, 0 connections)"
    assert t.evidence(4.0).confirmed


def test_a_prober_that_recovers_must_fall_again() -> None:
    t = ProbeTracker(ProbeSettings(fall=2))
    probes(t, LB, [0.0, 1.0], 503)
    assert t.probers[LB].fell == 1.0
    probes(t, LB, [2.0], 200)  # healthcheck/ok: back in rotation
    assert t.probers[LB].fell is None and not t.evidence(2.0).confirmed
    probes(t, LB, [3.0, 4.0], 503)
    assert t.probers[LB].fell == 4.0 and t.evidence(4.0).confirmed


def test_combine_waits_for_every_listener() -> None:
    a, b = ProbeTracker(ProbeSettings(fall=1)), ProbeTracker(ProbeSettings(fall=1))
    a.probe(0.0, LB, 503)
    assert not combine(0.0, [a, b]).confirmed  # b has seen no prober
    b.probe(0.0, "10.0.2.2", 503)
    assert combine(0.0, [a, b]).confirmed


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        ProbeSettings(fall=0)
    with pytest.raises(ValueError):
        ProbeSettings(interval=0.0)


@pytest.mark.parametrize("strategy", list(PrestopStrategy))
def test_confirm_ends_closing_before_the_bound(strategy: PrestopStrategy) -> None:
    t = ProbeTracker(ProbeSettings(fall=3))
    probes(t, LB, [-3.0, -2.0, -1.0], 200)
    p = Prestop(strategy, drain_timeout=10.0, lb_buffer=30.0, leave=Leave.CONFIRM)
    p.start(0.0)
    if strategy is PrestopStrategy.HOLD_HEALTH:
        assert p.tick(0.5, 0) == [PrestopAction.FAIL_HEALTH]
    assert p.state is PrestopState.CLOSING
    t.mark(0.5)
    probes(t, LB, [1.0, 2.0], 503)
    assert p.tick(2.0, 0, t.evidence(2.0)) == []
    assert p.awaited == (f"prober {LB} has 2/3 failing answers",)
    probes(t, LB, [3.0], 503)
    out = p.tick(3.0, 0, t.evidence(3.0))
    assert p.done and out == ([] if strategy is PrestopStrategy.HOLD_HEALTH
                              else [PrestopAction.DRAIN_LISTENERS])
    closing_end = next(x for x in p.transitions if x.source is PrestopState.CLOSING)
    assert closing_end.at == 3.0
    assert closing_end.reason == (
        f"lb converged (confirm): prober {LB} fell at +2.500s (3/3 failing)")
    assert p.confirmed_after == pytest.approx(3.0 - p.closing_since)  # type: ignore[operator]


def test_timer_ignores_the_evidence() -> None:
    t = ProbeTracker(ProbeSettings(fall=1))
    t.probe(0.0, LB, 503)
    p = Prestop(PrestopStrategy.DEREGISTER_FIRST, 1.0, 5.0)
    p.start(0.0)
    assert p.tick(1.0, 0, t.evidence(1.0)) == [] and p.state is PrestopState.CLOSING


def test_shutdown_leave_confirm_min_drain_is_only_the_bound() -> None:
    """SIGTERM's not-ready phase: an idle process waits min_drain, unless the LB was seen to
    let go (``leave_step``)."""
    from lameduck.drain import Cause, LeaveStep, ProcessDrain, ShutdownSettings, Step
    from lameduck.drain.prestop import Leave

    pd = ProcessDrain(shutdown=ShutdownSettings(deadline=40.0, min_drain=30.0,
                                                leave=Leave.CONFIRM))
    pd.start_shutdown(0.0, Cause.SHUTDOWN)
    assert pd.shutdown_step(5.0, 0) is Step.WAIT
    t = ProbeTracker(ProbeSettings(fall=1))
    t.probe(4.0, LB, 503)
    assert pd.leave_step(5.0, t.evidence(5.0)) is LeaveStep.CONFIRMED
    assert pd.min_drain == 0.0
    assert pd.shutdown_step(5.0, 0) is Step.EXIT


def test_a_workers_journal_replayed_in_the_main_process_gives_the_same_verdict() -> None:
    """Workers report what their health-check paths saw every 100 ms; the main process
    replays every worker's batches into one tracker and decides on all of them."""
    w1, w2 = ProbeTracker(ProbeSettings(fall=3)), ProbeTracker(ProbeSettings(fall=3))
    w1.journal, w2.journal = [], []
    main = ProbeTracker(ProbeSettings(fall=3))
    assert w1.take_journal() is None
    # SO_REUSEPORT spreads the prober's connections over both workers
    for i, at in enumerate([0.0, 1.0, 2.0, 3.0]):
        w = w1 if i % 2 == 0 else w2
        w.connection(at, LB)
        w.probe(at, LB, 503 if at >= 1.0 else 200)
    for at in (0.5, 0.6, 2.2):
        w2.connection(at, CLIENT)
        w2.request(at, CLIENT)
    b1, b2 = w1.take_journal(), w2.take_journal()
    assert b1 is not None and b2 is not None
    assert ["c", CLIENT, 3, 2.2] in b2["traffic"] and ["r", CLIENT, 3, 2.2] in b2["traffic"]
    assert w2.journal == []
    main.replay(b2)
    main.replay(b1)  # out of order across workers: each probe keeps its own time
    assert main.probers[LB].probes == 4 and main.probers[LB].failing == 3
    assert main.probers[LB].fell == 3.0
    assert main.talkers[CLIENT].requests == 3
    e = main.evidence(3.0)
    assert main.interval(main.probers[LB]) == 1.0  # learned from all four, in time order
    assert not e.confirmed and CLIENT in e.detail  # quiet: two intervals from 2.2
    assert main.evidence(4.2).confirmed


def test_traffic_reported_late_but_older_than_the_fall_is_not_after_it() -> None:
    t = ProbeTracker(ProbeSettings(fall=1, quiet=1.0))
    t.probe(2.0, LB, 503)
    t.request(1.5, LB)  # a worker's report, older than the fall
    t.connection(1.5, LB)
    p = t.probers[LB]
    assert p.rq_after == 0 and p.cx_unprobed == []
    assert t.evidence(2.0).confirmed


def test_probes_read_in_bursts_after_stalls_keep_the_probers_interval() -> None:
    """A busy server reads the checks that queued during a stall together: their times bunch
    (gaps of a millisecond between 0.9 s ones). That is not the prober's spacing: were it
    learned as such, the prober would look gone between bursts and, with no live prober, there
    would be no quiet window either: a straggler after its fall would then hold CLOSING to the
    bound (a loaded run: 30 s for a balancer that was DOWN at 0.9 s)."""
    t = ProbeTracker(ProbeSettings(fall=3))
    bursts = [b * 0.9 + k * 0.001 for b in range(4) for k in range(3)]  # 3 checks per 0.9 s
    probes(t, LB, bursts, 200)
    assert t.interval(t.probers[LB]) == pytest.approx(0.898, abs=0.01)
    t.mark(3.6)
    probes(t, LB, [3.6, 3.601, 3.602], 503)  # the fall: three failing answers in one burst
    t.connection(3.61, LB)  # a request HAProxy sent as it marked the server DOWN
    t.request(3.61, LB)
    assert not t.evidence(3.62).confirmed  # a straggler after the fall: waited out for quiet
    probes(t, LB, [4.5, 4.501, 4.502], 503)  # it goes on checking
    assert t.evidence(5.5).confirmed  # 3.61 + 2 x 0.898 is before 5.5


def test_the_quiet_window_outlives_the_probers_that_defined_it() -> None:
    """Every prober gone (a stalled server reads nothing for a while): the quiet window is still
    two of the last known intervals, so traffic that stopped is quiet after it, not forever."""
    t = ProbeTracker(ProbeSettings(fall=3))
    probes(t, LB, [0.0, 1.0, 2.0], 503)
    t.request(2.5, LB)
    assert t.quiet(20.0) == pytest.approx(2.0)
    assert t.evidence(20.0).confirmed
