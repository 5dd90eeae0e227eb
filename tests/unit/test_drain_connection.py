"""One connection through a drain as Envoy's draining docs describe it, on a fake clock.

Played on the real drain manager (the one HTTP/1.1 and HTTP/2 share) by a codec that records
what it is asked: the drain notice (HTTP/2: GOAWAY 2^31-1), the final notice (the final GOAWAY),
the proactive moment for its tunnels, the staged close.

T = 12, G = 1, the drain starts at 10: T/2 is at 16, the proactive window is [18, 21), T ends at 22.
A scripted rng value r puts the proactive moment at 18 + 3r.
"""

from __future__ import annotations

import math

import pytest

from lameduck.drain import (
    Cause,
    ConnAction,
    ConnectionDrain,
    ConnState,
    DrainedBy,
    DrainEvent,
    Strategy,
)
from lameduck.drain.connection import TRANSITIONS, Input
from lameduck.proxy.downstream import LINGER
from tests.drainplay import (
    CLOSE,
    DRAIN,
    END,
    FINAL,
    NOTICE,
    RESPONSE,
    RESPONSE_DRAINS,
    ClockLoop,
    FakeClock,
    Play,
    ScriptedRng,
    listener_with,
)

START, T, G = 10.0, 12.0, 1.0
EV = DrainEvent(START, Strategy.GRADUAL, T, G)
LO, HI = 18.0, 21.0  # START + 2T/3, START + T - G


def moment(r: float) -> float:
    return LO + r * (HI - LO)


# -- drained by a response ------------------------------------------------------------------------


