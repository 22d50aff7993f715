"""The HTML report: one self-contained file (jinja2, autoescape on, plots as data URIs).

Every string that comes from a results file (config, errors, labels, environment) is escaped
for HTML and, beyond that, ``{``/``}`` and U+2028/U+2029 are written as character
references, so no client-side template or script parser could ever read them as code. The page
carries no scripts and a Content-Security-Policy that forbids them.

Example::

    write_html(read_results("reports/run.json"), "reports/run.html", verdict=verdict)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
from markupsafe import Markup, escape

from loadlab._analysis.batch_job import batch_jobs
from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab._analysis.server_metrics import server_series
from loadlab._analysis.summary import interrupted_note, summarize
from loadlab._analysis.telemetry import energy_of, telemetry_of
from loadlab._report import plots
from loadlab._report.comparison import change_cell, footer_lines
from loadlab._report.cost import cost_rows, energy_rows
from loadlab._report.prefix_cache import prefix_cache_rows
from loadlab._report.telemetry import gpu_plot
from loadlab._report.text import (
    NOT_STREAMED_LINE,
    PCT_KEYS,
    fmt_num,
    latency_rows,
    pct_cells,
    short_error,
)
from loadlab._version import __version__
from loadlab.records import printable

if TYPE_CHECKING:
    from loadlab._analysis.compare import Comparison
    from loadlab._slo import ObjectiveResult, Verdict
    from loadlab.results import Results

__all__ = [
    "escape_text",
    "render_comparison_html",
    "render_html",
    "render_template",
    "write_comparison_html",
    "write_html",
]

_EXTRA = {"{": "&#123;", "}": "&#125;", "\u2028": "&#8232;", "\u2029": "&#8233;"}


def escape_text(value: Any) -> Markup:
    """HTML-escape, plus braces and the JavaScript line separators as character references."""
    out = str(escape(str(value)))
    for ch, ref in _EXTRA.items():
        out = out.replace(ch, ref)
    return Markup(out)  # noqa: S704 - built only from escaped text


def _finalize(value: Any) -> Any:
    """Applied to every ``{{ }}`` output before autoescaping: escape it our stricter way."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return ""
    return escape_text(value)


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
        autoescape=True,  # every template, whatever its extension
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _ci(r: ObjectiveResult) -> str:
    if r.ci_low is None and r.ci_high is None and r.status != "inconclusive":
        return "–"
    lo = "−∞" if r.ci_low is None else fmt_num(r.ci_low, 2)
    hi = "∞" if r.ci_high is None else fmt_num(r.ci_high, 2)
    return f"{lo} – {hi}"


def _rounded(data: Any) -> Any:
    """Floats to 6 significant digits (2.9413063599999996 -> 2.94131), inside lists too."""
    if isinstance(data, float):
        return float(f"{data:.6g}")
    if isinstance(data, list | tuple):
        return [_rounded(x) for x in data]
    return data


