"""How long the offline commands take on big results files: SLO verdict, compare, HTML report.

    python3 benchmarks/offline_speed.py --requests 5000 --tokens 64

Builds two synthetic runs (seeded gamma TTFT and ITL, no server), then times each step once
and prints seconds. Figures depend on the machine's load: run it twice and read the lower.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab._analysis.compare import compare
from loadlab._report.html import render_html
from loadlab._slo import evaluate, load_slo
from loadlab.results import read_results, write_results
from tests.helpers.synth import make_results

ROOT = Path(__file__).resolve().parent.parent


class Timer:
    """Wall and CPU seconds of a block: on a shared machine CPU time is the steadier figure."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:6.2f} s wall, {self.cpu:6.2f} s CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--bootstrap", type=int, default=2000)
    args = ap.parse_args()
    n, k = args.requests, args.tokens
    a = make_results(n, seed=1, tokens=k, rate_rps=50)
    b = make_results(n, seed=2, tokens=k, rate_rps=50, ttft_scale=1.1)
    with tempfile.TemporaryDirectory() as tmp, Timer() as t:
        path = write_results(a, Path(tmp) / "a.json")
        a = read_results(path)
        size_mb = path.stat().st_size / 1e6
    print(f"{n} requests x {k} tokens ({n * (k - 1):,} ITL gaps), results file {size_mb:.1f} MB")
    print(f"  write + read results file   {t}")
    spec = load_slo(ROOT / "examples" / "slo.toml")
    with Timer() as t:
        evaluate(a, spec)
    print(f"  SLO verdict (6 objectives)  {t}")
    with Timer() as t:
        cmp = compare([a, b], ["a", "b"], n_boot=args.bootstrap)
    print(f"  compare, {args.bootstrap} resamples    {t}")
    flagged = [r.metric for r in cmp.rows if r.significant[1]]
    print(f"    significant rows (TTFT was made 10 % slower): {', '.join(flagged) or 'none'}")
    with Timer() as t:
        html = render_html(a, evaluate(a, spec))
    print(f"  HTML report ({len(html) / 1e6:.1f} MB)      {t}")


if __name__ == "__main__":
    main()
