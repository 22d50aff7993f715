"""The lab report: the modes side by side, each number under the claim of the lesson it supports.

``class_stats`` turns one results file into the numbers of one request class (pure, tested on
hand-made records); ``lab_summary`` gathers them for every mode and experiment into plain data
(``lab.json``); ``loadlab.lab.render`` lays that out as tables for Markdown and HTML.

Example::

    summary = lab_summary(outcome, settings)
    Path("lab.md").write_text(render_markdown(summary))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab import metrics

if TYPE_CHECKING:
    from loadlab.lab.experiments import LabOutcome
    from loadlab.lab.settings import LabSettings
    from loadlab.results import Results

__all__ = [
    "CLAIMS",
    "acceptance",
    "batch_stats",
    "class_stats",
    "dig",
    "kv_transfer_stats",
    "lab_summary",
    "ratio",
    "server_counter",
]

# The lesson's claims (../shared/seed/), each number in the report names one of them.
CLAIMS = {
    "decode": "decode is memory-bandwidth-bound → batching multiplies decode throughput",
    "prefill": "prefill is compute-bound → batching barely helps prefill",
    "static": "static batching wastes finished slots; continuous batching refills them every step",
    "stall": "a long prompt stalls everyone's stream unless chunked or disaggregated",
    "chunked": "chunked prefill: everyone slows a little instead of stopping",
    "chunk_cost": "chunking costs the long prompt itself some TTFT",
    "disagg": "disaggregation: a long prompt cannot interfere with anyone's decode",
    "disagg_cost": "disaggregation's cost: the KV cache must be transferred before decode",
}


def class_stats(
    results: Results,
    request_class: str | None = None,
    objectives: Mapping[str, float] | None = None,
    k: float = 3.0,
) -> dict[str, Any]:
    """The numbers of one request class (``None``: all) inside the measurement window (ms).

    ``stall_*`` are over streams: each ok stream's longest gap (``metrics.max_gap_ms``);
    ``stalls_per_stream`` is the mean count of gaps over ``k`` x that stream's median gap.
    ``goodput_rps`` counts requests that met every objective (all classes' tokens count for
    tokens/s: the server's output). Failed requests are counted, never in a percentile.
    """
    window = results.measurement_window_ns()
    recs = [r for r in results.records if request_class in (None, r.request_class)]
    lat = metrics.latency_records(recs, window)
    ttft = [v for v in map(metrics.ttft_ms, lat) if v is not None]
    itl = [g for r in lat for g in metrics.itl_ms(r)]
    gaps = [v for v in map(metrics.max_gap_ms, lat) if v is not None]
    tp = metrics.throughput(results.records, window)
    # goodput over the span the requests took (from the window's start to the last one's
    # end): requests sent near the end complete after the window and are still judged
    good_n = len(metrics.good_requests(lat, objectives)) if objectives else None
    ends = [r.chunk_ns[-1] for r in lat if r.chunk_ns]
    span_s = max(((max(ends) if ends else window[1]) - window[0]) / 1e9, 1e-9)
    return {
        "requests": len(lat),
        "failed": sum(1 for r in recs if r.failed),
        "ttft_ms_p50": metrics.percentile(ttft, 50),
        "ttft_ms_p99": metrics.percentile(ttft, 99),
        "ttft_ms_max": max(ttft) if ttft else None,
        "itl_ms_p50": metrics.percentile(itl, 50),
        "itl_ms_p99": metrics.percentile(itl, 99),
        "stall_ms_p50": metrics.percentile(gaps, 50),
        "stall_ms_p99": metrics.percentile(gaps, 99),
        "stall_ms_max": max(gaps) if gaps else None,
        "stalls_per_stream": (sum(metrics.stall_count(r, k) for r in lat) / len(lat))
        if lat
        else None,
        "output_tokens_per_s": tp.output_tokens_per_s,
        "requests_per_s": len(lat) / span_s,
        "good_requests": good_n,
        "goodput_rps": None if good_n is None else good_n / span_s,
    }


def server_counter(results: Results, pattern: str, labels: str = "") -> float | None:
    """Sum of the server counter deltas over the experiment whose name matches ``pattern``
    (and whose labels match ``labels``, a regular expression)."""
    deltas = results.extra.get("lab", {}).get("server_deltas", {})
    rx, lx = re.compile(pattern), re.compile(labels)
    hits = [
        v
        for key, v in deltas.items()
        if rx.search(key.split("{", 1)[0]) and lx.search(key.partition("{")[2])
    ]
    return sum(hits) if hits else None


def kv_transfer_stats(results: Results) -> dict[str, Any]:
    """The KV cache transfers of an experiment (disaggregated mode): bytes, seconds, per request.

    From the server's counters where it has them, else from the records' ``server`` fields.
    """
    recs = [r for r in results.records if r.ok]
    per_s = [float(r.server["kv_transfer_s"]) for r in recs if "kv_transfer_s" in r.server]
    per_b = [float(r.server["kv_transfer_bytes"]) for r in recs if "kv_transfer_bytes" in r.server]
    total_b = server_counter(results, r"kv_transfer_bytes_total$")
    total_s = server_counter(results, r"kv_transfer_seconds_total$")
    prompt_tokens = sum(r.prompt_tokens or r.prompt_tokens_requested or 0 for r in recs)
    mean_ms = float(np.mean(per_s)) * 1e3 if per_s else None
    if mean_ms is None and total_s:  # no per-request field: the counters' mean transfer
        n = server_counter(results, r"kv_transfers_total$") or len(recs)
        mean_ms = total_s / n * 1e3 if n else None
    return {
        "bytes_total": total_b if total_b is not None else (sum(per_b) if per_b else None),
        "seconds_total": total_s if total_s is not None else (sum(per_s) if per_s else None),
        "per_request_ms_mean": mean_ms,
        "per_request_ms_p99": metrics.percentile(per_s, 99) * 1e3 if per_s else None,  # type: ignore[operator]
        "bytes_per_prompt_token": (total_b / prompt_tokens) if total_b and prompt_tokens else None,
    }


def batch_stats(results: Results) -> dict[str, Any]:
    """The batch job's numbers: job time, output tokens (and per second), mean decode batch."""
    recs = [r for r in results.records if r.sent_ns is not None]
    ends = [r.chunk_ns[-1] for r in results.records if r.chunk_ns]
    job_s = (max(ends) - min(r.sent_ns or 0 for r in recs)) / 1e9 if ends and recs else None
    out = sum(metrics.output_token_count(r) for r in results.records if r.ok)
    # mean decode batch (reference server counters): tokens made by decode steps per step that
    # decoded; static batching's idle finished slots show as a smaller batch
    decoded = server_counter(results, r"tokens_total$", 'phase="decode"')
    steps = server_counter(results, r"steps_total$", 'phase="(decode|mixed)"')
    return {
        "mean_decode_batch": ratio(decoded, steps),
        "job_s": job_s,
        "output_tokens": out,
        "output_tokens_per_s": out / job_s if job_s else None,
        "failed": sum(1 for r in results.records if r.failed),
    }


def lab_summary(outcome: LabOutcome, s: LabSettings) -> dict[str, Any]:
    """Everything the report shows, as plain data (``lab.json``)."""
    objectives = {"ttft_ms": s.slo_ttft_ms, "max_gap_ms": s.slo_stall_ms}
    modes: dict[str, Any] = {}
    for mode, runs in outcome.results.items():
        row: dict[str, Any] = {}
        if "interference" in runs:
            r = runs["interference"]
            row["chat"] = class_stats(r, "chat", objectives, s.stall_k)
            row["long"] = class_stats(r, "long_prompt", None, s.stall_k)
            row["preemptions"] = server_counter(r, r"preemptions_total$")
            row["kv"] = kv_transfer_stats(r)
            row["server_info"] = r.extra.get("lab", {}).get("server_info", {})
        if "baseline" in runs:
            row["baseline"] = class_stats(runs["baseline"], "chat", objectives, s.stall_k)
        if "batch" in runs:
            row["batch"] = batch_stats(runs["batch"])
            row["batch"]["preemptions"] = server_counter(runs["batch"], r"preemptions_total$")
            row["batch"]["kv"] = kv_transfer_stats(runs["batch"])
        # torch threads of a one-engine server (None: torch's default; disaggregated: per worker)
        row["threads"] = s.threads if mode != "disaggregated" else None
        modes[mode] = row
    summary = {
        "settings": s.to_dict(),
        "modes": modes,
        "unavailable": dict(outcome.unavailable),
        "batching": outcome.batching,
        "elapsed_s": outcome.elapsed_s,
        "machine": dict(outcome.machine),
        "files": {m: {e: str(p) for e, p in d.items()} for m, d in outcome.paths.items()},
    }
    summary["acceptance"] = acceptance(summary)
    return summary


def dig(d: Mapping[str, Any], *keys: str) -> Any:
    """``d[k1][k2]...``, or ``None`` where a key is missing (a mode or experiment not run).

    >>> dig({"chunked": {"chat": {"itl_ms_p99": 12.5}}}, "chunked", "chat", "itl_ms_p99")
    12.5
    >>> dig({}, "static", "batch") is None
    True
    """
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def ratio(a: Any, b: Any) -> float | None:
    """``a / b`` when both are numbers and ``b`` is not 0, else ``None``.

    >>> ratio(3, 4), ratio(None, 4), ratio(3, 0)
    (0.75, None, None)
    """
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def acceptance(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 7's interference checks: (what, measured ratio or value, limit, met)."""
    m = summary["modes"]
    out = []
    r = ratio(dig(m, "chunked", "chat", "itl_ms_p99"), dig(m, "continuous", "chat", "itl_ms_p99"))
    out.append(
        {
            "check": "p99 ITL of the streams, chunked / continuous (long prompts arriving)",
            "value": r,
            "limit": "<= 0.333",
            "met": None if r is None else r <= 1 / 3,
        }
    )
    r = ratio(
        dig(m, "disaggregated", "chat", "itl_ms_p99"),
        dig(m, "disaggregated", "baseline", "itl_ms_p99"),
    )
    out.append(
        {
            "check": "p99 ITL, disaggregated with long prompts / without (baseline)",
            "value": r,
            "limit": "<= 1.5",
            "met": None if r is None else r <= 1.5,
        }
    )
    t = dig(m, "chunked", "long", "ttft_ms_p50")
    out.append(
        {
            "check": "the long prompt's own TTFT in chunked mode (ms, p50)",
            "value": t,
            "limit": "reported",
            "met": None,
        }
    )
    return out
