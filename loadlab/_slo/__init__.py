"""SLO files (TOML) and verdicts: is this run evidence that the endpoint meets its SLOs?

An SLO file lists objectives as ``"metric[.pNN] OP threshold"`` strings::

    name = "chat, interactive tier"
    min_requests = 100          # fewer sent requests: not valid evidence (exit 2)
    confidence = 0.95           # of the intervals that decide pass / fail / inconclusive
    objectives = [
      "ttft_ms.p95 <= 500",
      "itl_ms.p99 <= 50",
      "error_rate <= 0.01",
      "goodput_rps >= 4",
      "output_tokens_per_s >= 1000",
    ]

    [request]                   # optional: what makes ONE request "good" (for goodput_rps)
    ttft_ms = 500               # default: each percentile objective on a per-request metric
    tpot_ms = 40

    [classes.long_prompt]       # optional: objectives for the requests of one request_class
    objectives = ["ttft_ms.p95 <= 2000"]

Percentile objectives carry a distribution-free confidence interval from order statistics;
error and drop rates an exact binomial (Clopper-Pearson) interval. An objective whose interval
straddles its threshold is ``inconclusive``, with an estimate of how many more requests would
decide it. Exit codes: 0 all pass, 1 any fail (or inconclusive under the "fail" policy),
2 not valid evidence (generator saturated, too few requests, unreadable results).

Example::

    spec = load_slo("examples/slo.toml")
    verdict = evaluate(read_results("reports/run.json"), spec, inconclusive="fail")
    sys.exit(verdict.exit_code)
"""

from __future__ import annotations

from loadlab._slo.intervals import percentile_ci, proportion_ci
from loadlab._slo.spec import (
    DIST_METRICS,
    RATE_METRICS,
    Objective,
    SLOError,
    SLOSpec,
    load_slo,
    parse_objective,
    parse_slo,
)
from loadlab._slo.verdict import ObjectiveResult, Verdict, evaluate

__all__ = [
    "DIST_METRICS",
    "RATE_METRICS",
    "Objective",
    "ObjectiveResult",
    "SLOError",
    "SLOSpec",
    "Verdict",
    "evaluate",
    "load_slo",
    "parse_objective",
    "parse_slo",
    "percentile_ci",
    "proportion_ci",
]
