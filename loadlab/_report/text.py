"""Plain-text tables for a terminal: the run summary and the SLO verdict.

Example::

    print(render_summary(read_results("reports/run.json")))
    print(render_verdict(evaluate(results, load_slo("slo.toml"))))
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics, vectors
from loadlab._analysis.batch_job import BatchJob, batch_jobs
from loadlab._analysis.columns import NONE, columns_of
from loadlab._analysis.generator import (
    parser_fell_behind,
    stalled_first_tokens,
    stalled_later_tokens,
    worst_process,
)
from loadlab._analysis.metrics import Distribution
from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab._analysis.shards import run_notes
from loadlab._analysis.summary import ANSWER_METRICS, RunSummary, interrupted_note, summarize
from loadlab._report.cost import cost_lines
from loadlab._report.prefix_cache import render_prefix_cache_text
from loadlab.records import RequestRecord, printable

if TYPE_CHECKING:
    from loadlab._slo import ObjectiveResult, Verdict
    from loadlab.results import Results

__all__ = [
    "batch_job_text",
    "fmt_num",
    "latency_rows",
    "objective_line",
    "pct_cells",
    "render_summary",
    "render_table",
    "render_verdict",
    "short_error",
    "slowest_requests",
]

# (label, RunSummary latency metric, only for open loop)
LATENCY_ROWS = (
    ("TTFT", "ttft_ms", False),
    # a reasoning model or an agent (shown when some request reasoned or called a tool)
    ("TTFAT (first answer token)", "ttfat_ms", False),
    ("Reasoning duration", "reasoning_ms", False),
    ("TTFT from intended", "ttft_from_intended_ms", True),
    ("ITL", "itl_ms", False),
    # shown only where some chunk carried several tokens (``latency_rows``)
    ("ITL per token", "itl_per_token_ms", False),
    # each stream's longest gap, over streams: the stall users see (beside the pooled ITL)
    ("Longest stall per stream", "max_gap_ms", False),
    ("TPOT", "tpot_ms", False),
    ("E2E", "e2e_ms", False),
    ("E2E from intended", "e2e_from_intended_ms", True),
)
PCT_KEYS = ("p50", "p90", "p95", "p99", "max")  # the table's columns


def pct_cells(d: Distribution) -> list[float | None]:
    """A distribution's values under ``PCT_KEYS``."""
    return [d.at(50), d.at(90), d.at(95), d.at(99), d.max]


