"""The in-flight ledger (the counter raised before the draining flag is tested) and the process
drain: server state, /drain_listeners, shutdown, and the exit decision (listeners, completion,
in-flight accounting, process exit).

Drain settings T = 12, G = 1; shutdown deadline 20, min_drain 2; SIGTERM at 100 unless said.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import pytest

from lameduck.drain import (
    Cause,
    ConnAction,
    ConnectionDrain,
    Direction,
    DrainSettings,
    DrainType,
    IdleClose,
    LeaveStep,
    Ledger,
    ListenerDrain,
    ProcessDrain,
    ServerState,
    ShutdownSettings,
    Step,
    Strategy,
)
from lameduck.drain import ledger as ledger_module
from lameduck.drain.prestop import Leave
from lameduck.drain.probers import ProbeSettings, ProbeTracker
from tests.drainplay import FakeClock, ScriptedRng

BELOW = math.nextafter
T, G = 12.0, 1.0
SIGTERM = 100.0


def process(
    deadline: float = 20.0,
    min_drain: float | None = 2.0,
    at_drain_end: bool = True,
    time: float = T,
    strategy: Strategy = Strategy.GRADUAL,
    grace: float = G,
    idle_close: IdleClose = IdleClose.IMMEDIATE,
    leave: Leave = Leave.TIMER,
) -> ProcessDrain:
    pd = ProcessDrain(
        DrainSettings(time=time, strategy=strategy, grace=grace, idle_close=idle_close),
        ShutdownSettings(deadline=deadline, min_drain=min_drain,
                         stop_accepting_at_drain_end=at_drain_end, leave=leave),
    )
    pd.add_listener(ListenerDrain("ingress", Direction.INBOUND))
    pd.add_listener(ListenerDrain("egress", Direction.OUTBOUND))
    pd.add_listener(ListenerDrain("sidecar-out", Direction.OUTBOUND, DrainType.MODIFY_ONLY))
    pd.initialized()
    return pd


# -- the ledger -----------------------------------------------------------------------------------


def _ledger_source() -> type[Ledger]:
    """The ledger's own source run by the interpreter: compiled, ``begin`` reads ``accepting``
    as a native field, so only the interpreted class lets a spy see the order of its steps
    (the same source; the compiled build runs the same tests below)."""
    path = Path(ledger_module.__file__).with_name("ledger.py")
    spec = importlib.util.spec_from_file_location("lameduck_ledger_source", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Ledger  # type: ignore[no-any-return]


class _SpyLedger(_ledger_source()):  # type: ignore[misc]
    """Records the count at the moment ``begin`` tests the flag."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self._accepting = True
        super().__init__()

    @property  # type: ignore[override]
    def accepting(self) -> bool:
        self.seen.append(self.active)
        return self._accepting

    @accepting.setter
    def accepting(self, value: bool) -> None:
        self._accepting = value


class TestLedger:
    def test_admit_and_end(self) -> None:
        ledger = Ledger()
        assert ledger.idle
        assert ledger.begin() is True
        assert ledger.begin() is True
        assert ledger.active == 2
        assert not ledger.idle
        ledger.end()
        ledger.end()
        assert ledger.idle
        assert ledger.completed == 0  # not draining: completions are not the drain's business

    def test_count_first_then_check(self) -> None:
        ledger = _SpyLedger()
        ledger.begin()
        ledger.accepting = False
        ledger.begin()
        # both requests were already counted when the flag was tested
        assert ledger.seen == [1, 2]
        assert ledger.active == 1
        assert ledger.refused == 1

    def test_refused_is_never_counted_active(self) -> None:
        ledger = Ledger()
        assert ledger.begin() is True
        ledger.accepting = False
        assert [ledger.begin() for _ in range(3)] == [False, False, False]
        assert ledger.active == 1
        assert ledger.refused == 3
        ledger.end()
        assert ledger.idle

    def test_completed_counted_only_while_draining(self) -> None:
        ledger = Ledger()
        ledger.begin()
        ledger.begin()
        ledger.begin()
        ledger.end()
        ledger.draining = True
        ledger.end()
        assert ledger.completed == 1
        assert ledger.active == 1

    def test_cut_one(self) -> None:
        ledger = Ledger()
        ledger.begin()
        ledger.begin()
        ledger.cut_one()
        assert (ledger.active, ledger.cut, ledger.completed) == (1, 1, 0)
        ledger.cut_one()
        assert ledger.idle
        assert ledger.cut == 2


