"""Where a decode step's time goes: the device's kernels against the host that issues them.

    python3 benchmarks/step_profile.py --preset 1b          # on a GPU: under a minute
    python3 benchmarks/step_profile.py --preset tiny        # on a CPU: the host side only

Runs the reference server's model runner (``ModelRunner.run``: the step's metadata, the
forward pass over the paged KV cache, sampling) for ``--steps`` decode steps at each batch,
under ``torch.profiler``, and prints per step: wall time, the number of kernels launched, the
time the GPU spent in them (summed kernel durations), and the time the step would take if it
only had to read its bytes (weights once plus every attended token's K/V) at ``--peak-tbps``.

A step whose kernel time is far below its wall time is bound by the host issuing kernels
(Python, the framework's dispatch, one launch per operation), not by memory: batching then
adds tokens at almost no cost per step until the kernels themselves fill it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from reference_server.bench import decode_batch, step_bytes
from reference_server.model_runner import ModelRunner


def profile_decode(runner: ModelRunner, batch: int, context: int, steps: int) -> dict[str, float]:
    """Per-step wall ms, kernels launched and kernel ms (NaN on a CPU) of ``steps`` decode steps."""
    work = decode_batch(runner, batch, context)
    cuda = runner.device.type == "cuda"
    for _ in range(3):  # warm: allocator, kernels, caches
        runner.run(work)
    if cuda:
        torch.cuda.synchronize(runner.device)
    t0 = time.perf_counter()  # timed without the profiler, which adds to every launch
    for _ in range(steps):
        runner.run(work)  # ends with .tolist() of the sampled ids: a device sync
    wall = time.perf_counter() - t0
    if not cuda:
        return {"wall_ms": wall * 1e3 / steps, "kernels": float("nan"), "kernel_ms": float("nan")}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.run(work)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # Kernel time is summed over kernels; memcpy and memset count as device work too.
    kernel_us = sum(e.time_range.elapsed_us() for e in kernels)
    return {
        "wall_ms": wall * 1e3 / steps,
        "kernels": len(kernels) / steps,
        "kernel_ms": kernel_us / 1e3 / steps,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="1b")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--context", type=int, default=256, help="K/V tokens per sequence")
    p.add_argument("--steps", type=int, default=20, help="profiled steps per batch")
    p.add_argument("--peak-tbps", type=float, default=4.8, help="memory peak, TB/s (H200: 4.8)")
    a = p.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    bs = 16
    runner = ModelRunner(a.preset, num_kv_blocks=max(batches) * -(-(a.context + 1) // bs) + 1)
    info = runner.info()
    print(f"preset {a.preset}: {info['num_params'] / 1e6:.1f} M params, {info['dtype']} on "
          f"{info['device']}; decode steps of {a.context} tokens of context each")  # fmt: skip
    head = (f"{'batch':>5} {'wall ms':>8} {'kernels':>8} {'kernel ms':>10} {'GPU busy':>9} "
            f"{'bytes-bound ms':>15} {'wall / bytes':>12}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for b in batches:
        r = profile_decode(runner, b, a.context, a.steps)
        need_ms = step_bytes(runner, a.context - 1, 1, b) / (a.peak_tbps * 1e12) * 1e3
        busy = r["kernel_ms"] / r["wall_ms"]
        print(f"{b:>5} {r['wall_ms']:>8.2f} {r['kernels']:>8.0f} {r['kernel_ms']:>10.2f} "
              f"{busy:>9.1%} {need_ms:>15.3f} {r['wall_ms'] / need_ms:>12.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
