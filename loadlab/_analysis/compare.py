"""Runs side by side: each metric's change against the first run, and whether it is real.

Latency percentiles (TTFT, ITL, TPOT, E2E, and TTFAT when every run has reasoning or tool
calls) get a bootstrap confidence interval of the relative change (Efron &
Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13, percentile method), resampling
whole requests (ITL gaps of one stream move together: a cluster bootstrap). Output tokens/s
resamples per-second bins; error rate and goodput use Fisher's exact test on the counts.
Intervals are Bonferroni-adjusted over the rows, so the chance that *any* row of a comparison
of two identical setups is called significant stays under ``alpha`` -- when the machines ran
at one speed in both runs: with one run per setup the resampling is within each run, and a
speed change between runs reads as a real one (on a shared VM, 37 of 48 pairs of same-load
runs a minute apart had a significant row; docs/slo-and-reports.md). Files that share a label
are one setup's runs: pooled, with a two-level bootstrap (the runs, then the requests in
each), so the spread between runs is in the interval.

A row is a regression when the change is significant, in the worse direction, and larger than
``--fail-on-regression PCT`` percent.

Example::

    cmp = compare([read_results("a.json"), read_results("b.json")], ["main", "pr"])
    print(render_comparison(cmp))
    sys.exit(cmp.exit_code(fail_on_regression_pct=10))
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics, vectors
from loadlab._analysis.columns import NONE, RecordColumns, columns_of
from loadlab._analysis.cost import COST_METRICS, Pricing, cost_units, pricing_of
from loadlab._analysis.prefix_cache import server_hit_rate, usage_hit_rate
from loadlab.errors import ConfigError

if TYPE_CHECKING:
    from loadlab._slo import SLOSpec
    from loadlab.results import Results

__all__ = [
    "BOOTSTRAP_MAX",
    "BOOTSTRAP_MIN",
    "CACHE_GAP_PP",
    "Comparison",
    "MetricChange",
    "cache_caution",
    "check_bootstrap",
    "compare",
    "numbered_labels",
]

# (metric, percentile) rows, in display order. Latency: higher is worse.
LATENCY = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
PERCENTILES = (50.0, 99.0)
_MAX_CELLS = 4_000_000  # bootstrap work matrix size per chunk (memory bound)
# Up to this many (replicates x requests) a weight is drawn for every request of every
# replicate; beyond it, a quantile of one run with one value a request (TTFT, TPOT, E2E) is
# drawn from its exact law (``_order_statistic_quantile``), the others (ITL, pooled runs) by
# the Poisson bootstrap over a window (``_poisson_quantile``).
EXACT_CELLS = 10_000_000
# The bootstrap of an extreme quantile is unreliable when few samples lie beyond it (for the
# maximum it is inconsistent: Bickel & Freedman, Ann. Statist. 9(6), 1981). Below this many
# samples on either side of the quantile a row is shown but not tested.
MIN_TAIL_SAMPLES = 10
# Resamples: below 100 the tails of a Bonferroni-adjusted interval hold no replicate at all;
# above 100,000 the interval moves by less than its own rounding while the time grows.
BOOTSTRAP_MIN, BOOTSTRAP_MAX = 100, 100_000


def check_bootstrap(n_boot: int) -> None:
    """Raises ``ConfigError`` naming ``--bootstrap`` unless ``n_boot`` is a sane resample count.

    >>> check_bootstrap(2000)
    >>> check_bootstrap(0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    loadlab.errors.ConfigError: --bootstrap must be a whole number from 100 to 100,000 ...
    """
    if type(n_boot) is not int or not BOOTSTRAP_MIN <= n_boot <= BOOTSTRAP_MAX:
        raise ConfigError(
            f"--bootstrap must be a whole number from {BOOTSTRAP_MIN} to {BOOTSTRAP_MAX:,} "
            f"(resamples of each run; default 2000), got {n_boot!r}"
        )


@dataclass(frozen=True)
class MetricChange:
    """One metric across runs; index 0 is the baseline (its change fields are ``None``)."""

    metric: str  # "ttft_ms.p50", "output_tokens_per_s", "error_rate", "goodput_rps"
    values: tuple[float | None, ...]
    higher_is_worse: bool
    change_pct: tuple[float | None, ...]
    ci_pct: tuple[tuple[float, float] | None, ...]
    p_value: tuple[float | None, ...]
    significant: tuple[bool, ...]
    n: tuple[int, ...] = ()
    note: str = ""

    def worse(self, i: int) -> bool:
        c = self.change_pct[i]
        return c is not None and (c > 0 if self.higher_is_worse else c < 0)

    def regression(self, i: int, pct: float) -> bool:
        """Significantly worse than the baseline by more than ``pct`` percent."""
        c = self.change_pct[i]
        return bool(self.significant[i] and self.worse(i) and c is not None and abs(c) > pct)


@dataclass(frozen=True)
class Comparison:
    labels: tuple[str, ...]  # one per setup; the first is the baseline
    rows: tuple[MetricChange, ...]
    alpha: float = 0.05
    warnings: tuple[str, ...] = ()
    repeats: tuple[int, ...] = ()  # runs per setup (files that share a label); () = one each
    # said beside the table, the gate unchanged: setups whose prefix caches were not equally
    # warm (``cache_caution``)
    cautions: tuple[str, ...] = ()

    def regressions(self, pct: float) -> list[tuple[MetricChange, int]]:
        return [
            (r, i) for r in self.rows for i in range(1, len(self.labels)) if r.regression(i, pct)
        ]

    def valid(self) -> bool:
        return not self.warnings

    def exit_code(self, fail_on_regression_pct: float | None = None) -> int:
        """0 fine; 1 a significant regression over the percentage; 2 a gate on invalid runs."""
        if fail_on_regression_pct is None:
            return 0
        if not self.valid():
            return 2
        return 1 if self.regressions(fail_on_regression_pct) else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": list(self.labels),
            "repeats": list(self.repeats or [1] * len(self.labels)),
            "alpha": self.alpha,
            "warnings": list(self.warnings),
            "cautions": list(self.cautions),
            "rows": [
                {
                    "metric": r.metric,
                    "values": list(r.values),
                    "change_pct": list(r.change_pct),
                    "ci_pct": [list(c) if c else None for c in r.ci_pct],
                    "p_value": list(r.p_value),
                    "significant": list(r.significant),
                    "higher_is_worse": r.higher_is_worse,
                    "note": r.note,
                }
                for r in self.rows
            ],
        }


def numbered_labels(labels: Sequence[str]) -> list[str]:
    """Each label, numbered where it repeats (``main #1``, ``main #2``): one name per file."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(f"{label} #{seen[label]}" if labels.count(label) > 1 else label)
    return out


# ---------------------------------------------------------------- bootstrap


def _boot_weights(k: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` rows of cluster multiplicities, each ``Multinomial(k, 1/k)``: [m, k] int32."""
    idx = rng.integers(0, k, size=(m, k)) + (np.arange(m) * k)[:, None]
    return np.bincount(idx.ravel(), minlength=m * k).reshape(m, k).astype(np.int32)


class _Resampler:
    """The bootstrap weights of one setup's requests, shared by all its latency rows (the same
    resamples for every metric; cached while small, regenerated from the seed otherwise).

    ``sizes``: the requests of each run of the setup, in order. With more than one run the
    bootstrap has two levels: each replicate draws the runs with replacement, then the
    requests within each run, so the spread between runs (a machine whose speed moved) is
    in the interval, not only the sampling within a run."""

    def __init__(self, sizes: Sequence[int], n_boot: int, seed: Sequence[int]) -> None:
        self.sizes = [int(x) for x in sizes if x]  # a run without requests adds nothing
        self.k, self.n_boot, self.seed = sum(self.sizes), n_boot, list(seed)
        self.chunk = max(1, _MAX_CELLS // max(self.k, 1))
        self._cache: dict[int, np.ndarray] = {}
        self._cacheable = n_boot * self.k <= 5 * _MAX_CELLS
        self._sizes: tuple[np.ndarray, np.ndarray] | None = None  # (clusters, values of each)

    def weights(self, start: int) -> np.ndarray:
        if start in self._cache:
            return self._cache[start]
        m = min(self.chunk, self.n_boot - start)
        rng = np.random.default_rng([*self.seed, start])
        w = _boot_weights(self.k, m, rng) if len(self.sizes) <= 1 else self._two_level(m, rng)
        if self._cacheable:
            self._cache[start] = w
        return w

    def quantile(
        self,
        values: np.ndarray,
        cluster: np.ndarray,
        q: float,
        key: str,
        alpha: float,
        ranked: np.ndarray | None = None,
    ) -> np.ndarray:
        """``n_boot`` replicates of the q-quantile of ``values`` (``cluster``: each value's
        request): resampling every request while ``n_boot`` x requests stays under
        ``EXACT_CELLS``, else from the law of the order statistics (one run, one value a
        request: ``_order_statistic_quantile``) or the Poisson bootstrap of
        ``_poisson_quantile`` (``key``, the row, seeds their draws; ``alpha``, its level,
        says how close a normal law must be). ``ranked``: ``values`` sorted, when they are
        already (every rank is read off it)."""
        if self.n_boot * self.k <= EXACT_CELLS:
            return _boot_quantile(values, cluster, q, self)
        rng_seed = [*self.seed, *key.encode()]
        ranked = np.sort(values) if ranked is None else ranked
        if len(self.sizes) == 1 and not (cluster[1:] <= cluster[:-1]).any():  # one value each
            rng = np.random.default_rng(rng_seed)
            return _order_statistic_quantile(values, q, self.k, self.n_boot, rng, ranked)
        run_of = np.repeat(np.arange(len(self.sizes)), self.sizes)
        if self._sizes is None or self._sizes[0] is not cluster:  # one metric's two rows: once
            self._sizes = (cluster, _tally(cluster, None, self.k))
        sizes = self._sizes[1]
        if len(self.sizes) == 1:
            rng = np.random.default_rng(rng_seed)
            drawn = _normal_rank_quantile(
                values, cluster, q, sizes, self.n_boot, rng, alpha, ranked
            )
            if drawn is not None:
                return drawn
        return _poisson_quantile(values, cluster, q, run_of, self.n_boot, rng_seed, sizes, ranked)

    def _two_level(self, m: int, rng: np.random.Generator) -> np.ndarray:
        runs = _boot_weights(len(self.sizes), m, rng)  # [m, runs]: how often each run is drawn
        within = np.concatenate([_boot_weights(k, m, rng) for k in self.sizes], axis=1)
        run_of = np.repeat(np.arange(len(self.sizes)), self.sizes)
        return (within * runs[:, run_of]).astype(np.int32)


def _sorted(values: np.ndarray, cluster: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` in ascending order (stable) with their clusters; no copy when they are."""
    if not (values[1:] < values[:-1]).any():
        return values, cluster
    order = np.argsort(values, kind="stable")
    return values[order], cluster[order]


def _boot_quantile(
    values: np.ndarray, cluster: np.ndarray, q: float, res: _Resampler
) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the q-quantile, resampling clusters (requests).

    Each replicate draws cluster multiplicities ``w`` and reads the weighted quantile off the
    sorted values. Only a window of ranks around the point estimate is scanned (it holds the
    replicate quantile unless the data are wildly skewed; rows outside it are redone in full).
    """
    v, c = _sorted(values, cluster)
    n, k = v.size, res.k
    sizes = np.bincount(c, minlength=k)
    r0 = int(q * n)
    below = np.bincount(c[:r0], minlength=k)
    sd = float(np.sqrt(np.sum((below - q * sizes) ** 2)))  # sd of the replicate's rank
    half = max(64, int(12 * sd) + 1)
    lo, hi = max(0, r0 - half), min(n, r0 + half)
    below_lo = np.bincount(c[:lo], minlength=k)
    out = np.empty(res.n_boot)
    for start in range(0, res.n_boot, res.chunk):
        w = res.weights(start)
        m = w.shape[0]
        target = q * (w @ sizes)  # [m]
        cum = (w @ below_lo)[:, None] + np.cumsum(w[:, c[lo:hi]], axis=1, dtype=np.int64)
        idx = lo + (cum < target[:, None]).sum(axis=1)
        outside = (cum[:, 0] >= target) & (lo > 0) | (cum[:, -1] < target) & (hi < n)
        for row in np.flatnonzero(outside):  # rare: scan the whole row
            full = np.cumsum(w[row, c], dtype=np.int64)
            idx[row] = int((full < target[row]).sum())
        out[start : start + m] = v[np.minimum(idx, n - 1)]
    return out


def _order_statistic_quantile(
    values: np.ndarray,
    q: float,
    k: int,
    n_boot: int,
    rng: np.random.Generator,
    ranked: np.ndarray | None = None,
) -> np.ndarray:
    """``n_boot`` replicates of the q-quantile of one run's ``values`` (at most one per
    request, ``k`` requests) drawn from the bootstrap's exact law, in O(``n_boot``) once
    they are sorted (``ranked``: sorted already), not O(``n_boot`` x ``k``).

    The bootstrap draws ``k`` requests with replacement; ``T`` of them hold a value,
    ``T ~ Binomial(k, m / k)`` for ``m`` values, and those are ``T`` draws with replacement
    from the ``m`` values. The replicate quantile is their ``r``-th smallest, ``r = ceil(q T)``
    (the rank ``_boot_quantile`` reads: the first whose running count reaches ``q T``). Of
    ``T`` draws, at least ``r`` fall on the ``j`` smallest values with probability
    ``P(Binomial(T, j / m) >= r) = P(U <= j / m)``, ``U ~ Beta(r, T - r + 1)`` (the r-th of
    ``T`` uniform order statistics; Maritz & Jarrett, JASA 73(361), 1978, give the sample
    median's bootstrap so): the replicate is the ``ceil(m U)``-th smallest value. Exact, not
    an approximation, ties included (they are counted by their place in the sorted order, as
    the weighted quantile counts them)."""
    m = values.size
    total = rng.binomial(k, m / k, n_boot) if m < k else np.full(n_boot, m)
    total = np.maximum(total, 1)
    rank = np.maximum(np.ceil(q * total), 1)  # the same float product as the weighted target
    idx = np.ceil(m * rng.beta(rank, total - rank + 1)).astype(np.int64) - 1
    idx = np.clip(idx, 0, m - 1)
    ranked = np.sort(values) if ranked is None else ranked
    return ranked[idx].astype(float)


NORMAL_RANK_MIN_SD = 100  # ranks: a smaller spread is drawn by the Poisson bootstrap
NORMAL_ERROR = 0.01  # the most a normal law's quantiles may be off, in its standard deviations


def _cornish_fisher_error(skew: float, kurt: float, alpha: float) -> float:
    """How far (in standard deviations) the normal law's ``1 - alpha / 2`` quantile is from
    that of a law with this skewness and excess kurtosis, to order 1/n (the Cornish-Fisher
    expansion; Hall, "The Bootstrap and Edgeworth Expansion", 1992, 2.5)."""
    z = NormalDist().inv_cdf(1 - alpha / 2)
    return (abs(skew) * (z * z - 1) / 6 + abs(kurt) * abs(z**3 - 3 * z) / 24
            + skew * skew * abs(2 * z**3 - 5 * z) / 36)  # fmt: skip


def _normal_rank_quantile(
    values: np.ndarray,
    cluster: np.ndarray,
    q: float,
    sizes: np.ndarray,
    n_boot: int,
    rng: np.random.Generator,
    alpha: float,
    ranked: np.ndarray | None = None,
) -> np.ndarray | None:
    """``n_boot`` replicates of the q-quantile of one run's ``values``, several a request
    (ITL: a stream's gaps; ``sizes``: each request's count), from the normal law of the
    replicate's rank; None where that law is not close enough (the Poisson bootstrap then).
    ``ranked``: ``values`` sorted, when they are already.

    A replicate weights request ``c`` by ``w_c`` (multinomial) and its quantile is the first
    rank ``i`` whose weighted count reaches ``q`` of the weighted total. At the point
    estimate's rank ``r`` that count minus its target is ``G = sum_c w_c d_c``,
    ``d_c = b_c - q s_c`` (``b_c``: the request's values below rank ``r``, ``s_c``: all of
    them), with mean ``sum d_c`` and variance ``V = sum d_c^2 - (sum d_c)^2 / k``; each rank
    further adds a weight of mean 1, so the replicate's rank is ``r - G`` (the Bahadur
    representation of a quantile; Serfling, "Approximation Theorems of Mathematical
    Statistics", 1980, 2.5): the first ``j`` with ``G + j >= 0`` past rank ``r - 1``. Used only where that is far below the Monte-Carlo noise of the
    interval: ``sqrt(V)`` of at least ``NORMAL_RANK_MIN_SD`` ranks; ``G``'s skewness and
    kurtosis (``sum d^3 / V^1.5``, ``sum d^4 / V^2``: a weight's cumulants are all about 1)
    moving the interval's quantiles (``alpha``: its two-sided level) by under
    ``NORMAL_ERROR`` of its spread; and the weights summed past ``r``, which add about
    ``rho |G|`` to the rank's variance (``rho``: the sum of squares over the sum of each
    request's values within 4 sd of ``r``, 1 when no request has two there), moving them by
    under that too. The Monte-Carlo noise of a 2,000-replicate tail quantile is over ten
    times more."""
    n, k = values.size, sizes.size
    ranked = np.sort(values) if ranked is None else ranked
    r = min(max(int(np.ceil(q * n)) - 1, 0), n - 1)
    at_r = ranked[r]
    d = _tally(cluster, values < at_r, k) - q * sizes
    total = float(d.sum())
    var = float(np.dot(d, d)) - total * total / k
    sd = math.sqrt(max(var, 0.0))
    if sd < NORMAL_RANK_MIN_SD:
        return None
    skew, kurt = float(np.sum(d**3)) / sd**3, float(np.sum(d**4)) / var**2
    if _cornish_fisher_error(skew, kurt, alpha) > NORMAL_ERROR:
        return None
    g = rng.normal(total, sd, n_boot)
    idx = np.clip(r - 1 + np.ceil(-g).astype(np.int64), 0, n - 1)  # G + j reaches 0 at j
    z = NormalDist().inv_cdf(1 - alpha / 2)
    span = int(4 * sd) + 1
    inside = (values >= ranked[max(r - span, 0)]) & (values <= ranked[min(r + span, n - 1)])
    m = np.bincount(cluster[inside])
    rho = float(np.dot(m, m)) / max(int(m.sum()), 1)
    if 0.4 * rho / sd * z > NORMAL_ERROR:  # the spread widens by 0.4 rho / sd of itself
        return None
    return ranked[idx].astype(float)


def _poisson_quantile(
    values: np.ndarray,
    cluster: np.ndarray,
    q: float,
    run_of: np.ndarray,
    n_boot: int,
    seed: Sequence[int],
    sizes: np.ndarray | None = None,
    ranked: np.ndarray | None = None,
) -> np.ndarray:
    """``n_boot`` replicates of the q-quantile by the Poisson bootstrap, for setups too large
    to draw a weight for every request of every replicate (a million requests x 2,000).

    Each request's weight is Poisson(1) (Hanley & MacGibbon, Comput. Methods Programs Biomed.
    83(1), 2006; Chamandy et al., "Estimating uncertainty for massive data streams", Google,
    2012): with more than one run, Poisson(R) where R is how often the replicate drew the
    request's run. A replicate's quantile lies among the values near the point estimate (a
    window of ranks, six standard deviations of the replicate's rank each side): the
    requests with a value there get their own weights; every other request only adds its
    values below the window and its size, so the requests alike in (run, values below, size)
    are drawn together, as the sum of their Poisson weights, itself Poisson. Exact for the
    Poisson bootstrap; a replicate that falls outside the window makes the window wider.
    ``sizes``: each cluster's values, when known (the rows of one metric share them);
    ``ranked``: ``values`` sorted, when they are already."""
    n, k = values.size, int(run_of.size)
    sizes = _tally(cluster, None, k) if sizes is None else sizes
    ranked = np.sort(values) if ranked is None else ranked
    r0 = min(int(q * n), n - 1)
    at_r0 = ranked[r0]
    sd = float(np.sqrt(np.sum((_tally(cluster, values < at_r0, k) - q * sizes) ** 2)))
    half = max(64, int(6 * sd) + 1)
    runs = int(run_of.max()) + 1 if k else 1
    while True:
        rng = np.random.default_rng(seed)
        drawn = (
            rng.multinomial(runs, [1 / runs] * runs, size=n_boot).astype(float)
            if runs > 1
            else np.ones((n_boot, 1))
        )  # [B, runs]: how often each replicate drew each run
        v, c, lo, hi = _window(values, cluster, ranked, r0 - half, r0 + half)  # ranks [lo, hi)
        near = np.unique(c)  # requests with a value in the window
        at = np.searchsorted(near, c)  # each window value's request, among ``near``
        below = _tally(cluster, values < v[0], k)
        rest = np.ones(k, dtype=bool)
        rest[near] = False
        rest &= sizes > 0
        # requests alike in (run, values below the window, size) form one group: one key
        span_b, span_s = int(below.max()) + 1, int(sizes.max()) + 1
        key = (run_of[rest] * span_b + below[rest]) * span_s + sizes[rest]
        if runs * span_b * span_s <= 1 << 22:  # few kinds: count them, no sort
            tally = np.bincount(key, minlength=runs * span_b * span_s)
            keys = np.flatnonzero(tally)
            count = tally[keys]
        else:
            keys, count = np.unique(key, return_counts=True)
        kinds = np.stack([keys // (span_b * span_s), keys // span_s % span_b, keys % span_s])
        out = np.empty(n_boot)
        fits = True
        step = max(1, _MAX_CELLS // max(v.size + near.size + kinds.shape[1], 1))
        for s0 in range(0, n_boot, step):
            r = drawn[s0 : s0 + step]
            grouped = rng.poisson(r[:, kinds[0]] * count)  # [m, G]
            own = _poisson_weights(rng, r[:, run_of[near]], np.unique(r))  # [m, near]
            under = grouped @ kinds[1] + own @ below[near]
            target = q * (grouped @ kinds[2] + own @ sizes[near])
            idx = _crossing(own[:, at], under, target)  # ranks from lo, -1: not in the window
            if ((idx < 0) & (hi < n) | (idx == 0) & (lo > 0)).any():
                fits = False
                break
            out[s0 : s0 + r.shape[0]] = v[
                np.where(idx < 0, v.size - 1, np.minimum(idx, v.size - 1))
            ]
        if fits:
            return out
        half *= 2


def _tally(cluster: np.ndarray, keep: np.ndarray | None, k: int) -> np.ndarray:
    """How many of the values (those of ``keep``) each of the ``k`` clusters holds, 4 M at a
    time (``np.bincount`` of all fifteen million at once makes an int64 copy of them)."""
    out = np.zeros(k, dtype=np.int64)
    for at in range(0, cluster.size, 1 << 22):
        part = cluster[at : at + (1 << 22)]
        if keep is not None:
            part = part[keep[at : at + (1 << 22)]]
        out += np.bincount(part, minlength=k)
    return out


def _window(
    values: np.ndarray, cluster: np.ndarray, ranked: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The values of ranks about [lo, hi) in order (``ranked``: all of them sorted), with
    their clusters, and the ranks they span: widened to whole runs of equal values (which of
    them has which rank does not move a replicate's quantile: the crossing falls in their
    run, whatever its order)."""
    n = values.size
    lo, hi = max(0, lo), min(n, hi)
    low, high = ranked[lo], ranked[hi - 1]
    inside = np.flatnonzero((values >= low) & (values <= high))
    order = np.argsort(values[inside], kind="stable")
    lo = int(np.count_nonzero(values < low))
    return values[inside][order], cluster[inside][order], lo, lo + inside.size


_BLOCK = 256  # window values summed a block at a time (``_crossing``)


def _poisson_weights(
    rng: np.random.Generator, lam: np.ndarray, means: np.ndarray | None = None
) -> np.ndarray:
    """Poisson(``lam``) draws (int8, the shape of ``lam``, whose values are whole: how often
    a replicate drew a run), by inverse transform over 32-bit uniforms: a draw is how many of
    ``_poisson_table``'s thresholds its uniform reaches. Each value's probability is within
    2**-32 of the Poisson's, at a third of ``rng.poisson``'s cost. ``means``: the values
    ``lam`` holds, when known (no sort of all of it to find them)."""
    means = np.unique(lam) if means is None else means
    if means.size == 1:  # one run: every weight Poisson(1)
        return _poisson_draws(rng, int(means[0]), lam.shape)
    out = np.zeros(lam.shape, dtype=np.int8)
    for mean in means[means > 0]:
        where = lam == mean
        out[where] = _poisson_draws(rng, int(mean), int(where.sum()))
    return out


def _poisson_draws(rng: np.random.Generator, mean: int, shape: Any) -> np.ndarray:
    u = rng.integers(0, 1 << 32, size=shape, dtype=np.uint32)
    drawn = np.zeros(u.shape, dtype=np.int8)
    for threshold in _poisson_table(mean) if mean else ():
        drawn += u >= threshold
    return drawn


@functools.cache
def _poisson_table(mean: int) -> np.ndarray:
    """floor(2**32 x P(X <= k)) for k = 0, 1, ... while under 2**32 (X ~ Poisson(mean)):
    X > k exactly when a uniform 32-bit integer reaches the k-th. The probabilities by their
    recurrence ``p(k) = p(k - 1) mean / k`` from ``p(0) = exp(-mean)`` (``mean``: a few runs)."""
    terms = [math.exp(-mean)]
    for k in range(1, mean * 4 + 40):
        terms.append(terms[-1] * mean / k)
    cdf = np.array([1.0 - math.fsum(terms[k + 1 :]) for k in range(len(terms))])  # 1 - P(X > k)
    table = np.floor(cdf * 2.0**32)
    return table[table < 2.0**32].astype(np.uint32)


def _crossing(w: np.ndarray, under: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each row of weights ``w`` [m, W] (the window's values in order): how many of its
    running totals ``under + cumsum(w)`` stay below ``target`` (-1: all of them). Blocks of
    ``_BLOCK`` values are summed first; only the block where the total crosses is scanned."""
    m, width = w.shape
    blocks = -(-width // _BLOCK)
    padded = np.zeros((m, blocks * _BLOCK), dtype=w.dtype)
    padded[:, :width] = w
    cells = padded.reshape(m, blocks, _BLOCK)
    ends = under[:, None] + np.cumsum(cells.sum(axis=2), axis=1)  # total at each block's end
    full = (ends < target[:, None]).sum(axis=1)  # blocks wholly below the target
    inside = np.minimum(full, blocks - 1)
    before = np.where(inside > 0, ends[np.arange(m), np.maximum(inside - 1, 0)], under)
    scan = before[:, None] + np.cumsum(cells[np.arange(m), inside], axis=1)
    idx = inside * _BLOCK + (scan < target[:, None]).sum(axis=1)
    return np.where(full == blocks, -1, np.minimum(idx, width))


def _change(
    boot_a: np.ndarray, boot_b: np.ndarray, alpha: float
) -> tuple[tuple[float, float], float]:
    """Percentile-method interval of the relative change (%), and a two-sided p-value."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = (boot_b / boot_a - 1.0) * 100.0
    d = d[np.isfinite(d)]
    if d.size == 0:
        return (float("nan"), float("nan")), 1.0
    lo, hi = np.quantile(d, [alpha / 2, 1 - alpha / 2])
    p = 2 * min(float(np.mean(d <= 0)), float(np.mean(d >= 0)))
    return (float(lo), float(hi)), min(1.0, max(p, 1.0 / d.size))


def _latency_samples(
    runs: Sequence[tuple[RecordColumns, np.ndarray]], metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Values and the request (cluster) of each, over the latency population of a setup's
    runs (``(columns, latency mask)`` each): clusters number the requests of the population,
    run after run, in record order."""
    vals, clus = [], []
    offset = 0
    for cols, lat in runs:
        position = np.cumsum(lat, dtype=np.int32) - 1 + offset  # its place in the population
        if metric == "itl_ms":  # every gap, clustered by its stream
            gaps, owner = vectors.itl_with_owner(cols, lat)
            vals.append(gaps)
            clus.append(position[owner])
            cols.forget("gaps", "chunk_owner", "same_stream")  # 260 MB a million streams
        else:
            v = vectors.per_request(cols, metric)
            keep = lat & ~np.isnan(v)
            vals.append(v[keep])
            clus.append(position[keep])
        offset += int(lat.sum())
    if len(vals) == 1:  # one run: no copy (a million streams' gaps are 120 MB)
        return vals[0], clus[0].astype(np.int32, copy=False)
    if not vals:
        return np.zeros(0), np.zeros(0, dtype=np.int32)
    return np.concatenate(vals), np.concatenate(clus).astype(np.int32)


def _per_second_bins(r: Results, tp: metrics.Throughput) -> np.ndarray:
    """Output tokens/s of each whole second inside the measurement window (``tp``: the run's
    throughput over that window)."""
    lo, hi = r.measurement_window_ns()
    series = tp.output_tokens_per_s_series
    first, last = -(-lo // 1_000_000_000), hi // 1_000_000_000  # whole bins only
    return np.asarray(series[first:last], dtype=float)


# ---------------------------------------------------------------- rows


def _bootstrap_row(
    metric: str,
    values: Sequence[float | None],
    higher_is_worse: bool,
    pair: Callable[[int], tuple[np.ndarray, np.ndarray] | None],
    n: Sequence[int],
    note: str,
    alpha: float,
) -> MetricChange:
    """Each run's change against the first, tested on the bootstrap distributions that
    ``pair(i)`` gives for (run 0, run i); ``None`` there: no test for that run."""
    changes: list[float | None] = [None]
    cis: list[tuple[float, float] | None] = [None]
    ps: list[float | None] = [None]
    sig = [False]
    for i in range(1, len(values)):
        changes.append(_pct_change(values[0], values[i]))
        boots = pair(i)
        ci, p = _change(*boots, alpha) if boots is not None else (None, None)
        cis.append(ci)
        ps.append(p)
        sig.append(ci is not None and bool(ci[0] > 0 or ci[1] < 0))
    return MetricChange(
        metric=metric,
        values=tuple(values),
        higher_is_worse=higher_is_worse,
        change_pct=tuple(changes),
        ci_pct=tuple(cis),
        p_value=tuple(ps),
        significant=tuple(sig),
        n=tuple(n),
        note=note,
    )


def _pct_change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if a == 0:
        return 0.0 if b == 0 else float("inf") * (1 if b > 0 else -1)
    return (b / a - 1.0) * 100.0


def _latency_rows(
    setups: Sequence[Sequence[tuple[RecordColumns, np.ndarray]]],
    resamplers: Sequence[_Resampler],
    metric: str,
    alpha: float,
) -> list[MetricChange]:
    """The ``PERCENTILES`` rows of one latency metric (its samples drawn once for both, and
    sorted once: each percentile and each rank a bootstrap reads is read off them)."""
    samples = [_latency_samples(runs, metric) for runs in setups]
    n = [int(v.size) for v, _ in samples]
    point: list[list[float | None]] = []  # [setup][percentile]
    drawn: list[list[np.ndarray | None]] = []
    for (v, c), res in zip(samples, resamplers, strict=True):
        ranked = np.sort(v)  # one setup's at a time: a million streams' gaps are 120 MB
        dist = metrics.distribution(ranked, PERCENTILES)  # both from one partition
        point.append([dist.at(q) for q in PERCENTILES])
        drawn.append(
            [
                (
                    res.quantile(v, c, q / 100, f"{metric}.p{q:g}", alpha, ranked)
                    if v.size * min(q, 100 - q) / 100 >= MIN_TAIL_SAMPLES
                    else None
                )
                for q in PERCENTILES
            ]
        )
        del ranked
    rows = []
    for j, q in enumerate(PERCENTILES):
        values = [p[j] for p in point]
        tail = min(q, 100 - q) / 100
        boots = [d[j] for d in drawn]
        note = ""
        if any(b is None for b in boots):
            need = int(np.ceil(MIN_TAIL_SAMPLES / tail))
            note = f"not tested: a p{q:g} needs >= {need} samples in each run"

        def pair(
            i: int, boots: list[np.ndarray | None] = boots
        ) -> tuple[np.ndarray, np.ndarray] | None:
            b0, bi = boots[0], boots[i]
            return None if b0 is None or bi is None else (b0, bi)

        rows.append(_bootstrap_row(f"{metric}.p{q:g}", values, True, pair, n, note, alpha))
    return rows


def _throughput_row(
    setups: Sequence[Sequence[Results]], alpha: float, n_boot: int, seed: int
) -> MetricChange:
    """Output tokens/s: the mean of a setup's runs; bootstrapped over whole seconds (and, with
    more than one run, over the runs first)."""
    tps = [
        [vectors.throughput(columns_of(r.records), r.measurement_window_ns()) for r in runs]
        for runs in setups
    ]
    values = [float(np.mean([tp.output_tokens_per_s for tp in runs])) for runs in tps]
    bins = [
        [_per_second_bins(r, tp) for r, tp in zip(runs, tp_runs, strict=True)]
        for runs, tp_runs in zip(setups, tps, strict=True)
    ]
    short = any(b.size < 5 for runs in bins for b in runs)
    note = "fewer than 5 whole seconds in a window: no significance test" if short else ""

    def boot(j: int) -> np.ndarray:
        rng = np.random.default_rng([seed, 99, j])
        runs = bins[j]
        if len(runs) == 1 and (law := _normal_mean(runs[0], alpha)) is not None:
            return rng.normal(law[0], law[1], n_boot)
        if len(runs) == 1:  # in blocks of rows (a day of seconds x 2,000 is 1.3 GB at once)
            b = runs[0]
            rows = max(1, _MAX_CELLS // b.size)
            return np.concatenate([
                rng.choice(b, size=(min(rows, n_boot - at), b.size), replace=True).mean(axis=1)
                for at in range(0, n_boot, rows)
            ])  # fmt: skip
        out = np.empty(n_boot)
        for t in range(n_boot):  # runs with replacement, then each drawn run's seconds
            drawn = [runs[x] for x in rng.integers(0, len(runs), len(runs))]
            out[t] = np.mean([rng.choice(b, size=b.size, replace=True).mean() for b in drawn])
        return out

    def pair(i: int) -> tuple[np.ndarray, np.ndarray] | None:
        if any(b.size < 5 for j in (0, i) for b in bins[j]):
            return None
        return boot(0), boot(i)

    n = [sum(int(b.size) for b in runs) for runs in bins]
    return _bootstrap_row("output_tokens_per_s", values, False, pair, n, note, alpha)


NORMAL_MEAN_MIN = 10_000  # seconds a run needs before its mean's bootstrap may be drawn normal


def _normal_mean(x: np.ndarray, alpha: float) -> tuple[float, float] | None:
    """(centre, spread) of the normal law to draw the bootstrap of ``x``'s mean from, or None
    where that law is not close enough and the resamples must be drawn.

    The mean of ``n`` draws with replacement from ``x`` has the mean of ``x`` and standard
    deviation ``s / sqrt(n)`` (``s``: ``x``'s, ddof 0), exactly; its quantiles differ from
    the normal's by the Cornish-Fisher terms (Hall, "The Bootstrap and Edgeworth Expansion",
    1992, 2.5): ``g (z^2 - 1) / (6 sqrt(n)) + k (z^3 - 3z) / (24 n) - g^2 (2z^3 - 5z) / (36 n)``
    standard deviations, ``g`` the skewness and ``k`` the excess kurtosis of ``x``. The normal
    law is used only from ``NORMAL_MEAN_MIN`` values and where that sum stays under
    ``NORMAL_ERROR`` at the interval's own ``z`` (``alpha``: the row's two-sided level):
    the Monte-Carlo noise of a 2,000-replicate tail quantile is over ten times more."""
    n = x.size
    if n < NORMAL_MEAN_MIN:
        return None
    centre, sd = float(x.mean()), float(x.std())
    if sd == 0:
        return centre, 0.0
    u = (x - centre) / sd
    g, k = float(np.mean(u**3)), float(np.mean(u**4)) - 3.0
    error = _cornish_fisher_error(g / math.sqrt(n), k / n, alpha)  # the mean's: g/sqrt(n), k/n
    return (centre, sd / math.sqrt(n)) if error <= NORMAL_ERROR else None


def _count_row(
    metric: str,
    values: Sequence[float],
    hits: Sequence[int],
    totals: Sequence[int],
    higher_is_worse: bool,
    alpha: float,
) -> MetricChange:
    """A rate compared by Fisher's exact test on (hits, misses) against the baseline."""
    changes: list[float | None] = [None]
    ps: list[float | None] = [None]
    sig = [False]
    for i in range(1, len(values)):
        changes.append(_pct_change(values[0], values[i]))
        table = [[hits[0], totals[0] - hits[0]], [hits[i], totals[i] - hits[i]]]
        p = _fisher_exact(table) if totals[0] and totals[i] else 1.0
        ps.append(p)
        sig.append(p < alpha)
    return MetricChange(
        metric=metric,
        values=tuple(values),
        higher_is_worse=higher_is_worse,
        change_pct=tuple(changes),
        ci_pct=tuple([None] * len(values)),
        p_value=tuple(ps),
        significant=tuple(sig),
        n=tuple(totals),
        note="Fisher's exact test on the counts",
    )


def _fisher_exact(table: Sequence[Sequence[int]]) -> float:
    """The two-sided p-value of Fisher's exact test on a 2x2 table of counts: the probability,
    with the margins fixed, of the tables no more likely than this one (relative tolerance
    1e-7, as ``scipy.stats.fisher_exact``, which gives the same value: importing scipy's
    statistics takes longer than a comparison of small files). The hypergeometric
    probabilities of the top-left cell come from the ratio of neighbours,
    ``p(x + 1) / p(x) = (r1 - x)(c1 - x) / ((x + 1)(r2 - c1 + x + 1))``, summed in logs."""
    (a, b), (c, d) = ((int(x) for x in row) for row in table)
    r1, r2, c1 = a + b, c + d, a + c
    lo, hi = max(0, c1 - r2), min(c1, r1)
    x = np.arange(lo, hi, dtype=float)  # each x to x + 1
    with np.errstate(divide="ignore"):
        steps = np.log((r1 - x) * (c1 - x)) - np.log((x + 1) * (r2 - c1 + x + 1))
    log_p = np.concatenate([[0.0], np.cumsum(steps)])
    tail = log_p[log_p <= log_p[a - lo] + math.log1p(1e-7)]
    return min(1.0, math.exp(_log_sum_exp(tail) - _log_sum_exp(log_p)))


def _log_sum_exp(x: np.ndarray) -> float:
    """log(sum(exp(x))), without overflow or underflow of the terms."""
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


def _ratio_boot(num: np.ndarray, den: np.ndarray, res: _Resampler) -> np.ndarray:
    """Bootstrap replicates of ``sum(num) / sum(den)``, the units drawn by ``res``."""
    out = np.empty(res.n_boot)
    for start in range(0, res.n_boot, res.chunk):
        w = res.weights(start)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[start : start + w.shape[0]] = (w @ num) / (w @ den)
    return out


def _cost_rows(
    setups: Sequence[Sequence[Results]],
    priced: Sequence[Sequence[Pricing | None]],
    alpha: float,
    n_boot: int,
    seed: int,
) -> list[MetricChange]:
    """Dollars per million output tokens, per 1,000 requests and per session at each setup's
    prices: the bill over what it bought, pooled over a setup's runs. Bootstrapped over the
    bill's units (``cost.cost_units``: sessions for an API price, whole seconds for GPU-hours;
    runs first when a setup has several); a setup without prices has no value."""
    units: list[list[np.ndarray] | None] = []
    for runs, prices in zip(setups, priced, strict=True):
        ok = all(p is not None and p.kind for p in prices)
        units.append(
            [cost_units(r, p) for r, p in zip(runs, prices, strict=True) if p] if ok else None
        )
    rows = []
    for col, metric, scale in ((1, COST_METRICS[0], 1e6), (2, COST_METRICS[1], 1e3),
                               (3, COST_METRICS[2], 1.0)):  # fmt: skip
        values: list[float | None] = []
        boots: list[np.ndarray | None] = []
        for j, u in enumerate(units):
            pooled = np.concatenate(u) if u else np.zeros((0, 4))
            den = float(pooled[:, col].sum())
            values.append(float(pooled[:, 0].sum()) / den * scale if den else None)
            few = not u or any(len(x) < 5 for x in u) or not den
            res = _Resampler([len(x) for x in u or []], n_boot, (seed, 77, j))
            boots.append(None if few else _ratio_boot(pooled[:, 0], pooled[:, col], res) * scale)

        def pair(
            i: int, b: list[np.ndarray | None] = boots
        ) -> tuple[np.ndarray, np.ndarray] | None:
            b0, bi = b[0], b[i]
            return None if b0 is None or bi is None else (b0, bi)

        note = "" if all(b is not None for b in boots) else (
            "not tested: needs prices and >= 5 sessions (API) or seconds (GPU-hours) in each run")  # fmt: skip
        n = [sum(len(x) for x in u) if u else 0 for u in units]
        rows.append(_bootstrap_row(metric, values, True, pair, n, note, alpha))
    return rows


def _undecided(rows: Sequence[MetricChange], names: Sequence[str]) -> list[str]:
    """A warning for each tested change whose interval is not finite (no finite bootstrap
    replicate: a baseline of zero): a gate cannot call it a pass, so it makes the
    comparison not valid evidence."""
    return [
        f"{names[i]}: {r.metric}: the bootstrap interval of the change is not finite "
        f"[{ci[0]:g}, {ci[1]:g}]; it cannot be judged"
        for r in rows
        for i, ci in enumerate(r.ci_pct)
        if ci is not None and not (np.isfinite(ci[0]) and np.isfinite(ci[1]))
    ]


def compare(
    results_list: Sequence[Results],
    labels: Sequence[str],
    *,
    slo: SLOSpec | None = None,
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare setups against the first one (see the module docstring for the tests used).

    Files that share a label are repeated runs of one setup: its latencies are pooled, and
    its intervals come from a two-level bootstrap (runs, then requests within them), so the
    spread between runs counts as noise rather than as a change."""
    if len(labels) != len(results_list):
        raise ConfigError(f"got {len(labels)} labels for {len(results_list)} results files")
    names = list(dict.fromkeys(labels))  # setups, in the order first given
    if len(names) < 2:
        raise ConfigError("compare needs at least two setups (two results files, or two labels)")
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be in (0, 1), e.g. 0.05; got {alpha}")
    check_bootstrap(n_boot)
    setups = [[r for r, lb in zip(results_list, labels, strict=True) if lb == n] for n in names]
    keys: tuple[str, ...] = LATENCY
    cols_of = [columns_of(r.records) for r in results_list]  # read once each: a file's own
    pooled = all(not (c.ints["inputs"] == NONE).any() for c in cols_of)
    if pooled:
        keys = ("e2e_ms",)  # embeddings / rerank: nothing streamed, so no TTFT, ITL or TPOT
    elif all(vectors.has_reasoning_or_tools(c) for c in cols_of):
        keys = (*LATENCY, "ttfat_ms")  # reasoning models: the answer's wait, not the first token
    # prices: each setup's own (a pricing file may hold a table per label), cost rows when any
    priced = [[pricing_of(r, n) for r in runs] for runs, n in zip(setups, names, strict=True)]
    cost_on = any(p is not None and p.kind for ps in priced for p in ps)
    m = len(keys) * len(PERCENTILES) + (1 if pooled else 2) + (1 if slo is not None else 0)
    m += len(COST_METRICS) if cost_on else 0
    a = alpha / m  # Bonferroni: family-wise error over all rows stays under alpha
    per_run = [
        [
            (cols := columns_of(r.records), vectors.latency_mask(cols, r.measurement_window_ns()))
            for r in runs
        ]
        for runs in setups
    ]
    resamplers = [
        _Resampler([int(lat.sum()) for _, lat in runs], n_boot, (seed, i))
        for i, runs in enumerate(per_run)
    ]
    rows = [row for k in keys for row in _latency_rows(per_run, resamplers, k, a)]
    if not pooled:
        rows.append(_throughput_row(setups, a, n_boot, seed))
    counts = [
        [vectors.count_outcomes(columns_of(r.records), r.scheduled_count) for r in runs]
        for runs in setups
    ]
    failed = [sum(c.failed for c in cs) for cs in counts]
    sent = [sum(c.sent for c in cs) for cs in counts]
    rows.append(
        _count_row(
            "error_rate",
            [f / s if s else 0.0 for f, s in zip(failed, sent, strict=True)],
            failed,
            sent,
            True,
            a,
        )
    )
    if slo is not None:
        from loadlab._slo.verdict import good_in_window

        good = [sum(good_in_window(r, slo) for r in runs) for runs in setups]
        spans = [
            sum(max(r.measurement_window_ns()[1] - r.measurement_window_ns()[0], 1) for r in runs)
            / 1e9
            for runs in setups
        ]
        rows.append(
            _count_row(
                "goodput_rps",
                [g / s for g, s in zip(good, spans, strict=True)],
                good,
                sent,
                False,
                a,
            )
        )
    if cost_on:
        rows.extend(_cost_rows(setups, priced, a, n_boot, seed))
    warnings = [
        f"{label}: the load generator was saturated; its latencies are not trustworthy"
        for label, r in zip(labels, results_list, strict=True)
        if r.saturated
    ]
    warnings += _undecided(rows, names)
    caution = cache_caution(setups, names)
    return Comparison(
        labels=tuple(names),
        rows=tuple(rows),
        alpha=alpha,
        warnings=tuple(dict.fromkeys(warnings)),
        repeats=tuple(len(runs) for runs in setups),
        cautions=(caution,) if caution else (),
    )


CACHE_GAP_PP = 5.0  # setups whose prefix-cache hit rates differ by more are said not alike


def _hit_rate(run: Results) -> float | None:
    """A run's prefix-cache hit rate: the server's counters, else the usage's cached tokens."""
    server = server_hit_rate(run.server_samples)
    if server is not None and server[0] is not None:
        return server[0]
    return usage_hit_rate(run.records)


def cache_caution(setups: Sequence[Sequence[Results]], labels: Sequence[str]) -> str | None:
    """A sentence when the setups' prefix-cache hit rates (the mean of each setup's runs)
    differ by more than ``CACHE_GAP_PP`` points: runs that did not start equally cold (a
    second run against one server finds the first's prompts cached) differ in TTFT for that
    reason alone. None when they agree, or fewer than two setups say."""
    rates = {}
    for label, runs in zip(labels, setups, strict=True):
        said = [v for r in runs if (v := _hit_rate(r)) is not None]
        if said:
            rates[label] = sum(said) / len(said)
    if len(rates) < 2 or (max(rates.values()) - min(rates.values())) * 100 <= CACHE_GAP_PP:
        return None
    each = ", ".join(f"{label} {rate * 100:.1f} %" for label, rate in rates.items())
    return (f"prefix-cache hit rates differ ({each} of prompt tokens): the runs did not start "
            "equally cold, so part of their TTFT difference is the cache's. Unless that is "
            "what is compared, run each with --cache-bust (or its own --seed)")  # fmt: skip