# -- server state ---------------------------------------------------------------------------------


class TestServerState:
    def test_initializing_then_live(self) -> None:
        pd = ProcessDrain()
        assert pd.state is ServerState.INITIALIZING
        assert not pd.live
        pd.initialized()
        assert pd.state is ServerState.LIVE
        assert pd.live

    def test_envoy_numbering(self) -> None:
        assert [int(s) for s in (ServerState.LIVE, ServerState.DRAINING,
                                 ServerState.PRE_INITIALIZING, ServerState.INITIALIZING)] == [
            0, 1, 2, 3]

    def test_health_check_fail_and_ok(self) -> None:
        pd = process()
        pd.healthcheck_fail()
        assert pd.state is ServerState.DRAINING
        assert pd.listeners["ingress"].hc_failed
        assert pd.listeners["egress"].hc_failed
        assert not pd.listeners["sidecar-out"].hc_failed  # modify_only ignores it
        pd.healthcheck_ok()
        assert pd.state is ServerState.LIVE
        assert not any(ls.hc_failed for ls in pd.listeners.values())

    def test_health_check_fail_while_initializing_is_draining(self) -> None:
        pd = ProcessDrain()
        pd.healthcheck_fail()
        assert pd.state is ServerState.DRAINING
        pd.healthcheck_ok()
        assert pd.state is ServerState.INITIALIZING

    def test_listener_added_while_health_check_failed_inherits_it(self) -> None:
        pd = process()
        pd.healthcheck_fail()
        late = pd.add_listener(ListenerDrain("late", grace=99.0))
        assert late.hc_failed
        assert late.grace == G  # the process's G wins

    def test_health_check_failed_connection_drains_on_response(self) -> None:
        pd = process()
        pd.healthcheck_fail()
        conn = ConnectionDrain(pd.listeners["ingress"], SIGTERM, ScriptedRng())  # no draw
        assert conn.proactive_at is None  # health-check fail alone has no T
        assert conn.on_response(SIGTERM, ScriptedRng()) is True

    def test_a_shutdown_while_health_check_failed_still_has_proactive_moments(self) -> None:
        pd = process()
        pd.healthcheck_fail()
        pd.start_shutdown(SIGTERM)
        conn = ConnectionDrain(pd.listeners["ingress"], SIGTERM, ScriptedRng(0.5))
        assert conn.proactive_at is not None

    def test_shutdown_is_draining_even_after_health_check_ok(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.state is ServerState.DRAINING
        pd.healthcheck_ok()
        assert pd.state is ServerState.DRAINING


# -- /drain_listeners -----------------------------------------------------------------------------


class TestDrainListeners:
    def test_graceful_keeps_accepting_until_t_then_stops(self) -> None:
        pd = process()
        event, reached = pd.drain_listeners(50.0, graceful=True, skip_exit=False,
                                            inbound_only=False)
        assert event.cause is Cause.DRAIN_LISTENERS
        assert (event.start, event.time, event.grace) == (50.0, T, G)
        assert [ls.name for ls in reached] == ["ingress", "egress"]  # not the modify_only one
        for ls in reached:
            assert ls.events == (event,)
            assert ls.accepting(BELOW(62.0, 0.0))
            assert not ls.accepting(62.0)
        sidecar = pd.listeners["sidecar-out"]
        assert not sidecar.draining
        assert sidecar.accepting(1e9)
        assert pd.last_event is event

    def test_graceful_skip_exit_never_stops(self) -> None:
        pd = process()
        _, reached = pd.drain_listeners(50.0, graceful=True, skip_exit=True, inbound_only=False)
        assert len(reached) == 2
        for ls in reached:
            assert ls.draining
            assert ls.stop_at is None
            assert ls.accepting(1e9)

    @pytest.mark.parametrize("skip_exit", [False, True])
    def test_not_graceful_stops_at_once_and_still_drains(self, skip_exit: bool) -> None:
        pd = process()
        _, reached = pd.drain_listeners(50.0, graceful=False, skip_exit=skip_exit,
                                        inbound_only=False)
        for ls in reached:
            assert ls.draining
            assert ls.stop_at == 50.0
            assert not ls.accepting(50.0)
        assert pd.listeners["sidecar-out"].accepting(50.0)

    def test_inbound_only(self) -> None:
        pd = process()
        event, reached = pd.drain_listeners(50.0, graceful=False, skip_exit=False,
                                            inbound_only=True)
        assert event.inbound_only
        assert [ls.name for ls in reached] == ["ingress"]
        assert not pd.listeners["egress"].draining
        assert pd.listeners["egress"].accepting(50.0)

    def test_is_not_a_shutdown(self) -> None:
        pd = process()
        pd.drain_listeners(50.0, graceful=False, skip_exit=False, inbound_only=False)
        assert pd.state is ServerState.LIVE
        assert pd.shutdown is None
        pd.tick(1000.0)
        assert pd.ledger.begin() is True
        assert pd.shutdown_step(1000.0, connections=0) is Step.WAIT
        assert pd.next_deadline(1000.0) is None


class TestDrainCounts:
    """``completed`` is the requests that complete during a drain, whatever started it: the
    drain report and ``server.drain.completed`` read it."""

    @pytest.mark.parametrize("graceful,skip_exit", [(True, True), (False, False),
                                                    (False, True)])
    def test_a_drain_that_stays_up_counts_until_it_is_over(self, graceful: bool,
                                                          skip_exit: bool) -> None:
        pd = process()
        ledger = pd.ledger
        ledger.begin()
        ledger.end()  # before the drain: no drain's
        pd.drain_listeners(50.0, graceful=graceful, skip_exit=skip_exit, inbound_only=False)
        for _ in range(3):
            ledger.begin()
            ledger.end()
        assert ledger.begin()  # in flight at T: the drain lasts until it completes
        pd.tick(50.0 + T)
        assert pd.drain_active(50.0 + T)
        ledger.end()
        assert ledger.completed == 4
        pd.tick(50.0 + T + 0.1)  # T passed, nothing in flight: the drain is over
        assert not pd.drain_active(50.0 + T + 0.1)
        ledger.begin()
        ledger.end()
        assert ledger.completed == 4
        pd.drain_listeners(80.0, graceful=True, skip_exit=True, inbound_only=False)
        ledger.begin()
        ledger.end()  # a second drain counts again
        assert ledger.completed == 5

    def test_a_drain_that_exits_counts_through_the_shutdown(self) -> None:
        pd = process()
        ledger = pd.ledger
        event, _ = pd.drain_listeners(50.0, graceful=True, skip_exit=False, inbound_only=False)
        ledger.begin()
        ledger.end()
        pd.tick(event.ends_at)  # idle at its T, and still not over: it becomes the shutdown
        ledger.begin()
        ledger.end()
        pd.start_shutdown(event.start, Cause.DRAIN_LISTENERS)
        ledger.begin()
        ledger.end()
        assert ledger.completed == 3


# -- shutdown -------------------------------------------------------------------------------------


class TestShutdown:
    def test_sigterm_reaches_every_listener_and_stops_accepting_at_t(self) -> None:
        pd = process()
        event, reached = pd.start_shutdown(SIGTERM)
        assert event.cause is Cause.SHUTDOWN
        assert event.start == SIGTERM
        assert pd.shutdown is event
        assert pd.state is ServerState.DRAINING
        assert [ls.name for ls in reached] == ["ingress", "egress", "sidecar-out"]
        for ls in pd.listeners.values():
            assert ls.events == (event,)
            assert ls.accepting(BELOW(SIGTERM + T, 0.0))
            assert not ls.accepting(SIGTERM + T)
        assert pd.deadline == SIGTERM + 20.0

    def test_stop_accepting_immediately(self) -> None:
        pd = process(at_drain_end=False)
        pd.start_shutdown(SIGTERM)
        for ls in pd.listeners.values():
            assert ls.draining
            assert not ls.accepting(SIGTERM)

    def test_earlier_drain_listeners_stop_is_kept(self) -> None:
        pd = process()
        pd.drain_listeners(50.0, graceful=False, skip_exit=False, inbound_only=True)
        pd.start_shutdown(SIGTERM)
        assert pd.listeners["ingress"].stop_at == 50.0
        assert pd.listeners["egress"].stop_at == SIGTERM + T

    def test_idempotent(self) -> None:
        pd = process()
        first, _ = pd.start_shutdown(SIGTERM)
        again, reached = pd.start_shutdown(SIGTERM + 5.0)
        assert again is first
        assert reached == []
        assert pd.listeners["ingress"].events == (first,)

    def test_no_new_work_from_t_on(self) -> None:
        pd = process()
        ledger = pd.ledger
        pd.start_shutdown(SIGTERM)
        assert ledger.draining
        pd.tick(BELOW(SIGTERM + T, 0.0))
        assert ledger.begin() is True
        pd.tick(SIGTERM + T)
        assert ledger.begin() is False
        assert (ledger.active, ledger.refused) == (1, 1)
        ledger.end()
        assert ledger.completed == 1

    def test_tick_before_shutdown_does_nothing(self) -> None:
        pd = process()
        pd.tick(1e9)
        assert pd.ledger.accepting


class TestShutdownStep:
    def test_wait_before_sigterm(self) -> None:
        assert process().shutdown_step(SIGTERM, connections=0) is Step.WAIT

    def test_min_drain_holds_even_without_connections(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM, connections=0) is Step.WAIT
        assert pd.shutdown_step(BELOW(SIGTERM + 2.0, 0.0), connections=0) is Step.WAIT

    def test_exit_when_no_connections_after_min_drain(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 2.0, connections=0) is Step.EXIT

    def test_exit_at_once_without_min_drain(self) -> None:
        pd = process(min_drain=0.0)
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM, connections=0) is Step.EXIT

    def test_unset_min_drain_serves_until_t(self) -> None:
        """The default: idle and without a connection, the process still serves (and its
        listeners accept) until T, for clients that have not yet seen it leave."""
        pd = process(min_drain=None)
        pd.start_shutdown(SIGTERM)
        assert pd.min_drain == T
        assert pd.shutdown_step(SIGTERM, connections=0) is Step.WAIT
        assert pd.shutdown_step(BELOW(SIGTERM + T, 0.0), connections=0) is Step.WAIT
        assert pd.next_deadline(SIGTERM) == SIGTERM + T
        assert pd.shutdown_step(SIGTERM + T, connections=0) is Step.EXIT

    @pytest.mark.parametrize("how", ["immediately", "hot_restart", "prestop"])
    def test_unset_min_drain_is_zero_when_nobody_can_still_arrive(self, how: str) -> None:
        """Listeners closed at once, a successor that accepts on the same sockets, or a
        preStop that waited for the LB: an idle process exits at once."""
        pd = process(min_drain=None, at_drain_end=how != "immediately")
        if how == "prestop":
            pd.prestop_done()
        pd.start_shutdown(SIGTERM, Cause.HOT_RESTART if how == "hot_restart" else Cause.SHUTDOWN)
        assert pd.min_drain == 0.0
        assert pd.shutdown_step(SIGTERM, connections=0) is Step.EXIT

    def test_explicit_min_drain_wins_over_a_completed_prestop(self) -> None:
        pd = process(min_drain=2.0)
        pd.prestop_done()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 1.0, connections=0) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 2.0, connections=0) is Step.EXIT

    def test_idle_keepalive_connections_wait_until_t(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 5.0, connections=3) is Step.WAIT
        assert pd.shutdown_step(BELOW(SIGTERM + T, 0.0), connections=3) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + T, connections=3) is Step.EXIT
        assert pd.shutdown_step(SIGTERM + 15.0, connections=3) is Step.EXIT

    def test_idle_close_on_response_waits_for_open_connections_until_t_plus_g(self) -> None:
        """``drain.idle_close: on_response``: an idle connection is closed only after a
        response or at the drain's end, T + G; the exit waits for it until then."""
        pd = process(idle_close=IdleClose.ON_RESPONSE)
        assert all(ls.idle_close_on_response for ls in pd.listeners.values())
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + T, connections=3) is Step.WAIT
        assert pd.shutdown_step(BELOW(SIGTERM + T + G, 0.0), connections=3) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + T + G, connections=3) is Step.EXIT
        assert pd.next_deadline(SIGTERM + T) == SIGTERM + T + G
        # with no connection left the exit is as early as by default (T: min_drain unset)
        pd2 = process(idle_close=IdleClose.ON_RESPONSE, min_drain=None)
        pd2.start_shutdown(SIGTERM)
        assert pd2.shutdown_step(SIGTERM + T, connections=0) is Step.EXIT

    def test_idle_close_on_response_the_deadline_still_ends_it(self) -> None:
        pd = process(deadline=12.5, idle_close=IdleClose.ON_RESPONSE)  # before T + G
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 12.5, connections=3) is Step.EXIT

    def test_busy_after_t_waits_then_exits_when_idle(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.ledger.begin()
        assert pd.shutdown_step(SIGTERM + T, connections=1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 15.0, connections=1) is Step.WAIT
        pd.ledger.end()
        assert pd.shutdown_step(SIGTERM + 15.0, connections=1) is Step.EXIT

    def test_cut_at_the_deadline_when_busy(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        pd.ledger.begin()
        assert pd.shutdown_step(BELOW(SIGTERM + 20.0, 0.0), connections=1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 20.0, connections=1) is Step.CUT
        assert pd.shutdown_step(SIGTERM + 30.0, connections=1) is Step.CUT
        pd.ledger.cut_one()
        assert pd.shutdown_step(SIGTERM + 30.0, connections=1) is Step.EXIT
        assert pd.ledger.cut == 1

    def test_exit_at_the_deadline_when_idle(self) -> None:
        pd = process(deadline=1.0)  # deadline before min_drain and before T
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 0.5, connections=4) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 1.0, connections=4) is Step.EXIT

    def test_no_connections_but_requests_in_flight_is_not_complete(self) -> None:
        """Completion counts requests, not connections (as the usual Envoy drain.sh preStop
        script does: downstream_rq_active + upstream_rq_active)."""
        pd = process()
        pd.start_shutdown(SIGTERM)
        pd.ledger.begin()  # e.g. an upstream request still finishing after the client left
        assert pd.shutdown_step(SIGTERM + 5.0, connections=0) is Step.WAIT
        pd.ledger.end()
        assert pd.shutdown_step(SIGTERM + 5.0, connections=0) is Step.EXIT

    def test_a_tls_handshake_under_way_holds_the_idle_exit(self) -> None:
        """A client mid-handshake has requests on the way that nothing can turn away yet: an
        idle process past min_drain waits for it, before T and after."""
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(SIGTERM + 5.0, connections=1, unread=1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + T, connections=1, unread=1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 15.0, connections=1, unread=0) is Step.EXIT

    def test_a_connection_that_has_sent_nothing_holds_the_exit_until_g_after_its_accept(
            self) -> None:
        """Its request may be on the way: past T the exit waits until G after its accept,
        wakes then, and exits; the deadline waits for nothing, and cuts nothing of it."""
        pd = process()  # G = 1 s, deadline 20 s
        pd.start_shutdown(SIGTERM)
        assert pd.arriving_until(0.0) == 0.0  # none
        accepted = SIGTERM + T - 0.001  # just before the listener closed at T
        until = pd.arriving_until(accepted)
        assert until == accepted + G
        assert pd.shutdown_step(SIGTERM + T, connections=1, silent_since=accepted) is Step.WAIT
        assert pd.next_deadline(SIGTERM + T, accepted) == until
        assert pd.shutdown_step(BELOW(until, 0.0), 1, silent_since=accepted) is Step.WAIT
        assert pd.shutdown_step(until, connections=1, silent_since=accepted) is Step.EXIT
        late = SIGTERM + 19.5  # G after it is past the deadline: the deadline bounds it
        assert pd.arriving_until(late) == SIGTERM + 20.0
        assert pd.shutdown_step(SIGTERM + 20.0, 1, silent_since=late) is Step.EXIT

    def test_a_tls_handshake_under_way_at_the_deadline_is_cut(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        assert pd.shutdown_step(BELOW(SIGTERM + 20.0, 0.0), 1, unread=1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 20.0, connections=1, unread=1) is Step.CUT
        pd.ledger.cut_unheard(1)
        assert pd.ledger.cut == 1
        assert pd.shutdown_step(SIGTERM + 20.0, connections=0, unread=0) is Step.EXIT

    def test_step_applies_the_t_tick(self) -> None:
        pd = process()
        pd.start_shutdown(SIGTERM)
        pd.shutdown_step(SIGTERM + T, connections=1)
        assert pd.ledger.begin() is False


class TestNextDeadline:
    def test_none_before_shutdown(self) -> None:
        assert process().next_deadline(0.0) is None

    def test_marks_in_order(self) -> None:
        pd = process()  # min_drain 2, T 12, deadline 20
        pd.start_shutdown(SIGTERM)
        assert pd.next_deadline(SIGTERM) == SIGTERM + 2.0
        assert pd.next_deadline(SIGTERM + 2.0) == SIGTERM + T
        assert pd.next_deadline(SIGTERM + 5.0) == SIGTERM + T
        assert pd.next_deadline(SIGTERM + T) == SIGTERM + 20.0
        assert pd.next_deadline(SIGTERM + 20.0) is None

    def test_zero_min_drain_is_not_a_future_mark(self) -> None:
        pd = process(min_drain=0.0)
        pd.start_shutdown(SIGTERM)
        assert pd.next_deadline(SIGTERM) == SIGTERM + T


# -- the graceful-draining recipe: drain time 0, immediate, a 150 ms deadline ---------------------


class TestGracefulDrainRecipe:
    """Two quick requests and one slow one are in flight when SIGTERM arrives; new work is refused
    at once, the quick ones finish, the slow one is cut at 150 ms and counted."""

    def make(self) -> ProcessDrain:
        return process(deadline=0.150, min_drain=0.0, time=0.0, strategy=Strategy.IMMEDIATE,
                       grace=0.0)

    def test_new_work_refused_in_flight_finishes_straggler_cut(self) -> None:
        clock = FakeClock(10.0)
        pd = self.make()
        ledger = pd.ledger
        assert ledger.begin() and ledger.begin() and ledger.begin()  # q1, q2, slow
        clock.advance(0.010)
        start = clock()
        pd.start_shutdown(start)
        assert not pd.live
        assert ledger.begin() is False  # refused at once: T = 0
        assert ledger.active == 3
        assert pd.shutdown_step(clock(), connections=3) is Step.WAIT
        assert pd.next_deadline(clock()) == start + 0.150

        clock.advance(0.010)
        ledger.end()  # q1 (20 ms of work)
        clock.advance(0.010)
        ledger.end()  # q2 (30 ms)
        assert pd.shutdown_step(clock(), connections=1) is Step.WAIT
        assert ledger.begin() is False

        clock.set(start + 0.150)
        assert pd.shutdown_step(clock(), connections=1) is Step.CUT
        ledger.cut_one()  # slow (2 s)
        assert pd.shutdown_step(clock(), connections=0) is Step.EXIT
        assert (ledger.completed, ledger.cut, ledger.refused, ledger.active) == (2, 1, 2, 0)

    def test_no_straggler_exits_when_the_last_request_ends(self) -> None:
        pd = self.make()
        pd.ledger.begin()
        pd.start_shutdown(0.0)
        assert pd.shutdown_step(0.020, connections=1) is Step.WAIT
        pd.ledger.end()
        assert pd.shutdown_step(0.030, connections=1) is Step.EXIT

    def test_every_connection_drains_on_its_next_response_and_closes_at_once(self) -> None:
        pd = self.make()
        listener = pd.listeners["ingress"]
        conn = ConnectionDrain(listener, 0.0, ScriptedRng())
        event, _ = pd.start_shutdown(0.010)
        conn.on_drain_event(event, ScriptedRng())  # T = 0: no window, no draw
        assert conn.proactive_at is None
        assert conn.on_response(0.020, ScriptedRng()) is True
        assert conn.next_deadline() == 0.020
        assert conn.on_timer(0.020, idle=True) is ConnAction.CLOSE


# -- hot restart: the parent's drain ---------------------------------------------------------------


class TestHotRestartDrain:
    def test_parent_stops_accepting_at_once_drains_for_t_and_exits_by_its_own_deadline(
            self) -> None:
        pd = process(deadline=20.0, min_drain=0.0, at_drain_end=True)
        event, reached = pd.start_shutdown(SIGTERM, Cause.HOT_RESTART, deadline=30.0)
        assert event.cause is Cause.HOT_RESTART and event.time == T
        # every listener, modify_only too (Envoy's draining docs: they drain on hot restart)
        assert {ls.name for ls in reached} == {"ingress", "egress", "sidecar-out"}
        assert all(ls.stop_at == SIGTERM for ls in pd.listeners.values())
        assert pd.deadline == SIGTERM + 30.0
        pd.ledger.begin()  # a request still in flight
        assert pd.shutdown_step(SIGTERM + 20.0, 1) is Step.WAIT  # past shutdown.deadline
        assert pd.shutdown_step(BELOW(SIGTERM + 30.0, 0), 1) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 30.0, 1) is Step.CUT
        assert pd.next_deadline(SIGTERM + 20.0) == SIGTERM + 30.0

    def test_sigterm_keeps_the_configured_deadline_and_stop(self) -> None:
        pd = process(deadline=20.0, at_drain_end=True)
        pd.start_shutdown(SIGTERM)
        assert pd.deadline == SIGTERM + 20.0
        assert all(ls.stop_at == SIGTERM + T for ls in pd.listeners.values())


