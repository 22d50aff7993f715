"""Metrics: pure functions of request records (the definitions below are the normative ones).

Per request (milliseconds; ``None`` when undefined for that request)::

    ttft_ms      first token-carrying chunk - sent (content, reasoning or tool-call arguments)
    ttfat_ms     first chunk carrying answer content - sent (not reasoning, not a tool call's
                 arguments); equals ttft_ms for a model that does not reason
    reasoning_ms last reasoning chunk - first reasoning chunk (how long reasoning streamed)
    reasoning_tokens, answer_tokens, tool_call_tokens   output tokens by kind (see each)
    e2e_ms       last token-carrying chunk - sent     (a usage chunk or [DONE] does not move it)
    tpot_ms      (last - first token chunk) / (output_tokens - 1), output_tokens >= 2
    itl_ms       every gap between consecutive token-carrying chunks (a list)
    *_from_intended_ms   the same, measured from the intended send time (open loop; coordinated
                 omission aware: a request that waited to be sent shows the wait)
    max_gap_ms   the longest gap of one stream (a stall), stall_count: gaps over k x its median

A request asked without streaming (``RequestRecord.streamed`` False) has an E2E latency (its
body's arrival) but no TTFT, TTFAT, ITL or TPOT: those are ``None`` (empty for ITL), never 0.

Over a run: exact percentiles (numpy, linear interpolation) of ok requests sent inside the
measurement window; throughput over the window; goodput from per-request objectives.
``percentile`` is the one percentile of loadlab: every figure it prints or gates on (the
summary, the SLO verdict, the comparison, the lab, the selftest, the generator's own lag)
goes through it. ``LogHistogram`` is the mergeable, bounded-relative-error form for merging
many workers. ``loadlab._analysis.summary`` gathers these into a run's summary.

Example::

    >>> values = [float(i) for i in range(1, 101)]
    >>> percentile(values, 50), distribution(values).at(99), distribution([]).at(99)
    (50.5, 99.01, None)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from loadlab.records import OUTCOME_DROPPED, OUTCOME_OK, RequestRecord, is_failed

__all__ = [
    "DEFAULT_PERCENTILES",
    "LATENCY_METRICS",
    "STREAM_METRICS",
    "TOKEN_METRICS",
    "Counts",
    "Distribution",
    "LogHistogram",
    "Throughput",
    "answer_token_count",
    "chunk_token_counts",
    "count_outcomes",
    "distribution",
    "e2e_from_intended_ms",
    "e2e_ms",
    "good_requests",
    "goodput_rps",
    "itl_ms",
    "itl_per_token_ms",
    "latency_records",
    "max_gap_ms",
    "output_token_count",
    "percentile",
    "reasoning_ms",
    "reasoning_token_count",
    "stall_count",
    "tally_outcomes",
    "throughput",
    "tool_call_token_count",
    "tpot_ms",
    "ttfat_ms",
    "ttft_from_intended_ms",
    "ttft_ms",
]

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


# ---------------------------------------------------------------- per request


def ttft_ms(r: RequestRecord) -> float | None:
    """Time to first token: first token-carrying chunk minus ``sent`` (ms); ``None`` for a
    request not streamed (its one chunk is the whole answer)."""
    if r.sent_ns is None or not r.chunk_ns or not r.streamed:
        return None
    return (r.chunk_ns[0] - r.sent_ns) / NS_PER_MS


def ttft_from_intended_ms(r: RequestRecord) -> float | None:
    """TTFT from the intended send time (falls back to ``sent`` in closed loop)."""
    start = r.intended_ns if r.intended_ns is not None else r.sent_ns
    if start is None or not r.chunk_ns or not r.streamed:
        return None
    return (r.chunk_ns[0] - start) / NS_PER_MS


def e2e_ms(r: RequestRecord) -> float | None:
    """End-to-end latency: last token-carrying chunk minus ``sent`` (ms); for embeddings and
    rerank (nothing streamed: ``inputs`` set), the answer's end minus ``sent``."""
    end = _last_ns(r)
    if r.sent_ns is None or end is None:
        return None
    return (end - r.sent_ns) / NS_PER_MS


def _last_ns(r: RequestRecord) -> int | None:
    if r.chunk_ns:
        return r.chunk_ns[-1]
    return r.end_ns if r.inputs is not None and r.outcome == "ok" else None


