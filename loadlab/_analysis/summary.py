"""A run's summary: what ``loadlab report`` prints, as frozen data.

``summarize(run)`` reads any run that has records, a measurement window, a scheduled count
and a saturation flag (a ``loadlab.results.Results`` does); every figure is a pure function
of the records from ``loadlab._analysis.metrics``. ``RunSummary.to_dict()`` is the results file's
``"summary"`` section (informative: readers recompute it from the records)::

    {"counts": {"scheduled", "sent", "dropped", "ok", "failed", "late", "by_outcome",
                "error_rate"},
     "window_ns": [start, end],
     "ttft_ms" | "ttft_from_intended_ms" | "itl_ms" | "itl_per_token_ms" | "tpot_ms" | "e2e_ms" |
     "e2e_from_intended_ms" | "max_gap_ms" | "output_tokens_per_request":
                {"count", "p50", "p90", "p95", "p99", "mean", "min", "max"},
     "ttfat_ms" | "reasoning_ms" | "reasoning_tokens" | "answer_tokens" | "tool_call_tokens":
                the same, written only when some request of the run reasoned or called a
                tool (``has_reasoning_or_tools``; otherwise TTFAT is TTFT and they say nothing),
     "stalls_per_stream_mean", "token_count_disagreements",
     "prompt_tokens_match": {"compared", "exact", "off_by_one", "missed", "worst"},
     "short_outputs": int,
     "throughput": {"window_s", "output_tokens", "output_tokens_per_s", "total_tokens_per_s",
                    "requests_per_s", "series_bin_s"},
     "saturated": bool}

Example::

    s = summarize(read_results("reports/run.json"))
    s.ttft_ms.at(99), s.counts.failed, s.throughput.output_tokens_per_s
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from loadlab._analysis import vectors
from loadlab._analysis.columns import NONE, columns_of
from loadlab._analysis.metrics import (
    DEFAULT_PERCENTILES,
    LATENCY_METRICS,
    STREAM_METRICS,
    TOKEN_METRICS,
    Counts,
    Distribution,
    Throughput,
    distribution,
)
from loadlab._analysis.token_checks import PromptMatch
from loadlab.records import RequestRecord

__all__ = [
    "ANSWER_METRICS",
    "Run",
    "RunSummary",
    "has_reasoning_or_tools",
    "interrupted_note",
    "overload_note",
    "summarize",
]

# The distributions a reasoning model or an agent adds (written when the run has either).
ANSWER_METRICS = ("ttfat_ms", "reasoning_ms", *TOKEN_METRICS)


def has_reasoning_or_tools(records: Iterable[RequestRecord]) -> bool:
    """True when some request streamed reasoning or called a tool."""
    return any(r.reasoning_chunks or r.reasoning_tokens or r.tool_calls for r in records)


def interrupted_note(extra: Mapping[str, Any]) -> str | None:
    """Why a run is not whole (``results.extra``), or None: stopped by a signal before its
    stop rule, or rebuilt from its journal after the process died. Such a run sent less
    than it was asked to, and the requests in flight at the end are missing: the summary,
    the reports and the SLO gate say so (the gate does not take it as evidence)."""
    if not extra.get("interrupted"):
        return None
    source = extra.get("from_journal")
    if source:
        return (f"INTERRUPTED: rebuilt from the journal {source}; the run stopped before its "
                "stop rule and the requests in flight then are missing")  # fmt: skip
    return ("INTERRUPTED: the run was stopped (a signal) before its stop rule; the requests "
            "in flight then are missing")  # fmt: skip


def overload_note(run: Run) -> str | None:
    """In open loop, a server that completes requests more slowly than they arrive (under
    90 % of the arrival rate, 10 requests or more behind over the window) has a queue that
    grows without bound: its latencies grow with the run's length instead of describing a
    steady state. The sentence that says so, or None."""
    cols = columns_of(run.records)
    if not (cols.ints["intended_ns"] != NONE).any():
        return None  # closed loop: the queue is bounded by the streams
    lo, hi = run.measurement_window_ns()
    span_s = (hi - lo) / 1e9
    if span_s <= 0:
        return None
    sent = cols.sent
    arrived = int(((sent != NONE) & (sent >= lo) & (sent <= hi)).sum())
    served = vectors.throughput(cols, (lo, hi)).requests_per_s
    if not (served < 0.9 * arrived / span_s and arrived - served * span_s >= 10):
        return None
    failed = int(cols.failed.sum())
    lost = f" ({failed:,} never completed)" if failed else ""
    return (f"OVERLOADED: requests arrived at {arrived / span_s:.3g}/s and completed at "
            f"{served:.3g}/s{lost}: the queue grows without bound, so the latencies above grow "
            "with the run's length and describe no steady state; lower the rate, or add "
            "capacity")  # fmt: skip


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
    ``itl_ms`` pools every gap of those streams (per chunk: what a reader sees);
    ``itl_per_token_ms`` is its per-token view (each gap divided over the tokens of the chunk
    it ends; streams whose split is unknown left out); ``max_gap_ms`` is each stream's longest
    gap.
    """

    counts: Counts
    window_ns: tuple[int, int]
    ttft_ms: Distribution
    ttfat_ms: Distribution
    reasoning_ms: Distribution
    ttft_from_intended_ms: Distribution
    itl_ms: Distribution
    itl_per_token_ms: Distribution  # each gap divided over its chunk's tokens (labelled so)
    tpot_ms: Distribution
    e2e_ms: Distribution
    e2e_from_intended_ms: Distribution
    max_gap_ms: Distribution
    stalls_per_stream_mean: float
    output_tokens_per_request: Distribution
    token_count_disagreements: int
    prompt_tokens_match: PromptMatch  # first turns: requested against server-counted lengths
    short_outputs: int  # ok answers that stopped by themselves before max_tokens
    throughput: Throughput
    saturated: bool
    # ANSWER_METRICS but the two latencies (a reasoning model's and an agent's token counts)
    reasoning_tokens: Distribution
    answer_tokens: Distribution
    tool_call_tokens: Distribution
    reasoning_or_tools: bool  # some request reasoned or called a tool
    # some ok request of the window was streamed (or none was ok); False: TTFT, ITL and TPOT
    # do not apply (``STREAM_METRICS``) and are left out, not written as empty or zero
    streamed: bool = True

    def latency(self, name: str) -> Distribution:
        """The distribution of one of ``LATENCY_METRICS`` or ``TOKEN_METRICS`` (a report's
        row, an SLO's metric)."""
        if name not in LATENCY_METRICS and name not in TOKEN_METRICS:
            known = ", ".join((*LATENCY_METRICS, *TOKEN_METRICS))
            raise ValueError(f"unknown latency metric {name!r}; known: {known}")
        value: Distribution = getattr(self, name)
        return value

    def to_dict(self) -> dict[str, Any]:
        """The results file's ``"summary"`` section (schema in this module's docstring)."""
        return {
            "counts": self.counts.to_dict(),
            "window_ns": list(self.window_ns),
            **{
                name: self.latency(name).to_dict()
                for name in (*LATENCY_METRICS, *TOKEN_METRICS)
                if (name not in ANSWER_METRICS or self.reasoning_or_tools)
                and (self.streamed or name not in STREAM_METRICS)
            },
            **({} if self.streamed else {"streamed": False}),
            "stalls_per_stream_mean": self.stalls_per_stream_mean,
            "output_tokens_per_request": self.output_tokens_per_request.to_dict(),
            "token_count_disagreements": self.token_count_disagreements,
            "prompt_tokens_match": self.prompt_tokens_match.to_dict(),
            "short_outputs": self.short_outputs,
            "throughput": self.throughput.to_dict(),
            "saturated": self.saturated,
        }


