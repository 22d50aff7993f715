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

from loadlab._lab.claims import CLAIMS
from loadlab._lab.figures import dig, figure, ratio
from loadlab._lab.machine import JITTER_LIMIT, OTHERS_LIMIT_CORES, STEAL_LIMIT
from loadlab._report.text import fmt_num

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


def _f(fig: Any, digits: int = 1, x: bool = False) -> str:
    """A figure over rounds: ``median (min-max)``, and ``[busy k/n]`` when k of its n rounds
    were measured while the machine was busy (the measurements table says why)."""
    if not isinstance(fig, Mapping) or fig.get("median") is None:
        return "-"
    num = _x if x else (lambda v: _n(v, digits))
    text = num(fig["median"])
    if fig.get("n", 1) > 1 and fig["lo"] != fig["hi"]:
        text += f" ({num(fig['lo'])}-{num(fig['hi'])})"
    busy = fig.get("busy_rounds") or []
    if busy:
        text += f" [busy {len(busy)}/{len(fig.get('rounds') or [])}]"
    return text


def sections(summary: Mapping[str, Any]) -> list[Section]:
    """The report's tables in order (the same for Markdown and HTML)."""
    m = summary["modes"]
    out = [_claims_section(summary.get("claims", [])), _machine_section(summary)]
    out.append(_batching_section(summary.get("batching", {})))
    out += _batch_job_sections(summary)
    out.append(_interference_section(m))
    out.append(
        Section(
            "The long prompt's own TTFT",
            CLAIMS["chunk_cost"],
            ["mode", "long prompts per round", "TTFT p50 (ms)", "TTFT max (ms)", "failed"],
            [
                [
                    n,
                    _f(dig(m, n, "long", "requests"), 0),
                    _f(dig(m, n, "long", "ttft_ms_p50")),
                    _f(dig(m, n, "long", "ttft_ms_max")),
                    _f(dig(m, n, "long", "failed"), 0),
                ]
                for n in m
            ],
        )
    )
    out.append(_disagg_section(m))
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


def _claims_section(claims: list[Mapping[str, Any]]) -> Section:
    rows = [
        [
            c["text"],
            c["figure"],
            _n(c["median"], 2)
            + (f" ({_n(c['lo'], 2)}-{_n(c['hi'], 2)})" if c["n_rounds"] > 1 else "")
            if c["median"] is not None
            else "-",
            f"{c['direction']} {c['threshold']:.3g}",
            c["status"],
            c["reason"] or "-",
        ]
        for c in ({**c, "n_rounds": sum(v is not None for v in c["rounds"])} for c in claims)
    ]
    return Section(
        "The lesson's claims on this machine",
        "",
        [
            "claim",
            "judged by (per round)",
            "median (min-max over rounds)",
            "threshold",
            "status",
            "why",
        ],
        rows,
        "A claim is shown when every round is on its side of the threshold; otherwise it is not "
        "shown on this machine, with the reason (never a pass or a fail: a busy machine has not "
        "disproved anything). Pooled ITL percentiles are figures below, not judges: whether a "
        "stall reaches the p99 depends on how many gaps a stream has.",
    )


def _machine_section(summary: Mapping[str, Any]) -> Section:
    rows = [
        [
            str(x.get("round")),
            str(x.get("mode")),
            str(x.get("experiment")),
            _n(x.get("wall_s")),
            _n(x.get("own_cores"), 2),
            _n(x.get("others_cores"), 2),
            f"{(x.get('steal_share') or 0):.0%}",
            _n(x.get("load1_start"), 2),
            _n(x.get("step_jitter"), 2),
            "; ".join(x.get("busy") or []) or "quiet",
        ]
        for x in summary.get("measurements", [])
    ]
    placement = (summary.get("machine") or {}).get("placement") or {}
    note = "Placement (CPUs each process may run on, read back from the OS): " + (
        "; ".join(f"{k}: {v}" for k, v in placement.items()) or "not pinned"
    )
    return Section(
        "The machine during each measurement",
        "",
        ["round", "mode", "experiment", "wall (s)", "lab cores", "other processes (cores)",
         "steal", "load avg 1 min", "server decode step p90/p50", "busy?"],
        rows,
        note + ". A measurement is busy when other processes took more than "
        f"{OTHERS_LIMIT_CORES} cores (and more than the lab left free), steal passed "
        f"{STEAL_LIMIT:.0%}, or the server's decode steps of a steady batch had p90 over "
        f"{JITTER_LIMIT}x their p50; every figure measured then says [busy k/n].",
    )  # fmt: skip


