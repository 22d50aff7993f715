"""``loadlab report RESULTS``: the summary table, and optionally HTML, CSV and an SLO verdict.

Example::

    loadlab report reports/run.json --html reports/run.html --csv reports/run.csv \\
        --slo examples/slo.toml

    loadlab report --from-journal reports/run.journal.jsonl --out reports/run.json
        # a run killed (or whose disk filled) before it wrote its file: rebuild it

Exit code 0, or 2 when a file cannot be read or written (the message names it). (``loadlab
slo`` is the CI gate.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab._report.output import write_output
from loadlab.errors import ConfigError
from loadlab.records import printable

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["add_arguments", "run", "write_csv"]

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "results", metavar="RESULTS", nargs="?", help="results file written by loadlab run"
    )
    parser.add_argument(
        "--from-journal",
        metavar="JOURNAL",
        help="rebuild the run from the journal a killed or failed run left (<out>.journal.jsonl)",
    )
    parser.add_argument("--out", metavar="FILE", help="with --from-journal: write the results here")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report")
    parser.add_argument("--csv", metavar="FILE", help="write the per-request table as CSV")
    parser.add_argument("--slo", metavar="FILE", help="add the verdict against this SLO file")
    parser.add_argument("--pricing", metavar="FILE", help="price the run with this pricing file")
    parser.add_argument(
        "--inconclusive",
        choices=("fail", "pass"),
        default="fail",
        help="verdict policy for inconclusive objectives (default: fail)",
    )


def write_csv(results: Results, path: str | Path) -> Path:
    """One row per request (``loadlab.results.to_dataframe``). Text cells that a spreadsheet
    would run as a formula (=, +, -, @) get a leading apostrophe (OWASP, "CSV Injection");
    what a terminal would act on (an escape sequence in a server's error) is escaped."""
    import pandas as pd

    from loadlab.results import to_dataframe

    df = to_dataframe(results)
    for col in df.columns:
        if pd.api.types.is_object_dtype(df[col]) or pd.api.types.is_string_dtype(df[col]):
            df[col] = df[col].map(_cell)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(p, index=False)
    return p


def _cell(v: object) -> object:
    if not isinstance(v, str):
        return v
    return "'" + printable(v) if v.startswith(_FORMULA_START) else printable(v)


def run(args: argparse.Namespace) -> int:
    from loadlab._commands import read_said
    from loadlab._report.text import render_summary, render_verdict
    from loadlab._slo import evaluate, load_slo
    from loadlab.journal import journal_note, read_journal
    from loadlab.results import write_results

    if (args.results is None) == (args.from_journal is None):
        raise ConfigError("give a results file or --from-journal JOURNAL (one of them)")
    if args.out and not args.from_journal:
        raise ConfigError("--out writes a results file rebuilt with --from-journal; give that")
    if args.results and not args.from_journal:
        from loadlab._analysis.recorded import (
            is_recorded_trace,
            render_trace_summary,
            trace_summary,
        )

        if is_recorded_trace(args.results):  # a `loadlab record` trace, not a results file
            print(render_trace_summary(trace_summary(args.results)))
            return 0
    if args.from_journal:
        results = read_journal(args.from_journal)
        note = journal_note(results)
        if note:
            print(f"loadlab report: {args.from_journal}: {note}", file=sys.stderr)
    else:
        results = read_said(args.results, "report")
    if args.pricing:  # prices applied after the run (the file's own otherwise)
        from loadlab._analysis.cost import apply_pricing

        apply_pricing(results, args.pricing)
    source = args.results or args.from_journal
    spec = load_slo(args.slo) if args.slo else None
    print(render_summary(results))
    verdict = evaluate(results, spec, inconclusive=args.inconclusive) if spec else None
    if verdict is not None:
        print(render_verdict(verdict))
    if args.out:
        print(f"results: {write_output(args.out, '--out', lambda p: write_results(results, p))}")
    if args.csv:
        print(f"CSV: {write_output(args.csv, '--csv', lambda p: write_csv(results, p))}")
    if args.html:
        from loadlab._report.html import write_html

        html = write_output(
            args.html, "--html", lambda p: write_html(results, p, verdict, source=str(source))
        )
        print(f"HTML: {html}")
    return 0
