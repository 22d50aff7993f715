"""The lab's batching experiment: decode and prefill tokens/s against batch size.

"Batching helps decode enormously and prefill barely": a decode step reads every weight to
make one token per sequence, so B sequences share that read (tokens/s grows ~B-fold until
compute binds); a prefill step is already a large matmul, so a batch of prompts finds no
idle capacity. Measured with ``reference_server.bench`` on the real model runner, in rounds
(each visiting every batch size in a rotated order, its repeats interleaved across sizes); run as a subprocess by ``loadlab lab``
(it imports torch) and prints one JSON object with each round's step times::

    python3 -m loadlab._lab.batching '{"preset": "tiny", "decode_batches": [1, 4], ...}'
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["main", "measure", "speedups"]


def speedups(tokens_per_s: Mapping[int, float]) -> dict[int, float]:
    """Tokens/s of each batch size divided by that of the smallest one.

    >>> speedups({1: 10.0, 4: 35.0})
    {1: 1.0, 4: 3.5}
    """
    if not tokens_per_s:
        return {}
    base = tokens_per_s[min(tokens_per_s)]
    return {b: v / base for b, v in sorted(tokens_per_s.items())}


def measure(
    preset: str,
    decode_batches: Sequence[int],
    decode_context: int,
    prefill_batches: Sequence[int],
    prefill_prompt: int,
    repeats: int = 2,
    threads: int | None = None,
    rounds: int = 1,
    watch_root: int | None = None,
    prefill_repeats: int | None = None,
) -> dict[str, Any]:
    """Seconds of one decode step per batch size (``decode_context`` tokens of K/V each) and
    of one prefill step per batch of ``prefill_prompt``-token prompts, each the fastest of
    ``repeats`` (``prefill_repeats`` for prefill), in ``rounds`` rounds; each round visits the sizes in a rotated order and
    records what the machine did meanwhile (``MachineWatch`` rooted at ``watch_root``, the lab)."""
    import torch

    from loadlab._lab.machine import MachineWatch
    from reference_server.bench import decode_step_time_s, prefill_time_s, step_bytes
    from reference_server.model_runner import ModelRunner

    bs = 16
    need = max(
        max(decode_batches) * -(-(decode_context + 1) // bs),
        max(prefill_batches) * -(-(prefill_prompt + 1) // bs),
    )
    t0 = time.perf_counter()
    runner = ModelRunner(preset, num_kv_blocks=need, block_size=bs, threads=threads)
    jobs = [("decode", b) for b in decode_batches] + [("prefill", b) for b in prefill_batches]
    reps = {"decode": repeats, "prefill": prefill_repeats or repeats}

    def once(phase: str, b: int, warmup: bool) -> float:
        if phase == "decode":
            return decode_step_time_s(runner, b, decode_context, 1, warmup=warmup)
        return prefill_time_s(runner, prefill_prompt, b, 1, warmup=warmup)

    out_rounds = []
    for r in range(rounds):
        k = r % len(jobs)
        order = jobs[k:] + jobs[:k]
        watch = MachineWatch.start(watch_root)
        # the repeats interleave the sizes, so a slow spell lands on all of them alike; each
        # size keeps its fastest step (interference only ever adds time)
        step_s: dict[str, dict[str, float]] = {"decode": {}, "prefill": {}}
        for rep in range(max(reps.values())):
            for phase, b in order:
                if rep < reps[phase]:
                    t = once(phase, b, warmup=rep == 0)
                    step_s[phase][str(b)] = min(t, step_s[phase].get(str(b), t))
        out_rounds.append(
            {"decode_step_s": step_s["decode"], "prefill_step_s": step_s["prefill"],
             "machine": watch.stop()}
        )  # fmt: skip
    info = runner.info()
    return {
        "preset": preset,
        "device": str(info.get("device")),
        "dtype": str(info.get("dtype")),
        "torch_threads": torch.get_num_threads(),
        "decode_context": decode_context,
        "prefill_prompt": prefill_prompt,
        # what a step must read at least: every weight once, every attended token's K/V
        "step_bytes": {
            "decode": {
                str(b): step_bytes(runner, decode_context - 1, 1, b) for b in decode_batches
            },
            "prefill": {str(b): step_bytes(runner, 0, prefill_prompt, b) for b in prefill_batches},
        },
        "rounds": out_rounds,
        "elapsed_s": time.perf_counter() - t0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    s: dict[str, Any] = json.loads(argv[0]) if argv else {"preset": "tiny"}
    out = measure(
        s["preset"],
        s.get("decode_batches", (1, 4, 16)),
        int(s.get("decode_context", 64)),
        s.get("prefill_batches", (1, 4)),
        int(s.get("prefill_prompt", 64)),
        int(s.get("bench_repeats", 2)),
        s.get("threads"),
        int(s.get("rounds", 1)),
        os.getppid(),  # the lab: its whole process tree is "ours", the rest is other work
        s.get("prefill_repeats"),
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
