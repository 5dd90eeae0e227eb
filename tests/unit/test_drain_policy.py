"""The drain decisions of Envoy's draining docs: the per-response ramp, the proactive window
and moment, drain events, and a listener's node in the drain tree.

Numbers are chosen to be exact in binary floating point: T = 12, G = 1 gives T/2 = 6 and the
proactive window [8, 11).
"""

from __future__ import annotations

import math

import pytest

from lameduck.drain import (
    Cause,
    Direction,
    DrainEvent,
    DrainType,
    ListenerDrain,
    Strategy,
    proactive_moment,
    proactive_window,
    response_drains,
)
from tests.drainplay import ScriptedRng

T, G = 12.0, 1.0
BELOW = math.nextafter  # BELOW(x, 0.0): the float just under x


def gradual(start: float = 0.0, time: float = T, grace: float = G,
            cause: Cause = Cause.SHUTDOWN, inbound_only: bool = False) -> DrainEvent:
    return DrainEvent(start, Strategy.GRADUAL, time, grace, cause, inbound_only)


def immediate(start: float = 0.0, time: float = T, grace: float = G) -> DrainEvent:
    return DrainEvent(start, Strategy.IMMEDIATE, time, grace)


# -- the drain event ------------------------------------------------------------------------------


class TestDrainEvent:
    def test_ends_at_and_elapsed(self) -> None:
        ev = gradual(start=100.0)
        assert ev.ends_at == 112.0
        assert ev.elapsed(103.5) == 3.5
        assert ev.elapsed(99.0) == 0.0  # never negative

    @pytest.mark.parametrize(("time", "grace"), [
        (-1.0, 1.0), (1.0, -0.5), (float("nan"), 1.0), (1.0, float("nan")),
        (float("inf"), 1.0)])
    def test_negative_or_non_finite_times_cannot_exist(self, time: float, grace: float) -> None:
        with pytest.raises(ValueError):
            DrainEvent(0.0, Strategy.GRADUAL, time, grace)

    def test_unknown_strategy_cannot_exist(self) -> None:
        with pytest.raises(ValueError):
            DrainEvent(0.0, "gradual", T, G)  # type: ignore[arg-type]

    def test_frozen(self) -> None:
        ev = gradual()
        with pytest.raises(AttributeError):
            ev.time = 1.0  # type: ignore[misc]

    @pytest.mark.parametrize(
        ("cause", "drain_type", "direction", "inbound_only", "covered"),
        [
            # default listeners take part in every drain
            (Cause.SHUTDOWN, DrainType.DEFAULT, Direction.INBOUND, False, True),
            (Cause.DRAIN_LISTENERS, DrainType.DEFAULT, Direction.INBOUND, False, True),
            (Cause.HOT_RESTART, DrainType.DEFAULT, Direction.INBOUND, False, True),
            (Cause.RELOAD, DrainType.DEFAULT, Direction.INBOUND, False, True),
            (Cause.DRAIN_LISTENERS, DrainType.DEFAULT, Direction.OUTBOUND, False, True),
            # modify_only ignores /drain_listeners, but not shutdown, hot restart or reload
            (Cause.DRAIN_LISTENERS, DrainType.MODIFY_ONLY, Direction.INBOUND, False, False),
            (Cause.DRAIN_LISTENERS, DrainType.MODIFY_ONLY, Direction.OUTBOUND, False, False),
            (Cause.SHUTDOWN, DrainType.MODIFY_ONLY, Direction.INBOUND, False, True),
            (Cause.HOT_RESTART, DrainType.MODIFY_ONLY, Direction.OUTBOUND, False, True),
            (Cause.RELOAD, DrainType.MODIFY_ONLY, Direction.OUTBOUND, False, True),
            # inboundonly filters out outbound listeners
            (Cause.DRAIN_LISTENERS, DrainType.DEFAULT, Direction.INBOUND, True, True),
            (Cause.DRAIN_LISTENERS, DrainType.DEFAULT, Direction.OUTBOUND, True, False),
            (Cause.DRAIN_LISTENERS, DrainType.MODIFY_ONLY, Direction.INBOUND, True, False),
        ],
    )
    def test_covers(self, cause: Cause, drain_type: DrainType, direction: Direction,
                    inbound_only: bool, covered: bool) -> None:
        ev = gradual(cause=cause, inbound_only=inbound_only)
        assert ev.covers(direction, drain_type) is covered


# -- per-response decision ------------------------------------------------------------------------


