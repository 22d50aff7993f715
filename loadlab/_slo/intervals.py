"""Confidence intervals that decide an objective: order statistics and Clopper-Pearson.

Example::

    percentile_ci(latencies_ms, 99)      # (low, high); None = that side is unbounded
    proportion_ci(3, 1000)               # exact binomial interval of an error rate
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "MAX_N",
    "Bounds",
    "order_stat_ranks",
    "percentile_bounds_at",
    "percentile_ci",
    "proportion_bounds_at",
    "proportion_ci",
]

MAX_N = 10_000_000  # "more requests needed" is searched up to this many
Bounds = tuple[float | None, float | None]


def order_stat_ranks(n: int, q: float, confidence: float) -> tuple[int, int]:
    """1-based ranks (l, u) with P(X_(l) <= xi_q <= X_(u)) >= confidence, distribution-free.

    The count B of samples below the true quantile xi_q is Binomial(n, q); X_(l) <= xi_q
    iff B >= l and X_(u) >= xi_q iff B <= u - 1, so coverage = F(u - 1) - F(l - 1)
    (David & Nagaraja, "Order Statistics", 3rd ed., section 7.1). l = 0 or u = n + 1 mean
    the interval is unbounded on that side: too few samples to bound that tail.
    """
    a = (1 - confidence) / 2
    lo = int(stats.binom.ppf(a, n, q))  # F(lo - 1) < a
    hi = int(stats.binom.ppf(1 - a, n, q)) + 1  # F(hi - 1) >= 1 - a
    return lo, hi


def percentile_ci(
    values: Sequence[float] | np.ndarray, pct: float, confidence: float = 0.95
) -> tuple[float | None, float | None]:
    """Distribution-free interval for the ``pct`` percentile; ``None`` = unbounded side.

    >>> percentile_ci(list(range(1, 1001)), 50)
    (469.0, 532.0)
    """
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 0:
        return None, None
    lo, hi = order_stat_ranks(n, pct / 100, confidence)
    return (float(x[lo - 1]) if lo >= 1 else None, float(x[hi - 1]) if hi <= n else None)


def proportion_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial (Clopper-Pearson, 1934) interval for a proportion k / n."""
    if n == 0:
        return 0.0, 1.0
    a = (1 - confidence) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def percentile_bounds_at(x: np.ndarray, pct: float, confidence: float) -> Callable[[int], Bounds]:
    """Interval bounds at N samples, read from the current sample's quantile function."""

    def at(big_n: int) -> tuple[float | None, float | None]:
        lo, hi = order_stat_ranks(big_n, pct / 100, confidence)
        # The r-th of N order statistics sits near quantile r / (N + 1) of the distribution.
        lv = float(np.quantile(x, lo / (big_n + 1))) if lo >= 1 else None
        hv = float(np.quantile(x, hi / (big_n + 1))) if hi <= big_n else None
        return lv, hv

    return at


def proportion_bounds_at(p_hat: float, confidence: float) -> Callable[[int], Bounds]:
    def at(big_n: int) -> tuple[float, float]:
        return proportion_ci(round(p_hat * big_n), big_n, confidence)

    return at
