"""The lab's batching experiment: decode and prefill tokens/s against batch size.

"Batching helps decode enormously and prefill barely": a decode step reads every weight to
make one token per sequence, so B sequences share that read (tokens/s grows ~B-fold until
compute binds); a prefill step is already a large matmul, so a batch of prompts finds no
idle capacity. Measured with ``reference_server.bench`` on the real model runner; run as a
subprocess by ``loadlab lab`` (it imports torch) and prints one JSON object::

    python3 -m loadlab.lab.batching '{"preset": "tiny", "decode_batches": [1, 4], ...}'
"""

from __future__ import annotations

import json
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
) -> dict[str, Any]:
    """Decode tokens/s per batch size (``decode_context`` tokens of K/V each) and prefill
    tokens/s per batch of ``prefill_prompt``-token prompts, each the fastest of ``repeats``."""
    import torch

    from reference_server.bench import decode_step_time_s, prefill_time_s
    from reference_server.model_runner import ModelRunner

    bs = 16
    need = max(
        max(decode_batches) * -(-(decode_context + 1) // bs),
        max(prefill_batches) * -(-(prefill_prompt + 1) // bs),
    )
    t0 = time.perf_counter()
    runner = ModelRunner(preset, num_kv_blocks=need, block_size=bs, threads=threads)
    decode = {}
    for b in decode_batches:
        decode[b] = b / decode_step_time_s(runner, b, decode_context, repeats)
    prefill = {}
    for b in prefill_batches:
        prefill[b] = b * prefill_prompt / prefill_time_s(runner, prefill_prompt, b, repeats)
    info = runner.info()
    return {
        "preset": preset,
        "device": str(info.get("device")),
        "dtype": str(info.get("dtype")),
        "torch_threads": torch.get_num_threads(),
        "decode_context": decode_context,
        "prefill_prompt": prefill_prompt,
        "decode_tokens_per_s": {str(b): v for b, v in decode.items()},
        "prefill_tokens_per_s": {str(b): v for b, v in prefill.items()},
        "decode_speedup": {str(b): v for b, v in speedups(decode).items()},
        "prefill_speedup": {str(b): v for b, v in speedups(prefill).items()},
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
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
