"""The simulator held against measured sweeps of the reference server.

For each mode: start the reference server, warm it up, put a calibration load on it (closed
loop, ``--calibrate``: a few seconds at a low and at a full batch), fit a step-time model to
the server's own step log of that load (``GET /v1/step_log``: each whole step, scheduling to
token hand-off, by shape; disaggregated: each worker role its own model; white box: step
timings only), and run ``loadlab sweep --predict`` against it with the simulated server set
from its ``/v1/server_info`` and that model. ``--fit reference`` instead times the model's
steps alone in this process (the earlier method: no server, no load beside it); with
``--also-reference`` (the default) that fit's predictions of the same sweeps are printed too,
for comparison. With ``--recalibrate`` (the default) the calibration load runs again after
the sweep and one fit to both calibrations predicts the sweep again (a calibration on each
side of the measurement: this machine's step prices drift by 10-40 % within one sweep); with
``--own-steps`` (the default) a fit to the steps the server took during the sweep predicts it
again too, and each compared level once more from a fit to the steps of that level alone
(not predictions: checks that separate the scheduling from the step prices, the second with
prices that cannot have drifted). The first fit also predicts the sweep with every step at
its shape's median (``--step-jitter off``: without the spread its steps showed).
With ``--remeasure N`` (default 1) each compared level is measured N more times, each a new
draw at the same load, and each draw predicted too: how far a second measurement of the same
load lands from the first is the measurement's own noise, the floor under any prediction.
Printed per mode: the measured and predicted SLO-max load (objectives on ``ttft_ms.p90``
and ``itl_ms.p99``) with the error (target: within 15 %), and TTFT and ITL p50 and p90,
measured and predicted, at the three highest measured loads at or below the measured knee
(target: within 20 %), and at or below the measured SLO-max (nearer saturation).

Then the black box: a step-time model fitted only from the first sweep's results files of
``--blackbox-mode`` (``loadlab simulate --fit-results``'s fit) predicts the SLO-max load for a
second SLO, held against a measured sweep for that SLO on the same server (target: within
20 %).

Nothing is tuned to the measurement: the fits never see the measured latencies they are
compared with (the white box sees only step times, of the model alone or of the server under
the calibration load, never the sweep's; the black box only the first SLO's sweep). Expect noise on a shared machine: two measured sweeps minutes apart have
differed by 3-20 % here (docs/benchmarks.md, sweep repeatability).

Usage::

    python3 benchmarks/simulate_vs_sweep.py                       # every mode, ~12 min
    python3 benchmarks/simulate_vs_sweep.py --rates 1,2,4,6,8,12,16,24,32 --duration 30 \
        --calibrate 2:10,16:15                                    # 30-second levels, ~35 min
    python3 benchmarks/simulate_vs_sweep.py --modes continuous --rates 1,2 --duration 4 \\
        --bisect-steps 0 --quick-fit                              # a dry run, ~1 min
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadlab._analysis.server_metrics import parse_prometheus_text  # noqa: E402
from loadlab._capacity.vs_run import fetch_server_info  # noqa: E402
from loadlab._commands import run as run_command  # noqa: E402
from loadlab._runner.sweep import level_config  # noqa: E402
from loadlab._slo import load_slo  # noqa: E402
from loadlab.simulate import _fit as fit  # noqa: E402
from loadlab.simulate._capacity import predicted_sweep  # noqa: E402
from loadlab.simulate._engine import Simulator  # noqa: E402
from loadlab.simulate._server import ServerConfig as SimServer  # noqa: E402
from loadlab.simulate._versus import curves_of  # noqa: E402
from loadlab.workloads import build_requests  # noqa: E402
from reference_server.config import ServerConfig  # noqa: E402
from reference_server.launch import start_server  # noqa: E402

LOAD_TARGET_PCT = 15.0
LATENCY_TARGET_PCT = 20.0
BLACKBOX_TARGET_PCT = 20.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_setup_arguments(p)
    # 4 rps apart and bisected twice: 1 rps resolution, 5-10 % at the 10-20 rps limits here
    p.add_argument("--rates", default="4,8,12,16,20,24,28,32", help="sweep levels, requests/s")
    p.add_argument("--bisect-steps", type=int, default=2)
    p.add_argument("--fit", choices=("steps", "reference"), default="steps",
                   help="the sweep's model: the server's step log under the calibration load "
                   "(steps), or the model's steps timed alone here (reference)")  # fmt: skip
    p.add_argument("--calibrate", default="2:4,16:6",
                   help="calibration load before each sweep: concurrency:seconds, ...")  # fmt: skip
    p.add_argument("--recalibrate", action=argparse.BooleanOptionalAction, default=True,
                   help="calibrate again after each sweep and predict it with one fit to both "
                   "calibrations (interleaved with the measurement)")  # fmt: skip
    p.add_argument("--own-steps", action=argparse.BooleanOptionalAction, default=True,
                   help="also predict each sweep with a fit to its own step log: not a "
                   "prediction, a check of the scheduling apart from the step prices")  # fmt: skip
    p.add_argument("--remeasure", type=int, default=1, metavar="N",
                   help="measure each compared level N more times, each a new draw at the "
                   "same load: how close a second measurement comes to the first (the floor "
                   "under any prediction's error), and the prediction of each new draw")  # fmt: skip
    p.add_argument("--also-reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also predict each sweep with the model timed alone (one fit, first)")  # fmt: skip
    # TTFT p90 loose enough for static batching (a request waits for the running batch).
    # The second SLO binds earlier, on queueing (TTFT p90 four times tighter). Not on the
    # ITL tail: "itl_ms.p99 <= 100" sat between the measured and the priced cost of a
    # continuous step with two 64-token prefills beside 12 rows (109 against 116-118 ms),
    # a knife edge where a 7 % step-price error flips every level's verdict.
    p.add_argument("--slo", default="ttft_ms.p90 <= 2000,itl_ms.p99 <= 200",
                   help="the sweep's objectives, comma-separated")  # fmt: skip
    p.add_argument("--slo2", default="ttft_ms.p90 <= 500,itl_ms.p99 <= 200",
                   help="the black box's second SLO")  # fmt: skip
    # Short levels cannot decide a p90 at 95 % confidence (that takes ~30 requests): an
    # objective fails when its interval is wholly past the threshold. The predicted sweep
    # judges its levels (as many requests) by the same rule.
    p.add_argument("--inconclusive", choices=("pass", "fail"), default="pass")
    # Latencies here are 50 ms and up; on a loaded 2-core machine the client's loop lags
    # past the default 20 ms and every level would be invalid.
    p.add_argument("--saturation-lag-ms", type=float, default=50.0)
    p.add_argument("--blackbox-mode", default="continuous", help="'' to skip the black box")
    p.add_argument("--rates2", default="1,2,4,6,8,12,16,24", help="the black box's sweep levels")
    # The median step, not the fastest: the server's steps share the machine as the fit's do.
    p.add_argument("--fastest", dest="typical", action="store_false",
                   help="fit the fastest of the repeats instead of their median")  # fmt: skip
    p.add_argument("--quick-fit", action="store_true", help="a small fit grid (dry runs)")
    p.add_argument("--out-dir", default="reports/simulate-vs-sweep")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    slo1 = _slo_file(out / "slo1.toml", args.slo, args, args.rates)
    slo2 = _slo_file(out / "slo2.toml", args.slo2, args, args.rates2)
    t_start = time.monotonic()
    print(f"load average before: {_loadavg()}", flush=True)
    summary: dict[str, Any] = {"args": vars(args), "loadavg_before": _loadavg(), "modes": {}}
    reference = None
    if args.fit == "reference" or args.also_reference:
        reference = _reference_fit(args, out / "fit-reference.json")
    for mode in [m for m in args.modes.split(",") if m]:
        summary["modes"][mode] = _one_mode(mode, args, out, slo1, slo2, reference)
        _print_mode(mode, summary["modes"][mode])
    summary["loadavg_after"] = _loadavg()
    summary["wall_s"] = round(time.monotonic() - t_start, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    _print_tables(summary)
    print(f"load average after: {summary['loadavg_after']}; {summary['wall_s']:.0f} s; "
          f"{out / 'summary.json'}")  # fmt: skip
    return 0


def _reference_fit(args: argparse.Namespace, path: Path) -> Path:
    """The reference model's steps timed alone in this process (median of the repeats)."""
    t0 = time.monotonic()
    grid = (
        {"batches": (1, 4, 16), "contexts": (160,), "prompts": (128, 512), "repeats": 1}
        if args.quick_fit
        else {
            "batches": (1, 2, 4, 8, 16),
            "contexts": (64, 128),
            "prompts": (32, 64, 128, 256),
            "repeats": 3,
        }
    )
    model = fit.fit_reference(args.preset, threads=args.threads, typical=args.typical, **grid)
    path.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
    print(f"model timed alone: fit in {time.monotonic() - t0:.0f} s", flush=True)
    print(fit.residual_table(model), flush=True)
    return path


