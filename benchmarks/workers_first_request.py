"""Time from the start of ``loadlab run`` to its first load request, with 1 and with N workers.

The fixed-schedule server (``python -m loadlab.selftest``) stamps every request's arrival
with ``perf_counter_ns`` (CLOCK_MONOTONIC, one clock for every process of the machine); this
script takes the same clock just before it starts the command, so the difference is process
start, imports, prompt sizing (calibration against this server: it has no tokenizer route),
workload building and, with N workers, starting them. Calibration requests carry no
``X-Request-Id``; the load's do, so the first load request is told apart.

    python3 benchmarks/workers_first_request.py                      # 1 vs 2 workers, 5 rounds
    python3 benchmarks/workers_first_request.py --workers 1,2,4 --rounds 3 --requests 400
    python3 benchmarks/workers_first_request.py --duration 2   # an endless stream: each process
                                                               # builds its 2,048-request read-ahead

Prints, per worker count, the median and range over the rounds (the counts alternate in each
round, so a machine that slows down mid-way weighs on every count alike).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from loadlab.selftest import FixedServerProcess


def first_request_s(url: str, workers: int, args: argparse.Namespace, out: Path) -> float:
    """Seconds from just before ``loadlab run`` starts to its first load request's arrival."""
    reset = urllib.request.Request(url + "/truth/reset", method="POST")  # noqa: S310
    urllib.request.urlopen(reset).read()  # noqa: S310 - the loopback server started here
    cmd = [
        sys.executable, "-m", "loadlab", "run", "--endpoint", url, "--model", "m",
        "--concurrency", str(max(workers, args.concurrency)), *_stop(args),
        "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", "8",
        "--workers", str(workers), "--no-progress", "--out", str(out),
    ]  # fmt: skip
    t0 = time.perf_counter_ns()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    truth = json.loads(urllib.request.urlopen(url + "/truth").read())  # noqa: S310 - loopback
    # the server names a request without X-Request-Id r<n> (calibration); the load's carry ids
    load = [t["recv_ns"] for rid, t in truth.items() if not rid[1:].isdigit()]
    if not load:
        raise SystemExit("no load request reached the server")
    return (min(load) - t0) / 1e9


def _stop(args: argparse.Namespace) -> list[str]:
    return (
        ["--duration", str(args.duration)] if args.duration else ["--requests", str(args.requests)]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--duration", type=float, help="stop by time instead of --requests")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=256)
    args = p.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    seen: dict[int, list[float]] = {n: [] for n in counts}
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with FixedServerProcess(ttft_ms=20, itl_ms=2) as url, tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = counts if r % 2 == 0 else counts[::-1]
            for n in order:
                seen[n].append(first_request_s(url, n, args, Path(tmp) / f"w{n}-{r}.json"))
    print(f"first load request after the command started ({args.rounds} rounds)")
    for n, xs in seen.items():
        print(
            f"  --workers {n}: median {statistics.median(xs):.3f} s "
            f"(min {min(xs):.3f}, max {max(xs):.3f})"
        )


if __name__ == "__main__":
    main()
