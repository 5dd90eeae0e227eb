"""Endpoint drain and persistence (the decision order of Kemp LoadMaster's drain stop), on a
fake clock.

The endpoint enters DRAIN at 100 with drain_stop 30 unless said."""

from __future__ import annotations

import math

import pytest

from lameduck.drain.endpoint import (
    AdminState,
    ConnAction,
    Decision,
    EndpointDrain,
    Layer,
    PersistenceTable,
    Route,
    decide,
)

BELOW = math.nextafter
DRAIN_AT = 100.0


def draining(**kw: object) -> EndpointDrain:
    ep = EndpointDrain(**kw)  # type: ignore[arg-type]
    ep.set_state(AdminState.DRAIN, DRAIN_AT)
    return ep


BALANCE_NEW = Decision(Route.BALANCE, discard=False, record=True)
REBALANCE = Decision(Route.BALANCE, discard=True, record=True)
STICK = Decision(Route.STICK, discard=False, record=True)


def test_persistence_off_always_balances() -> None:
    for ep in (None, EndpointDrain(), draining()):
        assert decide(False, ep, Layer.L7, DRAIN_AT) == Decision(Route.BALANCE, False, False)


def test_no_record_balances_and_creates_one() -> None:
    assert decide(True, None, Layer.L7, 0.0) == BALANCE_NEW


@pytest.mark.parametrize("layer", [Layer.L4, Layer.L7])
def test_record_for_an_up_endpoint_sticks_and_refreshes(layer: Layer) -> None:
    assert decide(True, EndpointDrain(), layer, 0.0) == STICK


@pytest.mark.parametrize("layer", [Layer.L4, Layer.L7])
def test_record_for_a_down_or_halted_endpoint_is_discarded(layer: Layer) -> None:
    down = EndpointDrain(healthy=False)
    assert decide(True, down, layer, 0.0) == REBALANCE
    maint = EndpointDrain()
    maint.set_state(AdminState.MAINT, 0.0)
    assert decide(True, maint, layer, 0.0) == REBALANCE
    sick_drain = draining(healthy=False)  # down wins over drain
    assert decide(True, sick_drain, layer, DRAIN_AT) == REBALANCE


def test_drain_on_layer7_sticks_until_the_drain_stop_timer_expires() -> None:
    ep = draining(drain_stop=30.0)
    assert decide(True, ep, Layer.L7, DRAIN_AT) == STICK
    assert decide(True, ep, Layer.L7, BELOW(DRAIN_AT + 30.0, 0)) == STICK
    assert decide(True, ep, Layer.L7, DRAIN_AT + 30.0) == REBALANCE
    assert ep.next_change(DRAIN_AT + 1) == DRAIN_AT + 30.0
    assert ep.next_change(DRAIN_AT + 30.0) is None


def test_drain_on_layer4_discards_at_once() -> None:
    assert decide(True, draining(drain_stop=30.0), Layer.L4, DRAIN_AT) == REBALANCE


def test_clear_persistence_on_drain_rebalances_at_once() -> None:
    ep = draining(drain_stop=30.0, clear_persistence_on_drain=True)
    assert decide(True, ep, Layer.L7, DRAIN_AT) == REBALANCE


def test_the_timer_leaves_connections_alone_unless_told() -> None:
    keep = draining(drain_stop=30.0)
    assert keep.connections(DRAIN_AT + 1000) is ConnAction.KEEP
    drop_end = draining(drain_stop=30.0, drop_at_drain_end=True)
    assert drop_end.connections(BELOW(DRAIN_AT + 30.0, 0)) is ConnAction.KEEP
    assert drop_end.connections(DRAIN_AT + 30.0) is ConnAction.DROP
    zero = draining(drain_stop=0.0)  # as in Kemp LoadMaster: 0 drops them immediately
    assert zero.connections(DRAIN_AT) is ConnAction.DROP
    assert decide(True, zero, Layer.L7, DRAIN_AT) == REBALANCE


def test_states_and_the_timer_start() -> None:
    ep = EndpointDrain()
    assert ep.up and ep.drain_since is None
    ep.set_state(AdminState.DRAIN, 5.0)
    ep.set_state(AdminState.DRAIN, 9.0)  # already draining: the timer keeps its start
    assert ep.drain_since == 5.0 and not ep.up
    ep.set_state(AdminState.READY, 10.0)
    assert ep.up and ep.drain_since is None
    assert decide(True, ep, Layer.L7, 10.0) == STICK
    ep.set_state(AdminState.MAINT, 11.0)
    assert ep.connections(11.0) is ConnAction.KEEP  # in-flight finishes; nothing new


def test_persistence_table_expires_refreshes_and_is_bounded() -> None:
    t: PersistenceTable[str, str] = PersistenceTable(timeout=10.0, max_records=2)
    t.record("1.2.3.4", "a", 0.0)
    assert t.lookup("1.2.3.4", BELOW(10.0, 0)) == "a"
    assert t.lookup("1.2.3.4", 10.0) is None  # expired and gone
    assert len(t) == 0
    t.record("x", "a", 0.0)
    t.record("y", "b", 1.0)
    t.record("x", "a", 5.0)  # refreshed: now the newest
    t.record("z", "c", 6.0)  # over the bound: the oldest (y) goes
    assert t.lookup("y", 6.0) is None and t.lookup("x", 6.0) == "a"
    assert t.expire(15.0) == 1  # x (expires 15.0); z lives until 16.0
    assert t.lookup("z", 15.5) == "c"
    t.discard("z")
    assert len(t) == 0
    with pytest.raises(ValueError):
        PersistenceTable(timeout=0)