LB = "10.0.0.9"  # the balancer's health checker


class LeavePlay:
    """SIGTERM with ``shutdown.leave: confirm`` played as the shell plays it, on a fake clock:
    the balancer's probes on the health-check path come at their scripted times (answered 503:
    the process is not ready from the SIGTERM on), and the evidence is read at the shutdown's
    start and then whenever ``leave_next`` says. ``log``: ``(time, LeaveStep)`` of each read."""

    def __init__(self, pd: ProcessDrain, probes: list[float], fall: int = 3) -> None:
        self.pd = pd
        self.clock = FakeClock(SIGTERM)
        self.tracker = ProbeTracker(ProbeSettings(fall=fall, interval=1.0))
        self.probes = sorted(probes)
        self.log: list[tuple[float, LeaveStep]] = []

    def run(self, until: float) -> None:
        pd, clock = self.pd, self.clock
        pd.start_shutdown(clock.now)
        self.tracker.mark(clock.now)
        at: float | None = clock.now
        while at is not None and at <= until:
            clock.now = at
            while self.probes and self.probes[0] <= at:
                self.tracker.probe(self.probes.pop(0), LB, 503)
            step = pd.leave_step(at, self.tracker.evidence(at))
            self.log.append((at, step))
            at = pd.leave_next(at) if step is LeaveStep.WAIT else None