def _flatten(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested config as (dotted key, JSON value) rows, floats rounded (``_rounded``)."""
    if isinstance(data, Mapping) and data:
        rows = []
        for k, v in data.items():
            rows += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return rows
    if isinstance(data, str):
        return [(prefix or "(value)", data)]
    text = json.dumps(_rounded(data), default=str, ensure_ascii=False)
    return [(prefix or "(value)", text)]


def _errors(results: Results, limit: int = 20) -> list[tuple[str, int]]:
    c = Counter(
        printable(f"{r.outcome}: {short_error(r.error, 400)}")
        for r in results.records
        if r.failed and r.error
    )
    return c.most_common(limit)


def _globals() -> dict[str, Any]:
    return {"num": fmt_num, "ci": _ci, "version": __version__}


def render_template(name: str, **context: Any) -> str:
    """One page from ``report/templates/`` with this module's escaping and helpers (``num``,
    ``ci``, ``version``): how the run, comparison and lab pages are all made."""
    return _env().get_template(name).render(**context, **_globals())


def render_html(results: Results, verdict: Verdict | None = None, source: str = "") -> str:
    """The whole report page as a string."""
    s = summarize(results)
    c = s.counts
    lo, hi = s.window_ns
    series = server_series(results.server_samples)
    gen = {k: v for k, v in results.generator.items() if k not in ("samples", "parts")}
    ctx = {
        "source": source,
        "started_at": results.started_at,
        "kind": results.kind,
        "workers": results.workers,
        "window": f"{(hi - lo) / 1e9:.2f} s",
        "saturated": results.saturated,
        "interrupted": interrupted_note(results.extra),
        "lag": fmt_num(results.generator.get("loop_lag_ms_max")),
        "pct_keys": PCT_KEYS,
        "latency": [(label, d.count, pct_cells(d)) for label, d in latency_rows(results, s)],
        "not_streamed": "" if s.streamed else NOT_STREAMED_LINE,
        "batch_jobs": batch_jobs(results),
        "counts": c,
        "failed_text": f"{c.failed:,} of {c.sent:,}" if c.failed else "0",
        "tp": s.throughput,
        "longest_stall": s.max_gap_ms.max,
        "stalls": s.stalls_per_stream_mean,
        "errors": _errors(results),
        "verdict": verdict,
        "pct": f"{verdict.confidence * 100:g} %" if verdict else "",
        "plots": {
            "cdfs": plots.latency_cdfs(results),
            "throughput": plots.throughput_inflight(results),
            "server": plots.server_side(results),
            "prompt": plots.ttft_vs_prompt(results),
            "timeline": plots.timeline(results),
            "gpu": gpu_plot(results),
        },
        **_cost_context(results),
        "server_sources": [(k, v[2]) for k, v in series.items()],
        "prefix_cache": prefix_cache_rows(pc) if (pc := prefix_cache_summary(results)) else [],
        "config": _flatten(results.config),
        "environment": _flatten(results.environment),
        "generator": _flatten(gen) if gen else [],
    }
    return render_template("report.html.j2", **ctx)


def _cost_context(results: Results) -> dict[str, Any]:
    """The cost and energy rows (``loadlab._report.cost``) and the GPU source's name."""
    energy = energy_of(results)
    tel = telemetry_of(results)
    return {
        "cost": cost_rows(results),
        "energy": energy_rows(energy) if energy is not None else [],
        "gpu_source": tel.get("source", "") if tel else "",
    }


def _write(text: str, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


def write_html(
    results: Results, path: str | Path, verdict: Verdict | None = None, source: str = ""
) -> Path:
    return _write(render_html(results, verdict, source), path)


def render_comparison_html(
    cmp: Comparison,
    runs: Sequence[Results],
    fail_on_regression_pct: float | None = None,
    run_labels: Sequence[str] | None = None,
) -> str:
    """``run_labels``: each run's label when setups have repeated runs (one CDF line each)."""
    from loadlab._analysis.compare import numbered_labels

    rows = [
        {
            "metric": r.metric,
            "cells": [fmt_num(v, 2) for v in r.values],
            "changes": [
                change_cell(r, i, fail_on_regression_pct) for i in range(1, len(cmp.labels))
            ],
        }
        for r in cmp.rows
    ]
    ctx = {
        "labels": list(cmp.labels),
        "rows": rows,
        "gate": cmp.exit_code(fail_on_regression_pct),
        "pct": fail_on_regression_pct,
        "warnings": [*cmp.warnings, *cmp.cautions],
        "footer": footer_lines(cmp, fail_on_regression_pct),
        "cdfs": plots.comparison_cdfs(runs, numbered_labels(run_labels or cmp.labels)),
    }
    return render_template("compare.html.j2", **ctx)


def write_comparison_html(
    cmp: Comparison,
    runs: Iterable[Results],
    path: str | Path,
    fail_on_regression_pct: float | None = None,
    run_labels: Sequence[str] | None = None,
) -> Path:
    html = render_comparison_html(cmp, list(runs), fail_on_regression_pct, run_labels)
    return _write(html, path)
