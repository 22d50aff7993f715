"""The lab report: the modes side by side, each number under the claim of the lesson it supports.

``class_stats`` turns one results file into the numbers of one request class (pure, tested on
hand-made records); ``lab_summary`` gathers them for every mode and experiment into plain data
(``lab.json``); ``sections`` lays that out as titled tables, which ``render_markdown`` and
``render_html`` (jinja2, autoescape on, the HTML report's escaping) print the same way.

Example::

    summary = lab_summary(outcome, settings)
    Path("lab.md").write_text(render_markdown(summary))
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab import metrics
from loadlab.report.text import fmt_num

if TYPE_CHECKING:
    from loadlab.lab import LabOutcome
    from loadlab.lab_settings import LabSettings
    from loadlab.results import Results

__all__ = [
    "CLAIMS",
    "Section",
    "acceptance",
    "class_stats",
    "lab_summary",
    "render_html",
    "render_markdown",
    "sections",
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


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


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
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p99": _pct(ttft, 99),
        "ttft_ms_max": max(ttft) if ttft else None,
        "itl_ms_p50": _pct(itl, 50),
        "itl_ms_p99": _pct(itl, 99),
        "stall_ms_p50": _pct(gaps, 50),
        "stall_ms_p99": _pct(gaps, 99),
        "stall_ms_max": max(gaps) if gaps else None,
        "stalls_per_stream": (sum(metrics.stall_count(r, k) for r in lat) / len(lat))
        if lat
        else None,
        "output_tokens_per_s": tp["output_tokens_per_s"],
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


def _kv(results: Results) -> dict[str, Any]:
    recs = [r for r in results.records if r.ok]
    per_s = [float(r.server["kv_transfer_s"]) for r in recs if "kv_transfer_s" in r.server]
    per_b = [float(r.server["kv_transfer_bytes"]) for r in recs if "kv_transfer_bytes" in r.server]
    total_b = server_counter(results, r"kv_transfer_bytes_total$")
    total_s = server_counter(results, r"kv_transfer_seconds_total$")
    prompt_tokens = sum(r.prompt_tokens or r.prompt_tokens_requested or 0 for r in recs)
    return {
        "bytes_total": total_b if total_b is not None else (sum(per_b) if per_b else None),
        "seconds_total": total_s if total_s is not None else (sum(per_s) if per_s else None),
        "per_request_ms_mean": float(np.mean(per_s)) * 1e3 if per_s else None,
        "per_request_ms_p99": _pct(per_s, 99) * 1e3 if per_s else None,  # type: ignore[operator]
        "bytes_per_prompt_token": (total_b / prompt_tokens) if total_b and prompt_tokens else None,
    }


def _batch_stats(results: Results) -> dict[str, Any]:
    recs = [r for r in results.records if r.sent_ns is not None]
    ends = [r.chunk_ns[-1] for r in results.records if r.chunk_ns]
    job_s = (max(ends) - min(r.sent_ns or 0 for r in recs)) / 1e9 if ends and recs else None
    out = sum(metrics.output_token_count(r) for r in results.records if r.ok)
    # mean decode batch (reference server counters): tokens made by decode steps per step that
    # decoded; static batching's idle finished slots show as a smaller batch
    decoded = server_counter(results, r"tokens_total$", 'phase="decode"')
    steps = server_counter(results, r"steps_total$", 'phase="(decode|mixed)"')
    return {
        "mean_decode_batch": _ratio(decoded, steps),
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
            row["kv"] = _kv(r)
            row["server_info"] = r.extra.get("lab", {}).get("server_info", {})
        if "baseline" in runs:
            row["baseline"] = class_stats(runs["baseline"], "chat", objectives, s.stall_k)
        if "batch" in runs:
            row["batch"] = _batch_stats(runs["batch"])
            row["batch"]["preemptions"] = server_counter(runs["batch"], r"preemptions_total$")
            row["batch"]["kv"] = _kv(runs["batch"])
        modes[mode] = row
    summary = {
        "settings": s.to_dict(),
        "modes": modes,
        "unavailable": dict(outcome.unavailable),
        "batching": outcome.batching,
        "elapsed_s": outcome.elapsed_s,
        "files": {m: {e: str(p) for e, p in d.items()} for m, d in outcome.paths.items()},
    }
    summary["acceptance"] = acceptance(summary)
    return summary


def _get(d: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return None
        d = d[k]
    return d


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def acceptance(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Issue 7's interference checks: (what, measured ratio or value, limit, met)."""
    m = summary["modes"]
    out = []
    r = _ratio(
        _get(m, "chunked", "chat", "itl_ms_p99"), _get(m, "continuous", "chat", "itl_ms_p99")
    )
    out.append(
        {
            "check": "p99 ITL of the streams, chunked / continuous (long prompts arriving)",
            "value": r,
            "limit": "<= 0.333",
            "met": None if r is None else r <= 1 / 3,
        }
    )
    r = _ratio(
        _get(m, "disaggregated", "chat", "itl_ms_p99"),
        _get(m, "disaggregated", "baseline", "itl_ms_p99"),
    )
    out.append(
        {
            "check": "p99 ITL, disaggregated with long prompts / without (baseline)",
            "value": r,
            "limit": "<= 1.5",
            "met": None if r is None else r <= 1.5,
        }
    )
    t = _get(m, "chunked", "long", "ttft_ms_p50")
    out.append(
        {
            "check": "the long prompt's own TTFT in chunked mode (ms, p50)",
            "value": t,
            "limit": "reported",
            "met": None,
        }
    )
    return out


