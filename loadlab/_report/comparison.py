"""Text and Markdown tables of a ``loadlab._analysis.compare.Comparison``.

Each run's value per metric, then for each run after the first its change against the first,
the (Bonferroni-adjusted) interval of that change, and a mark: ``*`` significant,
``REGRESSION`` significant, worse and over the ``--fail-on-regression`` percentage.

Example::

    print(render_comparison(cmp, fail_on_regression_pct=10))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadlab._report.markdown import md_escape, md_table
from loadlab._report.text import fmt_num, render_table

if TYPE_CHECKING:
    from loadlab._analysis.compare import Comparison, MetricChange

__all__ = ["change_cell", "footer_lines", "render_comparison", "render_comparison_markdown"]


def _signed(v: float) -> str:
    return f"{v:+.1f}"


def change_cell(row: MetricChange, i: int, pct: float | None) -> tuple[str, str]:
    """(change text, mark) of run ``i`` against the baseline."""
    c = row.change_pct[i]
    if c is None:
        return "-", ""
    text = f"{_signed(c)} %"
    ci = row.ci_pct[i]
    if ci is not None:
        text += f" [{_signed(ci[0])}, {_signed(ci[1])}]"
    elif row.p_value[i] is not None:
        text += f" (p {row.p_value[i]:.2g})"
    mark = "not tested" if row.note.startswith(("not tested", "fewer")) else ""
    if row.significant[i]:
        mark = "significant, " + ("worse" if row.worse(i) else "better")
        if pct is not None and row.regression(i, pct):
            mark = "REGRESSION"
    return text, mark


def _header(cmp: Comparison) -> list[str]:
    base = cmp.labels[0]
    runs = cmp.repeats or (1,) * len(cmp.labels)
    head = [
        f"{label}{f' ({n} runs)' if n > 1 else ''}{' (baseline)' if i == 0 else ''}"
        for i, (label, n) in enumerate(zip(cmp.labels, runs, strict=True))
    ]
    for label in cmp.labels[1:]:
        head += [f"{label} vs {base}", "verdict"]
    return ["metric", *head]


def footer_lines(cmp: Comparison, pct: float | None) -> list[str]:
    out = [
        f"Intervals: {(1 - cmp.alpha) * 100:g} % for the whole table (Bonferroni over "
        f"{len(cmp.rows)} rows); latency by a bootstrap over requests, rates by Fisher's exact test."
    ]
    if any(r.metric.startswith("usd_") for r in cmp.rows):
        out.append(
            "Cost rows: each setup's prices (docs/cost.md), bootstrapped over its sessions (API "
            "prices) or whole seconds of the window (GPU-hours)."
        )
    if any(n > 1 for n in cmp.repeats):
        out.append(
            "Files that share a label are runs of one setup: the bootstrap draws the runs, then "
            "the requests in them, so the spread between runs is in the intervals."
        )
    else:
        out.append(
            "One run per setup: the intervals cover sampling within each run, not a machine "
            "whose speed changed between the runs (give repeated runs the same label)."
        )
    if pct is not None:
        n = len(cmp.regressions(pct))
        out.append(
            f"Regression gate: significant and worse by more than {pct:g} %: "
            + (f"{n} found" if n else "none found")
        )
    notes = sorted(
        {f"{r.metric}: {r.note}" for r in cmp.rows if r.note.startswith(("not", "fewer"))}
    )
    out += notes
    out += [f"WARNING: {w}" for w in (*cmp.warnings, *cmp.cautions)]
    return out


def render_comparison(cmp: Comparison, fail_on_regression_pct: float | None = None) -> str:
    rows = []
    for r in cmp.rows:
        cells = [r.metric, *(fmt_num(v, 2) for v in r.values)]
        for i in range(1, len(cmp.labels)):
            cells += list(change_cell(r, i, fail_on_regression_pct))
        rows.append(cells)
    n_runs = len(cmp.labels)
    align = "l" + "r" * n_runs + "rl" * (n_runs - 1)
    table = render_table(_header(cmp), rows, align=align)
    return table + "\n\n" + "\n".join(footer_lines(cmp, fail_on_regression_pct)) + "\n"


def render_comparison_markdown(cmp: Comparison, fail_on_regression_pct: float | None = None) -> str:
    rows = []
    for r in cmp.rows:
        cells = [md_escape(r.metric), *(fmt_num(v, 2) for v in r.values)]
        for i in range(1, len(cmp.labels)):
            text, mark = change_cell(r, i, fail_on_regression_pct)
            mark = {"REGRESSION": "❌ **REGRESSION**"}.get(mark, mark)
            cells += [md_escape(text), mark]
        rows.append(cells)
    header = [md_escape(h) for h in _header(cmp)]
    n_runs = len(cmp.labels)
    gate = cmp.exit_code(fail_on_regression_pct)
    title = {0: "✅", 1: "❌ regression", 2: "⚠️ not valid evidence"}[gate]
    out = [
        f"### loadlab compare {title}",
        md_table(header, rows, align="l" + "r" * n_runs + "rl" * (n_runs - 1)),
        "\n\n".join(md_escape(line) for line in footer_lines(cmp, fail_on_regression_pct)),
    ]
    return "\n\n".join(out) + "\n"