class TestResponseDrains:
    @pytest.mark.parametrize("now", [-1.0, 0.0, 0.001, 3.0, 6.0, 11.0, 12.0, 50.0])
    def test_immediate_always_drains_without_drawing(self, now: float) -> None:
        assert response_drains(immediate(), now, ScriptedRng()) is True

    @pytest.mark.parametrize("now", [-5.0, 0.0])
    def test_gradual_never_drains_at_or_before_start(self, now: float) -> None:
        assert response_drains(gradual(), now, ScriptedRng()) is False

    @pytest.mark.parametrize(
        ("elapsed", "ratio"), [(0.75, 0.125), (1.5, 0.25), (3.0, 0.5), (4.5, 0.75)]
    )
    def test_gradual_ramp_boundary(self, elapsed: float, ratio: float) -> None:
        """P(drain) = elapsed / (T/2): ``rng() < ratio`` drains, ``rng() >= ratio`` does not."""
        ev = gradual(start=100.0)
        now = 100.0 + elapsed
        assert elapsed / (T / 2) == ratio
        assert response_drains(ev, now, ScriptedRng(BELOW(ratio, 0.0))) is True
        assert response_drains(ev, now, ScriptedRng(ratio)) is False
        assert response_drains(ev, now, ScriptedRng(BELOW(1.0, 0.0))) is False
        assert response_drains(ev, now, ScriptedRng(0.0)) is True

    @pytest.mark.parametrize("elapsed", [6.0, 6.5, 8.0, 12.0, 1000.0])
    def test_gradual_always_drains_from_half_t(self, elapsed: float) -> None:
        # no rng draw at all: an empty script would fail the test if one were made
        assert response_drains(gradual(start=7.0), 7.0 + elapsed, ScriptedRng()) is True

    def test_gradual_just_before_half_t_still_draws(self) -> None:
        now = BELOW(6.0, 0.0)
        assert response_drains(gradual(), now, ScriptedRng(BELOW(1.0, 0.0))) is False

    @pytest.mark.parametrize("strategy", list(Strategy))
    def test_zero_drain_time_drains_every_response_at_once(self, strategy: Strategy) -> None:
        ev = DrainEvent(5.0, strategy, 0.0, G)
        assert response_drains(ev, 5.0, ScriptedRng()) is True
        assert response_drains(ev, 9.0, ScriptedRng()) is True


# -- proactive window and moment ------------------------------------------------------------------


class TestProactiveWindow:
    def test_window_is_two_thirds_to_t_minus_g(self) -> None:
        assert proactive_window(gradual()) == (8.0, 11.0)
        assert proactive_window(gradual(start=100.0)) == (108.0, 111.0)
        assert proactive_window(gradual(grace=0.0)) == (8.0, 12.0)
        assert proactive_window(immediate(start=3.0, time=30.0, grace=5.0)) == (23.0, 28.0)

    @pytest.mark.parametrize("grace", [4.0, 4.5, 12.0, 100.0])
    def test_empty_when_grace_at_least_a_third(self, grace: float) -> None:
        assert proactive_window(gradual(grace=grace)) is None

    @pytest.mark.parametrize(("time", "grace"), [(0.9, 0.3), (1.2, 0.4), (0.3, 0.1), (3.0, 1.0),
                                                 (0.6, 0.2), (2.1, 0.7)])
    @pytest.mark.parametrize("start", [0.0, 12345.678, 98765.4321, 1e9 + 0.1])
    def test_empty_when_grace_is_a_third_in_config_units(
        self, time: float, grace: float, start: float
    ) -> None:
        # G == T/3 as an operator writes it (900ms, 300ms) is not exact in floats; comparing the
        # absolute bounds left a window a few ulps wide for some starts (found by the
        # integration test: a connection was drained "proactively" with G == T/3).
        assert proactive_window(gradual(start=start, time=time, grace=grace)) is None

    def test_not_empty_just_under_a_third(self) -> None:
        window = proactive_window(gradual(grace=3.5))
        assert window == (8.0, 8.5)

    @pytest.mark.parametrize("grace", [0.0, 1.0])
    def test_zero_drain_time_has_no_window(self, grace: float) -> None:
        assert proactive_window(gradual(time=0.0, grace=grace)) is None