# ---------------------------------------------------------------- layout


class Section:
    """A titled table: ``claim`` is the lesson's claim the numbers support."""

    def __init__(
        self, title: str, claim: str, header: list[str], rows: list[list[str]], note: str = ""
    ) -> None:
        self.title, self.claim, self.header, self.rows, self.note = title, claim, header, rows, note


def _n(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits)


def _x(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}x"


def sections(summary: Mapping[str, Any]) -> list[Section]:
    """The report's tables in order (the same for Markdown and HTML)."""
    m = summary["modes"]
    names = list(m)
    out = [_batching_section(summary.get("batching", {}))]
    out.append(
        Section(
            "Static against continuous batching: a batch job",
            CLAIMS["static"],
            [
                "mode",
                "job time (s)",
                "output tokens",
                "output tok/s",
                "mean decode batch",
                "preemptions",
                "failed",
            ],
            [
                [
                    n,
                    _n(_get(m, n, "batch", "job_s"), 2),
                    _n(_get(m, n, "batch", "output_tokens")),
                    _n(_get(m, n, "batch", "output_tokens_per_s")),
                    _n(_get(m, n, "batch", "mean_decode_batch"), 2),
                    _n(_get(m, n, "batch", "preemptions")),
                    _n(_get(m, n, "batch", "failed")),
                ]
                for n in names
            ],
            "The same documents (answers of different lengths, submitted at once) in every mode. "
            "Mean decode batch (server counters) = decode tokens / steps that decoded: static "
            "batching's finished slots idle until the batch's longest answer ends.",
        )
    )
    out.append(
        Section(
            "Interference: the steady chat streams while long prompts arrive",
            f"{CLAIMS['stall']}; {CLAIMS['chunked']}; {CLAIMS['disagg']}",
            [
                "mode",
                "ITL p50",
                "ITL p99",
                "longest stall p50",
                "p99",
                "max",
                "stalls/stream",
                "chat TTFT p50",
                "p99",
                "output tok/s",
                "goodput (req/s)",
                "preemptions",
                "failed",
            ],
            [
                [
                    n,
                    *(
                        _n(_get(m, n, "chat", k))
                        for k in (
                            "itl_ms_p50",
                            "itl_ms_p99",
                            "stall_ms_p50",
                            "stall_ms_p99",
                            "stall_ms_max",
                        )
                    ),
                    _n(_get(m, n, "chat", "stalls_per_stream"), 2),
                    _n(_get(m, n, "chat", "ttft_ms_p50")),
                    _n(_get(m, n, "chat", "ttft_ms_p99")),
                    _n(_get(m, n, "chat", "output_tokens_per_s")),
                    _n(_get(m, n, "chat", "goodput_rps"), 3),
                    _n(_get(m, n, "preemptions")),
                    _n(_get(m, n, "chat", "failed")),
                ]
                for n in names
            ],
            "Times in ms. ITL and stalls are the chat streams' (request_class chat); a stall is a "
            "stream's longest gap; stalls/stream counts gaps over k x the stream's median gap.",
        )
    )
    out.append(
        Section(
            "Baseline: the same streams, no long prompts",
            CLAIMS["stall"],
            ["mode", "ITL p50", "ITL p99", "longest stall max", "p99 ITL with long / without"],
            [
                [
                    n,
                    _n(_get(m, n, "baseline", "itl_ms_p50")),
                    _n(_get(m, n, "baseline", "itl_ms_p99")),
                    _n(_get(m, n, "baseline", "stall_ms_max")),
                    _x(
                        _ratio(
                            _get(m, n, "chat", "itl_ms_p99"), _get(m, n, "baseline", "itl_ms_p99")
                        )
                    ),
                ]
                for n in names
            ],
        )
    )
    out.append(
        Section(
            "The long prompt's own TTFT",
            CLAIMS["chunk_cost"],
            ["mode", "long prompts", "TTFT p50 (ms)", "TTFT max (ms)", "failed"],
            [
                [
                    n,
                    _n(_get(m, n, "long", "requests")),
                    _n(_get(m, n, "long", "ttft_ms_p50")),
                    _n(_get(m, n, "long", "ttft_ms_max")),
                    _n(_get(m, n, "long", "failed")),
                ]
                for n in names
            ],
        )
    )
    out.append(_disagg_section(m))
    acc = summary.get("acceptance", [])
    out.append(
        Section(
            "Acceptance (issue 7)",
            f"{CLAIMS['chunked']}; {CLAIMS['disagg']}",
            ["check", "measured", "limit", "met"],
            [
                [
                    a["check"],
                    _n(a["value"], 3),
                    a["limit"],
                    "-" if a["met"] is None else ("yes" if a["met"] else "NO"),
                ]
                for a in acc
            ],
        )
    )
    if summary.get("unavailable"):
        out.append(
            Section(
                "Modes not run",
                "",
                ["mode", "why"],
                [[k, v] for k, v in summary["unavailable"].items()],
            )
        )
    return out


