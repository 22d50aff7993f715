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

Exit code: 0, the SLO verdict's code with ``--slo``, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from loadlab.commands import run as run_cmd

__all__ = ["HELP", "add_arguments", "run"]

HELP = "predict a run by simulating the server; write a results file marked predicted"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from loadlab.simulate.setup import add_server_arguments, add_step_arguments

    run_cmd.add_arguments(p)  # the same load: run's flags (endpoint flags only label the file)
    add_server_arguments(p)
    add_step_arguments(p)


def run(args: argparse.Namespace) -> int:
    from loadlab.results import write_results
    from loadlab.simulate import Simulator
    from loadlab.simulate.setup import server_from_args, step_model_from_args
    from loadlab.workloads import build_requests

    try:
        cfg = run_cmd.config_from_args(args)
        run_cmd._check(cfg)
        step_model = step_model_from_args(args)
        server = server_from_args(args, step_model)
    except ValueError as exc:
        print(f"loadlab simulate: {exc}", file=sys.stderr)
        return 2
    print(f"loadlab simulate: {server.mode}, {step_model.describe()}", file=sys.stderr)
    try:
        out = Simulator(cfg, server, step_model).run(build_requests(cfg))
    except ValueError as exc:
        print(f"loadlab simulate: {exc}", file=sys.stderr)
        return 2
    name = cfg.endpoints[0].name if cfg.endpoints else "predicted"
    results = out.to_results(endpoint=name)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = write_results(results, Path(cfg.out or f"reports/predicted-{stamp}.json"))
    print(run_cmd.summary_text(results))
    print(
        f"predicted: {out.num_steps:,} steps ({out.stretch_steps:,} by the decode shortcut), "
        f"{out.preemptions} preemptions, {len(out.requests):,} requests in {out.wall_s:.2f} s"
    )
    print(f"results: {path}")
    return run_cmd._slo_exit(cfg, results)