class TestDrainedByResponse:
    def test_no_drain_no_decision(self) -> None:
        play = Play.accept(listener_with(grace=G), at=0.0)
        assert play.response(at=5.0) is False
        assert play.state is ConnState.OPEN
        assert play.conn.next_deadline() is None

    def test_first_draining_response_then_every_later_one(self) -> None:
        # accepted at 0, the drain reaches it at 10 (r=0.5 draws its moment: 19.5).
        # At 13 the ramp is at 0.5: rng 0.7 keeps it open, 0.3 drains it.
        play = Play.through(EV, 0.0, 0.5, 0.7, 0.3)
        assert play.conn.proactive_at == moment(0.5)
        assert play.response(at=13.0) is False
        assert play.response(at=13.0) is True
        assert play.state is ConnState.DRAINING
        assert play.conn.drained_by is DrainedBy.RESPONSE
        assert play.conn.drained_at == 13.0
        # every later response drains, without consulting the ramp (the script is empty now)
        assert play.rng.exhausted
        assert play.response(at=13.5) is True
        play.run(until=30.0)
        assert play.log == [
            (13.0, RESPONSE),
            (13.0, NOTICE),  # sent as the first draining response starts
            (13.0, RESPONSE_DRAINS),
            (13.5, RESPONSE_DRAINS),
            (14.0, FINAL),  # G after the drain: the last word
            (14.0, CLOSE),  # idle: closes at drained_at + G
        ]
        assert play.state is ConnState.CLOSING

    def test_immediate_drains_the_first_response(self) -> None:
        ev = DrainEvent(START, Strategy.IMMEDIATE, T, G)
        play = Play.through(ev, 0.0, 0.0)  # r=0: moment at 18
        assert play.response(at=START) is True
        play.run(until=30.0)
        assert play.log == [(START, NOTICE), (START, RESPONSE_DRAINS), (START + G, FINAL),
                            (START + G, CLOSE)]

    def test_after_half_t_the_first_response_drains(self) -> None:
        play = Play.through(EV, 0.0, 0.9)
        assert play.response(at=16.0) is True  # no ramp draw: the script holds only the moment
        assert play.conn.drained_by is DrainedBy.RESPONSE

    def test_busy_connection_closes_when_its_last_request_ends(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.begin(at=15.0)
        play.begin(at=15.5)
        play.end(at=16.0, drains=True)  # drained at 16 by this response; one request left
        # grace elapsed at 17, but not idle: the final notice goes out, the close waits
        assert play.run(until=17.0) == [(17.0, FINAL)]
        assert play.state is ConnState.DRAINING
        assert play.conn.grace_elapsed
        # the shell waits for on_idle now; only the proactive moment (for tunnels) is left
        assert play.conn.next_deadline() == 19.5
        play.end(at=19.0, drains=True)
        assert play.actions == [(16.0, NOTICE), (16.0, RESPONSE_DRAINS), (17.0, FINAL),
                                (19.0, RESPONSE_DRAINS), (19.0, CLOSE)]


# -- drained proactively --------------------------------------------------------------------------


class TestProactiveDrain:
    def test_drained_at_two_thirds_plus_x_idle_closes_at_plus_g(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        x = moment(0.5)
        assert x == 19.5
        assert play.conn.next_deadline() == x
        assert play.run(until=x - 0.25) == []
        assert play.run(until=40.0) == [(x, NOTICE), (x, DRAIN), (x + G, FINAL), (x + G, CLOSE)]
        # the staged close: the FIN at x + G, reads for LINGER, then the socket is closed
        assert play.socket.eof_at == x + G
        assert play.socket.closed_at == x + G + LINGER
        assert play.conn.drained_by is DrainedBy.PROACTIVE
        assert play.conn.drained_at == x
        assert play.conn.next_deadline() is None

    def test_timer_before_the_moment_does_nothing(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        assert play.conn.on_timer(math.nextafter(19.5, 0.0), idle=True) is ConnAction.NONE
        assert play.state is ConnState.OPEN

    def test_late_timer_drains_at_the_time_it_fires(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        assert play.conn.on_timer(20.0, idle=True) is ConnAction.DRAIN
        assert play.conn.drained_at == 20.0
        assert play.conn.next_deadline() == 21.0

    def test_idle_close_exactly_at_drained_at_plus_g_not_before(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.run(until=19.5)
        conn = play.conn
        assert conn.next_deadline() == 20.5
        assert conn.on_timer(math.nextafter(20.5, 0.0), idle=True) is ConnAction.NONE
        assert conn.state is ConnState.DRAINING
        assert conn.on_timer(20.5, idle=True) is ConnAction.CLOSE
        assert conn.state is ConnState.CLOSING

    def test_busy_past_grace_closes_on_idle(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.begin(at=15.0)  # a long request, in flight across the whole drain
        # 20.5: grace over, but busy: the final notice, no close
        assert play.run(until=25.0) == [(19.5, NOTICE), (19.5, DRAIN), (20.5, FINAL)]
        assert play.conn.grace_elapsed
        assert play.state is ConnState.DRAINING
        play.end(at=25.0)
        assert play.actions[-2:] == [(25.0, RESPONSE_DRAINS), (25.0, CLOSE)]

    def test_idle_before_grace_waits_for_the_timer(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.begin(at=19.0)
        play.end(at=20.0)  # after the proactive drain at 19.5, before 20.5
        assert play.actions == [(19.5, NOTICE), (19.5, DRAIN), (20.0, RESPONSE_DRAINS)]
        assert play.state is ConnState.DRAINING
        assert play.run(until=30.0) == [(20.5, FINAL), (20.5, CLOSE)]

    def test_zero_grace_drains_and_closes_at_once(self) -> None:
        ev = DrainEvent(START, Strategy.GRADUAL, T, 0.0)  # window [18, 22)
        play = Play.through(ev, 0.0, 0.5)
        # its moment finds it idle and past G at once: closed, no tunnel to end
        assert play.run(until=30.0) == [(20.0, NOTICE), (20.0, FINAL), (20.0, CLOSE)]

    def test_no_moment_when_the_window_is_empty(self) -> None:
        ev = DrainEvent(START, Strategy.GRADUAL, T, 4.0)  # G = T/3
        play = Play.through(ev)  # no rng values: none may be drawn
        assert play.conn.proactive_at is None
        assert play.run(until=100.0) == []
        assert play.state is ConnState.OPEN

    def test_health_check_fail_alone_draws_no_moment(self) -> None:
        listener = listener_with(grace=G)
        listener.set_health_check_failed(True)
        play = Play.accept(listener, at=0.0)  # no rng draw allowed: no event, no T
        assert play.conn.proactive_at is None
        assert play.run(until=100.0) == []
        assert play.response(at=100.0) is True  # but every response drains

    def test_an_event_while_health_check_failed_still_spreads_its_closes(self) -> None:
        listener = listener_with(grace=G)
        listener.set_health_check_failed(True)
        play = Play.accept(listener, at=0.0)
        play.run(until=START)
        play.rng.push(0.5)
        play.drain_event(EV)  # the event has its T: a moment is drawn
        assert play.conn.proactive_at is not None

    def test_no_second_moment_once_draining(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.response(at=16.0)
        play.drain_event(DrainEvent(16.5, Strategy.GRADUAL, 3.0, 0.5, Cause.RELOAD))  # no draw
        assert play.conn.proactive_at == 19.5


# -- drained at the end ---------------------------------------------------------------------------


class TestDrainAtEnd:
    def test_open_idle_connection_is_closed_at_the_deadline_at_once(self) -> None:
        """The drain is over: no grace G is left to give; the final notice, then the close."""
        ev = DrainEvent(START, Strategy.GRADUAL, T, 5.0)  # empty window: nothing proactive
        play = Play.through(ev)
        assert play.run(until=25.0) == []
        play.close_at_end(at=25.0)
        assert play.conn.drained_by is DrainedBy.END
        assert play.conn.drain_at_end(25.0) is False
        assert play.side.drain_stats.cx_closed_at_end == 1
        assert play.log == [(25.0, END), (25.0, FINAL), (25.0, CLOSE)]
        assert play.socket.eof_at == 25.0

    def test_busy_connection_at_the_deadline_closes_when_its_last_request_ends(self) -> None:
        ev = DrainEvent(START, Strategy.GRADUAL, T, 5.0)
        play = Play.through(ev)
        play.begin(at=24.0)
        play.close_at_end(at=25.0)
        assert play.log == [(25.0, END), (25.0, FINAL)]
        assert play.run(until=100.0) == []  # no timer closes it under its request
        play.end(at=100.0)
        assert play.log[-2:] == [(100.0, RESPONSE_DRAINS), (100.0, CLOSE)]

    def test_already_draining_is_not_drained_again(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.response(at=16.0)
        assert play.conn.drain_at_end(25.0) is False
        assert play.conn.drained_by is DrainedBy.RESPONSE
        assert play.conn.drained_at == 16.0


class TestNoNewWork:
    def test_past_t_the_final_notice_goes_out_and_a_busy_connection_closes_when_idle(
        self,
    ) -> None:
        play = Play.through(EV, 18.5)  # accepted after 2T/3: no moment, no draw
        play.begin(at=21.0)
        play.no_new_work(at=START + T)
        assert play.log == [(22.0, FINAL)]  # at T, not G after a drain (HTTP/2: final GOAWAY)
        assert play.state is ConnState.OPEN
        play.end(at=23.0)  # past T/2 every response drains; its end is the close
        assert play.log[1:] == [(23.0, NOTICE), (23.0, RESPONSE_DRAINS), (23.0, CLOSE)]


    def test_no_new_work_closes_an_idle_connection_once_its_last_word_is_said(self) -> None:
        play = Play.through(EV, 18.5)  # no moment; nothing in flight at T
        play.no_new_work(at=START + T)
        assert play.log == [(22.0, FINAL), (22.0, CLOSE)]


# -- drain.idle_close: on_response ----------------------------------------------------------------
# HAProxy's ``option idle-close-on-response``: an idle connection is never closed while idle; its
# next response carries the close (HTTP/1.1 Connection: close, HTTP/2 GOAWAY); the drain's end
# (T + G, here 23) closes what is still waiting. A load balancer that reuses an idle connection
# just as it closes answers 502 (AWS ALB); this never closes one under it.

END_AT = START + T + G  # 23.0


def deferred(accepted_at: float = 0.0, *rng_values: float) -> Play:
    return Play.through(EV, accepted_at, *rng_values, on_response=True)


class TestIdleCloseOnResponse:
    def test_default_closes_the_idle_connection_at_its_moment_plus_g(self) -> None:
        """What ``on_response`` changes (the default, ``immediate``): closed while idle."""
        play = Play.through(EV, 0.0, 0.5)
        assert play.run(until=40.0) == [(19.5, NOTICE), (19.5, DRAIN), (20.5, FINAL),
                                        (20.5, CLOSE)]

    def test_idle_connection_is_not_closed_or_told_while_idle(self) -> None:
        """Its moment (19.5) passes with nothing on the wire: no HTTP/2 GOAWAY, no close,
        through T - G, T and up to the drain's end."""
        play = deferred(0.0, 0.5)
        assert play.conn.end_at == END_AT
        assert play.run(until=END_AT - 0.01) == []
        assert play.state is ConnState.OPEN
        assert play.conn.proactive_fired
        assert play.conn.next_deadline() == END_AT
        assert play.side.drain_stats.cx_drained_proactive == 0

    def test_closed_after_its_next_response(self) -> None:
        """A request on it after its moment: that response drains it (the notice as it starts:
        HTTP/2 GOAWAY; HTTP/1.1 says Connection: close on it), then it closes as a connection
        a response drained does (HTTP/2: the final GOAWAY G later)."""
        play = deferred(0.0, 0.5)
        play.run(until=21.0)
        play.begin(at=21.0)
        play.end(at=21.2, drains=True)  # past its moment: no rng draw, the script is empty
        assert play.conn.drained_by is DrainedBy.RESPONSE
        assert play.conn.told
        assert play.run(until=40.0) == [(22.2, FINAL), (22.2, CLOSE)]
        assert play.actions == [(21.2, NOTICE), (21.2, RESPONSE_DRAINS), (22.2, FINAL),
                                (22.2, CLOSE)]
        assert play.side.drain_stats.cx_drained_by_response == 1

    def test_a_response_before_its_moment_drains_it_as_by_default(self) -> None:
        """The ramp is unchanged: at 13 (ramp 0.5) rng 0.3 drains it, G later it closes."""
        play = deferred(0.0, 0.5, 0.3)
        play.begin(at=13.0)
        play.end(at=13.0, drains=True)
        assert play.run(until=40.0) == [(14.0, FINAL), (14.0, CLOSE)]

    def test_the_window_still_spreads_the_connections_busy_at_their_moments(self) -> None:
        """A connection with a request in flight at its moment is drained then, as by
        default: the notices spread over [2T/3, T - G) by the rng; each closes after its
        response."""
        for r in (0.1, 0.5, 0.9):
            for on_response in (False, True):
                play = Play.through(EV, 0.0, r, on_response=on_response)
                play.begin(at=17.0)
                x = moment(r)
                assert play.run(until=21.9)[:2] == [(x, NOTICE), (x, DRAIN)]
                assert play.conn.drained_by is DrainedBy.PROACTIVE
                play.end(at=21.9, drains=True)
                assert play.log[-1] == (21.9, CLOSE)

    def test_drained_busy_but_untold_waits_for_a_response_or_the_end(self) -> None:
        """Busy at its moment with a response already under way (its head went out before,
        without Connection: close): once idle it has not been told, so it is not closed at
        G (HTTP/1.1, which has no notice outside a response) until a response or the end."""
        play = deferred(0.0, 0.5, 0.9)
        play.begin(at=12.0)
        assert play.response(at=12.5) is False  # ramp 0.25: rng 0.9 keeps it open
        play.run(until=20.0)  # its moment 19.5: drained with the response still streaming
        conn = play.conn
        assert conn.drained_by is DrainedBy.PROACTIVE
        play.codec.in_flight = 0  # the response ends (its head said keep-alive)
        assert conn.on_idle(20.0) is ConnAction.NONE
        assert conn.on_timer(20.5, idle=True) is ConnAction.NONE  # G: not closed, waits
        assert conn.waits_for_response()
        assert conn.next_deadline() == END_AT
        assert conn.on_timer(END_AT, idle=True) is ConnAction.CLOSE  # the drain's end

    def test_cut_at_the_drain_end_when_no_request_comes(self) -> None:
        """Still idle and untold at T + G: drained at the end and closed, counted as such."""
        play = deferred(0.0, 0.5)
        assert play.run(until=40.0) == [(END_AT, NOTICE), (END_AT, FINAL), (END_AT, CLOSE)]
        assert play.conn.drained_by is DrainedBy.END
        assert play.side.drain_stats.cx_closed_at_end == 1
        assert play.side.drain_stats.cx_drained_proactive == 0

    def test_busy_at_the_drain_end_closes_when_its_request_ends(self) -> None:
        play = deferred(0.0, 0.5)
        play.begin(at=22.5)
        assert play.run(until=30.0) == [(END_AT, NOTICE), (END_AT, FINAL)]
        play.end(at=30.0)
        assert play.log[-2:] == [(30.0, RESPONSE_DRAINS), (30.0, CLOSE)]

    def test_shutdown_deadline_still_ends_it(self) -> None:
        """The process's deadline (``close_at_end``) before T + G closes it whatever it
        waits for."""
        play = deferred(0.0, 0.5)
        play.close_at_end(at=22.5)
        assert play.log == [(22.5, END), (22.5, FINAL), (22.5, CLOSE)]

    def test_t_passing_leaves_an_idle_untold_connection_open(self) -> None:
        """At T (no new work) the default says the last word and closes what is idle; on
        response leaves it: a request that still comes is answered going away, which tells
        it, and T + G closes it otherwise."""
        play = deferred(0.0, 0.5)
        play.no_new_work(at=START + T)
        assert play.log == []
        assert play.conn.holds_open(START + T)
        assert play.run(until=40.0) == [(END_AT, NOTICE), (END_AT, FINAL), (END_AT, CLOSE)]

    def test_t_passing_still_tells_a_busy_connection(self) -> None:
        play = deferred(18.5)  # accepted after 2T/3: no moment
        play.begin(at=21.0)
        play.no_new_work(at=START + T)
        assert play.log == [(22.0, FINAL)]

    def test_a_connection_without_a_moment_is_held_at_t_and_not_closed_by_itself(self) -> None:
        """Accepted after 2T/3: no moment, so no end of its own either (a drain that stays
        up keeps serving it); a shutdown closes it at its exit, T + G at the earliest."""
        play = deferred(18.5)
        play.no_new_work(at=START + T)
        assert play.run(until=100.0) == []
        assert not play.conn.holds_open(100.0)
        play.close_at_end(at=100.0)
        assert play.log == [(100.0, END), (100.0, FINAL), (100.0, CLOSE)]


# -- drain events reaching a connection -----------------------------------------------------------


class TestEventsReachingAConnection:
    def test_event_replayed_to_a_connection_accepted_after_the_drain_started(self) -> None:
        play = Play.through(EV, 12.0, 0.25)  # accepted at 12: the listener's event is replayed
        assert play.conn.proactive_at == moment(0.25)
        assert play.rng.exhausted
        assert play.run(until=30.0) == [(18.75, NOTICE), (18.75, DRAIN), (19.75, FINAL),
                                        (19.75, CLOSE)]

    def test_connection_accepted_at_two_thirds_still_gets_a_moment(self) -> None:
        play = Play.through(EV, LO, 0.0)
        assert play.conn.proactive_at == LO

    def test_connection_accepted_after_two_thirds_is_drained_by_its_first_response(self) -> None:
        play = Play.through(EV, 18.5)  # no draw
        assert play.conn.proactive_at is None
        assert play.run(until=40.0) == []
        assert play.response(at=40.0) is True
        assert play.run(until=50.0) == [(41.0, FINAL), (41.0, CLOSE)]

    @pytest.mark.parametrize("order", ["long-first", "short-first"])
    def test_earliest_moment_wins_across_two_events(self, order: str) -> None:
        long = DrainEvent(START, Strategy.GRADUAL, T, G)  # window [18, 21): r=0.5 -> 19.5
        short = DrainEvent(13.0, Strategy.GRADUAL, 6.0, 0.5, Cause.RELOAD)  # [17, 18.5) -> 17.75
        events = [long, short] if order == "long-first" else [short, long]
        play = Play.accept(listener_with(grace=G), at=0.0, rng=ScriptedRng(0.5, 0.5))
        for ev in events:
            play.run(until=ev.start)
            play.drain_event(ev)
        assert play.conn.proactive_at == 17.75
        assert play.run(until=40.0) == [(17.75, NOTICE), (17.75, DRAIN), (18.75, FINAL),
                                        (18.75, CLOSE)]

    def test_two_events_replayed_at_accept(self) -> None:
        short = DrainEvent(13.0, Strategy.GRADUAL, 6.0, 0.5, Cause.RELOAD)
        listener = listener_with(EV, short, grace=G)
        play = Play.accept(listener, at=14.0, rng=ScriptedRng(0.0, 0.0))
        assert play.conn.proactive_at == 17.0
        assert play.rng.exhausted


# -- drained by a limit of its own ----------------------------------------------------------------


class TestDrainedByALimit:
    """Envoy's max_connection_duration and max_requests_per_connection: the connection drains
    the way a response drains it, with no drain event anywhere."""

    def test_max_duration_is_the_one_deadline_then_its_grace(self) -> None:
        conn = ConnectionDrain(listener_with(grace=G), 2.0, ScriptedRng(), max_duration=30.0)
        assert conn.next_deadline() == 32.0
        assert conn.on_timer(31.99, idle=True) is ConnAction.NONE
        assert conn.state is ConnState.OPEN
        assert conn.on_timer(32.0, idle=False) is ConnAction.NONE  # busy: it drains, no close
        assert (conn.state, conn.drained_by, conn.drained_at) == (
            ConnState.DRAINING, DrainedBy.MAX_DURATION, 32.0)
        assert conn.next_deadline() == 32.0 + G
        assert conn.on_timer(32.0 + G, idle=True) is ConnAction.CLOSE

    def test_no_max_duration_no_deadline(self) -> None:
        conn = ConnectionDrain(listener_with(grace=G), 2.0, ScriptedRng())
        assert conn.next_deadline() is None
        assert conn.on_timer(1e9, idle=True) is ConnAction.NONE

    def test_an_earlier_proactive_moment_wins_and_a_later_one_still_fires(self) -> None:
        conn = ConnectionDrain(listener_with(EV), 0.0, ScriptedRng(0.5), max_duration=15.0)
        assert conn.next_deadline() == 15.0  # before its moment (19.5)
        conn.on_timer(15.0, idle=False)
        assert conn.drained_by is DrainedBy.MAX_DURATION
        assert conn.next_deadline() == 15.0 + G
        conn.on_timer(15.0 + G, idle=False)
        assert conn.next_deadline() == moment(0.5)  # its tunnels still end at their moment
        assert conn.on_timer(moment(0.5), idle=False) is ConnAction.DRAIN
        conn = ConnectionDrain(listener_with(EV), 0.0, ScriptedRng(0.5), max_duration=25.0)
        assert conn.next_deadline() == moment(0.5)
        conn.on_timer(moment(0.5), idle=False)
        assert conn.drained_by is DrainedBy.PROACTIVE

    def test_max_requests_drains_an_open_connection_once(self) -> None:
        conn = ConnectionDrain(listener_with(grace=G), 0.0, ScriptedRng())
        assert conn.drain_by_limit(4.0, DrainedBy.MAX_REQUESTS) is True
        assert (conn.state, conn.drained_by) == (ConnState.DRAINING, DrainedBy.MAX_REQUESTS)
        assert conn.on_response(4.5, ScriptedRng()) is True  # its response says so
        assert conn.drain_by_limit(5.0, DrainedBy.MAX_REQUESTS) is False
        assert conn.next_deadline() == 4.0 + G


# -- the transitions table ------------------------------------------------------------------------


class TestTransitions:
    def test_table(self) -> None:
        S, I = ConnState, Input  # noqa: E741
        assert {
            (S.OPEN, I.DRAIN): S.DRAINING,
            (S.OPEN, I.CLOSE): S.CLOSING,
            (S.OPEN, I.CLOSED): S.CLOSED,
            (S.DRAINING, I.CLOSE): S.CLOSING,
            (S.DRAINING, I.CLOSED): S.CLOSED,
            (S.CLOSING, I.CLOSED): S.CLOSED,
        } == TRANSITIONS

    def test_no_transition_out_of_closed(self) -> None:
        assert not [key for key in TRANSITIONS if key[0] is ConnState.CLOSED]

    def test_states_only_move_forward(self) -> None:
        order = list(ConnState)
        for (src, _), dst in TRANSITIONS.items():
            assert order.index(dst) > order.index(src)

    def test_peer_closes_an_open_connection(self) -> None:
        conn = ConnectionDrain(listener_with(EV), 12.0, ScriptedRng(0.5))
        conn.closed()
        assert conn.state is ConnState.CLOSED
        assert conn.next_deadline() is None

    def test_closed_connection_ignores_everything(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.run(until=40.0)
        assert play.state is ConnState.CLOSING
        play.conn.closed()
        conn = play.conn
        assert conn.state is ConnState.CLOSED
        assert conn.on_timer(100.0, idle=True) is ConnAction.NONE
        assert conn.on_idle(100.0) is ConnAction.NONE
        assert conn.drain_at_end(100.0) is False
        conn.close()
        conn.on_drain_event(DrainEvent(90.0, Strategy.IMMEDIATE, 3.0, 0.0), ScriptedRng())
        assert conn.state is ConnState.CLOSED
        assert conn.next_deadline() is None

    def test_shell_closes_a_draining_connection(self) -> None:
        play = Play.through(EV, 0.0, 0.5)
        play.response(at=16.0)
        play.conn.close()
        assert play.state is ConnState.CLOSING
        assert play.conn.next_deadline() is None
        assert play.conn.on_idle(30.0) is ConnAction.NONE


def test_fake_clock_is_monotonic() -> None:
    clock = FakeClock(5.0)
    assert clock() == 5.0
    assert clock.advance(1.5) == 6.5
    with pytest.raises(AssertionError):
        clock.set(6.0)


def test_a_timer_that_never_moves_on_fails_the_play_instead_of_hanging_it() -> None:
    loop = ClockLoop(FakeClock())

    def again() -> None:
        loop.call_at(loop.time(), again)

    loop.call_at(1.0, again)
    with pytest.raises(AssertionError, match="never moves on"):
        loop.advance(2.0, max_fires=50)
    assert loop.time() == 1.0


def test_scripted_rng_fails_on_an_unscripted_draw() -> None:
    rng = ScriptedRng(0.5)
    assert rng() == 0.5
    with pytest.raises(AssertionError):
        rng()
    with pytest.raises(ValueError):
        rng.push(1.0)


def test_response_drained_connection_is_still_drained_proactively_for_its_tunnels() -> None:
    """As Envoy's draining docs describe, a connection drained by a response keeps its
    tunneling streams until it is drained proactively as well."""
    play = Play.through(EV, 0.0, 0.5)  # moment 19.5
    play.begin(at=11.0)  # e.g. an HTTP/2 CONNECT / WebSocket stream, open through the drain
    play.response(at=16.0)  # another stream's response drains the connection (GOAWAY)
    log = play.run(until=30.0)
    assert (19.5, DRAIN) in log
    assert play.conn.drained_by is DrainedBy.RESPONSE  # still counted as drained by response
    assert [e for e in log if e[1] is DRAIN] == [(19.5, DRAIN)]  # once


def test_moment_before_response_drain_fires_once() -> None:
    """Drained proactively first: the moment is spent; a later response changes nothing."""
    play = Play.through(EV, 0.0, 0.5)  # moment 19.5
    play.begin(at=11.0)
    log = play.run(until=30.0)
    assert [e for e in log if e[1] is DRAIN] == [(19.5, DRAIN)]


def test_the_manager_arms_the_grace_of_a_connection_a_response_drained() -> None:
    """The manager keeps the drain's one timer: the grace G a draining response starts is one
    of its moments, whatever the codec does with the notice."""
    play = Play.through(EV, 18.5)  # no proactive moment: no timer armed before the response
    assert play.response(at=40.0) is True
    assert play.run(until=50.0) == [(41.0, FINAL), (41.0, CLOSE)]
