"""Per process, the distributed sender against ``loadlab run --workers 1``, at one timing error.

For each rate of a ladder, the same open-loop load (seeded Poisson arrivals, fixed-length
streamed answers from the fixed-schedule server, which stamps each request's arrival) is sent
twice from this machine:

  single   ``loadlab run --start-at T`` (one process, loadlab's runner)
  fleet    Locust's master and ``--fleet-workers`` workers (``examples/locust_openloop.py``),
           each worker running its shard with loadlab's runner, records streamed to the master;
           the rate is multiplied by the worker count so each sending process gets the
           single run's rate

and prints, per sending process: output tokens/s, arrivals behind schedule at the server
(p50 / p99 / max, ms: the server's arrival stamp minus the intended time from the common
start) and whether the generator marked itself saturated. The summary line gives, for each
mode, the highest rate per process whose arrivals p99 stayed within ``--bound-ms``, and their
ratio (the target: the fleet carries at least 80 % of the single process).

Usage (run alone on an idle machine; a few minutes)::

    python3 benchmarks/distributed_sender.py                       # 100..1600 req/s, 2 ms
    python3 benchmarks/distributed_sender.py --rates 20,40 --seconds 3   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab.results import Results, read_results  # noqa: E402
from loadlab.selftest import FixedServerProcess  # noqa: E402

LOCUSTFILE = str(ROOT / "examples" / "locust_openloop.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _truth(url: str, reset: bool = False) -> dict[str, Any]:
    path, body = ("/truth/reset", b"") if reset else ("/truth", None)
    req = urllib.request.Request(url + path, data=body)  # noqa: S310 (loopback)
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (loopback)
        return {} if reset else dict(json.loads(resp.read()))


def _run_args(url: str, rate: float, args: argparse.Namespace) -> list[str]:
    return ["--endpoint", url, "--rate", f"{rate:g}", "--requests", str(int(rate * args.seconds)),
            "--seed", "1", "--tokenizer", "none", "--max-tokens", str(args.tokens),
            "--prompt-tokens", str(args.prompt_tokens)]  # fmt: skip


def _single(url: str, rate: float, args: argparse.Namespace, folder: Path) -> tuple[Results, float]:
    start = time.time() + args.lead_s
    out = folder / f"single-{rate:g}.json"
    cmd = [sys.executable, "-m", "loadlab", "run", *_run_args(url, rate, args), "--no-progress",
           "--start-at", f"{start:.6f}", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, env=ENV, check=False, capture_output=True, timeout=600)
    return read_results(out), start


def _fleet(url: str, rate: float, args: argparse.Namespace, folder: Path) -> tuple[Results, float]:
    n, port = args.fleet_workers, _free_port()
    out, log = folder / f"fleet-{rate:g}.json", folder / f"fleet-{rate:g}.log"
    locust = [sys.executable, "-m", "locust", "-f", LOCUSTFILE]
    run = shlex.join(_run_args(url, rate * n, args))
    with log.open("wb") as fh:
        master = subprocess.Popen(
            [*locust, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
             str(port), "--headless", "--expect-workers", str(n), "-u", str(n),
             "--loadlab-run", run, "--loadlab-out", str(out), "--loadlab-lead", str(args.lead_s)],
            cwd=ROOT, env=ENV, stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
    workers = [
        subprocess.Popen([*locust, "--worker", "--master-port", str(port)], cwd=ROOT, env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(n)
    ]  # fmt: skip
    try:
        master.wait(timeout=600)
    finally:
        for p in [master, *workers]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    res = read_results(out)
    return res, float(res.extra["distributed"]["start_at"])


def measure(res: Results, start: float, truth: dict[str, Any], processes: int) -> dict[str, Any]:
    """Per sending process: tokens/s, arrivals behind schedule at the server, saturation."""
    wall_minus_mono = time.time_ns() - time.perf_counter_ns()  # the server is on this host
    late = np.array([
        (truth[r.request_id]["recv_ns"] + wall_minus_mono - start * 1e9 - r.intended_ns) / 1e6
        for r in res.records if r.ok and r.intended_ns is not None and r.request_id in truth
    ])  # fmt: skip
    lo, hi = res.measurement_window_ns()
    tokens = sum(r.output_tokens or 0 for r in res.records if r.ok)
    pct = (lambda q: float(np.percentile(late, q))) if len(late) else (lambda q: float("nan"))
    return {
        "tokens_per_s_per_process": tokens / max((hi - lo) / 1e9, 1e-9) / processes,
        "ok": sum(r.ok for r in res.records), "records": len(res.records),
        "arrival_p50_ms": pct(50), "arrival_p99_ms": pct(99), "arrival_max_ms": pct(100),
        "saturated": res.saturated,
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="100,200,400,800,1600", help="req/s per sending process")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    p.add_argument("--tokens", type=int, default=32, help="tokens per answer")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--itl-ms", type=float, default=5.0, help="the server's gap between tokens")
    p.add_argument("--fleet-workers", type=int, default=1, help="Locust workers in the fleet")
    p.add_argument("--bound-ms", type=float, default=2.0, help="the timing error compared at")
    p.add_argument("--lead-s", type=float, default=5.0, help="seconds to the common start")
    p.add_argument("--json", type=Path, help="also write every row here")
    args = p.parse_args()
    rows = []
    with FixedServerProcess(ttft_ms=20, itl_ms=args.itl_ms, tokens=args.tokens) as url, \
            tempfile.TemporaryDirectory() as tmp:  # fmt: skip
        for rate in (float(r) for r in args.rates.split(",")):
            for mode, run, processes in (("single", _single, 1),
                                         ("fleet", _fleet, args.fleet_workers)):  # fmt: skip
                _truth(url, reset=True)
                res, start = run(url, rate, args, Path(tmp))
                row = {"mode": mode, "rate_per_process": rate,
                       **measure(res, start, _truth(url), processes)}  # fmt: skip
                rows.append(row)
                print(f"{mode:6} {rate:7g} req/s/process  {row['tokens_per_s_per_process']:9,.0f} "
                      f"tok/s/process  arrivals p50 {row['arrival_p50_ms']:6.2f}  p99 "
                      f"{row['arrival_p99_ms']:7.2f}  max {row['arrival_max_ms']:7.2f} ms  "
                      f"ok {row['ok']}/{row['records']}"
                      f"{'  SATURATED' if row['saturated'] else ''}", flush=True)  # fmt: skip
    best = {}
    for mode in ("single", "fleet"):
        within = [r for r in rows if r["mode"] == mode and r["arrival_p99_ms"] <= args.bound_ms
                  and r["ok"] == r["records"]]  # fmt: skip
        best[mode] = max((r["tokens_per_s_per_process"] for r in within), default=0.0)
    ratio = best["fleet"] / best["single"] if best["single"] else float("nan")
    print(
        f"within arrivals p99 <= {args.bound_ms:g} ms, per process: single "
        f"{best['single']:,.0f} tok/s, fleet {best['fleet']:,.0f} tok/s: ratio {ratio:.2f}"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "best": best, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
