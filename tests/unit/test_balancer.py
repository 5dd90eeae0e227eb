"""Round robin (plain and nginx's smooth weighted) and power-of-two-choices least request."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from lameduck.upstream.balancer import LeastRequest, RoundRobin


@dataclass(eq=False)  # hashable by identity, like the pool's endpoints
class H:
    name: str
    weight: int = 1
    rq_active: int = 0

    def __repr__(self) -> str:
        return self.name


def names(seq: list[H | None]) -> str:
    return " ".join(h.name if h is not None else "-" for h in seq)


# --------------------------------------------------------------------------- round robin


def test_rr_empty_and_all_zero_weight() -> None:
    rr = RoundRobin()
    assert rr.pick([]) is None
    assert rr.pick([H("a", 0), H("b", 0)]) is None


def test_rr_equal_weights_rotate() -> None:
    rr = RoundRobin()
    hosts = [H("a"), H("b"), H("c")]
    assert names([rr.pick(hosts) for _ in range(7)]) == "a b c a b c a"


def test_rr_equal_weights_other_than_one_rotate_too() -> None:
    rr = RoundRobin()
    hosts = [H("a", 3), H("b", 3)]
    assert names([rr.pick(hosts) for _ in range(4)]) == "a b a b"


def test_rr_rotation_survives_a_shrinking_list() -> None:
    rr = RoundRobin()
    hosts = [H("a"), H("b"), H("c")]
    rr.pick(hosts)
    rr.pick(hosts)
    rr.pick(hosts)
    assert names([rr.pick(hosts[:2]) for _ in range(3)]) == "b a b"  # index 3 mod 2


def test_rr_single_host() -> None:
    rr = RoundRobin()
    a = H("a")
    assert [rr.pick([a]) for _ in range(3)] == [a, a, a]


def test_swrr_is_nginxs_sequence() -> None:
    rr = RoundRobin()
    hosts = [H("a", 5), H("b", 1), H("c", 1)]
    assert names([rr.pick(hosts) for _ in range(14)]) == "a a b a c a a a a b a c a a"


def test_swrr_proportions() -> None:
    rr = RoundRobin()
    hosts = [H("a", 3), H("b", 2), H("c", 0), H("d", 1)]
    counts = Counter(rr.pick(hosts) for _ in range(600))
    assert {h.name: counts[h] for h in hosts} == {"a": 300, "b": 200, "c": 0, "d": 100}


def test_swrr_a_departed_host_keeps_no_influence() -> None:
    a, b, c = H("a", 5), H("b", 1), H("c", 1)
    rr = RoundRobin()
    assert names([rr.pick([a, b, c]) for _ in range(3)]) == "a a b"  # c's current is now 3
    assert rr.pick([a, b]) is a  # c is gone: its entry is dropped
    assert c not in rr._current
    assert rr.pick([a, b, c]) is a
    assert rr._current == {a: -2, b: -2, c: 1}  # c starts from zero again, not from 3


def test_swrr_starts_afresh_after_a_phase_of_equal_weights() -> None:
    a, b, c = H("a", 5), H("b", 1), H("c", 1)
    rr = RoundRobin()
    assert names([rr.pick([a, b, c]) for _ in range(3)]) == "a a b"
    a.weight = 1  # equal weights: plain rotation
    assert names([rr.pick([a, b, c]) for _ in range(3)]) == "a b c"
    a.weight = 5  # weighted again: nginx's sequence from the start, no stale currents
    assert names([rr.pick([a, b, c]) for _ in range(7)]) == "a a b a c a a"


def test_rr_exclude_goes_elsewhere() -> None:
    a, b, c = H("a"), H("b"), H("c")
    rr = RoundRobin()
    assert rr.pick([a, b, c], exclude=a) is b
    assert rr.pick([a, b, c], exclude=c) is a  # index wrapped: c skipped
    assert rr.pick([a, b, c]) is b


def test_rr_exclude_of_the_only_host_gives_none() -> None:
    a = H("a")
    rr = RoundRobin()
    assert rr.pick([a], exclude=a) is None
    assert rr.pick([], exclude=a) is None
    assert rr.pick([a, H("z", 0)], exclude=a) is None  # the other one is weight 0
    assert rr.pick([a]) is a  # the rotation was not disturbed by the refusals


def test_rr_exclude_is_by_identity() -> None:
    a, a_twin = H("a"), H("a")
    rr = RoundRobin()
    assert rr.pick([a], exclude=a_twin) is a


def test_swrr_exclude_skips_and_keeps_its_current() -> None:
    a, b, c = H("a", 5), H("b", 1), H("c", 1)
    rr = RoundRobin()
    picks = [rr.pick([a, b, c], exclude=a) for _ in range(4)]
    assert names(picks) == "b c b c"
    assert rr._current[a] == 0  # a was skipped, not charged
    assert rr.pick([a, b, c], exclude=b) is a
    assert rr.pick([b], exclude=b) is None


# --------------------------------------------------------------------------- least request


def lr(seed: int = 1, choices: int = 2) -> LeastRequest:
    return LeastRequest(random.Random(seed).random, choices)


def test_lr_empty_single_and_zero_weight() -> None:
    b = lr()
    assert b.pick([]) is None
    a = H("a", rq_active=100)
    assert b.pick([a]) is a
    assert b.pick([H("z", 0)]) is None
    assert b.pick([a, H("z", 0)]) is a


def test_lr_two_hosts_always_the_less_loaded() -> None:
    b = lr()
    busy, idle = H("busy", rq_active=5), H("idle", rq_active=1)
    assert all(b.pick([busy, idle]) is idle for _ in range(50))


def test_lr_distribution_favours_the_least_loaded() -> None:
    hosts = [H("h0", rq_active=0), H("h1", rq_active=3), H("h2", rq_active=6), H("h3", rq_active=9)]
    b = lr(seed=7)
    counts = Counter(b.pick(hosts) for _ in range(1000))
    c = [counts[h] for h in hosts]
    # distinct pairs: the least loaded of a pair wins; P = 3/6, 2/6, 1/6, 0
    assert c[0] > c[1] > c[2] > c[3] == 0
    assert 430 < c[0] < 570 and 270 < c[1] < 400 and 110 < c[2] < 230


def test_lr_weight_zero_never_picked() -> None:
    hosts = [H("zero", weight=0), H("a", rq_active=50), H("b", rq_active=60)]
    b = lr(seed=3)
    counts = Counter(b.pick(hosts) for _ in range(1000))
    assert counts[hosts[0]] == 0
    assert counts[hosts[1]] + counts[hosts[2]] == 1000


def test_lr_equal_load_is_spread_uniformly() -> None:
    hosts = [H(f"h{i}") for i in range(4)]
    b = lr(seed=11)
    counts = Counter(b.pick(hosts) for _ in range(4000))
    assert all(850 < counts[h] < 1150 for h in hosts)


def test_lr_ties_go_to_the_first_sampled() -> None:
    a, b = H("a", rq_active=2), H("b", rq_active=2)
    draws = iter([0.0, 0.0, 0.9, 0.0])  # first: a then b; second: b then a
    bal = LeastRequest(lambda: next(draws))
    assert bal.pick([a, b]) is a
    assert bal.pick([a, b]) is b


def test_lr_weights_scale_the_load() -> None:
    big = H("big", weight=4, rq_active=8)  # 2 per unit of weight
    small = H("small", weight=1, rq_active=3)  # 3 per unit
    b = lr()
    assert all(b.pick([small, big]) is big for _ in range(20))
    small.rq_active = 1
    assert all(b.pick([small, big]) is small for _ in range(20))


def test_lr_exclude() -> None:
    a, b_ = H("a", rq_active=0), H("b", rq_active=9)
    bal = lr()
    assert all(bal.pick([a, b_], exclude=a) is b_ for _ in range(20))
    assert bal.pick([a], exclude=a) is None
    assert bal.pick([a, H("z", 0)], exclude=a) is None


def test_lr_is_deterministic_with_a_seeded_rng() -> None:
    hosts = [H(f"h{i}", rq_active=i % 3) for i in range(9)]
    b1, b2, b3 = lr(seed=42), lr(seed=42), lr(seed=43)
    seq1 = [b1.pick(hosts) for _ in range(200)]
    seq2 = [b2.pick(hosts) for _ in range(200)]
    assert seq1 == seq2
    assert seq1 != [b3.pick(hosts) for _ in range(200)]


def test_lr_more_choices_sharpen_the_pick() -> None:
    hosts = [H(f"h{i}", rq_active=i) for i in range(5)]
    b = lr(seed=5, choices=5)  # sees every host: always the least loaded
    assert all(b.pick(hosts) is hosts[0] for _ in range(50))
    one = lr(seed=5, choices=1)  # no choice: uniform
    counts = Counter(one.pick(hosts) for _ in range(2000))
    assert all(counts[h] > 300 for h in hosts)


def test_lr_rng_returning_one_does_not_overflow() -> None:
    a, b = H("a"), H("b")
    assert LeastRequest(lambda: 1.0).pick([a, b]) in (a, b)


def test_lr_choices_validated() -> None:
    with pytest.raises(ValueError):
        LeastRequest(random.random, 0)
