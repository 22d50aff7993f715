"""Estimate vs measurement: the roofline held against the reference server's real step times.

For the reference model (its shapes, dtype and device are known) this module measures, on
this machine and in this process, one decode step for each batch size and one prefill for
each prompt length (``reference_server.bench``, the fastest of a few repeats), and sets two
predictions beside each measurement:

- **roofline**: ``roofline.py`` with "this-machine" calibrated by a square matmul and a memory
  copy (``calibrate.py``): the first-principles estimate, as one would make it for a GPU;
- **shaped**: the same physics priced with kernels shaped like the model's own
  (``kernels.py``): its weight matrices at the step's token count (matmuls); decode
  attention done as the server does it (gather each sequence's K/V out of the paged cache,
  then masked grouped-query attention) at the step's batch and context, each layer's K/V
  read cold as in a real step; causal prefill
  attention at the model's head shape and the prompt's length; and
  the per-step overhead (Python dispatch, index building, sampling) measured on a *twin*:
  the same runner with every width shrunk to a few units, so FLOPs and bytes vanish and only
  the fixed costs remain. None of these runs the measured model, and nothing is fitted to
  the measurement: each point's kernels and the point itself are timed in turn, ``rounds``
times, keeping the fastest of each (so both sides see the same machine load).

Example::

    rows = measure_reference("cpu", batches=[1, 8], prompts=[128])
    print(format_table(rows))
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import IO, Any

from loadlab._capacity import roofline
from loadlab._capacity.calibrate import best_time_s, calibrate, load_or_calibrate
from loadlab._capacity.hardware import Hardware
from loadlab._capacity.kernels import ShapedKernels
from loadlab._capacity.models import ModelSpec, from_model_args
from loadlab.errors import ConfigError

__all__ = ["Comparison", "format_table", "measure_reference", "run_vs_measured"]


@dataclass(frozen=True)
class Comparison:
    """One point: a decode step of ``size`` sequences, or a prefill of ``size`` tokens."""

    kind: str  # "decode" | "prefill"
    size: int
    context_tokens: int
    measured_s: float
    roofline_s: float
    predicted_s: float  # the shaped prediction
    flops: float
    bytes: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """predicted / measured (1.0 = exact)."""
        return self.predicted_s / self.measured_s

    @property
    def roofline_ratio(self) -> float:
        return self.roofline_s / self.measured_s

    @property
    def error_pct(self) -> float:
        return (self.ratio - 1.0) * 100.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(ratio=self.ratio, roofline_ratio=self.roofline_ratio, error_pct=self.error_pct)
        return d


def _twin_args(args: Any) -> Any:
    """The reference ModelArgs with every width shrunk (same layers, vocab, code path)."""
    group = args.n_heads // args.n_kv_heads
    return dataclasses.replace(args, dim=8 * group, n_heads=group, n_kv_heads=1, ffn_dim=16)


CLOCKS = ("wall", "cpu")


def _step_timer(runner: Any, clock: str, repeats: int) -> tuple[Any, Any]:
    """(decode(batch, context) -> s, prefill(prompt) -> s) for one runner and clock.

    Wall clock: ``reference_server.bench`` as is. CPU clock (``time.thread_time``; use with one
    torch thread): the same steps built the same way from the public sequence contract,
    timed by this thread's CPU time, so time spent descheduled on a busy machine is not
    counted. Both report the fastest of ``repeats`` after one warm-up.
    """
    bench = importlib.import_module("reference_server.bench")  # torch: only when measuring

    if clock == "wall":
        return (
            lambda b, c: bench.decode_step_time_s(runner, b, c, repeats),
            lambda p: bench.prefill_time_s(runner, p, 1, repeats),
        )
    seqmod = importlib.import_module("reference_server.sequence")
    SamplingParams, ScheduledBatch = seqmod.SamplingParams, seqmod.ScheduledBatch
    ScheduledSeq, Seq = seqmod.ScheduledSeq, seqmod.Sequence

    def batch(n: int, tokens: int, computed: int) -> Any:
        per_seq = -(-(tokens + 1) // runner.block_size)
        items = []
        for i in range(n):
            s = Seq(f"b{i}", [(7 * i + j) % 256 for j in range(tokens)], SamplingParams(1))
            s.block_table = list(range(i * per_seq, (i + 1) * per_seq))
            s.num_computed_tokens = computed
            items.append(ScheduledSeq(s, tokens - computed))
        return ScheduledBatch(items)

    def timed(sb: Any) -> float:
        return best_time_s(lambda: runner.run(sb), repeats, clock=time.thread_time)

    return (lambda b, c: timed(batch(b, c, c - 1)), lambda p: timed(batch(1, p, 0)))


def measure_reference(
    preset: str = "cpu",
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
    prompts: Sequence[int] = (128, 256, 512, 1024, 2048),
    context_tokens: int = 256,
    repeats: int = 3,
    threads: int | None = None,
    clock: str = "wall",
    log: IO[str] | None = None,
    rounds: int = 2,
) -> tuple[ModelSpec, Hardware, list[Comparison], dict[str, Any]]:
    """Measure the reference model here and predict each point; see the module docstring."""
    ModelRunner = importlib.import_module("reference_server.model_runner").ModelRunner  # torch

    if clock not in CLOCKS:
        raise ConfigError(f"--clock must be one of {', '.join(CLOCKS)}, got {clock!r}")

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    kv_bytes = 1 << 30
    runner = ModelRunner(preset, kv_cache_bytes=kv_bytes, threads=threads)
    twin = ModelRunner(_twin_args(runner.args), kv_cache_bytes=1 << 26, threads=threads)
    model = from_model_args(f"ref-{preset}", runner.args, runner.dtype.itemsize)
    say(f"calibrating this machine ({runner.device}, {_torch_threads()} threads, {clock} clock)")
    timer = time.thread_time if clock == "cpu" else time.perf_counter
    hw = load_or_calibrate(force=True) if clock == "wall" else calibrate(clock=timer)
    kernels = ShapedKernels(model, device=runner.device.type, clock=timer)
    decode_s, prefill_s = _step_timer(runner, clock, repeats)
    twin_decode_s, twin_prefill_s = _step_timer(twin, clock, repeats)
    copy_bps = kernels.copy_bytes_per_s()
    rows: list[Comparison] = []
    for b in batches:
        mm, attn_s, overhead, measured = _interleaved(
            rounds,
            partial(kernels.matmul_s, b, repeats),
            partial(kernels.decode_attention_s, b, context_tokens, repeats),
            partial(twin_decode_s, b, context_tokens),
            partial(decode_s, b, context_tokens),
        )
        est = roofline.decode_step(model, hw, b, context_tokens - 1)
        parts = {"matmul_s": mm, "attention_s": attn_s, "overhead_s": overhead}
        rows.append(Comparison("decode", b, context_tokens, measured, est.time_s,
                               sum(parts.values()), est.flops, est.bytes, parts))  # fmt: skip
        say(_row_text(rows[-1]))
    for p in prompts:
        attn_flops = 4.0 * model.n_layers * model.attn_dim * p * (p + 1) / 2
        mm, attn_s, overhead, measured = _interleaved(
            rounds,
            partial(kernels.matmul_s, p, repeats),
            partial(_per_flop_s, attn_flops, partial(kernels.attention_flops_per_s, p, repeats)),
            partial(twin_prefill_s, p),
            partial(prefill_s, p),
        )
        est = roofline.prefill(model, hw, p)
        kv_write_s = 2.0 * p * model.kv_bytes_per_token / copy_bps  # index_copy_: read + write
        parts = {"matmul_s": mm, "attention_s": attn_s,
                 "kv_write_s": kv_write_s, "overhead_s": overhead}  # fmt: skip
        rows.append(Comparison("prefill", p, 0, measured, est.time_s, sum(parts.values()),
                               est.flops, est.bytes, parts))  # fmt: skip
        say(_row_text(rows[-1]))
    per_req = context_tokens * model.kv_bytes_per_token
    blocks_per_req = math.ceil(context_tokens / runner.block_size)
    extra = {
        "preset": preset,
        "device": str(runner.device),
        "dtype": str(runner.dtype).removeprefix("torch."),
        "threads": _torch_threads(),
        "clock": clock,
        "rounds": rounds,
        "copy_bytes_per_s": copy_bps,
        "kv_cache_bytes": kv_bytes,
        "max_concurrency_predicted": kv_bytes // per_req,
        "max_concurrency_server": runner.num_kv_blocks // blocks_per_req,
        "load_average": os.getloadavg(),
    }
    return model, hw, rows, extra


def _per_flop_s(flops: float, rate: Callable[[], float]) -> float:
    return flops / rate()


def _interleaved(rounds: int, *timers: Callable[[], float]) -> tuple[float, ...]:
    """Each timer's fastest result over ``rounds`` rounds of calling them in turn, so the
    prediction's kernels and the measurement they predict see the same machine load."""
    best = [math.inf] * len(timers)
    for _ in range(max(1, rounds)):
        for i, timer in enumerate(timers):
            best[i] = min(best[i], timer())
    return tuple(best)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _row_text(r: Comparison) -> str:
    what = f"batch {r.size:>4}" if r.kind == "decode" else f"prompt {r.size:>5}"
    return (
        f"{r.kind:<8}{what:<13}{r.measured_s * 1e3:>11.2f}{r.predicted_s * 1e3:>11.2f}"
        f"{r.ratio:>8.2f}{r.error_pct:>+8.1f}%{r.roofline_s * 1e3:>11.2f}{r.roofline_ratio:>8.2f}"
    )


