"""Which transport set-up lets loadlab measure 256 fast streams on 2 cores?

Runs ``loadlab selftest`` (the fixed-schedule server in its own process, its write times the
truth) once per option and prints one line each: the TTFT error, what the server reached, and
loadlab's own CPU time per token (the figure that decides how far one process can go)::

    python3 benchmarks/selftest_options.py                       # streams256: 2,560 requests
    python3 benchmarks/selftest_options.py --preset streams64
    python3 benchmarks/selftest_options.py --requests-per-stream 3 --options uvloop-1,uvloop-2

Options: ``asyncio-1`` (asyncio's own loop, one process), ``uvloop-1`` (uvloop, one process),
``uvloop-2`` (uvloop, ``--workers 2``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab.results import read_results  # noqa: E402

OPTIONS = {
    "asyncio-1": ({"LOADLAB_LOOP": "asyncio"}, 1),
    "uvloop-1": ({}, 1),
    "uvloop-2": ({}, 2),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="streams256")
    p.add_argument("--requests-per-stream", type=int, help="scale the run down (default: preset)")
    p.add_argument(
        "--options", default=",".join(OPTIONS), help="comma-separated, from: " + ", ".join(OPTIONS)
    )
    args = p.parse_args()
    print(f"preset {args.preset}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"{'option':<10} {'TTFT err p50/p90/p99 ms':>24} {'ITL p99 err':>11} {'server tok/s':>12} "
        f"{'tok/s err':>9} {'lag p99':>8} {'cpu us/tok':>10}  within tolerance"
    )
    for name in args.options.split(","):
        env_extra, workers = OPTIONS[name]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "st.json"
            cmd = [
                sys.executable,
                "-m",
                "loadlab",
                "selftest",
                "--preset",
                args.preset,
                "--workers",
                str(workers),
                "--out",
                str(out),
            ]
            if args.requests_per_stream:
                cmd += ["--requests-per-stream", str(args.requests_per_stream)]
            proc = subprocess.run(
                cmd,
                cwd=ROOT,
                env={**os.environ, **env_extra},
                capture_output=True,
                text=True,
                timeout=900,
            )
            if not out.exists():
                print(f"{name:<10} failed: {proc.stderr.strip()[-400:]}")
                continue
            res = read_results(out)
            lv = res.extra["levels"][0]
        e = lv["ttft_err_ms"]
        if e["p50"] is None:
            outcomes = sorted({(r.outcome, r.error) for r in res.records})[:3]
            print(f"{name:<10} no request matched the truth; outcomes {outcomes}")
            continue
        print(
            f"{name:<10} {e['p50']:>7.2f}/{e['p90']:>7.2f}/{e['p99']:>7.2f} "
            f"{lv['itl_p99_err_ms']:>+11.3f} {lv['server_tps']:>12,.0f} "
            f"{100 * lv['tps_err_rel']:>+8.2f}% {lv['loop_lag_ms_p99']:>8.1f} "
            f"{lv['cpu_us_per_token']:>10.1f}  {'yes' if lv['within_tolerance'] else 'NO'}"
        )


if __name__ == "__main__":
    main()
