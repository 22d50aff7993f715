"""``loadlab simulate``: predict a run instead of making it, and write a results file.

It takes ``loadlab run``'s flags (the same scenario, workload, rate or concurrency, stop
rules) plus the simulated server's (``loadlab-server``'s names) and a step-time model, and
writes a results file marked predicted that ``report``, ``slo`` and ``compare`` read like a
measured one. Examples::

    loadlab simulate --rate 4 --duration 60 --prompt-tokens 512 --max-tokens 128 \\
        --mode chunked --out reports/predicted.json                 # the reference server here
    loadlab simulate --scenario scenarios/chat.toml --rate 8 --sim-model llama-3-8b \\
        --hardware h100 --slo examples/slo.toml                     # an H100 roofline
    loadlab simulate --rate 2 --requests 500 --step-model reports/fit.json

Fit a step-time model (printing its residuals), then use it with ``--step-model``::

    loadlab simulate --fit-reference cpu --threads 2 --fit-out reports/fit-cpu.json
    loadlab simulate --fit-results reports/sweep/*.json --fit-out reports/fit-endpoint.json
    loadlab simulate --fit-steps http://127.0.0.1:8000 --fit-out reports/fit-steps.json

A simulation whose steps go past 1.5x the range a fitted model was fitted on is refused
(exit 2, naming what went past) unless ``--extrapolate`` is given.

Exit code: 0, the SLO verdict's code with ``--slo``, 2 on bad input or a refused extrapolation.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab._commands import run as run_cmd
from loadlab._commands.flags import add_run_arguments, config_from_args, refuse_shards

if TYPE_CHECKING:
    from loadlab.simulate._steptime import StepTimeModel

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from loadlab.simulate._setup import add_server_arguments, add_step_arguments

    add_run_arguments(p)  # the same load: run's flags (endpoint flags only label the file)
    add_server_arguments(p)
    add_step_arguments(p)
    f = p.add_argument_group("fit a step-time model")
    f.add_argument("--fit-reference", metavar="PRESET", help="time the reference model here")
    f.add_argument("--fit-results", nargs="+", metavar="FILE", help="a sweep's results files")
    f.add_argument("--fit-steps", metavar="URL|FILE",
                   help="a reference server's step log (its URL, or a saved /v1/step_log)")  # fmt: skip
    f.add_argument("--fit-out", metavar="FILE", help="write the fitted model here (JSON)")
    f.add_argument("--threads", type=int, help="torch threads for --fit-reference")
    f.add_argument("--extrapolate", action="store_true",
                   help="simulate even far beyond a fitted model's range")  # fmt: skip


def _load_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, a) is not None for a in ("rate", "concurrency", "scenario",
                                                       "requests", "duration"))  # fmt: skip


def _fit(args: argparse.Namespace) -> StepTimeModel | int:
    """The fitted model (its residuals printed, written to --fit-out), or an exit code."""
    import json

    from loadlab.results import ResultsError
    from loadlab.simulate._fit import (
        fit_reference,
        fit_results,
        fit_step_log,
        read_step_log,
        residual_table,
    )

    model: StepTimeModel
    try:
        if args.fit_steps:
            model = fit_step_log(read_step_log(args.fit_steps), f"step log of {args.fit_steps}")
        elif args.fit_reference:
            print(f"timing the reference {args.fit_reference} model's steps ...", file=sys.stderr)
            model = fit_reference(args.fit_reference, threads=args.threads, log=sys.stderr)
        else:
            model = fit_results(args.fit_results)
    except (ValueError, ResultsError, OSError) as exc:
        print(f"loadlab simulate: cannot fit: {exc}", file=sys.stderr)
        return 2
    print(residual_table(model))
    if args.fit_out:
        path = Path(args.fit_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
        print(f"step-time model: {path} (use it with --step-model {path})")
    return model if _load_given(args) else 0


def run(args: argparse.Namespace) -> int:
    from loadlab._analysis.summary import overload_note
    from loadlab._runner.run import check, settle
    from loadlab.results import write_results
    from loadlab.simulate import Simulator
    from loadlab.simulate._fit import extrapolation
    from loadlab.simulate._setup import jitter_as_asked, server_from_args, step_model_from_args
    from loadlab.workloads import build_requests

    fitted = _fit(args) if args.fit_reference or args.fit_results or args.fit_steps else None
    if isinstance(fitted, int):
        return fitted
    try:
        refuse_shards(args, "simulate", "it simulates the whole schedule, on no clock but its own")
        cfg = config_from_args(args)
        check(cfg)
        step_model = jitter_as_asked(args, fitted) if fitted else step_model_from_args(args)
        server = server_from_args(args, step_model)
    except ValueError as exc:
        print(f"loadlab simulate: {exc}", file=sys.stderr)
        return 2
    print(f"loadlab simulate: {server.mode}, {step_model.describe()}", file=sys.stderr)
    cfg = settle(cfg, log=lambda line: print(f"loadlab simulate: {line}", file=sys.stderr))
    try:  # no prompt sizing: a simulation reads the requested token counts, not the text
        out = Simulator(cfg, server, step_model).run(build_requests(cfg))
    except ValueError as exc:
        print(f"loadlab simulate: {exc}", file=sys.stderr)
        return 2
    beyond = extrapolation(step_model, out.extra["seen"])
    if beyond:
        verb = "extrapolated" if args.extrapolate else "refused"
        print(f"loadlab simulate: {verb}: " + "; ".join(beyond), file=sys.stderr)
        if not args.extrapolate:
            print("measure a wider range, or pass --extrapolate to simulate anyway",
                  file=sys.stderr)  # fmt: skip
            return 2
    name = cfg.endpoints[0].name if cfg.endpoints else "predicted"
    results = out.to_results(endpoint=name)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = write_results(results, Path(cfg.out or f"reports/predicted-{stamp}.json"))
    print(run_cmd.summary_text(results))
    overloaded = overload_note(results)
    if overloaded:
        run_cmd.warn(f"loadlab simulate: the simulated server is {overloaded}")
    print(
        f"predicted: {out.num_steps:,} steps ({out.stretch_steps:,} by the decode shortcut), "
        f"{out.preemptions} preemptions, {len(out.requests):,} requests in {out.wall_s:.2f} s"
    )
    print(f"results: {path}")
    return run_cmd.slo_exit_code(cfg, results)
