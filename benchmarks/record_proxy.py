"""What ``loadlab record`` costs: the same load direct and through the proxy, alternating.

The fixed-schedule server (``python -m loadlab.selftest``) answers every request on a fixed
schedule (TTFT and ITL), so whatever loadlab measures beyond the direct run's figures is the
proxy's own cost: TTFT and ITL at p50 / p99, direct and via the proxy, at each stream count.
Runs alternate direct, proxy, proxy, direct (``--rounds`` times) so a machine whose speed
drifts affects both alike. Timing figures: run it alone on the machine (the load average is
printed before and after). The proxy's own CPU time per streamed token (user + system over its
runs, request handling included) is printed too: a busy machine changes it far less than the
latencies; the trace writer's (a process of its own, at a lower priority) is printed beside it,
and the proxy's summary line says whether the writer kept up (no trace line lost).

    python3 benchmarks/record_proxy.py --streams 64,256 --requests-per-stream 10 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

from loadlab._analysis import metrics
from loadlab.results import read_results
from loadlab.selftest import FixedServerProcess

ROOT = Path(__file__).resolve().parent.parent


def _run(url: str, streams: int, requests: int, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--concurrency",
           str(streams), "--requests", str(requests), "--tokenizer", "none", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    recs = [r for r in read_results(out).records if r.outcome == "ok"]
    ttft = [t for r in recs if (t := metrics.ttft_ms(r)) is not None]
    itl = [g for r in recs for g in metrics.itl_ms(r)]
    return {
        "ok": len(recs),
        "ttft_p50": float(np.percentile(ttft, 50)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p50": float(np.percentile(itl, 50)),
        "itl_p99": float(np.percentile(itl, 99)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="64,256")
    ap.add_argument("--requests-per-stream", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    with FixedServerProcess(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, tokens=args.tokens) as url:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "loadlab", "record", "--listen", "127.0.0.1:0",
             "--upstream", url, "--out", os.devnull, "--force"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proxy.stdout is not None
        via = proxy.stdout.readline().split()[1]
        cpu_s = {}  # streams -> the proxy's CPU seconds over its runs
        proc = psutil.Process(proxy.pid)
        (writer,) = proc.children()  # the trace writer: its CPU is not the proxy's
        writer_s = {}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                for streams in map(int, args.streams.split(",")):
                    n = streams * args.requests_per_stream
                    for rnd in range(args.rounds):
                        order = ("direct", "proxy") if rnd % 2 == 0 else ("proxy", "direct")
                        for how in order:
                            before = sum(proc.cpu_times()[:2])
                            before_w = sum(writer.cpu_times()[:2])
                            fig = _run(url if how == "direct" else via, streams, n,
                                       Path(tmp) / f"{how}-{streams}-{rnd}.json")  # fmt: skip
                            if how == "proxy":
                                spent = sum(proc.cpu_times()[:2]) - before
                                cpu_s[streams] = cpu_s.get(streams, 0.0) + spent
                                spent_w = sum(writer.cpu_times()[:2]) - before_w
                                writer_s[streams] = writer_s.get(streams, 0.0) + spent_w
                            rows.append({"streams": streams, "round": rnd, "how": how, **fig})
                            print(json.dumps(rows[-1]), flush=True)
        finally:
            proxy.send_signal(signal.SIGTERM)
            _, err = proxy.communicate(timeout=30)
    print(err.strip().splitlines()[-1] if err.strip() else "(the proxy printed no summary)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\nstreams  via     TTFT p50  TTFT p99  ITL p50  ITL p99   (ms, mean of rounds)")
    worst = 0.0
    for streams in sorted({r["streams"] for r in rows}):
        mean = {}
        for how in ("direct", "proxy"):
            rs = [r for r in rows if r["streams"] == streams and r["how"] == how]
            mean[how] = {
                k: float(np.mean([r[k] for r in rs]))
                for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
            }
            m = mean[how]
            print(f"{streams:>7}  {how:<6}  {m['ttft_p50']:8.2f}  {m['ttft_p99']:8.2f}  "
                  f"{m['itl_p50']:7.2f}  {m['itl_p99']:7.2f}")  # fmt: skip
        d = {k: mean["proxy"][k] - mean["direct"][k] for k in mean["proxy"]}
        worst = max(worst, d["ttft_p99"], d["itl_p99"])
        tokens = streams * args.requests_per_stream * args.rounds * args.tokens
        print(f"{streams:>7}  cost    {d['ttft_p50']:+8.2f}  {d['ttft_p99']:+8.2f}  "
              f"{d['itl_p50']:+7.2f}  {d['itl_p99']:+7.2f}   proxy CPU "
              f"{1e6 * cpu_s[streams] / tokens:.1f} us/token (trace writer "
              f"{1e6 * writer_s[streams] / tokens:.1f})")  # fmt: skip
    verdict = "within" if worst <= 1.0 else "NOT within"
    print(f"\nproxy cost at p99: {verdict} 1 ms (worst {worst:+.2f} ms); a busy machine inflates "
          "this figure: run it alone")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
