"""Two runs of one setup, compared: does ``loadlab compare`` call the machine's drift a change?

    python3 benchmarks/compare_repeats.py                    # 4 + 4 runs of 15 s, ~3 min
    python3 benchmarks/compare_repeats.py --runs 6 --rate 4 --duration 20

Starts one reference server and runs the very same load ``2 x --runs`` times under the labels
``A`` and ``B`` in the order A, B, B, A, A, B, B, A (each run its own seed, so the prefix cache
holds none of the next run's prompts; the order cancels a drift that is linear in time, which
this server showed: A, B, A, B put every B a step later than its A). Nothing differs between
A and B but the moment they ran. Prints:

- each pair (the i-th A against the i-th B) compared one run against one: the rows called
  significant, and whether ``--fail-on-regression 10`` fails;
- all A runs against all B runs, files sharing a label (the two-level bootstrap).

Every "significant" row here is a false alarm. The one-run comparisons can only see sampling
within each run; the grouped one also draws the runs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadlab._analysis.compare import compare  # noqa: E402
from loadlab.results import read_results  # noqa: E402
from reference_server.config import ServerConfig  # noqa: E402
from reference_server.launch import start_server  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=4, help="runs per label")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--mode", default="continuous")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--gate", type=float, default=10.0, help="--fail-on-regression PCT")
    p.add_argument("--out-dir", default="reports/compare-repeats")
    a = p.parse_args()
    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    config = ServerConfig(mode=a.mode, preset=a.preset, threads=a.threads, port=0)
    files: dict[str, list[Path]] = {"A": [], "B": []}
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with start_server(config=config, timeout_s=300) as srv:
        for i in range(2 * a.runs):
            label = "AB"[(i + 1) // 2 % 2]  # A B B A A B B A: a drift in time cancels
            out = out_dir / f"{label}{i // 2 + 1}.json"
            cmd = [sys.executable, "-m", "loadlab", "run", "--endpoint", str(srv.url),
                   "--model", "loadlab-ref", "--rate", f"{a.rate:g}", "--duration",
                   f"{a.duration:g}", "--seed", str(100 + i), "--saturation-lag-ms", "50",
                   "--no-progress", "--out", str(out)]  # fmt: skip
            subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)
            if out.is_file():
                files[label].append(out)
        runs = {k: [read_results(f) for f in v] for k, v in files.items()}
    n = min(len(runs["A"]), len(runs["B"]))
    alarms = gates = 0
    print("\none run against one (every significant row is a false alarm):")
    for i in range(n):
        cmp = compare([runs["A"][i], runs["B"][i]], ["A", "B"])
        sig = [f"{r.metric} {r.change_pct[1]:+.0f} %" for r in cmp.rows if r.significant[1]]
        gate = cmp.exit_code(a.gate) == 1
        alarms += bool(sig)
        gates += gate
        print(f"  A{i + 1} vs B{i + 1}: {', '.join(sig) or 'nothing significant'}"
              f"{f'; --fail-on-regression {a.gate:g} FAILS' if gate else ''}")  # fmt: skip
    grouped = compare([*runs["A"][:n], *runs["B"][:n]], ["A"] * n + ["B"] * n)
    sig = [f"{r.metric} {r.change_pct[1]:+.0f} %" for r in grouped.rows if r.significant[1]]
    ttft = {r.metric: r for r in grouped.rows}["ttft_ms.p50"]
    lo, hi = ttft.ci_pct[1] or (float("nan"), float("nan"))
    print(f"\none run against one: {alarms} of {n} pairs had a significant row, "
          f"{gates} of {n} failed the {a.gate:g} % gate")  # fmt: skip
    print(f"all {n} A runs against all {n} B runs (two-level bootstrap): "
          f"{', '.join(sig) or 'nothing significant'}; TTFT p50 {ttft.change_pct[1]:+.1f} % "
          f"[{lo:+.1f}, {hi:+.1f}]"
          f"{'; the gate FAILS' if grouped.exit_code(a.gate) == 1 else '; the gate passes'}")  # fmt: skip
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