def _batching_section(b: Mapping[str, Any]) -> Section:
    if not b or "error" in b:
        why = b.get("error", "not run") if b else "not run"
        return Section(
            "Batching: decode and prefill against batch size",
            f"{CLAIMS['decode']}; {CLAIMS['prefill']}",
            ["result"],
            [[why]],
        )
    rows = []
    for b_, v in b["decode_tokens_per_s"].items():
        rows.append(["decode", b_, _n(v), _x(b["decode_speedup"][b_])])
    for b_, v in b["prefill_tokens_per_s"].items():
        rows.append(["prefill", b_, _n(v), _x(b["prefill_speedup"][b_])])
    note = (
        f"{b['preset']} on {b['device']} ({b['dtype']}, {b['torch_threads']} torch threads); "
        f"decode: {b['decode_context']} tokens of context per sequence; prefill: "
        f"{b['prefill_prompt']}-token prompts, whole in one step."
    )
    return Section(
        "Batching: decode and prefill against batch size",
        f"{CLAIMS['decode']}; {CLAIMS['prefill']}",
        ["phase", "batch", "tokens/s", "x batch 1"],
        rows,
        note,
    )


def _disagg_section(m: Mapping[str, Any]) -> Section:
    d = m.get("disaggregated")
    title = "What disaggregation costs"
    if not d:
        return Section(title, CLAIMS["disagg_cost"], ["result"], [["disaggregated mode not run"]])
    kv = d.get("kv", {})
    split = {
        k: v
        for k, v in d.get("server_info", {}).items()
        if re.search(r"prefill|decode|thread|worker|affinity|cpu|device", k)
    }
    tp_d = _get(d, "batch", "output_tokens_per_s")
    tp_c = _get(m, "continuous", "batch", "output_tokens_per_s")
    bw = _ratio(kv.get("bytes_total"), kv.get("seconds_total"))
    rows = [
        ["KV transferred (bytes, interference run)", _n(kv.get("bytes_total"), 0)],
        ["KV bytes per prompt token", _n(kv.get("bytes_per_prompt_token"), 0)],
        [
            "KV bytes per token (server_info)",
            _n(d.get("server_info", {}).get("kv_bytes_per_token")),
        ],
        ["transfer time (s, total)", _n(kv.get("seconds_total"), 3)],
        ["transfer bandwidth (MB/s)", _n(bw / 1e6 if bw else None)],
        [
            "transfer added to each TTFT (ms, mean / p99)",
            f"{_n(kv.get('per_request_ms_mean'))} / {_n(kv.get('per_request_ms_p99'))}",
        ],
        ["chat TTFT p50 (ms), for scale", _n(_get(d, "chat", "ttft_ms_p50"))],
        [
            "batch job output tok/s: disaggregated / continuous (one combined server)",
            f"{_n(tp_d)} / {_n(tp_c)} = {_x(_ratio(tp_d, tp_c))}",
        ],
        ["how the hardware was split", ", ".join(f"{k}={v}" for k, v in split.items()) or "-"],
    ]
    return Section(title, CLAIMS["disagg_cost"], ["quantity", "value"], rows)