def fmt_num(v: Any, digits: int = 1) -> str:
    """Compact number for tables: ``None`` -> "-", 1234.5 -> "1,234.5", 0.01234 -> "0.0123"."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "inf" if v > 0 else ("-inf" if v < 0 else "nan")
    if isinstance(v, int):
        return f"{v:,}"
    if v != 0 and abs(v) < 1:
        return f"{v:.3g}"
    return f"{v:,.{digits}f}"


_JSON_MESSAGE = re.compile(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)')


def short_error(text: str, width: int = 160) -> str:
    """An error on one line: the ``message`` of a JSON error body in place of the body (an
    OpenAI-shaped ``{"error": {"message": ...}}``), then, if still longer than ``width``, cut
    at a word boundary with an ellipsis; never mid-word, never inside JSON.

    >>> short_error('HTTP 400: {"error":{"message":"prompt too long","type":"inval...')
    'HTTP 400: prompt too long'
    >>> short_error("one two three four", 12)
    'one two…'
    """
    head, brace, body = text.partition("{")
    if brace:
        found = _JSON_MESSAGE.search(body)
        message = found.group(1).replace('\\"', '"').replace("\\\\", "\\") if found else None
        if message:
            text = head + message
        elif len(text) > width:  # a JSON body with no message: not cut inside
            text = head + "{…}"
    text = re.sub(r"[ \t\r\n]+", " ", text).strip()  # one line
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip(" ,;:") + "…"


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """Aligned columns; ``align`` has one letter per column, l or r (default: l then r...)."""
    align = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [
            str(c).ljust(w) if align[i] == "l" else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def is_open_loop(results: Results) -> bool:
    return bool((columns_of(results.records).ints["intended_ns"] != NONE).any())


def latency_rows(results: Results, summary: RunSummary) -> list[tuple[str, Distribution]]:
    """(label, distribution) for each latency metric shown (from-intended only for open loop)."""
    open_loop = is_open_loop(results)
    same = summary.itl_per_token_ms == summary.itl_ms  # one token per chunk: nothing to add
    # embeddings / rerank only: nothing streamed, so only end-to-end latency applies
    texts = columns_of(results.records).ints["inputs"]
    pooled = bool(texts.size) and not (texts == NONE).any()
    return [
        (label, summary.latency(name))
        for label, name, ol in LATENCY_ROWS
        if (open_loop or not ol)
        and (summary.reasoning_or_tools or name not in ANSWER_METRICS)
        and not (same and name == "itl_per_token_ms")
        and (summary.streamed or name not in metrics.STREAM_METRICS)
        and not (pooled and not name.startswith("e2e"))
    ]


NOT_STREAMED_LINE = (
    "not streamed: each answer came whole, so TTFT, ITL and TPOT do not apply (left out, "
    "not zero); E2E is the time to the whole answer"
)


def _saturation_banner(results: Results) -> str:
    g = results.generator
    lag_p99, _, thr = worst_process(g)
    lag = g.get("loop_lag_ms_max")
    detail = f": event-loop lag up to {fmt_num(lag)} ms" if lag is not None else ""
    why = "!!! the load generator was the bottleneck: latencies below are NOT trustworthy !!!"
    backlog = parser_fell_behind(g)
    if backlog is not None:
        detail += f", median parse backlog {fmt_num(backlog)} ms"
        if lag_p99 <= (thr or 0.0):
            why = (
                "!!! the load generator was the bottleneck: its timestamps are exact, but it "
                "sent less load than asked !!!"
            )
    stalled = stalled_first_tokens(g)
    if stalled is not None:
        detail += f", {stalled[0]} of {stalled[1]} first tokens read just after such a lag"
    later = stalled_later_tokens(g)
    if later is not None:
        detail += f", {later[0]} of {later[1]} later tokens read just after such a lag"
    detail += f" (threshold {fmt_num(thr)} ms)" if thr is not None else ""
    text = f"!!! GENERATOR SATURATED{detail} !!!"
    bar = "!" * max(len(text), len(why))
    return "\n".join([bar, text, why, bar])


def _first_error(results: Results) -> str | None:
    """The error of the first request that failed or was dropped and said why."""
    cols = columns_of(results.records)
    errors = cols.text["error"]
    first = vectors.first_index(~cols.ok & errors.given())
    return None if first is None else errors[first]


def _longest_stall(results: Results) -> tuple[float | None, str]:
    """The longest gap of any stream in the window, and its request (the first, on a tie)."""
    cols = columns_of(results.records)
    lat = vectors.latency_mask(cols, results.measurement_window_ns())
    gaps = np.where(lat, vectors.per_request(cols, "max_gap_ms"), np.nan)
    if np.isnan(gaps).all():
        return None, ""
    i = int(np.nanargmax(gaps))
    return float(gaps[i]), str(cols.text["request_id"][i])


def _token_kinds_line(s: RunSummary) -> str:
    """Output tokens per request by kind (a reasoning model's, an agent's)."""
    cells = [
        f"{what} p50 {fmt_num(d.at(50))} p99 {fmt_num(d.at(99))}"
        for what, d in (
            ("reasoning", s.reasoning_tokens),
            ("answer", s.answer_tokens),
            ("tool-call", s.tool_call_tokens),
        )
    ]
    return "tokens      per request: " + "; ".join(cells)


def slowest_requests(results: Results, n: int = 5) -> list[RequestRecord]:
    """The ``n`` ok requests of the window with the longest E2E latency, slowest first (in
    record order on a tie)."""
    cols = columns_of(results.records)
    lat = vectors.latency_mask(cols, results.measurement_window_ns())
    e2e = np.where(lat, vectors.per_request(cols, "e2e_ms"), np.nan)
    timed = np.flatnonzero(~np.isnan(e2e))
    order = timed[np.argsort(-e2e[timed], kind="stable")[:n]]
    return [cols.record(int(i)) for i in order]


def _slowest_table(results: Results, streamed: bool) -> str:
    """The slowest requests with loadlab's id and the server's (to find them in its logs);
    TTFT only where the requests were streamed."""
    rows = [
        [
            printable(r.request_id),
            printable(r.response_id or "-"),
            *([fmt_num(metrics.ttft_ms(r))] if streamed else []),
            fmt_num(metrics.e2e_ms(r)),
            fmt_num(metrics.output_token_count(r)),
        ]
        for r in slowest_requests(results)
    ]
    ttft = ["TTFT (ms)"] if streamed else []
    header = ["slowest requests", "server id", *ttft, "E2E (ms)", "tokens"]
    return render_table(header, rows, "ll" + "r" * (len(header) - 2))


def _trace_line(t: dict[str, Any]) -> str:
    """What a trace replay read, sent and skipped (``extra.workload.trace``)."""
    skipped = [
        f"{t[k]:,} {what}"
        for k, what in (
            ("too_long", "longer than max_total_tokens"),
            ("bad_lines", "malformed lines"),
            ("filtered_out", "filtered out"),
            ("zero_length", "zero-length"),
        )
        if t.get(k)
    ]
    return (
        f"trace       {t.get('format', '?')} {t.get('path', '?')}: {t.get('rows_read', 0):,} rows "
        f"read, {t.get('requests', 0):,} requests; skipped: {', '.join(skipped) or 'none'}"
    )


def batch_job_text(job: BatchJob) -> str:
    """A batch job's completion time and rates (``loadlab._analysis.batch_job``), two lines."""
    head = (f"batch job   class {job.request_class}: {job.documents:,} documents "
            f"({job.ok:,} ok, {job.failed:,} failed)")  # fmt: skip
    if job.completion_s is None:
        return head + "; none completed"
    e2e = job.e2e_ms
    return (
        f"{head}; job completion time {fmt_num(job.completion_s, 2)} s (first send to last "
        f"token)\n            {fmt_num(job.documents_per_s, 2)} documents/s   output "
        f"{fmt_num(job.output_tokens_per_s)} tok/s   total {fmt_num(job.total_tokens_per_s)} "
        f"tok/s   E2E per document p50 {fmt_num(e2e.at(50))} ms  p99 {fmt_num(e2e.at(99))} ms"
    )


