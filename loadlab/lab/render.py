"""The lab report's layout: titled tables (``sections``), printed as Markdown or HTML.

Each ``Section`` names the claim of the lesson its numbers support. ``render_markdown`` and
``render_html`` (jinja2, autoescape on, the HTML report's stricter escaping) print the same
sections, so the two reports never disagree.

Example::

    Path("lab.md").write_text(render_markdown(lab_summary(outcome, settings)))
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from loadlab.lab.summary import CLAIMS, dig, ratio
from loadlab.report.text import fmt_num

__all__ = ["Section", "render_html", "render_markdown", "sections"]

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
                    _n(dig(m, n, "batch", "job_s"), 2),
                    _n(dig(m, n, "batch", "output_tokens")),
                    _n(dig(m, n, "batch", "output_tokens_per_s")),
                    _n(dig(m, n, "batch", "mean_decode_batch"), 2),
                    _n(dig(m, n, "batch", "preemptions")),
                    _n(dig(m, n, "batch", "failed")),
                ]
                for n in names
            ],
            "The same documents (answers of different lengths, submitted at once) in every mode. "
            "Mean decode batch (server counters) = decode tokens / steps that decoded: static "
            "batching's finished slots do no useful work until the batch's longest answer ends "
            "(the server computes them as padding rows, not counted here).",
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
                        _n(dig(m, n, "chat", k))
                        for k in (
                            "itl_ms_p50",
                            "itl_ms_p99",
                            "stall_ms_p50",
                            "stall_ms_p99",
                            "stall_ms_max",
                        )
                    ),
                    _n(dig(m, n, "chat", "stalls_per_stream"), 2),
                    _n(dig(m, n, "chat", "ttft_ms_p50")),
                    _n(dig(m, n, "chat", "ttft_ms_p99")),
                    _n(dig(m, n, "chat", "output_tokens_per_s")),
                    _n(dig(m, n, "chat", "goodput_rps"), 3),
                    _n(dig(m, n, "preemptions")),
                    _n(dig(m, n, "chat", "failed")),
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
                    _n(dig(m, n, "baseline", "itl_ms_p50")),
                    _n(dig(m, n, "baseline", "itl_ms_p99")),
                    _n(dig(m, n, "baseline", "stall_ms_max")),
                    _x(ratio(dig(m, n, "chat", "itl_ms_p99"), dig(m, n, "baseline", "itl_ms_p99"))),
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
                    _n(dig(m, n, "long", "requests")),
                    _n(dig(m, n, "long", "ttft_ms_p50")),
                    _n(dig(m, n, "long", "ttft_ms_max")),
                    _n(dig(m, n, "long", "failed")),
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
    tp_d = dig(d, "batch", "output_tokens_per_s")
    tp_c = dig(m, "continuous", "batch", "output_tokens_per_s")
    bw = ratio(kv.get("bytes_total"), kv.get("seconds_total"))
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
        ["chat TTFT p50 (ms), for scale", _n(dig(d, "chat", "ttft_ms_p50"))],
        [
            "batch job output tok/s: disaggregated / continuous (one combined server)",
            f"{_n(tp_d)} / {_n(tp_c)} = {_x(ratio(tp_d, tp_c))}",
        ],
        _per_thread_row(d, tp_d, tp_c, m.get("continuous", {}).get("threads")),
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
    mach = summary.get("machine") or {}
    if mach:
        lines += [
            "",
            f"Machine: {mach.get('cpus')} CPUs; load average (1, 5, 15 min) "
            f"{mach.get('load_avg_start')} at the start, {mach.get('load_avg_end')} at the end "
            "(other work on the machine slows and scatters every figure).",
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


def render_html(summary: Mapping[str, Any]) -> str:
    """The same sections as one self-contained HTML page (the HTML report's escaping)."""
    from loadlab.report.html import render_template  # plots: matplotlib, only for this page

    return render_template(
        "lab.html.j2",
        settings=summary["settings"],
        elapsed=f"{summary.get('elapsed_s', 0):.0f}",
        machine=", ".join(f"{k} {v}" for k, v in (summary.get("machine") or {}).items()),
        sections=sections(summary),
    )


def _per_thread_row(d: Mapping[str, Any], tp_d: Any, tp_c: Any, threads_c: Any) -> list[str]:
    """Tokens/s per torch thread: what each pool's share of the hardware delivers."""
    workers = d.get("server_info", {}).get("workers") or []
    threads_d = sum(int(w.get("threads") or 0) for w in workers if isinstance(w, Mapping))
    per_d = ratio(tp_d, threads_d or None)
    per_c = ratio(tp_c, threads_c)
    return [
        "batch job output tok/s per torch thread: disaggregated / combined",
        f"{_n(per_d)} ({threads_d or '?'} threads) / {_n(per_c)} ({threads_c or '?'} threads)",
    ]
