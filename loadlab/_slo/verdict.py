"""Verdicts: each objective judged on a run, with its interval and the CI gate's exit code.

Example::

    verdict = evaluate(read_results("reports/run.json"), load_slo("slo.toml"))
    for row in verdict.rows:
        print(row.objective, row.measured, row.status)
    sys.exit(verdict.exit_code)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics, vectors
from loadlab._analysis.columns import NONE, RecordColumns, columns_of
from loadlab._analysis.cost import pricing_of, run_cost
from loadlab._analysis.summary import interrupted_note
from loadlab._analysis.telemetry import energy_of
from loadlab._slo.intervals import (
    MAX_N,
    Bounds,
    percentile_bounds_at,
    percentile_ci,
    proportion_bounds_at,
    proportion_ci,
)
from loadlab._slo.spec import COST_METRICS, DIST_METRICS, Objective, Policy, SLOSpec, Status
from loadlab.records import RequestRecord, pick

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["ObjectiveResult", "Verdict", "evaluate", "good_in_window"]


def _decides(obj: Objective, lo: float | None, hi: float | None) -> Status:
    """pass when the whole interval meets the objective, fail when none of it does."""
    inf = math.inf
    lo_v, hi_v = (-inf if lo is None else lo), (inf if hi is None else hi)
    worst, best = (hi_v, lo_v) if obj.upper_bound else (lo_v, hi_v)
    if obj.holds(worst):
        return "pass"
    if not obj.holds(best):
        return "fail"
    return "inconclusive"


def _n_to_decide(obj: Objective, n: int, bounds_at: Callable[[int], Bounds]) -> int | None:
    """Smallest sample count N > n whose interval (``bounds_at(N)``), if the data keep their
    shape, no longer straddles the threshold; ``None`` if none up to ``MAX_N`` does."""
    if _decides(obj, *bounds_at(MAX_N)) == "inconclusive":
        return None
    lo, hi = n, MAX_N
    while hi - lo > max(1, lo // 50):  # 2 % resolution is "roughly" enough
        mid = (lo + hi) // 2
        if _decides(obj, *bounds_at(mid)) == "inconclusive":
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class ObjectiveResult:
    """One row of a verdict. ``n`` counts samples (ITL: gaps; rates: requests)."""

    objective: Objective
    measured: float | None
    status: Status
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0
    extra_requests: int | None = None  # inconclusive: roughly how many more would decide
    note: str = ""

    @property
    def margin(self) -> float | None:
        """Headroom to the threshold in the metric's unit; negative = violated."""
        if self.measured is None:
            return None
        t = self.objective.threshold
        return t - self.measured if self.objective.upper_bound else self.measured - t

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": str(self.objective),
            **pick(self.objective, "metric percentile request_class op threshold"),
            **pick(self, "measured margin status ci_low ci_high n extra_requests note"),
        }


@dataclass(frozen=True)
class Verdict:
    """Rows per objective plus the reasons the run is not valid evidence (if any)."""

    rows: tuple[ObjectiveResult, ...]
    inconclusive_policy: Policy = "fail"
    invalid_reasons: tuple[str, ...] = ()
    confidence: float = 0.95
    name: str = ""
    counts: metrics.Counts | None = None

    @classmethod
    def unreadable(cls, reason: str) -> Verdict:
        """The verdict of a results file that could not be read (exit code 2)."""
        return cls(rows=(), invalid_reasons=(f"results unreadable: {reason}",))

    @property
    def valid(self) -> bool:
        return not self.invalid_reasons

    def failed_rows(self) -> list[ObjectiveResult]:
        """Rows that fail the gate under the inconclusive policy."""
        bad: tuple[str, ...] = (
            ("fail", "inconclusive") if self.inconclusive_policy == "fail" else ("fail",)
        )
        return [r for r in self.rows if r.status in bad]

    @property
    def passed(self) -> bool:
        return self.valid and not self.failed_rows()

    @property
    def exit_code(self) -> int:
        """0 all pass; 1 any fail (inconclusive counts by policy); 2 not valid evidence."""
        if not self.valid:
            return 2
        return 1 if self.failed_rows() else 0

    @property
    def outcome(self) -> str:
        return {0: "PASS", 1: "FAIL", 2: "INVALID"}[self.exit_code]

    def to_dict(self) -> dict[str, Any]:
        return {
            **pick(self, "name outcome exit_code inconclusive_policy confidence"),
            "invalid_reasons": list(self.invalid_reasons),
            "rows": [r.to_dict() for r in self.rows],
        }


def _good(cols: RecordColumns, spec: SLOSpec) -> np.ndarray:
    """bool [n]: good requests, each judged by its own class's per-request limits."""
    classes = cols.coded["request_class"][1]
    return vectors.good_mask(cols, {c: spec.limits_for(c) for c in classes})