def e2e_from_intended_ms(r: RequestRecord) -> float | None:
    """E2E latency from the intended send time (falls back to ``sent``)."""
    start = r.intended_ns if r.intended_ns is not None else r.sent_ns
    end = _last_ns(r)
    if start is None or end is None:
        return None
    return (end - start) / NS_PER_MS


def itl_ms(r: RequestRecord) -> list[float]:
    """Every gap between consecutive token-carrying chunks of one stream (ms)."""
    if not r.streamed:
        return []
    c = r.chunk_ns
    return [(c[i] - c[i - 1]) / NS_PER_MS for i in range(1, len(c))]


def chunk_token_counts(r: RequestRecord) -> list[int] | None:
    """Tokens carried by each token-carrying chunk: the recorded counts (the server's, or the
    tokenizer's over each chunk's text), else one each when the output token count equals
    the chunk count; None when a chunk carried several and nothing said which."""
    n = len(r.chunk_ns)
    if r.chunk_tokens and len(r.chunk_tokens) == n:
        return list(r.chunk_tokens)
    return [1] * n if output_token_count(r) == n else None


def itl_per_token_ms(r: RequestRecord) -> list[float]:
    """The per-token view of ITL (ms): each gap divided evenly over the tokens of the chunk it
    ends (a chunk of k tokens after a gap g gives k values g / k). Equal to ``itl_ms`` when
    every chunk carries one token; empty when the split is not known (``chunk_token_counts``)."""
    counts = chunk_token_counts(r)
    if counts is None or not r.streamed:
        return []
    c = r.chunk_ns
    out: list[float] = []
    for i in range(1, len(c)):
        k = max(1, counts[i])
        out.extend([(c[i] - c[i - 1]) / NS_PER_MS / k] * k)
    return out


def output_token_count(r: RequestRecord) -> int:
    """Output tokens by the precedence of the definition: usage, else chunks."""
    if r.output_tokens is not None:
        return r.output_tokens
    if r.chunk_tokens:
        return sum(r.chunk_tokens)
    return len(r.chunk_ns)


def ttfat_ms(r: RequestRecord) -> float | None:
    """Time to first answer token: the first chunk carrying answer content minus ``sent``
    (ms); ``None`` when no answer content came (an answer that is only a tool call), or
    the request was not streamed."""
    if r.sent_ns is None or r.answer_ns is None or not r.streamed:
        return None
    return (r.answer_ns - r.sent_ns) / NS_PER_MS


def reasoning_ms(r: RequestRecord) -> float | None:
    """Reasoning duration: the last reasoning chunk minus the first (ms); ``None`` for a
    request that streamed no reasoning."""
    if r.reasoning_start_ns is None or r.reasoning_end_ns is None:
        return None
    return (r.reasoning_end_ns - r.reasoning_start_ns) / NS_PER_MS


def reasoning_token_count(r: RequestRecord) -> int:
    """Reasoning tokens: the server's ``reasoning_tokens`` when it said, else reasoning chunks."""
    return r.reasoning_tokens if r.reasoning_tokens is not None else r.reasoning_chunks


def tool_call_token_count(r: RequestRecord) -> int:
    """Tool-call argument tokens: their chunks (no API's usage counts them apart)."""
    return r.tool_call_chunks


def answer_token_count(r: RequestRecord) -> int:
    """Answer content tokens: output tokens less reasoning and tool-call argument tokens."""
    return max(0, output_token_count(r) - reasoning_token_count(r) - tool_call_token_count(r))


def tpot_ms(r: RequestRecord) -> float | None:
    """Time per output token after the first: (t_last - t_first) / (output_tokens - 1) (ms);
    ``None`` for a request not streamed (its tokens came in one body, not one by one)."""
    n = output_token_count(r)
    if n < 2 or len(r.chunk_ns) < 1 or not r.streamed:
        return None
    return (r.chunk_ns[-1] - r.chunk_ns[0]) / NS_PER_MS / (n - 1)


def max_gap_ms(r: RequestRecord) -> float | None:
    """The longest gap between token-carrying chunks of one stream (ms): its worst stall."""
    gaps = itl_ms(r)
    return max(gaps) if gaps else None


def stall_count(r: RequestRecord, k: float = 3.0) -> int:
    """Gaps longer than ``k`` times the stream's own median gap: visible pauses."""
    gaps = itl_ms(r)
    if len(gaps) < 2:
        return 0
    med = float(np.median(gaps))
    return sum(1 for g in gaps if g > k * med)


