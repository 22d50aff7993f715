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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

from loadlab.analysis import metrics
from loadlab.analysis.cost import COST_METRICS, Pricing, cost_units, pricing_of
from loadlab.analysis.prefix_cache import server_hit_rate, usage_hit_rate
from loadlab.analysis.summary import has_reasoning_or_tools
from loadlab.errors import ConfigError
from loadlab.records import RequestRecord

if TYPE_CHECKING:
    from loadlab.results import Results
    from loadlab.slo import SLOSpec

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

    def weights(self, start: int) -> np.ndarray:
        if start in self._cache:
            return self._cache[start]
        m = min(self.chunk, self.n_boot - start)
        rng = np.random.default_rng([*self.seed, start])
        w = _boot_weights(self.k, m, rng) if len(self.sizes) <= 1 else self._two_level(m, rng)
        if self._cacheable:
            self._cache[start] = w
        return w

    def _two_level(self, m: int, rng: np.random.Generator) -> np.ndarray:
        runs = _boot_weights(len(self.sizes), m, rng)  # [m, runs]: how often each run is drawn
        within = np.concatenate([_boot_weights(k, m, rng) for k in self.sizes], axis=1)
        run_of = np.repeat(np.arange(len(self.sizes)), self.sizes)
        return (within * runs[:, run_of]).astype(np.int32)


def _boot_quantile(
    values: np.ndarray, cluster: np.ndarray, q: float, res: _Resampler
) -> np.ndarray:
    """``n_boot`` bootstrap replicates of the q-quantile, resampling clusters (requests).

    Each replicate draws cluster multiplicities ``w`` and reads the weighted quantile off the
    sorted values. Only a window of ranks around the point estimate is scanned (it holds the
    replicate quantile unless the data are wildly skewed; rows outside it are redone in full).
    """
    order = np.argsort(values, kind="stable")
    v, c = values[order], cluster[order]
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


def _latency_samples(lat: Sequence[RequestRecord], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Values and the request (cluster) index of each, for the latency population ``lat``."""
    vals: list[float] = []
    clus: list[int] = []
    fn: Callable[[RequestRecord], float | None] | None = metrics.PER_REQUEST_METRICS.get(metric)
    for i, rec in enumerate(lat):
        if fn is None:  # itl_ms: every gap, clustered by its stream
            gaps = metrics.itl_ms(rec)
            vals.extend(gaps)
            clus.extend([i] * len(gaps))
        else:
            v = fn(rec)
            if v is not None:
                vals.append(v)
                clus.append(i)
    return np.asarray(vals, dtype=float), np.asarray(clus, dtype=np.int64)


def _per_second_bins(r: Results) -> np.ndarray:
    """Output tokens/s of each whole second inside the measurement window."""
    lo, hi = r.measurement_window_ns()
    series = metrics.throughput(r.records, (lo, hi)).output_tokens_per_s_series
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


def _latency_row(
    lats: Sequence[Sequence[RequestRecord]],
    resamplers: Sequence[_Resampler],
    metric: str,
    q: float,
    alpha: float,
) -> MetricChange:
    samples = [_latency_samples(lat, metric) for lat in lats]
    values = [metrics.percentile(v, q) for v, _ in samples]
    tail = min(q, 100 - q) / 100
    boots = [
        _boot_quantile(v, c, q / 100, res) if v.size * tail >= MIN_TAIL_SAMPLES else None
        for (v, c), res in zip(samples, resamplers, strict=True)
    ]
    note = ""
    if any(b is None for b in boots):
        need = int(np.ceil(MIN_TAIL_SAMPLES / tail))
        note = f"not tested: a p{q:g} needs >= {need} samples in each run"

    def pair(i: int) -> tuple[np.ndarray, np.ndarray] | None:
        b0, bi = boots[0], boots[i]
        return None if b0 is None or bi is None else (b0, bi)

    n = [int(v.size) for v, _ in samples]
    return _bootstrap_row(f"{metric}.p{q:g}", values, True, pair, n, note, alpha)


def _throughput_row(
    setups: Sequence[Sequence[Results]], alpha: float, n_boot: int, seed: int
) -> MetricChange:
    """Output tokens/s: the mean of a setup's runs; bootstrapped over whole seconds (and, with
    more than one run, over the runs first)."""
    values = [
        float(
            np.mean(
                [
                    metrics.throughput(r.records, r.measurement_window_ns()).output_tokens_per_s
                    for r in runs
                ]
            )
        )
        for runs in setups
    ]
    bins = [[_per_second_bins(r) for r in runs] for runs in setups]
    short = any(b.size < 5 for runs in bins for b in runs)
    note = "fewer than 5 whole seconds in a window: no significance test" if short else ""

    def boot(j: int) -> np.ndarray:
        rng = np.random.default_rng([seed, 99, j])
        runs = bins[j]
        if len(runs) == 1:
            b = runs[0]
            return rng.choice(b, size=(n_boot, b.size), replace=True).mean(axis=1)
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
        p = float(stats.fisher_exact(table).pvalue) if totals[0] and totals[i] else 1.0
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
    pooled = all(rec.inputs is not None for r in results_list for rec in r.records)
    if pooled:
        keys = ("e2e_ms",)  # embeddings / rerank: nothing streamed, so no TTFT, ITL or TPOT
    elif all(has_reasoning_or_tools(r.records) for r in results_list):
        keys = (*LATENCY, "ttfat_ms")  # reasoning models: the answer's wait, not the first token
    # prices: each setup's own (a pricing file may hold a table per label), cost rows when any
    priced = [[pricing_of(r, n) for r in runs] for runs, n in zip(setups, names, strict=True)]
    cost_on = any(p is not None and p.kind for ps in priced for p in ps)
    m = len(keys) * len(PERCENTILES) + (1 if pooled else 2) + (1 if slo is not None else 0)
    m += len(COST_METRICS) if cost_on else 0
    a = alpha / m  # Bonferroni: family-wise error over all rows stays under alpha
    per_run = [
        [metrics.latency_records(r.records, r.measurement_window_ns()) for r in runs]
        for runs in setups
    ]
    lats = [[rec for lat in runs for rec in lat] for runs in per_run]
    resamplers = [
        _Resampler([len(lat) for lat in runs], n_boot, (seed, i)) for i, runs in enumerate(per_run)
    ]
    rows = [_latency_row(lats, resamplers, k, q, a) for k in keys for q in PERCENTILES]
    if not pooled:
        rows.append(_throughput_row(setups, a, n_boot, seed))
    counts = [
        [metrics.count_outcomes(r.records, r.scheduled_count) for r in runs] for runs in setups
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
        from loadlab.slo.verdict import good_in_window

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
