"""The lab report: the modes side by side, each number under the claim of the lesson it supports.

``class_stats`` turns one results file into the numbers of one request class (pure, tested on
hand-made records); ``lab_summary`` gathers them for every mode and experiment into plain data
(``lab.json``); ``loadlab._lab.render`` lays that out as tables for Markdown and HTML.

Example::

    summary = lab_summary(outcome, settings)
    Path("lab.md").write_text(render_markdown(summary))
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._analysis import metrics
from loadlab._lab import stalls
from loadlab._lab.batchjob import batch_job_summary
from loadlab._lab.claims import CLAIMS, judge_claims
from loadlab._lab.figures import aggregate, dig, figure, ratio
from loadlab._lab.machine import busy_reasons, step_jitter

if TYPE_CHECKING:
    from loadlab._lab.experiments import LabOutcome
    from loadlab._lab.settings import LabSettings
    from loadlab.results import Results

__all__ = [
    "CLAIMS",
    "batch_stats",
    "batching_summary",
    "class_stats",
    "dig",
    "interference_stats",
    "kv_transfer_stats",
    "lab_summary",
    "measurement",
    "ratio",
    "round_row",
    "server_counter",
    "tokens_per_s",
]


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
    # With prefix caching on the prefill side, part of what moved was cached there, not computed.
    cached_b = server_counter(results, r"kv_transfer_cached_bytes_total$")
    return {
        "bytes_total": total_b if total_b is not None else (sum(per_b) if per_b else None),
        "cached_bytes_total": cached_b,
        "seconds_total": total_s if total_s is not None else (sum(per_s) if per_s else None),
        "per_request_ms_mean": mean_ms,
        "per_request_ms_p99": metrics.percentile(per_s, 99) * 1e3 if per_s else None,  # type: ignore[operator]
        "bytes_per_prompt_token": (total_b / prompt_tokens) if total_b and prompt_tokens else None,
    }


def batch_stats(results: Results) -> dict[str, Any]:
    """The batch job's numbers: job time, output tokens (and per second), mean decode batch
    over the whole job, and useful decode rows per step while documents waited for a slot."""
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
        # the same while documents waited: the job's drain (nothing left to admit) left out
        "useful_rows_waiting": ratio(
            server_counter(results, r"decode_tokens_while_waiting_total$"),
            server_counter(results, r"steps_while_waiting_total$"),
        ),
        "job_s": job_s,
        "requests_per_s": len([r for r in recs if r.ok]) / job_s if job_s else None,
        "output_tokens": out,
        "output_tokens_per_s": out / job_s if job_s else None,
        "failed": sum(1 for r in results.records if r.failed),
    }


def interference_stats(
    inter: Results, base: Results | None, k: float = 3.0
) -> dict[str, float | int | None]:
    """The streams' stalls while long prompts are prefilled (``loadlab._lab.stalls``):
    longest stall per stream in flight, and the share of their time in gaps over k x the
    baseline's median gap; the baseline's longest stall per stream beside them (ms)."""
    chat = metrics.latency_records(
        (r for r in inter.records if r.request_class == "chat"), inter.measurement_window_ns()
    )
    windows = stalls.prefill_windows_ns(inter.records)
    hit = stalls.in_flight(chat, windows)
    base_chat = (
        metrics.latency_records(
            (r for r in base.records if r.request_class == "chat"), base.measurement_window_ns()
        )
        if base is not None
        else []
    )
    typical = [g for r in base_chat for g in metrics.itl_ms(r)] or [
        g for r in chat if r not in hit for g in metrics.itl_ms(r)
    ]
    gap_ms = float(np.median(typical)) if typical else None
    return {
        "longest_stall_ms": stalls.longest_stall_ms(hit),
        "streams_in_flight": len(hit),
        "stall_share": stalls.stall_share(hit, windows, k * gap_ms) if gap_ms else None,
        "baseline_longest_stall_ms": stalls.longest_stall_ms(base_chat),
        "baseline_gap_ms": gap_ms,
    }


def measurement(results: Results, cpus: int) -> dict[str, Any]:
    """What the machine did during one experiment, and the reasons it was busy (if any)."""
    lab = results.extra.get("lab", {})
    load = dict(lab.get("machine") or {})
    jitter = None
    if lab.get("experiment") in ("interference", "baseline"):  # a steady batch of streams
        jitter = step_jitter(lab.get("server_deltas", {}))["ratio"]
    return {
        "round": lab.get("round"),
        "mode": lab.get("mode"),
        "experiment": lab.get("experiment"),
        **load,
        "step_jitter": jitter,
        "busy": busy_reasons(load, cpus, jitter) if load else [],
    }


def round_row(
    runs: Mapping[str, Results], s: LabSettings, cpus: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One round of one mode: every section's numbers, and each experiment's measurement."""
    objectives = {"ttft_ms": s.slo_ttft_ms, "max_gap_ms": s.slo_stall_ms}
    inter, base, batch = (runs.get(e) for e in ("interference", "baseline", "batch"))
    row: dict[str, Any] = {}
    if inter is not None:
        row["chat"] = class_stats(inter, "chat", objectives, s.stall_k)
        row["long"] = class_stats(inter, "long_prompt", None, s.stall_k)
        row["kv"] = kv_transfer_stats(inter)
        row["server"] = {"preemptions": server_counter(inter, r"preemptions_total$")}
        row["stalls"] = interference_stats(inter, base, s.stall_k)
    if base is not None:
        row["baseline"] = class_stats(base, "chat", objectives, s.stall_k)
    if batch is not None:
        row["batch"] = batch_stats(batch)
    loads = [measurement(r, cpus) for r in (batch, inter, base) if r is not None]
    row["busy"] = {m["experiment"]: m["busy"] for m in loads if m["busy"]}
    return row, loads