class TestShutdownLeaveConfirm:
    """The SIGTERM confirm decision (Kubernetes sends SIGTERM with no preStop hook): min_drain
    is only the bound; the balancer seen to let go (HAProxy ``fall`` failing checks) ends it."""

    def test_the_balancer_letting_go_ends_min_drain_at_once(self) -> None:
        pd = process(min_drain=30.0, leave=Leave.CONFIRM)
        play = LeavePlay(pd, [SIGTERM + 0.55, SIGTERM + 1.55, SIGTERM + 2.55])
        play.run(until=SIGTERM + 30.0)
        assert pd.leave_bound == 30.0
        steps = [s for _, s in play.log]
        assert steps[:-1] == [LeaveStep.WAIT] * (len(steps) - 1)
        at, last = play.log[-1]
        assert last is LeaveStep.CONFIRMED
        assert SIGTERM + 2.55 <= at < SIGTERM + 2.55 + 0.1 + 1e-9  # the next read after the fall
        assert pd.confirmed_after == pytest.approx(at - SIGTERM)
        assert not pd.leave_watching and pd.min_drain == 0.0
        assert pd.shutdown_step(at, 0) is Step.EXIT  # idle: it may go now, not at +30
        assert pd.leave_step(at + 1.0, play.tracker.evidence(at + 1.0)) is LeaveStep.IDLE

    def test_the_bound_ends_the_watch_and_min_drain_decides(self) -> None:
        pd = process(min_drain=2.0, leave=Leave.CONFIRM)
        play = LeavePlay(pd, [SIGTERM + 0.5, SIGTERM + 1.5, SIGTERM + 2.5, SIGTERM + 3.5])
        play.run(until=SIGTERM + 30.0)
        at, last = play.log[-1]
        assert (at, last) == (SIGTERM + 2.0, LeaveStep.BOUND)  # never read past the bound
        assert all(b - a <= 0.1 + 1e-9 for (a, _), (b, _) in itertools.pairwise(play.log))
        assert pd.confirmed_after is None and not pd.leave_watching
        assert pd.shutdown_step(BELOW(SIGTERM + 2.0, 0), 0) is Step.WAIT
        assert pd.shutdown_step(SIGTERM + 2.0, 0) is Step.EXIT

    def test_timer_does_not_watch(self) -> None:
        pd = process(min_drain=2.0)
        pd.start_shutdown(SIGTERM)
        assert not pd.leave_watching and pd.leave_bound is None

    @pytest.mark.parametrize("how", ["prestop-before", "hot-restart", "drain-listeners"])
    def test_no_watch_where_nothing_is_left_to_prove(self, how: str) -> None:
        pd = process(min_drain=2.0, leave=Leave.CONFIRM)
        if how == "prestop-before":
            pd.prestop_done()
        cause = {"hot-restart": Cause.HOT_RESTART,
                 "drain-listeners": Cause.DRAIN_LISTENERS}.get(how, Cause.SHUTDOWN)
        pd.start_shutdown(SIGTERM, cause)
        assert not pd.leave_watching and pd.leave_bound is None
        tracker = ProbeTracker(ProbeSettings(fall=1))
        tracker.probe(SIGTERM, LB, 503)
        assert pd.leave_step(SIGTERM + 0.5, tracker.evidence(SIGTERM + 0.5)) is LeaveStep.IDLE
        assert pd.confirmed_after is None

    def test_a_prestop_ending_during_the_watch_ends_it(self) -> None:
        pd = process(min_drain=30.0, leave=Leave.CONFIRM)
        pd.start_shutdown(SIGTERM)
        assert pd.leave_watching
        pd.prestop_done()
        tracker = ProbeTracker(ProbeSettings(fall=1))
        tracker.probe(SIGTERM, LB, 503)
        assert pd.leave_step(SIGTERM + 0.5, tracker.evidence(SIGTERM + 0.5)) is LeaveStep.IDLE

    def test_stopping_accepting_at_once_has_no_bound_to_wait(self) -> None:
        pd = process(min_drain=None, at_drain_end=False, leave=Leave.CONFIRM)
        play = LeavePlay(pd, [SIGTERM + 0.5])
        play.run(until=SIGTERM + 30.0)
        assert pd.leave_bound == 0.0 and play.log == [(SIGTERM, LeaveStep.BOUND)]