# ---------------------------------------------------------------- percentiles


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between the closest ranks
    (numpy's default, Hyndman & Fan 1996 type 7); ``None`` for no values.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([], 99)
    (2.5, None)
    """
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q, method="linear"))


@dataclass(frozen=True)
class Distribution:
    """One metric's values over a run: count, exact percentiles, mean, min and max.

    Every value is ``None`` when there were no values (count 0). In the results file it is
    ``{"count", "p50", "p90", ..., "mean", "min", "max"}`` (``to_dict``).
    """

    count: int
    quantiles: tuple[tuple[float, float | None], ...]  # (q in 0-100, value), in asked order
    mean: float | None
    min: float | None
    max: float | None

    def at(self, q: float) -> float | None:
        """The ``q``-th percentile; ``q`` must be one this distribution was computed for."""
        for have, value in self.quantiles:
            if have == q:
                return value
        known = ", ".join(f"{have:g}" for have, _ in self.quantiles)
        raise ValueError(f"p{q:g} was not computed; computed: {known} (pass it in qs)")

    def to_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {"count": self.count}
        out.update({f"p{q:g}": v for q, v in self.quantiles})
        out.update({"mean": self.mean, "min": self.min, "max": self.max})
        return out


def distribution(
    values: Sequence[float] | np.ndarray,
    qs: Iterable[float] = DEFAULT_PERCENTILES,
    *,
    scratch: bool = False,
) -> Distribution:
    """The ``Distribution`` of ``values``, its percentiles by ``percentile``. ``scratch``:
    ``values`` is an array no one else reads, which the percentiles may reorder in place
    (a pooled ITL of fifteen million gaps is not copied again)."""
    arr = np.asarray(values, dtype=float)
    qs = tuple(float(q) for q in qs)
    if arr.size == 0:
        return Distribution(0, tuple((q, None) for q in qs), None, None, None)
    mean, low, high = float(arr.mean()), float(arr.min()), float(arr.max())  # before: in order
    # ``percentile``'s values, all from one partition of the array
    at = np.percentile(arr, qs, method="linear", overwrite_input=scratch) if qs else ()
    quantiles = tuple((q, float(v)) for q, v in zip(qs, at, strict=True))
    return Distribution(int(arr.size), quantiles, mean, low, high)


@dataclass
class LogHistogram:
    """Mergeable histogram with bounded relative error (DDSketch-style log buckets).

    Every positive value ``v`` falls into bucket ``ceil(log_gamma(v))`` with
    ``gamma = (1 + a) / (1 - a)``; a bucket is reported by its midpoint ``2 g^i / (g + 1)``,
    which is within relative error ``a`` of every value in it (Masson et al., "DDSketch",
    VLDB 2019, section 2). Default ``a`` = 0.5 %, inside the 1 % the architecture asks for.
    """

    relative_accuracy: float = 0.005
    counts: dict[int, int] = field(default_factory=dict)
    zero_count: int = 0
    total: int = 0

    @property
    def _gamma(self) -> float:
        a = self.relative_accuracy
        return (1 + a) / (1 - a)

    def add(self, value: float, count: int = 1) -> None:
        if value <= 0:
            self.zero_count += count
        else:
            i = math.ceil(math.log(value) / math.log(self._gamma))
            self.counts[i] = self.counts.get(i, 0) + count
        self.total += count

    def merge(self, other: LogHistogram) -> None:
        if other.relative_accuracy != self.relative_accuracy:
            raise ValueError("cannot merge histograms of different relative_accuracy")
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        self.zero_count += other.zero_count
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """Value at quantile ``q`` in [0, 1] (nearest rank)."""
        if self.total == 0:
            return None
        rank = q * (self.total - 1)
        seen = self.zero_count
        if rank < seen:
            return 0.0
        g = self._gamma
        for i in sorted(self.counts):
            seen += self.counts[i]
            if rank < seen:
                return 2 * g**i / (g + 1)
        return 2 * g ** max(self.counts) / (g + 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "relative_accuracy": self.relative_accuracy,
            "counts": {str(k): v for k, v in self.counts.items()},
            "zero_count": self.zero_count,
            "total": self.total,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LogHistogram:
        return cls(
            relative_accuracy=float(d["relative_accuracy"]),
            counts={int(k): int(v) for k, v in d["counts"].items()},
            zero_count=int(d["zero_count"]),
            total=int(d["total"]),
        )


# ---------------------------------------------------------------- run level


@dataclass(frozen=True)
class Counts:
    """Requests by outcome, with the invariants scheduled = sent + dropped, sent = ok + failed."""

    scheduled: int
    sent: int
    dropped: int
    ok: int
    failed: int
    late: int  # sent later than intended by more than the run's tolerance
    by_outcome: Mapping[str, int]  # outcome class -> requests, sorted by name

    @property
    def error_rate(self) -> float:
        """Failed / sent (0 when nothing was sent)."""
        return self.failed / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_rate": self.error_rate}


def count_outcomes(records: Iterable[RequestRecord], scheduled: int | None = None) -> Counts:
    """Counts by outcome; ``scheduled`` defaults to sent + dropped."""
    records = list(records)
    late = sum(1 for r in records if r.late)
    return tally_outcomes(Counter(r.outcome for r in records), late, scheduled)


def tally_outcomes(by: Mapping[str, int], late: int, scheduled: int | None = None) -> Counts:
    """``Counts`` from requests by outcome class and the late ones (``count_outcomes``)."""
    dropped = by.get(OUTCOME_DROPPED, 0)
    ok = by.get(OUTCOME_OK, 0)
    failed = sum(c for o, c in by.items() if is_failed(o))
    sent = ok + failed
    return Counts(
        scheduled=scheduled if scheduled is not None else sent + dropped,
        sent=sent,
        dropped=dropped,
        ok=ok,
        failed=failed,
        late=late,
        by_outcome=dict(sorted(by.items())),
    )


def latency_records(
    records: Iterable[RequestRecord], window_ns: tuple[int, int]
) -> list[RequestRecord]:
    """The ok requests sent inside the measurement window: the latency population."""
    lo, hi = window_ns
    return [r for r in records if r.ok and r.sent_ns is not None and lo <= r.sent_ns <= hi]


def _chunk_token_weights(r: RequestRecord) -> list[float]:
    """Tokens carried by each token chunk, adding up to ``output_token_count``: the chunks'
    own counts (scaled to the usage's total when a tokenizer's split disagrees with it), else
    the total spread evenly."""
    n = len(r.chunk_ns)
    if n == 0:
        return []
    total = output_token_count(r)
    counts = chunk_token_counts(r)
    if counts is None:
        return [total / n] * n
    split = sum(counts)
    if split == total or split == 0:
        return [float(c) for c in counts]
    return [c * total / split for c in counts]


@dataclass(frozen=True)
class Throughput:
    """Rates over the measurement window, and output tokens/s per ``series_bin_s`` bin from
    the run's start (the whole run, for plots and the comparison's per-second test)."""

    window_s: float
    output_tokens: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float
    output_tokens_per_s_series: tuple[float, ...]
    series_bin_s: float
    # embeddings and rerank (records with ``inputs``): texts and their tokens per second, of
    # the requests that completed ok inside the window; None for a run that sent none
    inputs_per_s: float | None = None
    input_tokens_per_s: float | None = None

    @classmethod
    def over(
        cls,
        window_s: float,
        output_tokens: float,
        prompt_tokens: int,
        completed: int,
        series: tuple[float, ...],
        bin_s: float,
        pooled: tuple[int, int] | None = None,
    ) -> Throughput:
        """The rates of ``window_s`` seconds that saw these tokens and completions (and,
        for embeddings and rerank, ``pooled``: the texts and their tokens)."""
        return cls(
            window_s=window_s,
            output_tokens=output_tokens,
            output_tokens_per_s=output_tokens / window_s,
            total_tokens_per_s=(output_tokens + prompt_tokens) / window_s,
            requests_per_s=completed / window_s,
            output_tokens_per_s_series=series,
            series_bin_s=bin_s,
            inputs_per_s=None if pooled is None else pooled[0] / window_s,
            input_tokens_per_s=None if pooled is None else pooled[1] / window_s,
        )

    def to_dict(self) -> dict[str, float]:
        """The results file's ``summary.throughput`` (without the series)."""
        out = asdict(self)
        del out["output_tokens_per_s_series"]
        for key in ("inputs_per_s", "input_tokens_per_s"):
            if out[key] is None:
                del out[key]
        return out


