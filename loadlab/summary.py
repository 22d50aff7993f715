"""A run's summary: what ``loadlab report`` prints, as frozen data.

``summarize(run)`` reads any run that has records, a measurement window, a scheduled count
and a saturation flag (a ``loadlab.results.Results`` does); every figure is a pure function
of the records from ``loadlab.metrics``. ``RunSummary.to_dict()`` is the results file's
``"summary"`` section (informative: readers recompute it from the records)::

    {"counts": {"scheduled", "sent", "dropped", "ok", "failed", "late", "by_outcome",
                "error_rate"},
     "window_ns": [start, end],
     "ttft_ms" | "ttft_from_intended_ms" | "itl_ms" | "tpot_ms" | "e2e_ms" |
     "e2e_from_intended_ms" | "max_gap_ms" | "output_tokens_per_request":
                {"count", "p50", "p90", "p95", "p99", "mean", "min", "max"},
     "stalls_per_stream_mean", "token_count_disagreements",
     "throughput": {"window_s", "output_tokens", "output_tokens_per_s", "total_tokens_per_s",
                    "requests_per_s", "series_bin_s"},
     "saturated": bool}

Example::

    s = summarize(read_results("reports/run.json"))
    s.ttft_ms.at(99), s.counts.failed, s.throughput.output_tokens_per_s
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loadlab.metrics import (
    DEFAULT_PERCENTILES,
    LATENCY_METRICS,
    Counts,
    Distribution,
    Throughput,
    count_outcomes,
    distribution,
    e2e_from_intended_ms,
    e2e_ms,
    itl_ms,
    latency_records,
    max_gap_ms,
    output_token_count,
    stall_count,
    throughput,
    tpot_ms,
    ttft_from_intended_ms,
    ttft_ms,
)
from loadlab.records import RequestRecord

__all__ = ["Run", "RunSummary", "summarize"]


class Run(Protocol):
    """What a summary reads of a run (``loadlab.results.Results`` has it)."""

    @property
    def records(self) -> Sequence[RequestRecord]: ...

    @property
    def scheduled_count(self) -> int: ...

    @property
    def saturated(self) -> bool: ...

    def measurement_window_ns(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class RunSummary:
    """Counts, latency distributions (ms) and throughput of one run's measurement window.

    Latency populations are the ok requests sent inside the window (``latency_records``);
    ``itl_ms`` pools every gap of those streams; ``max_gap_ms`` is each stream's longest gap.
    """

    counts: Counts
    window_ns: tuple[int, int]
    ttft_ms: Distribution
    ttft_from_intended_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    e2e_from_intended_ms: Distribution
    max_gap_ms: Distribution
    stalls_per_stream_mean: float
    output_tokens_per_request: Distribution
    token_count_disagreements: int
    throughput: Throughput
    saturated: bool

    def latency(self, name: str) -> Distribution:
        """The distribution of one of ``LATENCY_METRICS`` (a report's row, an SLO's metric)."""
        if name not in LATENCY_METRICS:
            raise ValueError(
                f"unknown latency metric {name!r}; known: {', '.join(LATENCY_METRICS)}"
            )
        value: Distribution = getattr(self, name)
        return value

    def to_dict(self) -> dict[str, Any]:
        """The results file's ``"summary"`` section (schema in this module's docstring)."""
        return {
            "counts": self.counts.to_dict(),
            "window_ns": list(self.window_ns),
            **{name: self.latency(name).to_dict() for name in LATENCY_METRICS},
            "stalls_per_stream_mean": self.stalls_per_stream_mean,
            "output_tokens_per_request": self.output_tokens_per_request.to_dict(),
            "token_count_disagreements": self.token_count_disagreements,
            "throughput": self.throughput.to_dict(),
            "saturated": self.saturated,
        }


def summarize(run: Run, qs: Iterable[float] = DEFAULT_PERCENTILES) -> RunSummary:
    """Everything ``loadlab report`` prints, as frozen data."""
    qs = tuple(qs)
    window = run.measurement_window_ns()
    lat = latency_records(run.records, window)

    def dist(fn: Callable[[RequestRecord], float | None]) -> Distribution:
        return distribution([v for v in map(fn, lat) if v is not None], qs)

    return RunSummary(
        counts=count_outcomes(run.records, run.scheduled_count),
        window_ns=window,
        ttft_ms=dist(ttft_ms),
        ttft_from_intended_ms=dist(ttft_from_intended_ms),
        itl_ms=distribution([g for r in lat for g in itl_ms(r)], qs),
        tpot_ms=dist(tpot_ms),
        e2e_ms=dist(e2e_ms),
        e2e_from_intended_ms=dist(e2e_from_intended_ms),
        max_gap_ms=dist(max_gap_ms),
        stalls_per_stream_mean=(sum(stall_count(r) for r in lat) / len(lat)) if lat else 0.0,
        output_tokens_per_request=distribution([output_token_count(r) for r in lat], qs),
        token_count_disagreements=sum(1 for r in run.records if r.output_tokens_disagree),
        throughput=throughput(run.records, window),
        saturated=run.saturated,
    )
