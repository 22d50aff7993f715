"""Does ``loadlab sweep`` find the same limit twice? Two sweeps against one reference server.

    python3 benchmarks/sweep_repeatability.py                      # tiny preset, concurrencies
    python3 benchmarks/sweep_repeatability.py --preset cpu --levels 1,2,4,8 --duration 20
    python3 benchmarks/sweep_repeatability.py --by rate --levels 4,8,16,32,64 --slo "ttft_ms.p90 <= 250"

By concurrency, latency grows about linearly with the load, so a few percent of machine noise
moves the crossing by as much (two runs here: 19 and 22 streams). By rate (open loop, seeded
Poisson arrivals), TTFT stays flat until the server's capacity and then climbs as the queue
builds: the crossing sits at the capacity, which is steadier than any latency.

Runs the same sweep twice (same SLO, levels, seed), each against a reference server started
for it (so both start cold: a shared server's prefix cache would answer the second sweep's
prompts, the first's, from cache), and prints both curves, both answers and their relative difference (acceptance: within 10 %).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadlab._lab.machine import pin_threads
from loadlab._runner.run import Prepared, prepare
from loadlab._runner.sweep import find_max_load, run_level
from loadlab._slo import parse_slo
from loadlab.config import EndpointConfig, RunConfig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--mode", default="continuous")
    p.add_argument("--by", choices=("concurrency", "rate"), default="concurrency")
    p.add_argument("--levels", default="1,2,4,8,16,32", help="concurrencies or rates, rising")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slo", default="tpot_ms.p90 <= 60", help="one objective")
    p.add_argument("--bisect-steps", type=int, default=4)
    p.add_argument("--min-requests", type=int, default=5)
    # A busy shared machine lags every event loop by tens of ms; the default 20 ms saturation
    # threshold would make every level invalid there. Say so beside the figures.
    p.add_argument("--saturation-lag-ms", type=float, default=20.0)
    p.add_argument(
        "--pin",
        action="store_true",
        help="server on CPU 0, load generator on CPU 1 (no migrations between the two)",
    )
    a = p.parse_args()
    from reference_server.launch import start_server

    spec = parse_slo({"name": "sweep", "min_requests": a.min_requests, "objectives": [a.slo]})
    levels = [float(x) for x in a.levels.split(",")]
    answers = []
    base = RunConfig(concurrency=1, duration_s=a.duration, warmup_s=1.0,
                     prompt_tokens=a.prompt_tokens, max_tokens=a.max_tokens,
                     progress=False, saturation_lag_ms=a.saturation_lag_ms,
                     arrival="poisson", seed=0)  # fmt: skip
    for i in range(2):
        # A server of its own per sweep: the second sweep sends the very prompts of the
        # first (same seed), which a shared server's prefix cache would answer warm.
        with start_server(mode=a.mode, preset=a.preset, port=None) as server:
            if a.pin:
                pin_threads(server.process.pid, {0})
                os.sched_setaffinity(0, {1})
            prepared = prepare(base, EndpointConfig(url=server.url, name="reference"))
            out = Path(tempfile.mkdtemp(prefix=f"sweep{i}-"))

            def ev(load: float, out: Path = out, prepared: Prepared = prepared):  # type: ignore[no-untyped-def]
                return run_level(base, prepared, spec, load, a.by, out, "pass")

            integer = a.by == "concurrency"
            r = find_max_load(ev, levels, a.bisect_steps, integer=integer, mode=a.by)
            print(f"run {i + 1} ({out}):\n{r.to_text()}\n")
            answers.append(r.max_passing_load)
    if None in answers:
        print("a sweep found no passing level")
        return 1
    x, y = answers
    assert x is not None and y is not None
    diff = abs(x - y) / max(x, y)
    print(
        f"answers {x:g} and {y:g}: differ by {diff:.1%} ({'within' if diff <= 0.1 else 'OUTSIDE'} 10 %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
