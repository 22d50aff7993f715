"""``loadlab compare A.json B.json ...``: runs side by side, changes and their significance.

The first file is the baseline. ``--fail-on-regression PCT`` makes it a CI gate: exit 1 when
a metric is significantly worse than the baseline by more than PCT percent, 2 when a file
cannot be read or a run's generator was saturated.

Example::

    loadlab compare reports/main.json reports/pr.json --labels main,pr --fail-on-regression 10
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadlab._report.output import write_output
from loadlab.errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS", help="two or more results files")
    parser.add_argument(
        "--labels",
        help="comma-separated names, one per file (default: file names); files with the same "
        "name are repeated runs of one setup, and the spread between them counts as noise",
    )
    parser.add_argument(
        "--slo", metavar="FILE", help="SLO file: adds goodput (requests meeting it, per s)"
    )
    parser.add_argument(
        "--pricing", metavar="FILE", help="prices by label (docs/cost.md): adds cost rows"
    )
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
    parser.add_argument(
        "--fail-on-regression",
        type=float,
        metavar="PCT",
        help="exit 1 when a metric is significantly worse than the baseline by more than PCT %%",
    )
    parser.add_argument(
        "--alpha", type=float, default=0.05, help="family-wise error rate (default 0.05)"
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        metavar="N",
        help="bootstrap resamples, 100 to 100,000 (default 2000)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from loadlab._analysis.compare import check_bootstrap, compare
    from loadlab._commands import read_said, say
    from loadlab._report.comparison import render_comparison, render_comparison_markdown

    if len(args.results) < 2:
        raise ConfigError("give at least two results files")
    labels = args.labels.split(",") if args.labels else _default_labels(args.results)
    if len(labels) != len(args.results):
        raise ConfigError(f"--labels has {len(labels)} names for {len(args.results)} files")
    pct = args.fail_on_regression
    if pct is not None and not 0 <= pct < float("inf"):
        raise ConfigError("--fail-on-regression must be a percentage >= 0, e.g. 10")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be in (0, 1), e.g. 0.05; got {args.alpha}")
    check_bootstrap(args.bootstrap)
    spec = None
    if args.slo:  # SLO intervals need scipy's statistics, a second and more to import
        from loadlab._slo import load_slo

        spec = load_slo(args.slo)
    runs = [read_said(p, "compare") for p in args.results]
    if args.pricing:  # each file priced by its label's table (else its endpoint's, else all)
        from loadlab._analysis.cost import apply_pricing

        for r, label in zip(runs, labels, strict=True):
            apply_pricing(r, args.pricing, label)
    requests = sum(len(r.records) for r in runs)
    if requests > 200_000:
        say("compare", f"{args.bootstrap:,} bootstrap resamples of {requests:,} requests ...")
    cmp = compare(runs, labels, slo=spec, alpha=args.alpha, n_boot=args.bootstrap, seed=args.seed)
    print(render_comparison(cmp, pct), end="")
    if args.markdown:

        def markdown(p: Path) -> None:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(render_comparison_markdown(cmp, pct), encoding="utf-8")

        print(f"Markdown: {write_output(args.markdown, '--markdown', markdown)}")
    if args.html:
        from loadlab._report.html import write_comparison_html

        html = write_output(
            args.html, "--html", lambda p: write_comparison_html(cmp, runs, p, pct, labels)
        )
        print(f"HTML: {html}")
    code = cmp.exit_code(pct)
    if pct is not None:
        print({0: "no regression", 1: "REGRESSION: exit 1", 2: "NOT VALID EVIDENCE: exit 2"}[code])
    return code


def _default_labels(paths: list[str]) -> list[str]:
    """File names, or the paths where names repeat (``main/run.json``, ``pr/run.json``), and
    numbered if still not unique: only ``--labels`` groups files into one setup's runs."""
    from loadlab._analysis.compare import numbered_labels

    labels = [Path(p).stem for p in paths]
    return numbered_labels(labels if len(set(labels)) == len(labels) else paths)