def _interference_section(m: Mapping[str, Any]) -> Section:
    keys = [("stalls", "longest_stall_ms", 1), ("stalls", "baseline_longest_stall_ms", 1),
            ("stalls", "stall_share", 2), ("stalls", "streams_in_flight", 0),
            ("chat", "itl_ms_p50", 1), ("chat", "itl_ms_p99", 1), ("chat", "ttft_ms_p50", 1),
            ("chat", "output_tokens_per_s", 1), ("server", "preemptions", 0),
            ("chat", "failed", 0)]  # fmt: skip
    return Section(
        "Interference: the steady chat streams while long prompts arrive",
        f"{CLAIMS['stall']}; {CLAIMS['chunked']}; {CLAIMS['disagg']}",
        ["mode", "longest stall per stream in flight (ms)", "same, baseline (no long prompts)",
         "stall share", "streams in flight", "ITL p50 (pooled)", "ITL p99 (pooled)",
         "chat TTFT p50", "output tok/s", "preemptions", "failed"],
        [[n, *(_f(dig(m, n, sec, k), d) for sec, k, d in keys)] for n in m],
        "Times in ms; each cell the median over rounds (min-max). A stream is in flight when "
        "its tokens overlap a long prompt's prefill window (send to first token); its longest "
        "stall is its longest gap between tokens (every chat answer has the same length, so "
        "the same number of gaps). Stall share: of the in-flight streams' time inside the "
        "windows, the share spent in gaps over k x the baseline's median gap.",
    )  # fmt: skip


def _batching_section(b: Mapping[str, Any]) -> Section:
    title = "Batching: decode and prefill against batch size"
    claim = f"{CLAIMS['decode']}; {CLAIMS['prefill']}"
    if not b or "error" in b or "decode" not in b:
        why = b.get("error", "not run") if b else "not run"
        return Section(title, claim, ["result"], [[why]])
    rows = []
    for phase in ("decode", "prefill"):
        for size, v in b[phase].items():
            rows.append([phase, size, _f(v["tokens_per_s"]), _f(v["speedup"], x=True),
                         _f(v["step_ms"], 2), _f(v.get("read_gb_per_s"), 1)])  # fmt: skip
    note = (
        f"{b['preset']} on {b['device']} ({b['dtype']}, {b['torch_threads']} torch threads); "
        f"decode: {b['decode_context']} tokens of context per sequence; prefill: "
        f"{b['prefill_prompt']}-token prompts, whole in one step. Each round times every size "
        "(the fastest of its repeats), in a rotated order. Bytes read: what the step must read "
        "at least (every weight once, every attended token's K/V) over its time; a decode step "
        "far below the device's memory bandwidth is bound by something else (on a GPU, "
        "typically the host issuing its kernels: benchmarks/step_profile.py shows it), and "
        "its cost is flat in the batch for that reason."
    )
    head = ["phase", "batch", "tokens/s", "x batch 1", "step (ms)", "bytes read (GB/s)"]
    return Section(title, claim, head, rows, note)


def _batch_job_sections(summary: Mapping[str, Any]) -> list[Section]:
    m, job = summary["modes"], summary.get("batch_job") or {}
    names = [n for n in m if "batch" in m[n]]
    keys = [("job_s", 2, False), ("requests_per_s", 2, False), ("output_tokens_per_s", 1, False),
            ("mean_decode_batch", 2, False), ("useful_rows_waiting", 2, False),
            ("preemptions", 0, False), ("failed", 0, False)]  # fmt: skip
    table = Section(
        "Static against continuous batching: a batch job",
        CLAIMS["static"],
        ["mode", "job time (s)", "requests/s", "output tok/s", "mean decode batch (whole job)",
         "useful decode rows per step while documents wait", "preemptions", "failed"],
        [[n, *(_f(dig(m, n, "batch", k), d, x) for k, d, x in keys)] for n in names],
        f"{job.get('documents')} documents submitted at once, {job.get('batch_slots')} batch "
        "slots; answer lengths at evenly spaced quantiles of the Azure 2023 conversation "
        f"trace's output lengths, scaled (mean {_n(job.get('length_mean'))}, median "
        f"{_n(job.get('length_p50'))}, longest {job.get('length_max')} tokens). Static "
        "batching computes a finished member's row as padding until its batch's longest answer "
        "ends (not counted as useful). Rows while documents wait leave out the job's drain.",
    )  # fmt: skip
    rps = job.get("measured_gain")
    curve = job.get("step_curve_s") or {}
    base = curve.get("1") or (next(iter(curve.values())) if curve else None)
    why = Section(
        "Why the useful rows and the requests/s differ",
        CLAIMS["static"],
        ["quantity", "value"],
        [
            ["bound: E[max of B answer lengths] / mean (a GPU's requests/s gain)",
             _x(job.get("bound"))],
            ["useful rows per step while waiting, continuous / static: replay of the job",
             _x(job.get("replay_ratio"))],
            ["requests/s gain this machine's step-cost curve allows (replayed on it)",
             _x(job.get("curve_gain"))],
            ["requests/s gain measured (static job time / continuous)", _f(rps, x=True)],
            *[[f"step-cost curve: decode step at batch {k} (ms, x batch 1)",
               f"{v * 1e3:.1f} ({_x(v / base if base else None)})"] for k, v in curve.items()],
        ],
        "The bound is the steady state's gain where a step costs the same at any batch (a "
        "GPU). A finite job drains: once nothing waits, continuous batching's last answers run "
        "in emptier steps, so the whole job gains less. The replay puts both schedules of this "
        "job on this machine's step-cost curve (decode steps only, from the batching "
        "experiment; static computes every row of a batch, finished ones as padding); the "
        "measured gain also pays for prefill and the server's per-step overhead.",
    )  # fmt: skip
    return [table, why]


