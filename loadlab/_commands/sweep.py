"""``loadlab sweep``: the highest load at which the SLOs still hold.

    loadlab sweep --endpoint http://127.0.0.1:8000 --model m --slo slo.toml \\
        --rates 1,2,4,8 --duration 30 --prompt-tokens 256 --max-tokens 64
    loadlab sweep --slo slo.toml --concurrencies 1,2,4,8,16 --duration 20   # embedded server

Each level is one ``loadlab run`` (every ``run`` flag applies: workload, scenario, warm-up,
seed...) judged by the SLO file's ceilings; rising levels until one fails, then bisection
between the last pass and the first fail. The file's floors (``output_tokens_per_s >= 1000``)
are set aside, as ``capacity --simulate`` does (a low load fails them by design), and judged
at the highest passing level. Writes one results file per level, ``sweep.json`` (the
summary) and ``sweep.html`` (the curve) into ``--out-dir``, and prints the latency-throughput curve with its knee. Exit code:
0 when some level met the SLOs, 1 when none did, 2 on bad input.

``--predict`` also simulates the same sweep (``loadlab simulate``'s server and step-time
flags; ``--mode`` is the simulated server's too) and prints, and writes as ``predicted.json``
and ``predicted.html``, the predicted SLO-max load beside the measured one with its error and
each latency metric's p50 / p90 / p99 against load, both curves.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from loadlab._commands.flags import add_run_arguments, config_from_args, refuse_shards
from loadlab._report.output import check_folder, write_output
from loadlab.config import EndpointConfig
from loadlab.errors import ConfigError, at_least, require

if TYPE_CHECKING:
    from loadlab._runner.sweep import SweepResult
    from loadlab._slo import SLOSpec
    from loadlab.config import RunConfig
    from loadlab.simulate._steptime import StepTimeModel

__all__ = ["add_arguments", "parse_levels", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("sweep")
    s.add_argument(
        "--rates",
        metavar="R1,R2,..",
        help="open-loop levels, rising: requests/s, or sessions/s for a chat workload",
    )
    s.add_argument("--concurrencies", metavar="C1,C2,..", help="closed-loop levels, rising")
    s.add_argument("--bisect-steps", type=int, default=3, help="bisections after the coarse pass")
    s.add_argument("--out-dir", help="folder for level results and sweep.json")
    s.add_argument("--inconclusive", choices=("fail", "pass"), default="fail",
                   help="an objective whose interval straddles its threshold (default: fail)")  # fmt: skip
    s.add_argument("--preset", default="cpu", help="embedded reference server preset")
    s.add_argument("--mode", default="continuous", help="embedded reference server mode")
    s.add_argument("--predict", action="store_true",
                   help="also simulate the sweep; print and plot predicted beside measured")  # fmt: skip
    add_run_arguments(p)  # every run flag: the levels are runs
    from loadlab.simulate._setup import add_server_arguments, add_step_arguments

    add_server_arguments(p, mode=False)  # --mode above is the simulated server's too
    add_step_arguments(p)


def parse_levels(text: str, integer: bool) -> list[float]:
    """``"1,2,4"`` -> [1.0, 2.0, 4.0]; rising and > 0, integers for concurrencies."""
    try:
        levels = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"load levels must be comma-separated numbers, got {text!r}") from exc
    if integer and any(x != int(x) for x in levels):
        raise ConfigError(f"--concurrencies must be whole numbers, got {text!r}")
    if not levels or any(b <= a for a, b in itertools.pairwise(levels)):
        raise ConfigError(f"load levels must be rising, e.g. 1,2,4,8; got {text!r}")
    if levels[0] <= 0:
        raise ConfigError(f"load levels must be > 0, got {text!r}")
    return levels


@contextlib.contextmanager
def _server(mode: str, preset: str) -> Iterator[str]:
    from reference_server.launch import start_server

    print(f"loadlab sweep: starting the reference server ({mode}, {preset}) ...", file=sys.stderr)
    with start_server(mode=mode, preset=preset, port=None) as server:
        yield str(server.url)


def run(args: argparse.Namespace) -> int:
    from loadlab._runner.sweep import (
        Level,
        ceilings_only,
        find_max_load,
        floors_line,
        judge_floors,
        render_html,
        run_level,
    )

    if (args.rates is None) == (args.concurrencies is None):
        raise ConfigError("give exactly one of --rates R1,R2,.. or --concurrencies C1,C2,..")
    if args.rate is not None or args.concurrency is not None:
        raise ConfigError("a sweep sets the load itself: use --rates / --concurrencies")
    if not args.slo:
        raise ConfigError("a sweep needs --slo FILE: the SLOs decide each level")
    refuse_shards(
        args,
        "sweep",
        "its levels run one after another from this machine "
        "(--workers N spreads each over this machine's processes); over several "
        "machines, run each level as one distributed run and judge its file with "
        'loadlab slo (docs/distributed.md, "A sweep over several machines")',
    )
    at_least("--bisect-steps", args.bisect_steps, 0, error=ConfigError)
    mode = "rate" if args.rates is not None else "concurrency"
    levels = parse_levels(args.rates or args.concurrencies, integer=mode == "concurrency")
    from loadlab._slo import load_slo  # scipy: only once the flags are right

    full_spec = load_slo(args.slo)
    spec, floors = ceilings_only(full_spec)  # one stream never meets a throughput floor
    step = None
    if args.predict:  # a model file that cannot be used is said before anything is measured
        from loadlab.simulate._setup import step_model_from_args

        step = step_model_from_args(args)
    if mode == "rate":
        args.rate = levels[0]
    else:
        args.concurrency = int(levels[0])
    base = config_from_args(args)
    if not base.endpoints:
        require("server", "the embedded reference server (no --endpoint)")
    from loadlab._runner.run import prepare, settle

    base = settle(base, log=_say)  # one seed for the sweep; each level derives its own
    from loadlab.workloads import rate_unit

    unit = rate_unit(base.workload) if mode == "rate" else "streams"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.out_dir or Path("reports") / f"sweep-{stamp}")
    check_folder(out_dir, "--out-dir")

    def sweep(endpoint: EndpointConfig) -> int:
        from loadlab._runner.preflight import preflight

        checked, _, notes = preflight(base.replace(endpoints=(endpoint,)))
        endpoint = checked.endpoints[0]  # the served model; a request that cannot fit: exit 2
        for note in notes:
            print(f"loadlab sweep: {note}", file=sys.stderr)
        if floors:
            print(f"loadlab sweep: {floors_line(floors)}", file=sys.stderr)
        # The prompt sizing (a tokenizer, or asking the server) is made once for every level.
        prepared = prepare(base, endpoint, log=_say)

        def evaluate(load: float) -> Level:
            print(f"loadlab sweep: {mode} {load:g} {unit} ...", file=sys.stderr, flush=True)
            lv = run_level(base, prepared, spec, load, mode, out_dir, args.inconclusive)
            verdict = "PASS" if lv.passed else ("INVALID" if lv.exit_code == 2 else "FAIL")
            print(f"  -> {verdict} {lv.path}", file=sys.stderr)
            for why in lv.failed_objectives:
                print(f"     {why}", file=sys.stderr)
            return lv

        result = find_max_load(
            evaluate, levels, args.bisect_steps, mode == "concurrency", mode, unit
        )
        result.floors = judge_floors(result, full_spec)
        summary = out_dir / "sweep.json"
        write_output(
            summary, "--out-dir", lambda p: p.write_text(json.dumps(result.to_dict(), indent=2))
        )
        page = out_dir / "sweep.html"
        write_output(page, "--out-dir", lambda p: p.write_text(render_html(result, full_spec)))
        print(result.to_text())
        print(f"summary: {summary}; plot: {page}")
        if args.predict:
            assert step is not None  # noqa: S101 - set above with --predict
            _predict(args, step, base, spec, levels, mode, result, out_dir)
        return 0 if result.max_passing_load is not None else 1

    if base.endpoints:
        return sweep(base.endpoints[0])
    with _server(args.mode, args.preset) as url:
        return sweep(EndpointConfig(url=url, name="reference", model=base_model(args)))


def _say(line: str) -> None:
    print(f"loadlab sweep: {line}", file=sys.stderr)


def base_model(args: argparse.Namespace) -> str:
    return str(args.model or "loadlab-ref")


def _predict(args: argparse.Namespace, step: StepTimeModel, base: RunConfig, spec: SLOSpec,
             levels: list[float], mode: str, measured: SweepResult,
             out_dir: Path) -> None:  # fmt: skip
    """``--predict``: the same sweep simulated, beside the measured one (text, JSON, HTML)."""
    from loadlab._runner.sweep import level_config
    from loadlab.results import read_results
    from loadlab.simulate._capacity import predicted_sweep
    from loadlab.simulate._engine import Simulator
    from loadlab.simulate._setup import server_from_args
    from loadlab.simulate._versus import curves_of, max_load_error_pct, versus_html, versus_text
    from loadlab.workloads import build_requests

    server = server_from_args(args, step)
    print(f"loadlab sweep: predicting ({server.mode}; {step.describe()}) ...", file=sys.stderr)
    predicted, runs = predicted_sweep(base, server, step, spec, levels, mode=mode,
                                      bisect_steps=args.bisect_steps, inconclusive=args.inconclusive)  # fmt: skip
    for lv in measured.levels:  # predict every measured load, for the curves
        if lv.load not in runs:
            cfg = level_config(base, lv.load, mode)  # no sizing: a simulation counts no text
            runs[lv.load] = Simulator(cfg, server, step).run(build_requests(cfg)).to_results()
    measured_runs = {lv.load: read_results(lv.path) for lv in measured.levels if lv.path}
    curves = {"measured": curves_of(measured_runs), "predicted": curves_of(runs)}
    print(versus_text(measured, predicted, curves))
    (out_dir / "predicted.json").write_text(json.dumps({
        "predicted": predicted.to_dict(), "curves": {k: {str(x): v for x, v in c.items()}
                                                     for k, c in curves.items()},
        "max_load_error_pct": max_load_error_pct(measured, predicted),
        "server": server.__dict__, "step_model": step.to_dict()}, indent=2), encoding="utf-8")  # fmt: skip
    page = out_dir / "predicted.html"
    page.write_text(versus_html(measured, predicted, curves), encoding="utf-8")
    print(f"predicted: {out_dir / 'predicted.json'}; plot: {page}")