def throughput(
    records: Sequence[RequestRecord], window_ns: tuple[int, int], bin_s: float = 1.0
) -> Throughput:
    """Output tokens/s, total tokens/s and requests/s over the window, plus a per-second series.

    Output tokens count when their chunk arrives inside the window (failed streams included:
    the tokens were delivered); prompt tokens count for requests sent inside it *and answered*
    (ok, or at least one token delivered: the server read the prompt), never for a request
    that did not connect or got an error status; a request counts for requests/s when it
    completed ok inside it. So a dead endpoint's connect errors add nothing to any rate.
    """
    lo, hi = window_ns
    span_s = max((hi - lo) / NS_PER_S, 1e-9)
    out_tokens = 0.0
    prompt_tokens = 0
    completed = 0
    inputs = input_tokens = 0
    pooled = False
    series: Counter[int] = Counter()
    bin_ns = int(bin_s * NS_PER_S)
    for r in records:
        for t, w in zip(r.chunk_ns, _chunk_token_weights(r), strict=True):
            series[t // bin_ns] += w  # type: ignore[assignment]
            if lo <= t <= hi:
                out_tokens += w
        answered = r.ok or bool(r.chunk_ns)
        if answered and r.sent_ns is not None and lo <= r.sent_ns <= hi:
            prompt_tokens += r.prompt_tokens or r.prompt_tokens_requested or 0
        last = _last_ns(r)
        if r.ok and last is not None and lo <= last <= hi:
            completed += 1
            if r.inputs is not None:
                inputs += r.inputs
                input_tokens += r.prompt_tokens or r.prompt_tokens_requested or 0
        pooled = pooled or r.inputs is not None
    n_bins = (max(series) + 1) if series else 0
    per_s = tuple(series.get(i, 0) / bin_s for i in range(n_bins))
    pooled_counts = (inputs, input_tokens) if pooled else None
    return Throughput.over(
        span_s, out_tokens, prompt_tokens, completed, per_s, bin_s, pooled_counts
    )


# The latency distributions of a run (a summary's rows, an SLO's percentile metrics): the
# per-request metrics plus ``itl_ms``, which pools every gap of every stream, and its
# per-token view ``itl_per_token_ms`` (each gap divided over its chunk's tokens).
LATENCY_METRICS = (
    "ttft_ms",
    "ttft_from_intended_ms",
    "itl_ms",
    "itl_per_token_ms",
    "tpot_ms",
    "e2e_ms",
    "e2e_from_intended_ms",
    "max_gap_ms",
    "ttfat_ms",
    "reasoning_ms",
)
# The latency metrics a request has only when it was streamed (``RequestRecord.streamed``).
STREAM_METRICS = (
    "ttft_ms",
    "ttft_from_intended_ms",
    "itl_ms",
    "itl_per_token_ms",
    "tpot_ms",
    "max_gap_ms",
    "ttfat_ms",
    "reasoning_ms",
)
# Per-request token counts by kind: distributions an SLO may name (``reasoning_tokens.p95``).
TOKEN_METRICS = ("reasoning_tokens", "answer_tokens", "tool_call_tokens")

# A per-request objective: metric name -> maximum (ms). Names are the per-request functions.
PER_REQUEST_METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft_ms": ttft_ms,
    "ttft_from_intended_ms": ttft_from_intended_ms,
    "e2e_ms": e2e_ms,
    "e2e_from_intended_ms": e2e_from_intended_ms,
    "tpot_ms": tpot_ms,
    "max_gap_ms": max_gap_ms,
    "ttfat_ms": ttfat_ms,
    "reasoning_ms": reasoning_ms,
    "reasoning_tokens": reasoning_token_count,
    "answer_tokens": answer_token_count,
    "tool_call_tokens": tool_call_token_count,
}


def good_requests(
    records: Iterable[RequestRecord], objectives: Mapping[str, float]
) -> list[RequestRecord]:
    """Requests that completed ok and met every per-request objective (``metric <= limit``).

    A metric that is undefined for a request (e.g. TPOT of a one-token answer) is not held
    against it. Failed requests are never good.
    """
    for name in objectives:
        if name not in PER_REQUEST_METRICS:
            known = ", ".join(sorted(PER_REQUEST_METRICS))
            raise ValueError(f"unknown per-request objective {name!r}; known: {known}")
    good = []
    for r in records:
        if not r.ok:
            continue
        values = ((PER_REQUEST_METRICS[n](r), limit) for n, limit in objectives.items())
        if all(v is None or v <= limit for v, limit in values):
            good.append(r)
    return good


def goodput_rps(
    records: Sequence[RequestRecord], window_ns: tuple[int, int], objectives: Mapping[str, float]
) -> float:
    """Good requests (see ``good_requests``) completed inside the window, per second."""
    lo, hi = window_ns
    span_s = max((hi - lo) / NS_PER_S, 1e-9)
    good = good_requests(records, objectives)
    return sum(1 for r in good if r.chunk_ns and lo <= r.chunk_ns[-1] <= hi) / span_s
