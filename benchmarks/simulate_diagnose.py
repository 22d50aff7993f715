"""Where the simulator's prediction of one load level parts from the server's: step by step.

``simulate_vs_sweep.py`` compares latencies; this looks under them. For each mode it runs one
open-loop level of the comparison's load (synthetic prompts) against the reference server and the same
level through the simulator (same arrivals: the same seed), and prints side by side:

- per step phase (prefill, decode, mixed; disaggregated: the prefill worker's steps are
  ``prefill``, the decode worker's ``decode``): steps, mean step ms and tokens per step, from
  the server's ``/metrics`` (``step_seconds`` and ``tokens_total``, scraped before and after)
  and from the simulated steps (stepped one at a time);
- the step-time model's price of the server's mean step of each phase (its residual there);
- the server's whole steps by shape (``/v1/step_log``: scheduling to tokens handed to the
  API), each against the step-time model's price of that shape;
- TTFT where the server framed it (``/v1/request_log``: received to first token written)
  beside the client's (sent to first chunk read): what HTTP and the client add;
- disaggregated: the measured KV transfers (count, mean ms, mean bytes) beside the model's.

Nothing here feeds a prediction: it is for reading.

Usage::

    python3 benchmarks/simulate_diagnose.py --modes continuous --rate 8 --duration 10
    python3 benchmarks/simulate_diagnose.py --step-model reports/fit-cpu.json   # reuse a fit
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulate_vs_sweep import _scrape, _sim_server, add_setup_arguments  # noqa: E402 - this folder

from loadlab._analysis.metrics import itl_ms, ttft_ms  # noqa: E402
from loadlab._capacity.vs_run import fetch_server_info  # noqa: E402
from loadlab._commands import run as run_command  # noqa: E402
from loadlab.results import read_results  # noqa: E402
from loadlab.simulate._engine import Simulator  # noqa: E402
from loadlab.simulate._fit import fit_reference, points_from_step_log  # noqa: E402
from loadlab.simulate._steptime import StepTimeModel, model_from_dict  # noqa: E402
from loadlab.workloads import build_requests  # noqa: E402
from reference_server.config import ServerConfig  # noqa: E402
from reference_server.launch import start_server  # noqa: E402

PHASES = ("prefill", "decode", "mixed")


class Recording:
    """A step-time model that tallies every step it prices, by phase (stepping one at a time:
    each call is one step)."""

    def __init__(self, inner: StepTimeModel) -> None:
        self.inner = inner
        self.tally: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])

    def step_s(self, prefill_tokens: Any, decode_tokens: Any, attn_pairs: Any, kv: Any) -> Any:
        s = self.inner.step_s(prefill_tokens, decode_tokens, attn_pairs, kv)
        phase = "mixed" if prefill_tokens and decode_tokens else (
            "prefill" if prefill_tokens else "decode")  # fmt: skip
        t = self.tally[phase]
        t[0] += 1
        t[1] += float(s)
        t[2] += float(prefill_tokens)
        t[3] += float(decode_tokens)
        return s

    def describe(self) -> str:
        return self.inner.describe()

    def to_dict(self) -> dict[str, Any]:
        return self.inner.to_dict()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_setup_arguments(p)  # the comparison's server and load
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--step-model", help="a fitted step-time model (default: fit one here)")
    p.add_argument("--out-dir", default="reports/simulate-diagnose")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {_loadavg()}", flush=True)
    if args.step_model:
        model = model_from_dict(json.loads(Path(args.step_model).read_text(encoding="utf-8")))
    else:
        model = fit_reference(args.preset, threads=args.threads, typical=True,
                              batches=(1, 2, 4, 8, 16), contexts=(64, 128),
                              prompts=(32, 64, 128, 256), repeats=3)  # fmt: skip
        (out / "fit.json").write_text(json.dumps(model.to_dict(), indent=2), encoding="utf-8")
    print(model.describe(), flush=True)
    report: dict[str, Any] = {"args": vars(args), "model": model.to_dict(), "modes": {}}
    for mode in [m for m in args.modes.split(",") if m]:
        report["modes"][mode] = r = _one_mode(mode, args, model, out)
        _print_mode(mode, r)
    report["loadavg_after"] = _loadavg()
    (out / "diagnose.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"load average after: {report['loadavg_after']}; {out / 'diagnose.json'}")
    return 0


def _one_mode(mode: str, args: argparse.Namespace, model: StepTimeModel, out: Path) -> dict:
    config = ServerConfig(mode=mode, preset=args.preset, threads=args.threads, port=0,
                          max_num_seqs=args.max_num_seqs)  # fmt: skip
    path = out / f"level-{mode}.json"
    with start_server(config=config, timeout_s=300) as srv:
        url = str(srv.url)
        info = fetch_server_info(url)
        _run(url, args, out / f"warmup-{mode}.json", ["--concurrency", "2", "--requests", "4"])
        before, t_before = _scrape(url), time.perf_counter_ns()
        _run(url, args, path, ["--rate", str(args.rate), "--duration", str(args.duration),
                               "--saturation-lag-ms", "50"])  # fmt: skip
        after = _scrape(url)
        log = _get(url + "/v1/request_log")
        steps = [e for e in _get(url + "/v1/step_log") if e["start_ns"] >= t_before]
    (out / f"steps-{mode}.json").write_text(json.dumps(steps), encoding="utf-8")
    measured = read_results(path)
    # the server's whole steps (step log) by shape, against the model's price of that shape
    by_shape = []
    for role in sorted({e["role"] for e in steps}):
        for pt in points_from_step_log(steps, role):
            price = float(model.step_s(*pt.features())) * 1e3
            by_shape.append({"role": role, "label": pt.label, "measured_ms": pt.seconds * 1e3,
                             "model_ms": price, "error_pct": (price / (pt.seconds * 1e3) - 1) * 100})  # fmt: skip
    server_ttft = [e["ttft_ms"] for e in log if e["received_ns"] >= t_before and e["ttft_ms"]]
    res: dict[str, Any] = {"measured": {"steps": _phase_stats(before, after),
                                        "client": _latency(measured.records),
                                        "server_ttft_ms": _pcts(server_ttft),
                                        "step_log": by_shape}}  # fmt: skip
    kv = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in
          ("kv_transfers_total", "kv_transfer_seconds_total", "kv_transfer_bytes_total")}  # fmt: skip
    if kv["kv_transfers_total"]:
        n = kv["kv_transfers_total"]
        res["measured"]["kv_transfer"] = {"count": n,
                                          "mean_ms": kv["kv_transfer_seconds_total"] / n * 1e3,
                                          "mean_bytes": kv["kv_transfer_bytes_total"] / n}  # fmt: skip
    # the same level simulated, one step at a time
    parser = argparse.ArgumentParser()
    run_command.add_arguments(parser)
    # with --endpoint, as the measured run had: without one, run takes its demo load (chat)
    cfg = run_command.config_from_args(parser.parse_args([
        "--endpoint", url, "--model", "loadlab-ref", "--rate", str(args.rate),
        "--duration", str(args.duration),
        "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens)]))  # fmt: skip
    server = _sim_server(mode, info)
    rec = Recording(model)
    sim = Simulator(cfg, server, rec, fast=False).run(build_requests(cfg)).to_results()
    res["predicted"] = {
        "steps": {ph: {"steps": t[0], "mean_ms": t[1] / t[0] * 1e3, "prefill_per_step": t[2] / t[0],
                       "decode_per_step": t[3] / t[0]}
                  for ph, t in rec.tally.items() if t[0]},
        "client": _latency(sim.records),
    }  # fmt: skip
    if mode == "disaggregated":
        res["predicted"]["kv_transfer_ms_at_mean_bytes"] = None
        if "kv_transfer" in res["measured"]:
            b = res["measured"]["kv_transfer"]["mean_bytes"]
            tokens = b / max(1, server.kv_bytes_per_token)
            res["predicted"]["kv_transfer_ms_at_mean_bytes"] = (
                server.kv_transfer_s(int(tokens)) * 1e3
            )
    # the model's price of the server's mean step of each phase (pairs from the workload's
    # typical context are left out: they are a small part of these steps)
    for st in res["measured"]["steps"].values():
        st["model_ms_at_mean"] = float(model.step_s(st["prefill_per_step"], st["decode_per_step"],
                                                    0.0, 0.0)) * 1e3  # fmt: skip
    return res


def _run(url: str, args: argparse.Namespace, path: Path, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model", "loadlab-ref",
           "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
           "--seed", "0", "--out", str(path), *extra]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (our loopback server)
        return json.loads(r.read())


def _phase_stats(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    out = {}
    for ph in PHASES:
        n = d(f'steps_total{{phase="{ph}"}}')
        if n <= 0:
            continue
        out[ph] = {"steps": n, "mean_ms": d(f'step_seconds_sum{{phase="{ph}"}}') / n * 1e3}
    # tokens_total is per kind, not per phase: spread over the phases that carry each kind
    pre, dec = d('tokens_total{phase="prefill"}'), d('tokens_total{phase="decode"}')
    pre_steps = sum(v["steps"] for k, v in out.items() if k in ("prefill", "mixed"))
    dec_steps = sum(v["steps"] for k, v in out.items() if k in ("decode", "mixed"))
    for k, v in out.items():
        v["prefill_per_step"] = pre / pre_steps if k != "decode" and pre_steps else 0.0
        v["decode_per_step"] = dec / dec_steps if k != "prefill" and dec_steps else 0.0
    return out


def _pcts(xs: list[float]) -> dict[str, float | None]:
    if len(xs) < 2:
        return {"n": len(xs), "p50": None, "p90": None}
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return {"n": len(xs), "p50": statistics.median(xs), "p90": q[8]}


def _latency(records: Any) -> dict[str, Any]:
    ok = [r for r in records if r.ok and r.chunk_ns]
    ttfts = [t for r in ok if (t := ttft_ms(r)) is not None]
    itls = [g for r in ok for g in itl_ms(r)]
    return {"ttft_ms": _pcts(ttfts), "itl_ms": _pcts(itls)}


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text(encoding="utf-8").strip()
    except OSError:
        return "n/a"


def _f(x: Any) -> str:
    return "-" if x is None else f"{x:.1f}"


def _print_mode(mode: str, r: dict[str, Any]) -> None:
    m, q = r["measured"], r["predicted"]
    print(f"\n[{mode}] steps: measured (server /metrics) | simulated")
    for ph in PHASES:
        a, b = m["steps"].get(ph), q["steps"].get(ph)
        if not a and not b:
            continue
        left = (f"{a['steps']:.0f} steps, {a['mean_ms']:.1f} ms, {a['prefill_per_step']:.0f} pre + "
                f"{a['decode_per_step']:.1f} dec/step (model {a['model_ms_at_mean']:.1f} ms)"
                if a else "-")  # fmt: skip
        right = (f"{b['steps']} steps, {b['mean_ms']:.1f} ms, {b['prefill_per_step']:.0f} pre + "
                 f"{b['decode_per_step']:.1f} dec/step" if b else "-")  # fmt: skip
        print(f"  {ph:<8} {left} | {right}")
    print("  whole steps (step log: scheduling to hand-off) by shape | the model's price")
    for row in m["step_log"]:
        print(f"    {row['role']:<8} {row['label']:<36} {row['measured_ms']:7.1f} ms | "
              f"{row['model_ms']:7.1f} ms ({row['error_pct']:+.0f} %)")  # fmt: skip
    for k in ("ttft_ms", "itl_ms"):
        a, b = m["client"][k], q["client"][k]
        print(f"  {k:<8} client p50/p90 {_f(a['p50'])}/{_f(a['p90'])} (n {a['n']}) | "
              f"predicted {_f(b['p50'])}/{_f(b['p90'])} (n {b['n']})")  # fmt: skip
    s = m["server_ttft_ms"]
    print(f"  server-framed TTFT p50/p90 {_f(s['p50'])}/{_f(s['p90'])} (n {s['n']})")
    if "kv_transfer" in m:
        kv = m["kv_transfer"]
        print(f"  KV transfers: {kv['count']:.0f}, mean {kv['mean_ms']:.2f} ms, "
              f"{kv['mean_bytes'] / 1e6:.2f} MB; model "
              f"{_f(q.get('kv_transfer_ms_at_mean_bytes'))} ms")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
