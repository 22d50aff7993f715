"""``loadlab slo RESULTS --slo slo.toml``: the CI gate.

Prints the verdict table and exits 0 (all objectives pass), 1 (any fails; inconclusive ones
too under ``--inconclusive fail``, the default) or 2 (the run is not valid evidence: the
generator was saturated, too few requests, or the results or SLO file cannot be read).

Example::

    loadlab slo reports/run.json --slo examples/slo.toml --junit reports/slo.xml \\
        --markdown reports/slo.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", metavar="RESULTS", help="results file written by loadlab run")
    parser.add_argument("--slo", required=True, metavar="FILE", help="SLO file (TOML)")
    parser.add_argument(
        "--junit", metavar="FILE", help="also write JUnit XML (one case per objective)"
    )
    parser.add_argument("--pricing", metavar="FILE", help="price the run with this pricing file")
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write a Markdown summary (CI job summary, PR comment)",
    )
    parser.add_argument(
        "--inconclusive",
        choices=("fail", "pass"),
        default="fail",
        help="whether an objective whose interval straddles its threshold fails the gate (default: fail)",
    )


def _write_outputs(args: argparse.Namespace, verdict: object, results: object) -> None:
    from loadlab._report.junit import write_junit
    from loadlab._report.markdown import render_verdict_markdown
    from loadlab._report.output import write_output

    if args.junit:
        junit = write_output(args.junit, "--junit", lambda p: write_junit(verdict, p))  # type: ignore[arg-type]
        print(f"JUnit XML: {junit}")
    if args.markdown:

        def markdown(p: Path) -> None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(render_verdict_markdown(verdict, results), encoding="utf-8")  # type: ignore[arg-type]

        print(f"Markdown: {write_output(args.markdown, '--markdown', markdown)}")


def run(args: argparse.Namespace) -> int:
    from loadlab._commands import read_said
    from loadlab._report.text import render_summary, render_verdict
    from loadlab._slo import Verdict, evaluate, load_slo
    from loadlab.results import ResultsError

    spec = load_slo(args.slo)
    try:
        results = read_said(args.results, "slo")
    except ResultsError as exc:
        verdict = Verdict.unreadable(str(exc))
        print(render_verdict(verdict), end="")
        _write_outputs(args, verdict, None)
        return verdict.exit_code
    if args.pricing:  # prices applied after the run (the file's own otherwise)
        from loadlab._analysis.cost import apply_pricing

        apply_pricing(results, args.pricing)
    verdict = evaluate(results, spec, inconclusive=args.inconclusive)
    print(render_summary(results))
    print(render_verdict(verdict), end="")
    _write_outputs(args, verdict, results)
    return verdict.exit_code