def _dataset_line(d: dict[str, Any]) -> str:
    """What a dataset workload read, sent, skipped and cut (``loadlab.workloads._dataset``)."""
    bad_media = d.get("bad_media")
    return (
        f"dataset     {d.get('format', '?')} {d.get('path', '?')}: {d.get('rows_read', 0):,} rows "
        f"read, {d.get('conversations', 0):,} conversations, {d.get('requests', 0):,} requests; "
        f"skipped: {d.get('bad_rows', 0):,} rows without text, {d.get('too_short', 0):,} prompts "
        f"too short; {d.get('cut', 0):,} prompts cut"
    ) + (f"; {bad_media:,} rows with unreadable media (bad_input)" if bad_media else "")


def render_summary(results: Results) -> str:
    """The summary table of ``loadlab report`` and the end of ``loadlab run``."""
    s = summarize(results)
    c = s.counts
    lo, hi = s.window_ns
    parts = []
    not_connected = c.by_outcome.get("connect_error", 0)
    if c.sent and not_connected * 2 > c.sent:  # the run measured a dead endpoint, say so first
        parts.append(
            f"MOSTLY NOT CONNECTED: {not_connected:,} of {c.sent:,} requests sent "
            f"({not_connected / c.sent * 100:.1f} %) never connected (connect_error); the "
            "figures below describe the rest. Is the endpoint up, and the URL right?"
        )
    head = f"run {results.started_at or '-'}  kind {results.kind}  workers {results.workers}"
    head += f"  window {fmt_num((hi - lo) / 1e9, 2)} s ({fmt_num(lo / 1e9, 2)} to {fmt_num(hi / 1e9, 2)} s)"
    parts.append(head)
    stopped = interrupted_note(results.extra)
    if stopped is not None:
        parts.append(f"{stopped}: not valid evidence for an SLO gate.")
    parts += run_notes(results.extra)
    if results.saturated:
        parts.append(_saturation_banner(results))
    failed = f"{c.failed:,} of {c.sent:,}" if c.failed else "0"
    rows = []
    for label, d in latency_rows(results, s):
        vals = [fmt_num(v) for v in pct_cells(d)]
        rows.append([f"{label} (ms)", fmt_num(d.count), *vals, failed])
    parts.append(render_table(["latency", "n", *PCT_KEYS, "failed (not in n)"], rows))
    if not s.streamed:
        parts[-1] += "\n" + NOT_STREAMED_LINE
    t = s.throughput
    parts.append(
        f"throughput  output {fmt_num(t.output_tokens_per_s)} tok/s   "
        f"total {fmt_num(t.total_tokens_per_s)} tok/s   "
        f"requests {fmt_num(t.requests_per_s, 2)} req/s"
        + (
            f"   inputs {fmt_num(t.inputs_per_s, 2)}/s   input {fmt_num(t.input_tokens_per_s)} tok/s"
            if t.inputs_per_s is not None
            else ""
        )
    )
    parts.extend(batch_job_text(job) for job in batch_jobs(results))
    err_pct = f" ({c.error_rate * 100:.1f} %)" if c.sent else ""
    by = ", ".join(f"{k} {v:,}" for k, v in c.by_outcome.items() if k != "ok") or "none"
    sent = f"outcomes    scheduled {c.scheduled:,}  sent {c.sent:,}  ok {c.ok:,}  "
    parts.append(
        f"{sent}FAILED {c.failed:,}{err_pct}  dropped {c.dropped:,}  late {c.late:,}\n"
        f"            not ok, by outcome: {by}"
        if c.failed or c.dropped
        else f"{sent}failed 0  dropped 0  late {c.late:,}"
    )
    first_error = _first_error(results)
    if first_error:
        parts[-1] += f"\n            first error: {printable(short_error(first_error))}"
    lost = (results.extra.get("locust") or {}).get("lost_by_worker") or {}
    if lost:
        parts[-1] += (
            f"\n            LOST {sum(lost.values()):,}: started on Locust worker(s) "
            f"{', '.join(sorted(lost))} that stopped without reporting them (counted as failed)"
        )
    pc = prefix_cache_summary(results)
    if pc is not None:
        parts.append(render_prefix_cache_text(pc))
    trace = (results.extra.get("workload") or {}).get("trace")
    if isinstance(trace, dict):
        parts.append(_trace_line(trace))
    dataset = (results.extra.get("workload") or {}).get("dataset")
    if isinstance(dataset, dict):
        parts.append(_dataset_line(dataset))
    gap, rid = _longest_stall(results)
    if gap is not None:
        parts.append(
            f"stalls      longest {fmt_num(gap)} ms (request {rid}); "
            f"stalls per stream (gap > 3x its median), mean {s.stalls_per_stream_mean:.2f}"
        )
    if s.reasoning_or_tools:
        parts.append(_token_kinds_line(s))
    if columns_of(results.records).text["response_id"].given().any():
        parts.append(_slowest_table(results, s.streamed))
    if s.token_count_disagreements:
        parts.append(
            f"note        {s.token_count_disagreements} requests: server usage and streamed "
            "chunks disagree on the output token count"
        )
    parts.extend(_length_lines(s))
    parts.extend(cost_lines(results))  # prices and GPU energy, when the run has them
    if results.saturated:
        parts.append("GENERATOR SATURATED: this run cannot pass an SLO gate.")
    return "\n\n".join(parts) + "\n"


