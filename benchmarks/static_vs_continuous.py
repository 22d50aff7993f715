"""Static vs continuous batching on the reference server, same seeded requests.

Output lengths are drawn (seeded) from the Azure 2023 conversation trace (GeneratedTokens:
mean 211, p50 129, p99 601), so one request stops after 20 tokens while another runs to 600.
All requests are offered at once (faster than either mode can serve). Static batching keeps
a batch's slots until its longest member ends; continuous batching refills a slot the step
after it frees. Static runs twice: ``pad`` (the server's default: finished rows keep running
as padding, as in a padded ``generate()`` call) and ``idle`` (finished rows leave the forward
pass). With padding, or with a decode step whose cost barely depends on the batch size (a
GPU), the ratio of throughputs approaches E[max of B lengths] / mean length: the bound printed
beside it (its inverse, mean / E[max], is the share of static slots that do useful work). On a
CPU a step's cost grows with its rows, so ``idle`` static steps get cheaper as a batch empties
and its ratio stays below the bound.

    python3 benchmarks/static_vs_continuous.py                     # tiny preset, ~1 minute
    python3 benchmarks/static_vs_continuous.py --preset cpu --requests 192 --batch 12 \
        --prompt-tokens 8 --length-scale 0.25 --no-stream --threads 2

Requests go through loadlab's own OpenAI client (streamed unless --no-stream, usage included),
so each record's output length is checked against the length asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadlab._lab.batchjob import expected_max  # noqa: E402
from loadlab.clients._openai import OpenAIClient  # noqa: E402
from loadlab.config import EndpointConfig  # noqa: E402
from loadlab.records import RequestSpec  # noqa: E402
from reference_server.launch import start_server  # noqa: E402

NAMES = (
    'tokens_total{phase="decode"}',
    'steps_total{phase="decode"}',
    'steps_total{phase="mixed"}',
    'tokens_total{phase="padding"}',
)
TRACE = ROOT / "loadlab" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def trace_lengths(path: Path, cap: int, scale: float = 1.0) -> list[int]:
    """GeneratedTokens of every trace row, times ``scale`` (at least 1), capped at ``cap``."""
    with open(path, newline="") as f:
        rows = [int(row["GeneratedTokens"]) for row in csv.DictReader(f)]
    return [min(max(1, round(n * scale)), cap) for n in rows if n > 0]


def scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310 (loopback)
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        for name in names:
            if line.startswith(f"loadlab_server_{name} "):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


async def drive(url: str, specs: list[RequestSpec], stream: bool) -> tuple[float, int, int]:
    """Send every spec at once; returns (makespan_s, ok requests, output tokens)."""
    endpoint = EndpointConfig(url, model="loadlab-ref", api="completions")
    async with OpenAIClient(
        endpoint, stream=stream, include_usage=True, timeout_s=3600, read_timeout_s=600
    ) as client:
        await client.send(RequestSpec("warmup", "w" * 8, 4), t0_ns=time.perf_counter_ns())
        t0 = time.perf_counter_ns()
        done = await asyncio.gather(*(client.send(s, t0_ns=t0) for s in specs))
    makespan_s = max((d.record.chunk_ns or [d.record.end_ns or 0])[-1] for d in done) / 1e9
    ok = [d.record for d in done if d.record.ok]
    for rec, spec in zip((d.record for d in done), specs, strict=True):
        if rec.ok and rec.output_tokens != spec.max_tokens:
            raise SystemExit(
                f"{rec.request_id}: {rec.output_tokens} tokens, asked {spec.max_tokens}"
            )
    return makespan_s, len(ok), sum(r.output_tokens or 0 for r in ok)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="max_num_seqs of both modes")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the server (1: the load generator needs a core too)",
    )
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--no-stream", action="store_true", help="whole responses (less client CPU)")
    p.add_argument(
        "--static",
        default="pad,idle",
        help="static variants to run: pad (finished rows computed as padding), idle, or both",
    )
    p.add_argument(
        "--length-scale",
        type=float,
        default=1.0,
        help="multiply trace lengths (same shape, so the same bound; shorter runs)",
    )
    args = p.parse_args()

    context = {"tiny": 1024}.get(args.preset, 4096)
    population = trace_lengths(args.trace, context - args.prompt_tokens - 1, args.length_scale)
    rng = random.Random(args.seed)
    lengths = [rng.choice(population) for _ in range(args.requests)]
    specs = [RequestSpec(f"r{i}", "x" * args.prompt_tokens, n) for i, n in enumerate(lengths)]
    extra = ["--max-num-seqs", str(args.batch), "--max-queue", str(args.requests + 8)]
    if args.threads:
        extra += ["--threads", str(args.threads)]

    print(
        f"preset={args.preset} requests={args.requests} batch={args.batch} prompt_tokens={args.prompt_tokens} seed={args.seed}"
    )
    print(
        f"output lengths drawn: mean {statistics.mean(lengths):.0f}, max {max(lengths)} (trace mean {statistics.mean(population):.0f})"
    )
    variants = [f"static-{v}" for v in args.static.split(",") if v] + ["continuous"]
    rps: dict[str, float] = {}
    batch: dict[str, float] = {}
    for variant in variants:
        mode, _, finished = variant.partition("-")
        flags = extra + (["--static-finished", finished] if finished else [])
        with start_server(mode, args.preset, extra_args=flags, timeout_s=300) as server:
            before = scrape(server.url, NAMES)
            makespan_s, ok, tokens = asyncio.run(drive(server.url, specs, not args.no_stream))
            after = scrape(server.url, NAMES)
        delta = {k: after[k] - before[k] for k in NAMES}
        # Steps that decoded: decode-only ones and mixed ones (decodes plus admitted prompts).
        steps = delta['steps_total{phase="decode"}'] + delta['steps_total{phase="mixed"}']
        decoded = delta['tokens_total{phase="decode"}']
        padded = delta['tokens_total{phase="padding"}']
        rps[variant] = ok / makespan_s
        batch[variant] = decoded / max(steps, 1)
        print(f"{variant:>11}: {ok}/{args.requests} ok in {makespan_s:6.1f} s  {rps[variant]:6.2f} req/s  "
              f"{tokens / makespan_s:8.0f} output tok/s  mean decode batch {batch[variant]:5.1f}"
              f"  (+{padded / max(steps, 1):.1f} padding rows)")  # fmt: skip
    e_max = expected_max(population, args.batch)
    mean = statistics.mean(population)
    for variant in variants[:-1]:
        print(f"continuous / {variant} = {rps['continuous'] / rps[variant]:.2f}x requests/s; "
              f"useful decode rows per step {batch['continuous'] / batch[variant]:.2f}x")  # fmt: skip
    print(f"bound: E[max of {args.batch} lengths] / mean = {e_max:.0f} / {mean:.0f} = {e_max / mean:.2f}x "
          f"(static slots doing useful work: {mean / e_max:.0%})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