def summarize(run: Run, qs: Iterable[float] = DEFAULT_PERCENTILES) -> RunSummary:
    """Everything ``loadlab report`` prints, as frozen data (over the records' columns:
    ``loadlab._analysis.vectors`` gives ``metrics``' values for every record at once)."""
    qs = tuple(qs)
    window = run.measurement_window_ns()
    cols = columns_of(run.records)
    lat = vectors.latency_mask(cols, window)

    def dist(name: str) -> Distribution:
        values = vectors.per_request(cols, name)[lat]
        return distribution(values[~np.isnan(values)], qs, scratch=True)

    n_lat = int(lat.sum())
    stalls = vectors.stall_counts(cols, lat)
    itl = distribution(vectors.itl_ms(cols, lat), qs, scratch=True)
    if vectors.per_token_is_per_chunk(cols, lat):
        itl_per_token = itl
    else:
        itl_per_token = distribution(vectors.itl_per_token_ms(cols, lat), qs)
    return RunSummary(
        counts=vectors.count_outcomes(cols, run.scheduled_count),
        window_ns=window,
        ttft_ms=dist("ttft_ms"),
        ttfat_ms=dist("ttfat_ms"),
        reasoning_ms=dist("reasoning_ms"),
        reasoning_tokens=dist("reasoning_tokens"),
        answer_tokens=dist("answer_tokens"),
        tool_call_tokens=dist("tool_call_tokens"),
        reasoning_or_tools=vectors.has_reasoning_or_tools(cols),
        ttft_from_intended_ms=dist("ttft_from_intended_ms"),
        itl_ms=itl,
        itl_per_token_ms=itl_per_token,
        tpot_ms=dist("tpot_ms"),
        e2e_ms=dist("e2e_ms"),
        e2e_from_intended_ms=dist("e2e_from_intended_ms"),
        max_gap_ms=dist("max_gap_ms"),
        stalls_per_stream_mean=int(stalls.sum()) / n_lat if n_lat else 0.0,
        output_tokens_per_request=distribution(cols.output_tokens[lat], qs),
        token_count_disagreements=int(cols.ints["output_tokens_disagree"].sum()),
        prompt_tokens_match=vectors.prompt_match(cols),
        short_outputs=vectors.short_outputs(cols, lat),
        throughput=vectors.throughput(cols, window),
        saturated=run.saturated,
        streamed=n_lat == 0 or bool(cols.ints["streamed"][lat].any()),
    )
