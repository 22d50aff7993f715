"""Run ``loadlab lab`` while competing processes each burn one core, and say what it showed.

On a busy machine the lab must never report a claim the wrong way
round; each claim is either shown or "not shown on this machine" with the reason. This script
starts ``--burners`` processes that spin on the CPU for the whole run (``--burners 0``: none,
the quiet-machine run), runs the lab as a user would (a separate process: the burners are not
part of its process tree, so its machine watch counts them as other work), and prints the
command, the lab's duration, the load averages and every claim's status.

    python3 benchmarks/lab_busy.py                         # default lab, one core burned
    python3 benchmarks/lab_busy.py --burners 0             # the same, nothing burned
    python3 benchmarks/lab_busy.py --out reports/lab-busy -- --modes static,continuous

Writes ``<out>/lab_busy.json`` beside the lab's own report.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BURN = "while True: pass"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--burners", type=int, default=1, help="processes spinning one core each")
    p.add_argument("--out", default="reports/lab-busy", help="the lab's output folder")
    p.add_argument("lab_args", nargs="*", help="more flags for loadlab lab (after --)")
    args = p.parse_args()
    out = Path(args.out)
    cmd = [sys.executable, "-m", "loadlab", "lab", "--out", str(out), *args.lab_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}  # fmt: skip
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    try:
        code = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    finally:
        for b in burners:
            b.kill()
            b.wait()
    elapsed_s = time.perf_counter() - t0
    load_end = os.getloadavg()
    summary = json.loads((ROOT / out / "lab.json").read_text()) if code == 0 else {}
    busy = [m for m in summary.get("measurements", []) if m.get("busy")]
    record = {
        "command": " ".join(["python3", "benchmarks/lab_busy.py", *sys.argv[1:]]),
        "lab_command": " ".join(["python3", *cmd[1:]]),
        "burners": args.burners,
        "exit_code": code,
        "elapsed_s": elapsed_s,
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in load_end],
        "busy_measurements": f"{len(busy)} of {len(summary.get('measurements', []))}",
        "claims": [
            {k: c.get(k) for k in ("claim", "median", "lo", "hi", "status", "reason")}
            for c in summary.get("claims", [])
        ],
    }
    (ROOT / out / "lab_busy.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    print(f"\n{record['command']}: exit {code}, {elapsed_s:.0f} s, {args.burners} core(s) burned")
    print(f"load average {record['load_avg_start']} -> {record['load_avg_end']}; "
          f"busy measurements {record['busy_measurements']}")  # fmt: skip
    for c in record["claims"]:
        spread = f"{c['lo']:.3g}-{c['hi']:.3g}" if c["lo"] is not None else "-"
        med = f"{c['median']:.3g}" if c["median"] is not None else "-"
        print(f"  {c['claim']:>8}: {med} ({spread})  {c['status']}  {c['reason']}")
    return code


if __name__ == "__main__":
    sys.exit(main())