def _eval_distribution(
    obj: Objective, cols: RecordColumns, mine: np.ndarray, window: tuple[int, int], conf: float
) -> ObjectiveResult:
    lat = vectors.latency_mask(cols, window) & mine
    if obj.metric == "itl_ms":
        values = vectors.itl_ms(cols, lat)
    else:
        values = vectors.per_request(cols, obj.metric)[lat]
        values = values[~np.isnan(values)]
    if not values.size:
        return ObjectiveResult(obj, None, "fail", note="no measurements: no ok request in window")
    x = np.sort(values)
    pct = float(obj.percentile or 0.0)
    measured = float(metrics.percentile(x, pct) or 0.0)  # x is not empty: never None
    lo, hi = percentile_ci(x, pct, conf)
    status = _decides(obj, lo, hi)
    extra, note = None, ""
    if status == "inconclusive":
        big_n = _n_to_decide(obj, x.size, percentile_bounds_at(x, pct, conf))
        if big_n is None:
            note = "measured value sits at the threshold: more requests will not decide it"
        else:
            per_request = x.size / max(int(lat.sum()), 1)  # ITL: gaps per request
            extra = max(1, math.ceil((big_n - x.size) / per_request))
    # Keep the point estimate honest: a pass needs the point to meet it too.
    if status == "pass" and not obj.holds(measured):
        status = "inconclusive"
    return ObjectiveResult(obj, measured, status, lo, hi, int(x.size), extra, note)


def _eval_proportion(obj: Objective, k: int, n: int, conf: float) -> ObjectiveResult:
    if n == 0:
        return ObjectiveResult(obj, None, "fail", note="no requests to measure")
    p_hat = k / n
    lo, hi = proportion_ci(k, n, conf)
    status = _decides(obj, lo, hi)
    extra, note = None, ""
    if status == "inconclusive":
        big_n = _n_to_decide(obj, n, proportion_bounds_at(p_hat, conf))
        if big_n is None:
            note = "measured rate sits at the threshold: more requests will not decide it"
        else:
            extra = max(1, big_n - n)
    return ObjectiveResult(obj, p_hat, status, lo, hi, n, extra, note)


def _eval_cost(
    obj: Objective, results: Results, recs: Sequence[RequestRecord], window: tuple[int, int]
) -> ObjectiveResult:
    """A cost figure at the run's prices, or an energy figure from its GPU power series: a
    point value over the window (no interval); a run without them fails and says why."""
    n = metrics.count_outcomes(recs).sent  # records one by one: only a cost objective asks
    if obj.metric.startswith("joules_"):
        e = energy_of(results)
        if e is None or e.missing:
            why = e.missing if e is not None else "the run has no GPU telemetry (--gpu-metrics)"
            return ObjectiveResult(obj, None, "fail", n=n, note=why)
        value = getattr(e, obj.metric)
        note = "the whole run's GPUs over the window (no interval)"
    else:
        pricing = pricing_of(results)
        bill = run_cost(recs, window, pricing) if pricing is not None else None
        if pricing is None or bill is None:
            note = ("the run has no prices: run it with --pricing FILE or --price, or give "
                    "this command --pricing FILE")  # fmt: skip
            return ObjectiveResult(obj, None, "fail", n=n, note=note)
        value = bill.figure(obj.metric)
        note = f"at {pricing.describe()} (no interval)"
    if value is None:
        return ObjectiveResult(obj, None, "fail", n=n, note="nothing completed in the window")
    status: Status = "pass" if obj.holds(value) else "fail"
    return ObjectiveResult(obj, float(value), status, n=n, note=note)


def _eval_one(
    obj: Objective, results: Results, cols: RecordColumns, spec: SLOSpec, window: tuple[int, int]
) -> ObjectiveResult:
    mine = np.ones(cols.n, dtype=bool)
    if obj.request_class is not None:
        mine = cols.mask("request_class", [obj.request_class])
        if not mine.any():
            note = f"no requests of class {obj.request_class!r} in this run"
            return ObjectiveResult(obj, None, "fail", note=note)
    if obj.metric in metrics.STREAM_METRICS and not _streamed(cols, mine):
        return ObjectiveResult(obj, None, "fail", note=NOT_STREAMED)
    if obj.metric in DIST_METRICS:
        return _eval_distribution(obj, cols, mine, window, spec.confidence)
    if obj.metric in COST_METRICS:
        recs = [r for r in results.records if r.request_class == obj.request_class] if (
            obj.request_class is not None) else results.records  # fmt: skip
        return _eval_cost(obj, results, recs, window)
    counts = vectors.count_outcomes(cols, mask=mine)
    if obj.metric == "error_rate":
        return _eval_proportion(obj, counts.failed, counts.sent, spec.confidence)
    if obj.metric == "drop_rate":
        scheduled = counts.sent + counts.dropped
        return _eval_proportion(obj, counts.dropped, scheduled, spec.confidence)
    if obj.metric == "goodput_rps":
        span_s = max((window[1] - window[0]) / 1e9, 1e-9)
        value = vectors.goodput_count(cols, _good(cols, spec) & mine, window) / span_s
        limits = spec.limits_for(obj.request_class)
        note = "good = ok and " + (
            ", ".join(f"{k} <= {v:g}" for k, v in limits.items()) or "no per-request limits"
        )
    else:
        rate = getattr(vectors.throughput(cols, window, mask=mine), obj.metric)
        if rate is None:  # inputs_per_s of a run that sent no embeddings or rerank requests
            return ObjectiveResult(obj, None, "inconclusive", n=counts.sent,
                                   note="no embeddings or rerank requests in this run")  # fmt: skip
        value = float(rate)
        note = "a rate over the measurement window (no interval)"
    status: Status = "pass" if obj.holds(value) else "fail"
    return ObjectiveResult(obj, value, status, n=counts.sent, note=note)


