"""Measured step times of the model runner, and the roofline inputs gpt-fast prints.

Used by ``benchmarks/batching.py`` and by the capacity and lab helpers, which want measured
seconds for a decode step (batch, context) and a prefill (prompt length, batch).

Accounting (per step, as gpt-fast's ``generate.py`` and nanoGPT's ``estimate_mfu`` do it):

- bytes read = weight bytes (every matrix; the embedding table is only gathered, so it is left
  out) + K/V bytes of every attended token (``kv_bytes_per_token`` each);
- FLOPs = 2 * N * tokens (a multiply and an add per weight per token; Kaplan et al. 2020,
  "Scaling Laws for Neural Language Models", Table 1, with N the non-embedding parameters)
  + 4 * n_layers * dim * attended keys, summed over tokens (QK^T and AV: nanoGPT
  ``estimate_mfu``, after the PaLM paper, appendix B; forward pass only).

Usage::

    runner = ModelRunner("cpu")
    step_s = decode_step_time_s(runner, batch=8, context_tokens=128, repeats=5)
    tokens_per_s = 8 / step_s
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from reference_server.checks import at_least
from reference_server.model import ModelArgs
from reference_server.model_runner import ModelRunner
from reference_server.sequence import SamplingParams, ScheduledBatch, ScheduledSeq, Sequence

__all__ = [
    "attention_flops",
    "decode_batch",
    "decode_step_time_s",
    "machine_peaks",
    "prefill_time_s",
    "step_bytes",
    "step_flops",
    "weight_bytes",
]


def weight_bytes(args: ModelArgs, dtype_bytes: int) -> int:
    """Bytes of weights a forward pass streams (all but the embedding table)."""
    return args.num_non_embedding_params * dtype_bytes


def attention_flops(args: ModelArgs, first_pos: int, num_tokens: int) -> int:
    """QK^T and AV FLOPs of ``num_tokens`` causal queries at positions first_pos.. (each
    attends to itself and everything before): 4 * n_layers * dim per (query, key) pair."""
    keys = num_tokens * first_pos + num_tokens * (num_tokens + 1) // 2
    return 4 * args.n_layers * args.n_heads * args.head_dim * keys


def step_flops(args: ModelArgs, first_pos: int, num_tokens: int, batch: int) -> int:
    """Forward FLOPs of a step of ``batch`` sequences, each processing ``num_tokens`` tokens
    from position ``first_pos``."""
    per_seq = 2 * args.num_non_embedding_params * num_tokens
    return batch * (per_seq + attention_flops(args, first_pos, num_tokens))


def step_bytes(runner: ModelRunner, first_pos: int, num_tokens: int, batch: int) -> int:
    """Bytes a step must read at least: weights once, plus every attended token's K/V."""
    kv_tokens = batch * (first_pos + num_tokens)
    return weight_bytes(runner.args, runner.dtype.itemsize) + kv_tokens * runner.kv_bytes_per_token


def _make_seqs(
    runner: ModelRunner, batch: int, prompt_tokens: int, computed: int
) -> list[Sequence]:
    bs = runner.block_size
    per_seq = -(-(prompt_tokens + 1) // bs)
    if batch * per_seq > runner.num_kv_blocks:
        raise ValueError(
            f"batch {batch} x {prompt_tokens} tokens needs {batch * per_seq} KV blocks, the "
            f"runner has {runner.num_kv_blocks}; pass a larger num_kv_blocks"
        )
    if prompt_tokens + 1 > runner.args.max_seq_len:
        raise ValueError(f"{prompt_tokens} tokens exceed max_seq_len {runner.args.max_seq_len}")
    seqs = []
    for b in range(batch):
        prompt = [(7 * b + i) % 256 for i in range(prompt_tokens)]
        s = Sequence(f"bench{b}", prompt, SamplingParams(max_tokens=1))
        s.block_table = list(range(b * per_seq, (b + 1) * per_seq))
        s.num_computed_tokens = computed
        seqs.append(s)
    return seqs


def _time_step(runner: ModelRunner, batch: ScheduledBatch, repeats: int, warmup: bool) -> float:
    at_least("repeats", repeats, 1)
    if warmup:
        runner.run(batch)  # allocator, kernels, caches
    times = []
    for _ in range(repeats):
        if runner.device.type == "cuda":
            torch.cuda.synchronize(runner.device)
        t0 = time.perf_counter()
        runner.run(batch)  # ends with .tolist() of the sampled ids: a device sync
        times.append(time.perf_counter() - t0)
    # The fastest repeat: on a shared machine interference only ever adds time.
    return min(times)


def decode_batch(runner: ModelRunner, batch: int, context_tokens: int) -> ScheduledBatch:
    """A decode step's work: ``batch`` sequences each holding ``context_tokens`` tokens of K/V
    make one token each (the context is not prefilled: its contents do not change the cost)."""
    seqs = _make_seqs(runner, batch, context_tokens, computed=context_tokens - 1)
    return ScheduledBatch([ScheduledSeq(s, 1) for s in seqs])


def decode_step_time_s(
    runner: ModelRunner, batch: int, context_tokens: int, repeats: int = 5, *, warmup: bool = True
) -> float:
    """Seconds (fastest of ``repeats``) of one decode step: ``batch`` sequences each holding ``context_tokens``
    tokens of K/V make one token each (the same step is re-run; the cache contents do not
    change the cost, so the context is not prefilled)."""
    return _time_step(runner, decode_batch(runner, batch, context_tokens), repeats, warmup)


def prefill_time_s(
    runner: ModelRunner,
    prompt_tokens: int,
    batch: int = 1,
    repeats: int = 3,
    *,
    warmup: bool = True,
) -> float:
    """Seconds (fastest of ``repeats``) of one step that prefills ``batch`` whole prompts of ``prompt_tokens``."""
    seqs = _make_seqs(runner, batch, prompt_tokens, computed=0)
    items = [ScheduledSeq(s, prompt_tokens) for s in seqs]
    return _time_step(runner, ScheduledBatch(items), repeats, warmup)


def machine_peaks(device: torch.device | str = "cpu", size_mb: int = 256) -> dict[str, float]:
    """Rough ceilings to compare against: memory read GB/s (a sum over ``size_mb`` of fp32,
    far beyond any cache) and matmul GFLOP/s (a 1024^3 fp32 GEMM; bf16 4096^3 on CUDA)."""
    dev = torch.device(device)
    x = torch.ones(size_mb * 2**20 // 4, device=dev)
    n = 4096 if dev.type == "cuda" else 1024
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.ones(n, n, device=dev, dtype=dt)

    def best(fn: Callable[[], object], reps: int) -> float:
        out = []
        for _ in range(reps + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            out.append(time.perf_counter() - t0)
        return min(out[1:])

    read_s = best(x.sum, 5)
    mm_s = best(lambda: a @ a, 5)
    return {"mem_read_gbps": x.numel() * 4 / read_s / 1e9, "matmul_gflops": 2 * n**3 / mm_s / 1e9}