def _length_lines(s: RunSummary) -> list[str]:
    """Prompt lengths as the server counted them, and answers shorter than asked."""
    lines = []
    m = s.prompt_tokens_match
    if m.compared:
        line = f"prompts     {m.exact:,} of {m.compared:,} exactly the requested length"
        if m.off_by_one or m.missed:
            line += (
                f" ({m.off_by_one:,} off by one, {m.missed:,} off by more; "
                f"worst {m.worst:+d} tokens)"
            )
        lines.append(line)
    if s.short_outputs:
        n = s.ttft_ms.count
        lines.append(
            f"short       {s.short_outputs:,} of {n:,} answers stopped before max_tokens "
            "(finish reason stop); they are in the percentiles above: ask --exact-output"
        )
    return lines


def _ci_text(lo: float | None, hi: float | None, has_ci: bool) -> str:
    if not has_ci:
        return "-"
    left = "(-inf" if lo is None else f"[{fmt_num(lo, 2)}"
    right = "inf)" if hi is None else f"{fmt_num(hi, 2)}]"
    return f"{left}, {right}"


def objective_line(r: ObjectiveResult) -> str:
    """One objective's result on one line: the measured value, margin, interval, count,
    status and, when inconclusive, roughly how many more requests would decide it."""
    ci = ""
    if r.ci_low is not None or r.ci_high is not None:
        lo = "-inf" if r.ci_low is None else fmt_num(r.ci_low, 3)
        hi = "inf" if r.ci_high is None else fmt_num(r.ci_high, 3)
        ci = f", interval [{lo}, {hi}]"
    extra = f", ~{r.extra_requests} more requests would decide it" if r.extra_requests else ""
    note = f" ({r.note})" if r.note else ""
    return (
        f"{r.objective}: measured {fmt_num(r.measured, 3)}, margin {fmt_num(r.margin, 3)}"
        f"{ci}, n {r.n}, {r.status}{extra}{note}"
    )


