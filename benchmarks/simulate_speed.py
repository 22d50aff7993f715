"""How fast the simulator runs: simulated requests per second of wall time.

The target: one replica-hour of traffic at one GPU's share of a busy service (8 requests/s of
250 output tokens; 1,000-token prompts) in under a minute, on an H100 roofline of
Llama-3-8B. Building the workload's requests (prompt text), simulating, and turning the
result into records are timed apart.

    python3 benchmarks/simulate_speed.py                      # 1 hour, continuous
    python3 benchmarks/simulate_speed.py --modes static,continuous,chunked --hours 0.25
    python3 benchmarks/simulate_speed.py --hours 0.25 --jitter-from reports/fit.json  # + spread
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from loadlab._capacity.hardware import get_hardware
from loadlab._capacity.models import get_model
from loadlab.config import RunConfig
from loadlab.simulate import RooflineStepTime, ServerConfig, Simulator
from loadlab.simulate._setup import default_kv_blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=1.0, help="simulated replica-hours")
    p.add_argument("--rate", type=float, default=8.0, help="requests/s")
    p.add_argument("--prompt-tokens", type=int, default=1000)
    p.add_argument("--output-tokens", type=int, default=250)
    p.add_argument("--modes", default="continuous")
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--hardware", default="h100")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--prefix-caching", choices=("on", "off"), default="on")
    p.add_argument("--jitter-from", metavar="FILE",
                   help="each step also drawn from this fitted model's measured spread: the "
                   "cost of --step-jitter on (alternated with the roofline alone)")  # fmt: skip
    args = p.parse_args()
    from loadlab.workloads import build_requests

    model, hw = get_model(args.model), get_hardware(args.hardware)
    steps: list[tuple[str, Any]] = [("", RooflineStepTime(model, hw))]
    if args.jitter_from:
        data = json.loads(Path(args.jitter_from).read_text(encoding="utf-8"))
        jitter = tuple((data.get("decode") or data).get("jitter") or ())
        if not jitter:
            raise SystemExit(f"{args.jitter_from} has no measured spread (jitter)")
        steps.append((" + spread", Spread(model, hw, jitter)))
    cfg = RunConfig(rate_rps=args.rate, duration_s=args.hours * 3600, max_tokens=args.output_tokens,
                    prompt_tokens=args.prompt_tokens, timeout_s=3600.0)  # fmt: skip
    t0 = time.perf_counter()
    specs = list(build_requests(cfg))
    build_s = time.perf_counter() - t0
    print(f"{len(specs):,} requests built in {build_s:.1f} s ({args.model} on {args.hardware}, "
          f"{args.rate:g} req/s, {args.prompt_tokens} + {args.output_tokens} tokens)")  # fmt: skip
    blocks = default_kv_blocks(model, 16, 8192, hw)
    for mode in args.modes.split(","):
        server = ServerConfig(mode=mode, num_kv_blocks=blocks, max_num_seqs=args.max_num_seqs,
                              prefix_caching=args.prefix_caching == "on",
                              max_model_len=8192)  # fmt: skip
        for label, step in steps:
            out = Simulator(cfg, server, step).run(specs)
            t1 = time.perf_counter()
            res = out.to_results()
            rec_s = time.perf_counter() - t1
            n = len(out.requests)
            ok = sum(r.ok for r in res.records)
            print(f"{mode + label:<20} simulate {out.wall_s:6.2f} s = {n / out.wall_s:9,.0f} "
                  f"simulated req/s; {out.num_steps:,} steps ({out.stretch_steps / out.num_steps:.0%}"
                  f" by the decode shortcut); records {rec_s:.1f} s; {ok:,} ok")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Spread(RooflineStepTime):
    """The roofline, each step drawn from a fitted model's measured spread."""

    jitter: tuple[float, ...] = ()


if __name__ == "__main__":
    main()
