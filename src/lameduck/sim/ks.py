"""The Kolmogorov-Smirnov test, one- and two-sample, with the asymptotic p-value (Kolmogorov's
distribution with Stephens' small-sample correction): to say whether the simulator's closes
follow the same distribution as a real drain's, without a statistics library."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def kolmogorov_q(lam: float) -> float:
    """P(K > lam) for Kolmogorov's distribution: 2 * sum (-1)^(j-1) exp(-2 j^2 lam^2)."""
    if lam < 0.2:  # the series converges slowly there and the answer is 1 to many places
        return 1.0
    total = 0.0
    sign = 1.0
    for j in range(1, 101):
        term = sign * math.exp(-2.0 * j * j * lam * lam)
        total += term
        if abs(term) < 1e-12 * max(abs(total), 1e-300):
            break
        sign = -sign
    return max(0.0, min(1.0, 2.0 * total))


def _p(d: float, n_eff: float) -> float:
    en = math.sqrt(n_eff)
    return kolmogorov_q((en + 0.12 + 0.11 / en) * d)


def ks_2samp(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray
             ) -> tuple[float, float]:
    """(D, p): the largest gap between the two empirical distribution functions."""
    x = np.sort(np.asarray(a, dtype=np.float64))
    y = np.sort(np.asarray(b, dtype=np.float64))
    if x.size == 0 or y.size == 0:
        raise ValueError("both samples must be non-empty")
    grid = np.concatenate([x, y])
    fx = np.searchsorted(x, grid, side="right") / x.size
    fy = np.searchsorted(y, grid, side="right") / y.size
    d = float(np.abs(fx - fy).max())
    return d, _p(d, x.size * y.size / (x.size + y.size))


def ks_1samp(a: Sequence[float] | np.ndarray, cdf: Callable[[np.ndarray], np.ndarray]
             ) -> tuple[float, float]:
    """(D, p) of a sample against a continuous distribution function."""
    x = np.sort(np.asarray(a, dtype=np.float64))
    n = x.size
    if n == 0:
        raise ValueError("the sample must be non-empty")
    f = cdf(x)
    i = np.arange(1, n + 1)
    d = float(max((i / n - f).max(), (f - (i - 1) / n).max()))
    return d, _p(d, n)


def uniform_cdf(lo: float, hi: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.clip((x - lo) / (hi - lo), 0.0, 1.0)