def _disagg_section(m: Mapping[str, Any]) -> Section:
    d = m.get("disaggregated")
    title = "What disaggregation costs"
    if not d:
        return Section(title, CLAIMS["disagg_cost"], ["result"], [["disaggregated mode not run"]])
    kv = d.get("kv", {})
    split = {
        k: v
        for k, v in d.get("server_info", {}).items()
        if re.search(r"prefill|decode|thread|worker|affinity|cpu|device|split", k)
    }
    tp_d = dig(d, "batch", "output_tokens_per_s", "median")
    tp_c = dig(m, "continuous", "batch", "output_tokens_per_s", "median")
    bws = [
        ratio(b, t)
        for b, t in zip(
            dig(kv, "bytes_total", "rounds") or [], dig(kv, "seconds_total", "rounds") or [],
            strict=False,
        )
    ]  # fmt: skip
    bw = figure([x / 1e6 if x else None for x in bws])
    rows = [
        ["KV transferred per round (bytes, interference)", _f(kv.get("bytes_total"), 0)],
        ["KV bytes per prompt token", _f(kv.get("bytes_per_prompt_token"), 0)],
        [
            "KV bytes per token (server_info)",
            _n(d.get("server_info", {}).get("kv_bytes_per_token")),
        ],
        ["transfer time per round (s)", _f(kv.get("seconds_total"), 3)],
        ["transfer bandwidth (MB/s)", _f(bw)],
        ["transfer added to each TTFT (ms, mean)", _f(kv.get("per_request_ms_mean"))],
        ["transfer added to each TTFT (ms, p99)", _f(kv.get("per_request_ms_p99"))],
        ["chat TTFT p50 (ms), for scale", _f(dig(d, "chat", "ttft_ms_p50"))],
    ]
    if tp_d is not None:  # the batch job ran in disaggregated mode too (--batch-modes)
        rows += [
            [
                "batch job output tok/s: disaggregated / continuous (one combined server)",
                f"{_n(tp_d)} / {_n(tp_c)} = {_x(ratio(tp_d, tp_c))}",
            ],
            _per_thread_row(d, tp_d, tp_c, m.get("continuous", {}).get("threads")),
        ]
    rows.append(
        ["how the hardware was split", ", ".join(f"{k}={v}" for k, v in split.items()) or "-"]
    )
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
        f"{s['max_batched_tokens']} tokens/step; {s['rounds']} rounds, each visiting every "
        f"mode once in a rotating order (figures: the median over rounds, min-max). "
        f"Lab time {summary.get('elapsed_s', 0):.0f} s.",
    ]
    mach = summary.get("machine") or {}
    if mach:
        lines += [
            "",
            f"Machine: {mach.get('cpus')} CPUs; load average (1, 5, 15 min) "
            f"{mach.get('load_avg_start')} at the start, {mach.get('load_avg_end')} at the end; "
            f"{sum(1 for x in summary.get('measurements', []) if x.get('busy'))} of "
            f"{len(summary.get('measurements', []))} measurements busy (see the machine table).",
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
    from loadlab._report.html import render_template  # plots: matplotlib, only for this page

    return render_template(
        "lab.html.j2",
        settings=summary["settings"],
        elapsed=f"{summary.get('elapsed_s', 0):.0f}",
        machine=", ".join(
            f"{k} {v}" for k, v in (summary.get("machine") or {}).items() if k != "placement"
        ),
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
