"""``loadlab report RESULTS``: the summary table, and optionally HTML, CSV and an SLO verdict.

Example::

    loadlab report reports/run.json --html reports/run.html --csv reports/run.csv \\
        --slo examples/slo.toml

Exit code 0, or 2 when a file cannot be read. (``loadlab slo`` is the CI gate.)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["add_arguments", "run", "write_csv"]

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS", help="results file written by loadlab run")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--csv", metavar="FILE", help="write the per-request table as CSV")
    parser.add_argument("--slo", metavar="FILE", help="add the verdict against this SLO file")
    parser.add_argument(
        "--inconclusive",
        choices=("fail", "pass"),
        default="fail",
        help="verdict policy for inconclusive objectives (default: fail)",
    )


def write_csv(results: Results, path: str | Path) -> Path:
    """One row per request (``loadlab.results.to_dataframe``). Text cells that a spreadsheet
    would run as a formula (=, +, -, @) get a leading apostrophe (OWASP, "CSV Injection")."""
    import pandas as pd

    from loadlab.results import to_dataframe

    df = to_dataframe(results)
    for col in df.columns:
        if pd.api.types.is_object_dtype(df[col]) or pd.api.types.is_string_dtype(df[col]):
            df[col] = df[col].map(
                lambda v: "'" + v if isinstance(v, str) and v.startswith(_FORMULA_START) else v
            )
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(p, index=False)
    return p


def run(args: argparse.Namespace) -> int:
    from loadlab.report.text import render_summary, render_verdict
    from loadlab.results import read_results
    from loadlab.slo import evaluate, load_slo

    results = read_results(args.results)
    spec = load_slo(args.slo) if args.slo else None
    print(render_summary(results))
    verdict = evaluate(results, spec, inconclusive=args.inconclusive) if spec else None
    if verdict is not None:
        print(render_verdict(verdict))
    if args.csv:
        print(f"CSV: {write_csv(results, args.csv)}")
    if args.html:
        from loadlab.report.html import write_html

        print(f"HTML: {write_html(results, args.html, verdict, source=str(args.results))}")
    return 0
