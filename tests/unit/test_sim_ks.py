"""The Kolmogorov-Smirnov test the cross-check relies on: Kolmogorov's distribution at its
tabulated points, the statistic on samples worked by hand, and p-values that reject a true
hypothesis about as often as their level says."""

from __future__ import annotations

import numpy as np
import pytest

from lameduck.sim.ks import kolmogorov_q, ks_1samp, ks_2samp, uniform_cdf


@pytest.mark.parametrize(("lam", "q"), [(1.0, 0.26999967), (1.3581, 0.05), (1.6276, 0.01),
                                        (0.5, 0.96394524), (2.0, 0.00067093)])
def test_kolmogorov_distribution_at_tabulated_points(lam: float, q: float) -> None:
    assert kolmogorov_q(lam) == pytest.approx(q, abs=2e-5)


def test_statistic_worked_by_hand() -> None:
    assert ks_2samp([1, 2, 3], [1, 2, 3])[0] == 0.0
    assert ks_2samp([1, 2, 3], [1, 2, 3])[1] == 1.0
    d, p = ks_2samp([1, 2, 3, 4], [3.5, 5, 6, 7])
    assert d == 0.75  # at 3: 3/4 of the first, none of the second
    d, p = ks_2samp(np.arange(50.0), np.arange(50.0) + 100)
    assert d == 1.0 and p < 1e-10
    d, _ = ks_1samp([0.1, 0.2, 0.9], uniform_cdf(0.0, 1.0))
    assert d == pytest.approx(max(1 / 3 - 0.1, 2 / 3 - 0.2, 0.9 - 2 / 3, 0.2 - 1 / 3,
                                  1.0 - 0.9))


def test_p_values_reject_at_their_level() -> None:
    rng = np.random.default_rng(11)
    two = [ks_2samp(rng.exponential(1.0, 60), rng.exponential(1.0, 80))[1] for _ in range(400)]
    one = [ks_1samp(rng.uniform(2.0, 5.0, 70), uniform_cdf(2.0, 5.0))[1] for _ in range(400)]
    for ps in (two, one):
        rate = np.mean(np.asarray(ps) < 0.05)
        assert 0.01 <= rate <= 0.10, rate
    # and they do reject what is false
    assert ks_2samp(rng.exponential(1.0, 200), rng.exponential(1.5, 200))[1] < 0.01
    assert ks_1samp(rng.uniform(2.0, 4.0, 200), uniform_cdf(2.0, 5.0))[1] < 0.01
