"""loadlab beside ``vllm bench serve``: the same vLLM, the same workload, interleaved.

    python3 benchmarks/vs_vllm_bench.py [--rounds 3] [--requests 200] [--concurrency 8]

The workload is vllm bench's random dataset, 256 tokens in and 64 out, ``--max-concurrency 8``,
EOS ignored; loadlab replays exactly the per-request lengths vLLM counted for it (how, and why
both send ``allowed_token_ids``: ``tests/helpers/vllm_bench.py``). Each round runs vllm bench,
then loadlab; the verdict compares the medians over the rounds of TTFT p50, TPOT p50 and ITL
p50, and the input and output token totals of every round.

vLLM (``LOADLAB_VLLM_PYTHON``, ``LOADLAB_TINY_MODEL``, as ``scripts/engines/vllm.sh`` sets them;
``--url`` uses one already running, serving the model as ``tiny``) runs on 127.0.0.1 with its
default flags but prefix caching off (``--vllm-args``): both tools send the same prompts in
every round (same seeds), so with caching on, every round after the first would skip most
prefill and the rounds would not measure the same thing. On a machine of 2 or more cores vLLM
is pinned to core 0 and both tools to the others (``--pin``): on this 2-core VM a tool's own
CPU use otherwise slows the server it measures. Prints a table; ``--json FILE`` writes every figure. Exit 1 when a total differs
or a median is more than ``--tolerance`` (10 %) away from vllm bench's.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.vllm_bench import (
    METRICS,
    BenchLoad,
    bench_figures,
    loadlab_figures,
    run_round,
    text_token_ids,
)
from tests.helpers.vllm_server import ENV_MODEL, ENV_PYTHON, start_vllm


def pin_split(pin: str) -> tuple[str | None, str | None]:
    """``--pin`` as (server cores, client cores). On a small CPU machine the engine and the
    load generators share the cores, so a tool that spends more CPU makes the server slower
    for its own run: pinned, each tool meets the same server."""
    if pin == "off":
        return None, None
    if pin == "auto":
        n = len(os.sched_getaffinity(0))
        return ("0", f"1-{n - 1}" if n > 2 else "1") if n >= 2 else (None, None)
    server, _, clients = pin.partition(":")
    return server or None, clients or None


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--url", help="a vLLM already serving the tiny model as 'tiny'")
    p.add_argument("--python", default=os.environ.get(ENV_PYTHON), help="vLLM's interpreter")
    p.add_argument("--model-dir", default=os.environ.get(ENV_MODEL), help="the tiny model")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument(
        "--vllm-args",
        default="--no-enable-prefix-caching",
        help="vLLM flags beside the defaults (default: prefix caching off; not with --url)",
    )
    p.add_argument(
        "--pin",
        default="auto",
        help="SERVER:CLIENTS core lists for taskset, e.g. 0:1 (vLLM on core 0, both tools on "
        "core 1); 'auto': 0:1..N-1 on a machine of 2+ cores; 'off': no pinning",
    )
    args = p.parse_args()
    server_cpus, client_cpus = pin_split(args.pin)
    if not args.python or not args.model_dir:
        p.error(f"give --python and --model-dir (or set {ENV_PYTHON} and {ENV_MODEL})")
    load = BenchLoad(args.requests, args.concurrency, args.input_len, args.output_len, args.seed)
    extra = {"allowed_token_ids": text_token_ids(args.model_dir)}
    work = Path(tempfile.mkdtemp(prefix="loadlab-vs-vllm-"))
    rounds: list[dict[str, dict[str, float]]] = []
    with ExitStack() as stack:
        url = args.url
        if url is None:
            server = stack.enter_context(
                start_vllm(args.python, args.model_dir, timeout_s=600,
                           extra_args=shlex.split(args.vllm_args), cpus=server_cpus)
            )  # fmt: skip
            url = server.url
        for i in range(args.rounds):
            bench, res = run_round(
                args.python, url, args.model_dir, load, work, extra, f"-{i}", cpus=client_cpus
            )
            b, ll = bench_figures(bench), loadlab_figures(res)
            rounds.append({"vllm_bench": b, "loadlab": ll})
            cells = "  ".join(f"{m} {b[m]:.2f} / {ll[m]:.2f}" for m in METRICS)
            print(f"round {i + 1} (vllm bench / loadlab): {cells}  tokens in "
                  f"{b['input_tokens']:.0f} / {ll['input_tokens']:.0f}, out "
                  f"{b['output_tokens']:.0f} / {ll['output_tokens']:.0f}", flush=True)  # fmt: skip
    print(f"pinning: vLLM on cores {server_cpus or 'any'}, both tools on {client_cpus or 'any'}")
    ok = True
    verdict: dict[str, Any] = {}
    print(f"\nmedians over {args.rounds} rounds    vllm bench   loadlab")
    for m in METRICS:
        theirs = statistics.median(r["vllm_bench"][m] for r in rounds)
        ours = statistics.median(r["loadlab"][m] for r in rounds)
        diff = (ours - theirs) / theirs
        ok &= abs(diff) <= args.tolerance
        verdict[m] = {"vllm_bench": theirs, "loadlab": ours, "diff": diff}
        print(f"  {m:8s} p50              {theirs:8.2f}  {ours:8.2f}  {diff * 100:+.1f} %")
    for key in ("input_tokens", "output_tokens"):
        same = all(r["vllm_bench"][key] == r["loadlab"][key] for r in rounds)
        ok &= same
        print(f"  {key} totals: {'equal in every round' if same else 'DIFFER'}")
    print(f"load average after: {Path('/proc/loadavg').read_text().strip()}")
    print("PASS" if ok else "FAIL")
    if args.json:
        report = {
            "pin": [server_cpus, client_cpus],
            "rounds": rounds,
            "medians": verdict,
            "pass": ok,
        }
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