def _calibrate(url: str, args: argparse.Namespace, out: Path, mode: str,
               tag: str = "") -> dict[str, Any]:  # fmt: skip
    """The calibration load; returns the step log of it and the KV transfers it made."""
    before = _scrape(url)
    t_begin = time.perf_counter_ns()
    for i, part in enumerate(p for p in args.calibrate.split(",") if p):
        conc, seconds = part.split(":")
        cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model", "loadlab-ref",
               "--concurrency", conc, "--duration", seconds,
               "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
               "--seed", str(1000 + i + (100 if tag else 0)),
               "--out", str(out / f"calibrate-{mode}{tag}-{i}.json")]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)
    after = _scrape(url)
    steps = [e for e in fit.read_step_log(url) if e["start_ns"] >= t_begin]
    (out / f"steps-{mode}{tag}.json").write_text(json.dumps(steps), encoding="utf-8")
    kv = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _KV_KEYS}
    return {"steps": steps, "kv": kv}


def add_setup_arguments(p: argparse.ArgumentParser) -> None:
    """The server and load options, shared with ``simulate_diagnose.py`` (which looks at one
    level of this very setup, so the two must not drift apart)."""
    p.add_argument("--modes", default="static,continuous,chunked,disaggregated")
    p.add_argument("--preset", default="cpu")
    # One torch thread: on a loaded 2-core machine two threads spin against each other (a
    # batch-1 decode step measured 270 ms with two, 31 ms with one, minutes apart).
    p.add_argument("--threads", type=int, default=1, help="torch threads (server and fit)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=16)


def _one_mode(mode: str, args: argparse.Namespace, out: Path, slo1: Path, slo2: Path,
              reference: Path | None) -> dict:  # fmt: skip
    config = ServerConfig(mode=mode, preset=args.preset, threads=args.threads, port=0,
                          max_num_seqs=args.max_num_seqs)  # fmt: skip
    res: dict[str, Any] = {}
    with start_server(config=config, timeout_s=300) as srv:
        url = str(srv.url)
        info = fetch_server_info(url)
        _warm_up(url, args, out / f"warmup-{mode}.json")
        flags = _sim_flags(mode, info)
        if args.fit == "steps":
            t0 = time.monotonic()
            cal = _calibrate(url, args, out, mode)
            model = fit.fit_step_log(cal["steps"], f"{mode} server's steps, calibration load")
            fit_path = out / f"fit-{mode}.json"
            fit_path.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
            print(f"[{mode}] fit to {len(cal['steps'])} server steps in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)  # fmt: skip
            print(fit.residual_table(model), flush=True)
            # the transfers the calibration made, as one effective rate (their fixed cost
            # included): what the decode worker measured from receive to import
            gbps = _kv_rate(cal["kv"])
            if gbps is not None:
                flags += ["--kv-transfer-gbps", f"{gbps:.4g}", "--kv-transfer-latency-ms", "0"]
                res["kv_transfer"] = {**cal["kv"], "gbps": gbps}
        else:
            assert reference is not None  # main fits it for --fit reference
            fit_path = reference
        res["fit"] = json.loads(fit_path.read_text(encoding="utf-8"))
        res["server_info"] = {k: info.get(k) for k in ("num_kv_blocks", "max_model_len",
                              "max_num_batched_tokens", "block_size", "prefix_caching")}  # fmt: skip
        sweep_dir = out / mode
        t_sweep = time.perf_counter_ns()  # the server's step log uses the same clock
        kv_before = _scrape(url)
        _sweep(url, args, slo1, sweep_dir, ["--predict", "--step-model", str(fit_path), *flags])
        res.update(_read_versus(sweep_dir))
        if args.fit == "steps":  # the same fit, every step at its median (no measured spread)
            res["median"] = _predict_with(url, sweep_dir, fit_path, args, info, mode, slo1,
                                          kv_gbps=res.get("kv_transfer", {}).get("gbps"),
                                          jitter=False)  # fmt: skip
        if args.own_steps:
            sweep_kv = _kv_gbps(kv_before, _scrape(url))
            res["own"] = _own_steps(url, args, out, mode, t_sweep, sweep_dir, info, slo1, sweep_kv)
        if args.fit == "steps":  # after the step log of the sweep alone was read
            res.update(_remeasure(url, args, mode, sweep_dir, fit_path, info,
                                  res.get("kv_transfer", {}).get("gbps")))  # fmt: skip
        if args.fit == "steps" and args.recalibrate:
            res["bracket"] = _bracket(url, args, out, mode, cal, sweep_dir, info, slo1)
        if reference is not None and args.fit == "steps":
            res["reference"] = _predict_with(
                url,
                sweep_dir,
                reference,
                args,
                info,
                mode,
                slo1,
                kv_gbps=res.get("kv_transfer", {}).get("gbps"),
            )
        if mode == args.blackbox_mode:
            res["blackbox"] = _blackbox(url, args, slo2, out, sweep_dir, mode, info)
    return res


def _own_steps(url: str, args: argparse.Namespace, out: Path, mode: str, t_sweep: int,
               sweep_dir: Path, info: dict[str, Any], slo: Path,
               kv_gbps: float | None) -> dict[str, Any]:  # fmt: skip
    """Not a prediction: the sweep predicted again by a model fitted to the steps the server
    took during that very sweep (step times only, never a latency). What is left of the error
    then is the simulator's scheduling and queueing, not the step prices: it separates the
    two, where the calibrations cannot follow a machine whose speed drifts."""
    steps = [e for e in fit.read_step_log(url) if e["start_ns"] >= t_sweep]
    (out / f"steps-{mode}-sweep.json").write_text(json.dumps(steps), encoding="utf-8")
    try:
        model = fit.fit_step_log(steps, f"{mode} server's steps during the measured sweep")
    except ValueError as exc:  # too few step shapes (a short sweep of one prompt length)
        print(f"[{mode}] no fit to the sweep's own steps: {exc}", flush=True)
        return {}
    path = out / f"fit-{mode}-own.json"
    path.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
    print(f"[{mode}] fit to the sweep's own {len(steps)} steps (a check, not a prediction)\n"
          f"{fit.residual_table(model)}", flush=True)  # fmt: skip
    res = _predict_with(url, sweep_dir, path, args, info, mode, slo, kv_gbps=kv_gbps)
    return {**res, "steps": len(steps), "kv_gbps": kv_gbps,
            "levels": _level_own(steps, sweep_dir, args, info, mode, url, kv_gbps)}  # fmt: skip


def _level_own(steps: list[dict[str, Any]], sweep_dir: Path, args: argparse.Namespace,
               info: dict[str, Any], mode: str, url: str,
               kv_gbps: float | None) -> dict[str, Any]:  # fmt: skip
    """Not a prediction: each compared level simulated with a fit to the steps the server
    took during that level alone (its results file's ``t0_ns`` is on the step log's clock).
    The step prices then cannot have drifted since they were measured, so what is left of
    the error is the simulator's scheduling and the spread it draws."""
    if not (sweep_dir / "predicted.json").is_file():
        return {}
    from loadlab.results import read_results

    measured = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    curve = json.loads((sweep_dir / "predicted.json").read_text(encoding="utf-8"))["curves"]
    loads = _compared_loads(measured, curve["measured"])["latency"]
    by_load = {}
    for path in sweep_dir.glob("level-*.json"):
        res = read_results(path)
        by_load[float(res.config.get("rate_rps") or 0)] = res
    base = _base_config(args, url)
    server = _sim_server(mode, info, kv_gbps)
    rows = []
    for load in loads:
        level = by_load.get(load)
        if level is None or "t0_ns" not in level.extra:
            continue
        t0 = int(level.extra["t0_ns"])
        mine = [e for e in steps if t0 <= e["start_ns"] <= t0 + level.duration_ns]
        try:
            model = fit.fit_step_log(mine, f"{mode} server's steps at {load:g} rps")
        except ValueError:  # too few shapes at a low level
            continue
        cfg = level_config(base, load, "rate")
        sim = Simulator(cfg, server, model).run(build_requests(cfg)).to_results()
        rows.append(_cells(load, curve["measured"][_key(curve["measured"], load)],
                           curves_of({load: sim})[load]))  # fmt: skip
    return {"predicted_max": None, "max_error_pct": None, "latency": rows}


def _remeasure(url: str, args: argparse.Namespace, mode: str, sweep_dir: Path, fit_path: Path,
               info: dict[str, Any], kv_gbps: float | None) -> dict[str, Any]:  # fmt: skip
    """The compared levels measured again, ``--remeasure`` times each, every time a new draw
    of arrivals and prompts at the same load (the sweep's own seed would send prompts the
    server's prefix cache still holds), and each new draw predicted with the calibration's
    fit (as ``sweep --predict`` predicted the first). ``again``: each second measurement
    against the first, the measurement's own noise, which no prediction can be expected to
    beat. ``again_predicted``: the prediction against the second measurement."""
    if args.remeasure <= 0 or not (sweep_dir / "predicted.json").is_file():
        return {}
    from loadlab.results import read_results
    from loadlab.simulate._steptime import model_from_dict

    measured = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    curve = json.loads((sweep_dir / "predicted.json").read_text(encoding="utf-8"))["curves"]
    first = curve["measured"]
    model = model_from_dict(json.loads(fit_path.read_text(encoding="utf-8")))
    base = _base_config(args, url)
    server = _sim_server(mode, info, kv_gbps)
    again: list[dict[str, Any]] = []
    predicted: list[dict[str, Any]] = []
    for k in range(1, args.remeasure + 1):
        for load in _compared_loads(measured, first)["latency"]:
            cfg = level_config(base.replace(seed=base.request_seed + k), load, "rate")
            path = sweep_dir / f"again-{k}-rate-{load:g}.json"
            cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model",
                   "loadlab-ref", "--rate", f"{load:g}", "--duration", str(args.duration),
                   "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
                   "--seed", str(cfg.seed), "--saturation-lag-ms", str(args.saturation_lag_ms),
                   "--out", str(path)]  # fmt: skip
            subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
            if not path.is_file():
                print(f"[{mode}] measuring {load:g} rps again wrote nothing", flush=True)
                continue
            second = curves_of({load: read_results(path)})[load]
            sim = Simulator(cfg, server, model).run(build_requests(cfg)).to_results()
            again.append(_cells(load, first[_key(first, load)], second))
            predicted.append(_cells(load, second, curves_of({load: sim})[load]))
    return {"again": {"predicted_max": None, "max_error_pct": None, "latency": again},
            "again_predicted": {"predicted_max": None, "max_error_pct": None,
                                "latency": predicted}}  # fmt: skip


def _bracket(url: str, args: argparse.Namespace, out: Path, mode: str, before: dict[str, Any],
             sweep_dir: Path, info: dict[str, Any], slo: Path) -> dict[str, Any]:  # fmt: skip
    """The calibration again after the sweep, and the sweep predicted by one fit to both
    calibrations' steps: a calibration on each side of the measurement (interleaved), so a
    machine whose speed drifts during the sweep is met half way. Also says the drift: the
    after-fit's price of a few step shapes against the before-fit's."""
    after = _calibrate(url, args, out, mode, tag="-after")
    source = f"{mode} server's steps, calibration loads before and after the sweep"
    model = fit.fit_step_log(before["steps"] + after["steps"], source)
    path = out / f"fit-{mode}-bracket.json"
    path.write_text(json.dumps(model.to_dict(), indent=2) + "\n", encoding="utf-8")
    print(f"[{mode}] fit to {len(before['steps'])} + {len(after['steps'])} server steps "
          f"(before and after the sweep)\n{fit.residual_table(model)}", flush=True)  # fmt: skip
    one = fit.fit_step_log(before["steps"], "before")
    two = fit.fit_step_log(after["steps"], "after")
    drift = {}
    # (prefill tokens, decode rows, attention pairs, KV tokens read): one 64-token prompt,
    # one decode row at context 80, 16 rows at context 80 (the default load's shapes)
    for name, shape in (("prefill 64", (64, 0, 2080, 0)), ("decode 1 x 80", (0, 1, 81, 80)),
                        ("decode 16 x 80", (0, 16, 1296, 1280))):  # fmt: skip
        b, a = float(one.step_s(*shape)), float(two.step_s(*shape))
        drift[name] = {"before_ms": b * 1e3, "after_ms": a * 1e3, "change_pct": _err(a, b)}
    print(f"[{mode}] drift of the step prices during the sweep (after vs before): " + ", ".join(
        f"{k} {v['before_ms']:.1f} -> {v['after_ms']:.1f} ms ({v['change_pct']:+.0f} %)"
        for k, v in drift.items()), flush=True)  # fmt: skip
    kv = {k: before["kv"][k] + after["kv"][k] for k in before["kv"]}
    gbps = _kv_rate(kv)
    res = _predict_with(url, sweep_dir, path, args, info, mode, slo, kv_gbps=gbps)
    return {**res, "fit": model.to_dict(), "drift": drift}


_KV_KEYS = ("kv_transfers_total", "kv_transfer_seconds_total", "kv_transfer_bytes_total")


def _kv_gbps(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The KV transfers between two scrapes as one effective rate, GB/s (None: none made)."""
    return _kv_rate({k: after.get(k, 0.0) - before.get(k, 0.0) for k in _KV_KEYS})


def _kv_rate(kv: dict[str, float]) -> float | None:
    if kv.get("kv_transfers_total") and kv.get("kv_transfer_seconds_total", 0) > 0:
        return kv["kv_transfer_bytes_total"] / kv["kv_transfer_seconds_total"] / 1e9
    return None


def _predict_with(url: str, sweep_dir: Path, model_path: Path, args: argparse.Namespace,
                  info: dict[str, Any], mode: str, slo: Path,
                  kv_gbps: float | None = None, jitter: bool = True) -> dict[str, Any]:  # fmt: skip
    """The same measured sweep predicted by another step-time model (simulation only): the
    model timed alone, the fit to both calibrations, or the fit to the sweep's own steps;
    ``jitter=False``: every step at its shape's median (``--step-jitter off``)."""
    if not (sweep_dir / "sweep.json").is_file():
        return {}
    from loadlab.simulate._steptime import model_from_dict, without_jitter

    model = model_from_dict(json.loads(model_path.read_text(encoding="utf-8")))
    if not jitter:
        model = without_jitter(model)
    base = _base_config(args, url)
    server = _sim_server(mode, info, kv_gbps)
    rates = [float(x) for x in args.rates.split(",")]
    predicted, runs = predicted_sweep(base, server, model, load_slo(slo), rates,
                                      bisect_steps=args.bisect_steps,
                                      inconclusive=args.inconclusive)  # fmt: skip
    measured = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    m_max, q_max = measured.get("max_passing_load"), predicted.max_passing_load
    out: dict[str, Any] = {"predicted_max": q_max, "max_error_pct": _err(q_max, m_max)}
    pred = json.loads((sweep_dir / "predicted.json").read_text(encoding="utf-8"))
    curves = pred["curves"]
    for name, loads in _compared_loads(measured, curves["measured"]).items():
        out[name] = []
        for load in loads:
            if load not in runs:
                cfg = level_config(base, load, "rate")
                runs[load] = Simulator(cfg, server, model).run(build_requests(cfg)).to_results()
            curve = curves_of({load: runs[load]})[load]
            out[name].append(
                _cells(load, curves["measured"][_key(curves["measured"], load)], curve)
            )
    return out


def _compared_loads(measured: dict[str, Any], curve: dict[str, Any]) -> dict[str, list[float]]:
    """The measured loads whose latencies are compared: the three highest at or below the
    measured knee (``latency``: the acceptance's "three load levels below the knee"; the
    SLO-max where no knee was found), and the three highest at or below the measured SLO-max
    (``latency_slo_max``: nearer saturation, where TTFT is the most sensitive)."""
    loads = sorted(float(x) for x in curve)
    m_max, knee = measured.get("max_passing_load"), measured.get("knee_load")
    at_max = [x for x in loads if m_max is not None and x <= m_max + 1e-9][-3:]
    at_knee = [x for x in loads if knee is not None and x <= knee + 1e-9][-3:]
    return {"latency": at_knee or at_max, "latency_slo_max": at_max}


def _cells(load: float, measured: dict[str, Any], predicted: dict[str, Any]) -> dict[str, Any]:
    """TTFT and ITL p50 / p90 at one load, measured and predicted, with the error."""
    row: dict[str, Any] = {"load": load}
    for metric in ("ttft_ms", "itl_ms"):
        for pct in ("p50", "p90"):
            m, q = measured[metric][pct], predicted[metric][pct]
            row[f"{metric}.{pct}"] = {"measured": m, "predicted": q, "error_pct": _err(q, m)}
    return row


def _sweep(url: str, args: argparse.Namespace, slo: Path, out_dir: Path, extra: list[str],
           rates: str | None = None) -> None:  # fmt: skip
    cmd = [sys.executable, "-m", "loadlab", "sweep", "--endpoint", url, "--model", "loadlab-ref",
           "--slo", str(slo), "--rates", rates or args.rates, "--bisect-steps", str(args.bisect_steps),
           "--duration", str(args.duration), "--prompt-tokens", str(args.prompt_tokens),
           "--max-tokens", str(args.max_tokens), "--out-dir", str(out_dir),
           "--inconclusive", args.inconclusive, "--saturation-lag-ms", str(args.saturation_lag_ms),
           "--seed", "0", *extra]  # fmt: skip
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    print(done.stdout[-3000:], flush=True)
    if done.returncode not in (0, 1):  # said, and the table shows the gap
        print(f"loadlab sweep exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr)


def _warm_up(url: str, args: argparse.Namespace, path: Path) -> None:
    """A few requests first, so the first level does not pay for the workers' first steps
    (allocator, thread pool), which the simulator does not model."""
    cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model", "loadlab-ref",
           "--concurrency", "2", "--requests", "4", "--prompt-tokens", str(args.prompt_tokens),
           "--max-tokens", "8", "--out", str(path)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300)


def _sim_flags(mode: str, info: dict[str, Any]) -> list[str]:
    """The simulated server set as the measured one reports itself."""
    blocks = int(info["num_kv_blocks"])
    if mode == "disaggregated":  # the total over workers; each simulated worker has its share
        blocks //= 2
    flags = ["--mode", mode, "--num-kv-blocks", str(blocks),
             "--max-model-len", str(info["max_model_len"]),
             "--max-num-seqs", str(info["max_num_seqs"]),
             "--block-size", str(info.get("block_size", 16)),
             "--prefix-caching", "on" if info.get("prefix_caching", True) else "off"]  # fmt: skip
    if info.get("max_num_batched_tokens"):
        flags += ["--max-batched-tokens", str(info["max_num_batched_tokens"])]
    return flags


def _read_versus(sweep_dir: Path) -> dict[str, Any]:
    if not (sweep_dir / "predicted.json").is_file():
        return {"measured_max": None, "predicted_max": None, "max_error_pct": None,
                "levels": [], "latency": [], "latency_slo_max": []}  # fmt: skip
    measured = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    pred = json.loads((sweep_dir / "predicted.json").read_text(encoding="utf-8"))
    m_max = measured.get("max_passing_load")
    p_max = pred["predicted"].get("max_passing_load")
    curves = pred["curves"]
    out: dict[str, Any] = {"measured_max": m_max, "predicted_max": p_max,
                           "max_error_pct": _err(p_max, m_max), "knee": measured.get("knee_load"),
                           "levels": [lv["load"] for lv in measured.get("levels", [])]}  # fmt: skip
    for name, loads in _compared_loads(measured, curves["measured"]).items():
        out[name] = [_cells(x, curves["measured"][_key(curves["measured"], x)],
                            curves["predicted"][_key(curves["predicted"], x)]) for x in loads]  # fmt: skip
    return out


def _blackbox(url: str, args: argparse.Namespace, slo2: Path, out: Path, sweep_dir: Path,
              mode: str, info: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Fit from the first sweep's results only; predict the second SLO's SLO-max load; then
    measure it with a second sweep on the same server."""
    files = sorted(sweep_dir.glob("level-*.json"))
    model = fit.fit_results(files)
    print(f"[{mode}] black-box fit\n{fit.residual_table(model)}", flush=True)
    rates = [float(x) for x in args.rates2.split(",")]
    base = _base_config(args, url)
    server = _sim_server(mode, info)
    predicted, _ = predicted_sweep(base, server, model, load_slo(slo2), rates,
                                   bisect_steps=args.bisect_steps,
                                   inconclusive=args.inconclusive)  # fmt: skip
    second = out / f"{mode}-slo2"
    _sweep(url, args, slo2, second, [], args.rates2)
    path = second / "sweep.json"
    measured = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    m, q = measured.get("max_passing_load"), predicted.max_passing_load
    return {"fit": model.to_dict(), "measured_max": m, "predicted_max": q, "error_pct": _err(q, m)}


def _base_config(args: argparse.Namespace, url: str) -> Any:
    """The measured sweep's own load, built from the same flags as ``_sweep``'s command
    (``--endpoint`` included: without one ``run`` would take its demo load, two-turn chat
    sessions, where the sweep against an endpoint sends synthetic prompts)."""
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    rate = args.rates.split(",")[0]
    return run_command.config_from_args(parser.parse_args([
        "--endpoint", url, "--model", "loadlab-ref", "--rate", rate, "--duration", str(args.duration),
        "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
        "--seed", "0"]))  # fmt: skip


def _sim_server(mode: str, info: dict[str, Any], kv_gbps: float | None = None) -> SimServer:
    """The simulated server as the measured one reports itself (``_sim_flags`` in Python);
    ``kv_gbps``: the KV transfers measured, as one effective rate (their fixed cost in it)."""
    blocks = int(info["num_kv_blocks"]) // (2 if mode == "disaggregated" else 1)
    server = SimServer(mode=mode, num_kv_blocks=blocks, max_num_seqs=int(info["max_num_seqs"]),
                       max_model_len=int(info["max_model_len"]),
                       max_num_batched_tokens=info.get("max_num_batched_tokens"),
                       prefix_caching=bool(info.get("prefix_caching", True)),
                       kv_bytes_per_token=int(info.get("kv_bytes_per_token", 0)))  # fmt: skip
    if kv_gbps:
        server = dataclasses.replace(server, kv_transfer_bytes_per_s=kv_gbps * 1e9,
                                     kv_transfer_latency_s=0.0)  # fmt: skip
    return server


def _scrape(url: str) -> dict[str, float]:
    """``/metrics`` as name -> value (the full name with labels, prefix dropped)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310 (our server)
        text = r.read().decode()
    parsed = parse_prometheus_text(text)
    return {name.removeprefix("loadlab_server_"): value for name, value in parsed.items()}


def _slo_file(path: Path, objectives: str, args: argparse.Namespace, rates: str) -> Path:
    # A short level still decides: most of the lowest level's requests suffice.
    low = float(rates.split(",")[0])
    min_requests = max(3, int(low * args.duration * 0.5))
    body = ", ".join(json.dumps(o.strip()) for o in objectives.split(",") if o.strip())
    path.write_text(f'name = "simulate vs sweep"\nmin_requests = {min_requests}\n'
                    f"objectives = [{body}]\n", encoding="utf-8")  # fmt: skip
    return path


def _key(curve: dict[str, Any], load: float) -> str:
    return min(curve, key=lambda k: abs(float(k) - load))


def _err(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or meas == 0 or math.isnan(meas) or math.isnan(pred):
        return None
    return (pred - meas) / meas * 100.0


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text(encoding="utf-8").strip()
    except OSError:
        return "n/a"


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None, target: float) -> str:
    if x is None:
        return "-"
    return f"{x:+.1f} %" + ("" if abs(x) <= target else " (over)")


def _print_mode(mode: str, r: dict[str, Any]) -> None:
    print(f"[{mode}] SLO-max measured {_fmt(r['measured_max'], 2)} rps, predicted "
          f"{_fmt(r['predicted_max'], 2)} rps: {_pct(r['max_error_pct'], LOAD_TARGET_PCT)}",
          flush=True)  # fmt: skip


def _print_latency(modes: dict[str, Any]) -> None:
    """TTFT and ITL p50 / p90, measured and predicted, at each mode's compared loads: at or
    below the measured knee (the acceptance), then at or below the measured SLO-max."""
    for key, where in (("latency", "the three highest loads at or below the measured knee"),
                       ("latency_slo_max", "the three highest at or below the measured SLO-max")):  # fmt: skip
        _print_cells(modes, key, where)


def _print_cells(modes: dict[str, Any], key: str, where: str) -> None:
    print(f"\nat {where}:")
    print("| mode | load (rps) | TTFT p50 meas / pred (ms) | TTFT p90 | ITL p50 | ITL p90 |")
    print("| --- | --- | --- | --- | --- | --- |")
    n_in = n_all = 0
    for mode, r in modes.items():
        for row in r.get(key, []):
            cells = []
            for cell in ("ttft_ms.p50", "ttft_ms.p90", "itl_ms.p50", "itl_ms.p90"):
                c = row[cell]
                e = c["error_pct"]
                n_all += 1
                n_in += e is not None and abs(e) <= LATENCY_TARGET_PCT
                cells.append(f"{_fmt(c['measured'])} / {_fmt(c['predicted'])} "
                             f"({_pct(e, LATENCY_TARGET_PCT)})")  # fmt: skip
            print(f"| {mode} | {row['load']:g} | " + " | ".join(cells) + " |")
    print(f"\nlatency cells within {LATENCY_TARGET_PCT:g} %: {n_in} of {n_all}")


def _print_tables(summary: dict[str, Any]) -> None:
    modes = summary["modes"]
    print("\n| mode | levels run (rps) | measured SLO-max (rps) | predicted (rps) | error |")
    print("| --- | --- | --- | --- | --- |")
    for mode, r in modes.items():
        levels = ", ".join(f"{x:g}" for x in r["levels"])
        print(f"| {mode} | {levels} | {_fmt(r['measured_max'], 2)} | "
              f"{_fmt(r['predicted_max'], 2)} | {_pct(r['max_error_pct'], LOAD_TARGET_PCT)} |")  # fmt: skip
    _print_latency(modes)
    for key, title in (
        (
            "again",
            "nothing: each compared level measured again, a new draw at the same load "
            "(--remeasure; 'predicted' is the second measurement, the error its distance from "
            "the first: the measurement's own noise)",
        ),
        (
            "again_predicted",
            "the calibration's fit, for each second measurement's own draw (--remeasure)",
        ),
        ("median", "the same fit with every step at its shape's median (--step-jitter off)"),
        ("bracket", "one fit to the calibrations before and after each sweep (--recalibrate)"),
        ("own", "a fit to each sweep's own steps (--own-steps; a check, not a prediction)"),
        ("levels", "a fit to each level's own steps (--own-steps; a check: no drift)"),
        ("reference", "the model timed alone (--fit reference)"),
    ):
        if key == "levels":
            other = {m: r["own"]["levels"] for m, r in modes.items()
                     if (r.get("own") or {}).get("levels")}  # fmt: skip
        else:
            other = {mode: r[key] for mode, r in modes.items() if r.get(key)}
        if not other:
            continue
        print(f"\nthe same measured sweeps predicted by {title}:")
        print("| mode | predicted SLO-max (rps) | error | latency cells within 20 % (knee) |")
        print("| --- | --- | --- | --- |")
        for mode, r in other.items():
            errs = [row[k]["error_pct"] for row in r["latency"] for k in row if k != "load"]
            within = sum(e is not None and abs(e) <= LATENCY_TARGET_PCT for e in errs)
            print(f"| {mode} | {_fmt(r['predicted_max'], 2)} | "
                  f"{_pct(r['max_error_pct'], LOAD_TARGET_PCT)} | {within} of {len(errs)} |")  # fmt: skip
        if key in ("bracket", "own", "median", "again", "again_predicted"):
            _print_latency(other)
        elif key == "levels":
            _print_cells(other, "latency", "the three highest loads at or below the knee")
    for mode, r in modes.items():
        bb = r.get("blackbox")
        if bb:
            print(f"black box ({mode}, second SLO): measured {_fmt(bb['measured_max'], 2)} rps, "
                  f"predicted {_fmt(bb['predicted_max'], 2)} rps: "
                  f"{_pct(bb['error_pct'], BLACKBOX_TARGET_PCT)}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