NOT_STREAMED = "not measured: the requests were not streamed"


def _streamed(cols: RecordColumns, mine: np.ndarray | None = None) -> bool:
    """Some ok request (of ``mine``) was streamed (an embedding or rerank request never is),
    or none was ok (a failed run is judged as before)."""
    ok = cols.ok if mine is None else cols.ok & mine
    streamed = (cols.ints["streamed"] != 0) & (cols.ints["inputs"] == NONE)
    return not ok.any() or bool((ok & streamed).any())


def _unmeasured(cols: RecordColumns, spec: SLOSpec) -> str | None:
    """The reason a run is no evidence for ``spec`` when it names a metric only a stream has
    (TTFT, ITL, TPOT, as an objective or a per-request limit) and nothing was streamed: an
    absent metric passes nothing (before, a non-streamed TPOT of 0.0 passed any objective)."""
    if _streamed(cols):
        return None
    named = {o.metric for o in spec.objectives}
    named |= {m for limits in spec.request_limits.values() for m in limits}
    asked = sorted(named & set(metrics.STREAM_METRICS))
    if not asked:
        return None
    return (f"{', '.join(asked)} cannot be judged: the requests were not streamed (an answer "
            "that comes whole has no first token or gaps between tokens); run with streaming "
            "(drop --no-stream, stream = true), or judge e2e_ms instead")  # fmt: skip


def _window_reasons(cols: RecordColumns, window: tuple[int, int]) -> list[str]:
    """Why a run has nothing to judge: no measurement window, or no request sent in it."""
    lo, hi = window
    if hi <= lo:
        return [
            f"the run has no measurement window ({lo / 1e9:g} to {hi / 1e9:g} s: the warm-up "
            "and cool-down cover the whole run): run longer than --warmup + --cooldown"
        ]
    sent = cols.sent
    if not ((sent != NONE) & (sent >= lo) & (sent <= hi)).any():
        return [
            f"no request was sent inside the measurement window ({lo / 1e9:g} to "
            f"{hi / 1e9:g} s): run longer than --warmup + --cooldown"
        ]
    return []


def evaluate(results: Results, spec: SLOSpec, *, inconclusive: Policy = "fail") -> Verdict:
    """Judge a run against an SLO. The verdict's ``exit_code`` is the CI gate."""
    if inconclusive not in ("fail", "pass"):
        raise ValueError(f'inconclusive policy must be "fail" or "pass", got {inconclusive!r}')
    window = results.measurement_window_ns()
    cols = columns_of(results.records)
    counts = vectors.count_outcomes(cols, results.scheduled_count)
    reasons = []
    if results.saturated:
        lag = results.generator.get("loop_lag_ms_max")
        lag_text = f" (event-loop lag up to {lag:.1f} ms)" if isinstance(lag, int | float) else ""
        reasons.append(
            f"the load generator was saturated{lag_text}: its timings are not trustworthy; "
            "lower the load, use --workers, or a bigger client machine"
        )
    unmeasured = _unmeasured(cols, spec)
    if unmeasured is not None:
        reasons.append(unmeasured)
    stopped = interrupted_note(results.extra)
    if stopped is not None:
        reasons.append(f"{stopped}: run it again to its end")
    if counts.sent < spec.min_requests:
        reasons.append(
            f"only {counts.sent} requests were sent; the SLO asks for at least "
            f"{spec.min_requests} (min_requests): run longer or at a higher rate"
        )
    if counts.sent:
        reasons.extend(_window_reasons(cols, window))
    rows = tuple(_eval_one(o, results, cols, spec, window) for o in spec.objectives)
    return Verdict(
        rows=rows,
        inconclusive_policy=inconclusive,
        invalid_reasons=tuple(reasons),
        confidence=spec.confidence,
        name=spec.name,
        counts=counts,
    )


def good_in_window(results: Results, spec: SLOSpec) -> int:
    """Good requests (by the SLO's per-request limits) completed inside the window."""
    cols = columns_of(results.records)
    return vectors.goodput_count(cols, _good(cols, spec), results.measurement_window_ns())
