"""The lab's knobs: one ``LabSettings`` per model preset, chosen so each effect is visible.

Why these defaults (cpu preset, a 2-core machine; measured, see docs/lab.md):

- **rounds**: every experiment runs ``rounds`` times, each round visiting every mode once in a
  rotating order, so a slow spell of other work touches all modes alike; each figure is the
  median over rounds with its spread. Three rounds of short experiments fit in ~5 minutes.
- 4 steady chat streams of 64-token prompts and 48-token answers: a decode batch of 4 is
  memory-bound (every step streams all the weights), so the streams tick at a steady pace.
  Every answer has the same length, so each stream's longest gap is over the same 47 gaps.
- a 1024-token prompt at 1.5 s and 5 s of an 8 s interference experiment: its whole prefill is
  a step tens of times longer than a decode step, so in ``continuous`` mode every stream in
  flight waits for it (the stall the lesson describes). Two per round are enough: the figures
  that judge it are per stream in flight (``loadlab._lab.stalls``), not pooled percentiles.
- ``chunk_size`` 64 (budget 256 tokens a step) in ``chunked`` mode: the prompt becomes 16
  slices, so the worst step is ~1/16 of the whole prefill plus the decodes, well under the 1/3
  the lesson's claim needs, while the long prompt pays ~16 extra decode-sized steps of TTFT.
- the server gets one torch thread on CPU (``threads``) and its own core where there are two
  (``loadlab._lab.machine.plan_placement``): the load generator has the other.
- a batch job of 48 documents whose answer lengths follow the Azure conversation trace's
  output lengths (scaled by 1/16: mean 13, longest 37 tokens; ``loadlab._lab.batchjob``), with
  16 batch slots: static batching holds each batch until its longest answer ends, so at that
  spread its useful rows per step are ~1/2.3 of continuous batching's. It runs in ``static``
  and ``continuous`` mode only (``batch_modes``): the claim compares those two.

Example::

    s = settings_for("cpu")
    s.server_args("chunked")   # ['--max-num-seqs', '16', '--prefix-caching', 'off', ...]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loadlab._lab.machine import Placement

from loadlab.errors import ConfigError, at_least

__all__ = ["ALL_MODES", "PRESETS", "LabSettings", "settings_for"]

ALL_MODES = ("static", "continuous", "chunked", "disaggregated")


@dataclass(frozen=True)
class LabSettings:
    """Every knob of one ``loadlab lab`` run (times in seconds, lengths in tokens)."""

    preset: str
    rounds: int = 3
    streams: int = 4
    chat_prompt_tokens: int = 64
    chat_output_tokens: int = 48
    long_prompt_tokens: int = 1024
    long_output_tokens: int = 8
    long_first_s: float = 1.5  # first long prompt, after the streams start
    long_every_s: float = 3.5
    duration_s: float = 8.0  # the interference experiment, per round
    baseline_s: float = 4.0  # the same streams without long prompts, per round
    # 0: a stream's requests count from the first (a closed-loop stream's first round starts
    # at 0 and a warm-up would drop it, leaving a short baseline nearly empty)
    warmup_s: float = 0.0
    batch_documents: int = 48
    batch_prompt_tokens: int = 32
    batch_length_scale: float = 1 / 16  # the Azure trace's output lengths, times this
    batch_modes: tuple[str, ...] = ("static", "continuous")
    max_num_seqs: int = 16
    chunk_size: int = 64
    max_batched_tokens: int = 256
    threads: int | None = 1
    # Each server's KV cache (MiB; None: the server's default). On a GPU the four modes' servers
    # share one device, and a server's default takes most of what is free when it starts.
    kv_cache_mb: float | None = None
    slo_ttft_ms: float = 10000.0  # goodput: a chat request is good within both limits
    slo_stall_ms: float = 3000.0
    stall_k: float = 3.0  # a stall: a gap over k x the mode's baseline median gap
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_context: int = 128
    prefill_batches: tuple[int, ...] = (1, 2, 4)
    # 256 tokens: a single prompt already fills the matmuls (at 128 one thread ran a batch of
    # four 1.24x faster per token: the GEMM's efficiency, not idle capacity)
    prefill_prompt: int = 256
    bench_repeats: int = 5  # decode, per round: the fastest of these (after one warm-up)
    prefill_repeats: int = 3  # prefill steps cost ~10x more: fewer
    seed: int = 0
    server_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        for name in (
            "rounds",
            "streams",
            "chat_prompt_tokens",
            "chat_output_tokens",
            "long_prompt_tokens",
            "long_output_tokens",
            "batch_documents",
            "batch_prompt_tokens",
            "max_num_seqs",
            "chunk_size",
            "max_batched_tokens",
        ):
            at_least(f"lab setting {name}", getattr(self, name), 1, error=ConfigError)
        for name in ("long_every_s", "duration_s", "baseline_s", "batch_length_scale"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"lab setting {name} must be > 0 s, got {getattr(self, name)}")
        if self.warmup_s >= min(self.duration_s, self.baseline_s):
            raise ConfigError(
                f"warmup_s ({self.warmup_s}) must be shorter than the experiments "
                f"({self.duration_s} s, baseline {self.baseline_s} s); raise --duration"
            )
        if self.long_first_s >= self.duration_s:
            raise ConfigError(
                f"the first long prompt (at {self.long_first_s} s) must arrive inside "
                f"--duration {self.duration_s} s; raise --duration"
            )
        if self.max_batched_tokens < self.chunk_size:
            raise ConfigError("max_batched_tokens must be >= chunk_size")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1 or None, got {self.threads}")

    @property
    def long_prompts(self) -> int:
        """Long prompts that arrive inside the interference experiment."""
        return int((self.duration_s - self.long_first_s - 1e-9) // self.long_every_s) + 1

    def server_args(self, mode: str, placement: Placement | None = None) -> list[str]:
        """Flags for ``loadlab-server`` in ``mode`` (every mode gets the same batch size);
        ``placement``: the disaggregated pools' CPUs (the other modes are pinned from outside)."""
        # no prefix caching: every round sends the same seeded prompts, and a cached long
        # prompt would cost no prefill (the prefix-caching experiment turns it on itself)
        args = ["--max-num-seqs", str(self.max_num_seqs), "--prefix-caching", "off"]
        if self.threads is not None and mode != "disaggregated":  # it splits cores itself
            args += ["--threads", str(self.threads)]
        if self.kv_cache_mb is not None:  # disaggregated: each worker's
            args += ["--kv-cache-mb", f"{self.kv_cache_mb:g}"]
        if mode == "disaggregated" and placement and placement.prefill and placement.decode:
            args += ["--prefill-cpus", ",".join(map(str, placement.prefill))]
            args += ["--decode-cpus", ",".join(map(str, placement.decode))]
        if mode == "chunked":
            args += ["--chunk-size", str(self.chunk_size)]
            args += ["--max-batched-tokens", str(self.max_batched_tokens)]
        return args

    def replace(self, **changes: Any) -> LabSettings:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


