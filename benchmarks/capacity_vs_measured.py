"""Estimate vs measurement on the reference model: the ratio table of ``loadlab capacity
--vs-measured``, for docs/capacity.md.

    python3 benchmarks/capacity_vs_measured.py                       # batch 1-32, prompts 128-2048
    python3 benchmarks/capacity_vs_measured.py --threads 1 --clock cpu   # on a busy shared machine
    python3 benchmarks/capacity_vs_measured.py --batches 1,8 --prompts 128 --repeats 2   # quick

Prints, per point, the measured time, the shaped prediction and its ratio and error, the plain
roofline (square-matmul / copy calibration) and its ratio, achieved FLOP/s and bandwidth as a
fraction of the calibrated peaks, and whether every shaped error is within --tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab._capacity.measured import format_table, measure_reference


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--prompts", default="128,256,512,1024,2048")
    p.add_argument("--context-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds per point")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--json", help="write the rows here too")
    a = p.parse_args()
    t0 = time.perf_counter()
    model, hw, rows, extra = measure_reference(
        a.preset,
        [int(x) for x in a.batches.split(",")],
        [int(x) for x in a.prompts.split(",")],
        a.context_tokens,
        a.repeats,
        a.threads,
        a.clock,
        log=sys.stderr,
        rounds=a.rounds,
    )
    print(f"{model.name}, {extra['dtype']} on {extra['device']}, {extra['threads']} threads, "
          f"{a.clock} clock, decode context {a.context_tokens}")  # fmt: skip
    print(format_table(rows, hw, extra))
    ok = all(abs(r.ratio - 1) <= a.tolerance for r in rows)
    print(f"all shaped predictions within {a.tolerance:.0%}: {'yes' if ok else 'NO'} "
          f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    if a.json:
        Path(a.json).write_text(
            json.dumps({"extra": extra, "rows": [r.to_dict() for r in rows]}, indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