class TestProactiveMoment:
    @pytest.mark.parametrize(("r", "moment"), [(0.0, 8.0), (0.25, 8.75), (0.5, 9.5), (0.75, 10.25)])
    def test_moment_is_lo_plus_r_times_width(self, r: float, moment: float) -> None:
        rng = ScriptedRng(r)
        assert proactive_moment(gradual(), accepted_at=0.0, rng=rng) == moment
        assert rng.exhausted

    def test_moment_is_strictly_below_hi_for_r_just_under_one(self) -> None:
        r = BELOW(1.0, 0.0)
        assert 8.0 + r * (11.0 - 8.0) == 11.0  # the unclamped formula rounds up onto hi
        moment = proactive_moment(gradual(), 0.0, ScriptedRng(r))
        assert moment is not None
        assert 8.0 <= moment < 11.0
        assert moment == BELOW(11.0, 0.0)

    def test_far_start_still_strictly_below_hi(self) -> None:
        ev = gradual(start=1e9 + 0.1)
        window = proactive_window(ev)
        assert window is not None
        lo, hi = window
        moment = proactive_moment(ev, ev.start, ScriptedRng(BELOW(1.0, 0.0)))
        assert moment is not None
        assert lo <= moment < hi

    @pytest.mark.parametrize("accepted_at", [-100.0, 0.0, 5.0, 8.0])
    def test_connection_accepted_up_to_two_thirds_gets_a_moment(self, accepted_at: float) -> None:
        assert proactive_moment(gradual(), accepted_at, ScriptedRng(0.5)) == 9.5

    @pytest.mark.parametrize("accepted_at", [math.nextafter(8.0, 9.0), 8.5, 10.0, 12.0, 40.0])
    def test_connection_accepted_after_two_thirds_gets_none(self, accepted_at: float) -> None:
        # no draw either
        assert proactive_moment(gradual(), accepted_at, ScriptedRng()) is None

    @pytest.mark.parametrize("grace", [4.0, 6.0])
    def test_empty_window_gives_none_without_drawing(self, grace: float) -> None:
        assert proactive_moment(gradual(grace=grace), 0.0, ScriptedRng()) is None


# -- a listener's node in the drain tree ----------------------------------------------------------


class TestListenerDrain:
    def test_fresh_listener(self) -> None:
        ls = ListenerDrain("ingress")
        assert not ls.draining
        assert ls.accepting(1e9)
        assert ls.response_drains(0.0, ScriptedRng()) is False

    def test_add_event_follows_coverage(self) -> None:
        egress = ListenerDrain("egress", Direction.OUTBOUND, DrainType.MODIFY_ONLY)
        assert egress.add_event(gradual(cause=Cause.DRAIN_LISTENERS)) is False
        assert not egress.draining
        assert egress.add_event(gradual(cause=Cause.SHUTDOWN, inbound_only=True)) is False
        assert not egress.draining
        ev = gradual(cause=Cause.HOT_RESTART)
        assert egress.add_event(ev) is True
        assert egress.draining
        assert egress.events == (ev,)

    def test_events_accumulate(self) -> None:
        ls = ListenerDrain("ingress")
        a, b = gradual(), immediate(start=3.0)
        ls.add_event(a)
        ls.add_event(b)
        assert ls.events == (a, b)

    def test_any_covering_event_may_drain_a_response(self) -> None:
        ls = ListenerDrain("ingress")
        ls.add_event(gradual(start=0.0))  # at now=3: ratio 0.5
        ls.add_event(gradual(start=1.5))  # at now=3: ratio 0.25
        assert ls.response_drains(3.0, ScriptedRng(0.6, 0.2)) is True
        assert ls.response_drains(3.0, ScriptedRng(0.6, 0.3)) is False
        assert ls.response_drains(3.0, ScriptedRng(0.4)) is True  # first one decides, no 2nd draw

    def test_health_check_failed_drains_every_response_of_a_default_listener(self) -> None:
        ls = ListenerDrain("ingress")
        ls.set_health_check_failed(True)
        assert ls.hc_failed
        assert ls.response_drains(0.0, ScriptedRng()) is True  # no event, no draw
        ls.set_health_check_failed(False)
        assert not ls.hc_failed
        assert ls.response_drains(0.0, ScriptedRng()) is False

    def test_health_check_failed_leaves_modify_only_alone(self) -> None:
        ls = ListenerDrain("egress", Direction.OUTBOUND, DrainType.MODIFY_ONLY)
        ls.set_health_check_failed(True)
        assert not ls.hc_failed
        assert ls.response_drains(0.0, ScriptedRng()) is False

    def test_stop_accepting_keeps_the_earliest(self) -> None:
        ls = ListenerDrain("ingress")
        ls.stop_accepting(10.0)
        ls.stop_accepting(20.0)
        assert ls.stop_at == 10.0
        ls.stop_accepting(5.0)
        assert ls.stop_at == 5.0
        assert ls.accepting(BELOW(5.0, 0.0))
        assert not ls.accepting(5.0)
        assert not ls.accepting(6.0)