def lab_summary(outcome: LabOutcome, s: LabSettings) -> dict[str, Any]:
    """Everything the report shows, as plain data (``lab.json``)."""
    cpus = int(outcome.machine.get("cpus") or os.cpu_count() or 1)
    modes: dict[str, Any] = {}
    per_round: dict[str, list[dict[str, Any]]] = {}
    loads: list[dict[str, Any]] = []
    for mode, runs in outcome.results.items():
        n = max((len(v) for v in runs.values()), default=0)
        rows = []
        for i in range(n):
            row, row_loads = round_row({e: v[i] for e, v in runs.items() if i < len(v)}, s, cpus)
            rows.append(row)
            loads += row_loads
        per_round[mode] = rows
        modes[mode] = aggregate(rows)
        last = runs.get("interference") or runs.get("batch") or []
        modes[mode]["server_info"] = (
            last[-1].extra.get("lab", {}).get("server_info", {}) if last else {}
        )
        # torch threads of a one-engine server (None: torch's default; disaggregated: per worker)
        modes[mode]["threads"] = s.threads if mode != "disaggregated" else None
    batching = batching_summary(outcome.batching, cpus)
    summary: dict[str, Any] = {
        "settings": s.to_dict(),
        "modes": modes,
        "per_round": per_round,
        "measurements": sorted(loads, key=lambda m: m["round"] or 0),
        "unavailable": dict(outcome.unavailable),
        "batching": batching,
        "batch_job": batch_job_summary(s, per_round, batching),
        "elapsed_s": outcome.elapsed_s,
        "machine": dict(outcome.machine),
        "files": {
            m: {e: [str(p) for p in ps] for e, ps in d.items()} for m, d in outcome.paths.items()
        },
    }
    summary["claims"] = judge_claims(summary)
    return summary


def tokens_per_s(round_: Mapping[str, Any], prefill_prompt: int) -> dict[str, dict[int, float]]:
    """One round's step times as tokens/s: decode ``b / step``, prefill ``b * prompt / step``.

    >>> tokens_per_s({"decode_step_s": {"1": 0.05, "4": 0.1}, "prefill_step_s": {"2": 0.5}}, 100)
    {'decode': {1: 20.0, 4: 40.0}, 'prefill': {2: 400.0}}
    """
    dec = {int(b): int(b) / t for b, t in round_["decode_step_s"].items() if t > 0}
    pre = {
        int(b): int(b) * prefill_prompt / t for b, t in round_["prefill_step_s"].items() if t > 0
    }
    return {"decode": dict(sorted(dec.items())), "prefill": dict(sorted(pre.items()))}


def batching_summary(data: Mapping[str, Any], cpus: int) -> dict[str, Any]:
    """The batching rounds as figures: tokens/s, x batch 1 (per round) and step time per size."""
    if not data or "error" in data or not data.get("rounds"):
        return dict(data) if data else {}
    rounds = data["rounds"]
    busy = [i + 1 for i, r in enumerate(rounds) if busy_reasons(r.get("machine", {}), cpus)]
    per = [tokens_per_s(r, int(data["prefill_prompt"])) for r in rounds]
    out: dict[str, Any] = {k: data[k] for k in data if k != "rounds"}
    out["busy"] = {
        i + 1: busy_reasons(r.get("machine", {}), cpus)
        for i, r in enumerate(rounds)
        if i + 1 in busy
    }
    for phase in ("decode", "prefill"):
        sizes = sorted({b for p in per for b in p[phase]})
        out[phase] = {
            str(b): {
                "tokens_per_s": figure([p[phase].get(b) for p in per], busy),
                "speedup": figure(
                    [ratio(p[phase].get(b), p[phase].get(sizes[0])) for p in per], busy
                ),
                "step_ms": figure(
                    [
                        1e3 * r[f"{phase}_step_s"][str(b)]
                        for r in rounds
                        if str(b) in r[f"{phase}_step_s"]
                    ],
                    busy,
                ),
                "read_gb_per_s": figure(
                    [ratio(nbytes / 1e9, r[f"{phase}_step_s"].get(str(b))) for r in rounds], busy
                )
                if (nbytes := dig(data, "step_bytes", phase, str(b))) is not None
                else None,
            }
            for b in sizes
        }
    return out
