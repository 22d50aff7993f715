"""``loadlab run``: run a load test and write a results file.

    loadlab run                                   # the embedded reference server, a short chat load
    loadlab run --endpoint http://127.0.0.1:8000 --model m --rate 4 --duration 60 \\
        --prompt-tokens 512 --max-tokens 128 --out reports/r.json
    loadlab run --scenario scenarios/chat.toml --rate 8      # flags override the scenario
    loadlab run --endpoint a=http://h1:8000 --endpoint b=http://h2:8000 --concurrency 8 --requests 200
    loadlab run --endpoint ours=http://h1:8000 --endpoint claude=https://api.anthropic.com \\
        --endpoint-api claude=anthropic --endpoint-model claude=claude-x \\
        --endpoint-key-env claude=ANTHROPIC_API_KEY --rate 2 --requests 100   # vendor comparison

The flags become a ``RunConfig`` (``loadlab._commands.flags``), which ``loadlab._runner.run``
runs from start to results, as it does for the Python API; this module prints what it did.
"""

from __future__ import annotations

import argparse
import sys

from loadlab._commands.flags import add_run_arguments, config_from_args
from loadlab._runner import signals
from loadlab._runner.run import RunOutcome
from loadlab._runner.run import run as run_config
from loadlab.config import RunConfig
from loadlab.results import Results

__all__ = ["add_arguments", "config_from_args", "run", "slo_exit_code", "summary_text"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_run_arguments(p)


def summary_text(results: Results) -> str:
    from loadlab._report.text import render_summary

    return render_summary(results)


def warn(text: str) -> None:
    """A loud line on stderr, red on a terminal."""
    if sys.stderr.isatty():
        text = f"\033[1;31m{text}\033[0m"
    print(text, file=sys.stderr)


def _say(line: str) -> None:
    print(f"loadlab run: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    with signals.install():  # SIGTERM and SIGHUP end a run as Ctrl-C does
        outcome = run_config(config_from_args(args), log=_say)
    show(outcome)
    return outcome.exit_code


def show(outcome: RunOutcome) -> None:
    """Each endpoint's summary, warnings, results file and verdict, then the comparison."""
    from loadlab._analysis.generator import saturation_warning
    from loadlab._analysis.token_checks import prompt_match, prompt_warning
    from loadlab._report.text import render_verdict

    for run in outcome.runs:
        print(summary_text(run.results))
        for line in (
            saturation_warning(run.results.generator),
            prompt_warning(prompt_match(run.results.records)),
            *(f"loadlab run: {note}" for note in run.notes),
        ):
            if line:
                warn(line)
        if run.path is not None:
            print(f"results: {run.path}")
        if run.verdict is not None:
            print(render_verdict(run.verdict))
    if len(outcome.runs) > 1:
        if outcome.comparison is None:
            print("compare the files with: loadlab compare " + " ".join(
                str(r.path or r.endpoint) for r in outcome.runs))  # fmt: skip
        else:
            from loadlab._report.comparison import render_comparison

            files = outcome.comparison_files
            where = f"comparison: {files[0]} {files[1]}" if files else ""
            print(f"{render_comparison(outcome.comparison)}{where}")
    for note in outcome.notes:
        warn(f"loadlab run: {note}")


def slo_exit_code(cfg: RunConfig, results: Results) -> int:
    """``cfg.slo``'s verdict on ``results``, printed; its exit code (0 without an SLO file)."""
    if not cfg.slo:
        return 0
    from loadlab._report.text import render_verdict
    from loadlab._slo import evaluate, load_slo

    verdict = evaluate(results, load_slo(cfg.slo))
    print(render_verdict(verdict))
    return int(verdict.exit_code)