PRESETS: dict[str, LabSettings] = {
    "cpu": LabSettings(preset="cpu"),
    # Tests: the tiny model (max 1024 positions), every experiment a few seconds.
    "tiny": LabSettings(
        preset="tiny",
        rounds=2,
        streams=3,
        chat_prompt_tokens=32,
        chat_output_tokens=48,
        long_prompt_tokens=700,
        long_output_tokens=4,
        long_first_s=1.0,
        long_every_s=1.2,
        duration_s=3.0,
        baseline_s=1.5,
        batch_documents=48,  # the cpu preset's job: its spread (a smaller one's bound is ~1.8)
        batch_prompt_tokens=32,
        max_num_seqs=16,
        chunk_size=64,
        max_batched_tokens=128,
        slo_ttft_ms=3000.0,
        slo_stall_ms=1000.0,
        decode_batches=(1, 4, 16),
        decode_context=64,
        prefill_batches=(1, 4),
        prefill_prompt=64,
        bench_repeats=1,
        prefill_repeats=1,
        server_timeout_s=90.0,
    ),
    # One GPU: longer prompts, bigger batches, tighter objectives.
    "1b": LabSettings(
        preset="1b",
        streams=8,
        chat_prompt_tokens=128,
        chat_output_tokens=256,
        long_prompt_tokens=6144,
        long_output_tokens=8,
        long_first_s=2.0,
        long_every_s=4.0,
        duration_s=12.0,
        baseline_s=6.0,
        batch_documents=128,
        batch_prompt_tokens=512,
        batch_length_scale=1.0,
        max_num_seqs=32,
        chunk_size=512,
        max_batched_tokens=1024,
        threads=None,
        kv_cache_mb=8192,  # 32 slots of 8,192 tokens at 32 KiB each
        slo_ttft_ms=2000.0,
        slo_stall_ms=300.0,
        decode_batches=(1, 4, 16, 64),
        decode_context=512,
        # On an H200 a 512-token prompt's step costs what a decode step does (the host issuing
        # kernels bounds both); at 2,048 tokens one prompt fills the GPU's matmuls.
        prefill_batches=(1, 4),
        prefill_prompt=2048,
        bench_repeats=3,
    ),
}


def settings_for(preset: str, quick: bool = False, **overrides: Any) -> LabSettings:
    """The defaults of ``preset`` (``quick``: the tiny preset's), then the overrides given.

    >>> settings_for("cpu", duration_s=60.0).duration_s
    60.0
    """
    if quick:
        preset = "tiny"
    if preset not in PRESETS:
        raise ConfigError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return PRESETS[preset].replace(**given) if given else PRESETS[preset]