# ---------------------------------------------------------------- rendering


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(summary: Mapping[str, Any]) -> str:
    """The report as Markdown: one table per section, each under the claim it supports."""
    s = summary["settings"]
    lines = [
        "# loadlab lab: the reference server's modes side by side",
        "",
        f"Preset `{s['preset']}`; {s['streams']} chat streams ({s['chat_prompt_tokens']}-token "
        f"prompts, {s['chat_output_tokens']}-token answers); a {s['long_prompt_tokens']}-token "
        f"prompt every {s['long_every_s']:g} s from {s['long_first_s']:g} s for "
        f"{s['duration_s']:g} s; baseline {s['baseline_s']:g} s; batch job of "
        f"{s['batch_documents']} documents; chunked: chunk {s['chunk_size']}, budget "
        f"{s['max_batched_tokens']} tokens/step; goodput objectives TTFT <= "
        f"{s['slo_ttft_ms']:g} ms and longest stall <= {s['slo_stall_ms']:g} ms. "
        f"Lab time {summary.get('elapsed_s', 0):.0f} s.",
    ]
    for sec in sections(summary):
        lines += ["", f"## {sec.title}", ""]
        if sec.claim:
            lines += [f"*Supports: {sec.claim}.*", ""]
        lines.append("| " + " | ".join(_md_cell(h) for h in sec.header) + " |")
        lines.append("|" + "|".join(" --- " for _ in sec.header) + "|")
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in sec.rows]
        if sec.note:
            lines += ["", sec.note]
    return "\n".join(lines) + "\n"


_TEMPLATE = """{% extends "base.html.j2" %}
{% block title %}loadlab lab{% endblock %}
{% block body %}
<h1>loadlab lab: the reference server's modes side by side</h1>
<p class="sub">preset {{ settings.preset }} · lab time {{ elapsed }} s</p>
{% for sec in sections %}
<h2>{{ sec.title }}</h2>
{% if sec.claim %}<p class="note">Supports: {{ sec.claim }}.</p>{% endif %}
<table>
  <tr>{% for h in sec.header %}<th>{{ h }}</th>{% endfor %}</tr>
  {% for row in sec.rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
{% if sec.note %}<p class="note">{{ sec.note }}</p>{% endif %}
{% endfor %}
{% endblock %}
"""


def render_html(summary: Mapping[str, Any]) -> str:
    """The same sections as one self-contained HTML page (the HTML report's escaping)."""
    from loadlab.report.html import _env, _globals

    env = _env()
    template = env.from_string(_TEMPLATE)
    return template.render(
        settings=summary["settings"],
        elapsed=f"{summary.get('elapsed_s', 0):.0f}",
        sections=sections(summary),
        **_globals(),
    )
