"""Prefill is compute-bound, decode is memory-bound, batching helps decode and barely prefill.

Measures the reference server's model runner (the real paged-KV forward pass the server
runs) and prints, as gpt-fast does, tokens/s with the achieved memory bandwidth and FLOP/s:

    python3 benchmarks/batching.py --preset cpu              # ~3-5 minutes on a busy 2-core box
    python3 benchmarks/batching.py --preset cpu --quick      # fewer rows, one repeat

Accounting (reference_server/bench.py): GB/s = (weight bytes + attended K/V bytes) / step
time; GFLOP/s = (2 * non-embedding params * tokens + attention FLOPs) / step time (Kaplan et
al. 2020; nanoGPT estimate_mfu). Each figure is the fastest of --repeats rounds; a round times
every row once, so all rows sample the same stretch of a busy machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from reference_server.bench import (
    decode_step_time_s,
    machine_peaks,
    prefill_time_s,
    step_bytes,
    step_flops,
)
from reference_server.model_runner import ModelRunner


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--context", type=int, default=128, help="K/V tokens per decoding sequence")
    p.add_argument("--batches", type=ints, default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--prompts", type=ints, default=[128, 256, 512, 1024, 2048])
    p.add_argument("--prefill-batch", type=int, default=4, help="batch of the extra prefill row")
    p.add_argument("--prefill-batch-prompt", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3, help="rounds (each row once per round)")
    p.add_argument("--quick", action="store_true", help="batches 1,8,32; prompts 128,512; 1 repeat")
    a = p.parse_args()
    if a.quick:
        a.batches, a.prompts, a.repeats = [1, 8, 32], [128, 512], 1

    bs = 16
    need = max(
        max(a.batches) * -(-(a.context + 1) // bs),
        -(-(max(a.prompts) + 1) // bs),
        a.prefill_batch * -(-(a.prefill_batch_prompt + 1) // bs),
    )
    t0 = time.perf_counter()
    runner = ModelRunner(a.preset, num_kv_blocks=need, block_size=bs, threads=a.threads)
    info = runner.info()
    wbytes = runner.args.num_non_embedding_params * runner.dtype.itemsize
    print(
        f"preset {a.preset}: {info['num_params'] / 1e6:.1f} M params, {info['dtype']} on "
        f"{info['device']}, weights {wbytes / 2**20:.0f} MiB, torch threads "
        f"{torch.get_num_threads()}, loaded in {time.perf_counter() - t0:.1f} s"
    )
    peaks = machine_peaks(runner.device)
    print(
        f"machine now: memory read {peaks['mem_read_gbps']:.1f} GB/s, "
        f"matmul {peaks['matmul_gflops']:.1f} GFLOP/s (rough ceilings, measured just now)\n"
    )

    # Rounds: every row is timed once per round and keeps its fastest time, so each row's
    # samples spread over the whole run and see the same mix of interference from other work.
    pre_rows = [(1, n) for n in a.prompts]
    if (1, a.prefill_batch_prompt) not in pre_rows:
        pre_rows.append((1, a.prefill_batch_prompt))
    pre_rows.append((a.prefill_batch, a.prefill_batch_prompt))
    dec_s = {b: float("inf") for b in a.batches}
    pre_s = {r: float("inf") for r in pre_rows}
    for rnd in range(a.repeats):
        t_round = time.perf_counter()
        for b in a.batches:
            t = decode_step_time_s(runner, b, a.context, 1, warmup=rnd == 0)
            dec_s[b] = min(dec_s[b], t)
        for bn, n in pre_rows:
            t = prefill_time_s(runner, n, bn, 1, warmup=rnd == 0 and n <= 512)
            pre_s[bn, n] = min(pre_s[bn, n], t)
        print(f"round {rnd + 1}/{a.repeats}: {time.perf_counter() - t_round:.0f} s", flush=True)

    print(f"\nDECODE: batch B sequences, {a.context} tokens of context each, one token each")
    print(f"{'batch':>5} {'step ms':>9} {'tok/s':>9} {'x batch1':>8} {'GB/s':>7} {'GFLOP/s':>8}")
    decode = {b: b / s for b, s in dec_s.items()}
    for b, s in dec_s.items():
        gbps = step_bytes(runner, a.context - 1, 1, b) / s / 1e9
        gflops = step_flops(runner.args, a.context - 1, 1, b) / s / 1e9
        ratio = decode[b] / decode[a.batches[0]]
        print(f"{b:>5} {s * 1e3:>9.1f} {decode[b]:>9.1f} {ratio:>8.2f} {gbps:>7.2f} {gflops:>8.1f}")

    print("\nPREFILL: whole prompts in one step")
    print(f"{'batch':>5} {'prompt':>7} {'step ms':>9} {'tok/s':>9} {'GB/s':>7} {'GFLOP/s':>8}")
    prefill = {(b, n): b * n / s for (b, n), s in pre_s.items()}
    for (b, n), s in pre_s.items():
        gbps = step_bytes(runner, 0, n, b) / s / 1e9
        gflops = step_flops(runner.args, 0, n, b) / s / 1e9
        print(f"{b:>5} {n:>7} {s * 1e3:>9.1f} {prefill[b, n]:>9.1f} {gbps:>7.2f} {gflops:>8.1f}")

    print("\nSUMMARY")
    if 1 in decode and 32 in decode:
        print(f"decode tok/s, batch 32 / batch 1: {decode[32] / decode[1]:.1f}x (target >= 8x)")
    bn = (a.prefill_batch, a.prefill_batch_prompt)
    print(
        f"prefill tok/s, batch {bn[0]} / batch 1 at {bn[1]}-token prompts: "
        f"{prefill[bn] / prefill[1, bn[1]]:.2f}x (flat: ~1x)"
    )
    print(
        f"prefill tok/s at {a.prompts[0]} tokens / decode tok/s at batch 1: "
        f"{prefill[1, a.prompts[0]] / decode[a.batches[0]]:.0f}x"
    )


if __name__ == "__main__":
    main()