def format_table(
    rows: Sequence[Comparison], hw: Hardware | None = None, extra: dict[str, Any] | None = None
) -> str:
    """The ratio table: measured, shaped prediction, ratio, error; roofline and its ratio;
    then achieved FLOP/s and bandwidth as fractions of the calibrated peaks."""
    head = (
        f"{'phase':<8}{'size':<13}{'measured ms':>11}{'shaped ms':>11}{'ratio':>8}{'error':>9}"
        f"{'roofline ms':>11}{'ratio':>8}"
    )
    lines = [head, "-" * len(head), *(_row_text(r) for r in rows)]
    if hw is not None:
        lines += ["", "achieved (roofline FLOPs and bytes / measured time), as fraction of "
                  f"this machine's calibrated peaks ({hw.peak_flops_per_s / 1e9:.1f} GFLOP/s, "
                  f"{hw.peak_bytes_per_s / 1e9:.2f} GB/s):"]  # fmt: skip
        for r in rows:
            fps, bps = r.flops / r.measured_s, r.bytes / r.measured_s
            lines.append(
                f"  {r.kind:<8}{r.size:>6}: {fps / 1e9:8.1f} GFLOP/s ({fps / hw.peak_flops_per_s:5.0%})"
                f"  {bps / 1e9:7.2f} GB/s ({bps / hw.peak_bytes_per_s:5.0%})"
            )
    worst = max((abs(r.error_pct) for r in rows), default=0.0)
    lines.append(f"\nworst shaped error: {worst:.1f} % over {len(rows)} points")
    if extra:
        lines.append(
            f"max concurrency at {rows[0].context_tokens if rows else 0} tokens: predicted from "
            f"memory {extra['max_concurrency_predicted']:,}, server admits (paged blocks) "
            f"{extra['max_concurrency_server']:,}; load average {extra['load_average']}"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from exc


def run_vs_measured(args: Any) -> int:
    """``loadlab capacity --vs-measured``: measure the reference preset here, print the table."""
    model, hw, rows, extra = measure_reference(
        preset=args.preset,
        batches=_ints(args.batches),
        prompts=_ints(args.prompts),
        context_tokens=args.context_tokens,
        repeats=args.repeats,
        threads=getattr(args, "threads", None),
        clock=getattr(args, "clock", "wall"),
        log=sys.stderr,
        rounds=getattr(args, "rounds", 2),
    )
    print(f"{model.name} ({model.num_params / 1e6:.1f} M params, {extra['dtype']}) on "
          f"{extra['device']}, {extra['threads']} threads, {extra['clock']} clock; decode context "
          f"{args.context_tokens} tokens")  # fmt: skip
    print(format_table(rows, hw, extra))
    if args.json_out:
        doc = {"model": model.to_dict(), "hardware": hw.to_dict(), "extra": extra,
               "rows": [r.to_dict() for r in rows]}  # fmt: skip
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, default=str)
    return 0
