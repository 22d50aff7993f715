"""Markdown for a CI job summary ($GITHUB_STEP_SUMMARY) or a pull-request comment.

Example::

    Path(os.environ["GITHUB_STEP_SUMMARY"]).write_text(render_verdict_markdown(verdict, results))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab._report.prefix_cache import prefix_cache_rows
from loadlab._report.text import fmt_num, render_summary

if TYPE_CHECKING:
    from loadlab._slo import Verdict
    from loadlab.results import Results

__all__ = ["md_escape", "md_table", "render_verdict_markdown"]

_BADGE = {"PASS": "✅ PASS", "FAIL": "❌ FAIL", "INVALID": "⚠️ NOT VALID EVIDENCE"}
_STATUS = {"pass": "✅ pass", "fail": "❌ fail", "inconclusive": "❔ inconclusive"}


def md_escape(text: str) -> str:
    """Escape what would change a table cell: pipes, HTML, backticks, line breaks."""
    out = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    out = out.replace("|", "\\|").replace("`", "\\`")
    return " ".join(out.split())  # newlines, U+2028 and friends become spaces


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def render_verdict_markdown(verdict: Verdict, results: Results | None = None) -> str:
    """Heading with the outcome, the objectives table, reasons, and the run summary folded."""
    name = f" · {md_escape(verdict.name)}" if verdict.name else ""
    out = [f"### SLO {_BADGE[verdict.outcome]}{name}"]
    pct = f"{verdict.confidence * 100:g} %"
    if verdict.rows:
        rows = []
        for r in verdict.rows:
            ci = "–"
            if r.ci_low is not None or r.ci_high is not None or r.status == "inconclusive":
                lo = "−∞" if r.ci_low is None else fmt_num(r.ci_low, 2)
                hi = "∞" if r.ci_high is None else fmt_num(r.ci_high, 2)
                ci = f"{lo} – {hi}"
            status = _STATUS[r.status]
            if r.extra_requests:
                status += f" (~{r.extra_requests:,} more requests)"
            rows.append(
                [
                    md_escape(r.objective.name),
                    md_escape(f"{r.objective.op} {r.objective.threshold:g}"),
                    fmt_num(r.measured, 2),
                    fmt_num(r.margin, 2),
                    ci,
                    fmt_num(r.n),
                    status,
                ]
            )
        header = ["objective", "threshold", "measured", "margin", f"{pct} interval", "n", "status"]
        out.append(md_table(header, rows, align="llrrrrl"))
    for reason in verdict.invalid_reasons:
        out.append(f"> **Not valid evidence:** {md_escape(reason)}")
    policy = verdict.inconclusive_policy
    out.append(
        f"Exit code {verdict.exit_code}. An objective is *inconclusive* when its {pct} interval "
        f"straddles the threshold; under this gate's policy it counts as **{policy}**."
    )
    pc = prefix_cache_summary(results) if results is not None else None
    if pc is not None:
        rows = [[md_escape(label), md_escape(value)] for label, value in prefix_cache_rows(pc)]
        out.append("#### Prefix cache\n\n" + md_table(["", "value"], rows, align="ll"))
    if results is not None:
        summary = render_summary(results).replace("```", "'''")
        out.append(f"<details><summary>Run summary</summary>\n\n```text\n{summary}```\n</details>")
    return "\n\n".join(out) + "\n"