def render_verdict(verdict: Verdict) -> str:
    """The verdict table of ``loadlab slo``: one row per objective, then the outcome."""
    pct = f"{verdict.confidence * 100:g} %"
    rows = []
    for r in verdict.rows:
        has_ci = r.ci_low is not None or r.ci_high is not None or r.status == "inconclusive"
        status = r.status if r.status == "pass" else r.status.upper()
        if r.extra_requests is not None:
            status += f" (~{r.extra_requests:,} more requests)"
        margin = r.margin
        rows.append(
            [
                r.objective.name,
                f"{r.objective.op} {r.objective.threshold:g}",
                fmt_num(r.measured, 2),
                fmt_num(margin if margin is None else round(margin, 6), 2),
                _ci_text(r.ci_low, r.ci_high, has_ci),
                fmt_num(r.n),
                status,
            ]
        )
    out = []
    title = f"SLO {verdict.name!r}" if verdict.name else "SLO"
    policy = f"inconclusive counts as {verdict.inconclusive_policy}"
    out.append(f"{title}: {pct} intervals, {policy}")
    if rows:
        out.append(
            render_table(
                ["objective", "threshold", "measured", "margin", f"{pct} CI", "n", "status"],
                rows,
                align="llrrrrl",
            )
        )
    notes = [f"  {r.objective.name}: {r.note}" for r in verdict.rows if r.note]
    if notes:
        out.append("notes:\n" + "\n".join(notes))
    for reason in verdict.invalid_reasons:
        out.append(f"NOT VALID EVIDENCE: {reason}")
    out.append(f"verdict: {verdict.outcome} (exit {verdict.exit_code})")
    return "\n\n".join(out) + "\n"
