"""The GPU sizing sequence: throughput bound, memory cross-check, take the larger.

From given figures (the classic back-of-envelope sequence)::

    1. decode throughput per GPU, batched       2,000 tokens/s
    2. average completion length                  250 tokens
    3. completions per GPU per second         2,000 / 250 = 8
    4. peak completions per second needed           400
    5. GPUs for decode                          400 / 8 = 50
    6. add prefill capacity and headroom         50 x 1.3 = 65

then, when the model, hardware and prompt length are known, the memory cross-check: the KV
cache of the requests in flight (Little's law: arrival rate x mean request time) must fit
beside the weights. Serving capacity is bounded by whichever binds first: memory for
concurrency, or bandwidth for throughput. Long conversations at a low rate are memory-bound;
short requests at a high rate are throughput-bound.

Prefix caching (``MemoryCheck.prefix_hit_rate`` h, ``--prefix-hit-rate``): the first
``C = h x prompt`` tokens of each prompt come from the cache, so a prefill costs only its
uncached ``prompt - C`` tokens (attending to the C cached ones), and the memory cross-check
counts the shared prefix blocks once per GPU (``shared_prefixes`` of them, C tokens each)
instead of once per request: each request holds ``prompt - C + completion`` tokens of its own.

Example::

    >>> plan = size_from_figures(decode_tokens_per_s=2000, completion_tokens=250,
    ...                          peak_rps=400, headroom=0.3)
    >>> plan.decode_gpus, plan.total_gpus, plan.binding
    (50, 65, 'throughput')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from loadlab._capacity import roofline
from loadlab._capacity.hardware import DEFAULT_MEMORY_RESERVE_FRACTION, Hardware
from loadlab._capacity.models import ModelSpec
from loadlab.errors import ConfigError, at_least
from loadlab.records import pick

__all__ = [
    "DEFAULT_BATCH",
    "MemoryCheck",
    "Plan",
    "Step",
    "ceil_gpus",
    "size_first_principles",
    "size_from_figures",
]

DEFAULT_BATCH = 64  # sequences a GPU decodes together when the throughput bound is computed


def ceil_gpus(x: float) -> int:
    """Round a GPU count up, forgiving float dust (50 x 1.3 = 65.00000000000001 is 65)."""
    return max(0, math.ceil(round(x, 9)))


@dataclass(frozen=True)
class Step:
    """One printed line of the sequence."""

    label: str
    value: float
    unit: str = ""
    how: str = ""  # the arithmetic, e.g. "2,000 / 250"


@dataclass(frozen=True)
class MemoryCheck:
    """What the memory cross-check needs beyond the figures: model, hardware, traffic shape."""

    model: ModelSpec
    hardware: Hardware
    prompt_tokens: int
    batch: int = DEFAULT_BATCH
    reserve_fraction: float = DEFAULT_MEMORY_RESERVE_FRACTION
    prefix_hit_rate: float = 0.0  # fraction of prompt tokens served from a prefix cache
    shared_prefixes: int = 1  # distinct cached prefixes each GPU holds (counted once each)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens per request served from the cache (the last one is always computed)."""
        return min(round(self.prefix_hit_rate * self.prompt_tokens), self.prompt_tokens - 1)

    def __post_init__(self) -> None:
        if not 0 <= self.prefix_hit_rate < 1:
            raise ConfigError(
                f"--prefix-hit-rate is a fraction in [0, 1) (0.5 = half the prompt tokens "
                f"cached), got {self.prefix_hit_rate}"
            )
        at_least("--shared-prefixes", self.shared_prefixes, 1, error=ConfigError)
        at_least("--prompt-tokens", self.prompt_tokens, 1, error=ConfigError)
        at_least("--batch", self.batch, 1, error=ConfigError)
        if not 0 <= self.reserve_fraction < 1:
            raise ConfigError(f"--reserve must be in [0, 1), got {self.reserve_fraction}")


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    decode_gpus: int = 0
    throughput_gpus: int = 0  # decode (+ prefill) with headroom
    memory_gpus: int | None = None  # with headroom; None when not checked
    total_gpus: int = 0
    binding: str = "throughput"  # "throughput" | "memory"
    notes: list[str] = field(default_factory=list)

    def add(self, label: str, value: float, unit: str = "", how: str = "") -> float:
        self.steps.append(Step(label, value, unit, how))
        return value

    def to_text(self) -> str:
        lines = []
        for i, s in enumerate(self.steps, 1):
            how = f"{s.how} = " if s.how else ""
            lines.append(f"{i:>2}. {s.label:<44} {how}{_fmt(s.value)} {s.unit}".rstrip())
        lines.append(
            f"=> {self.total_gpus} GPUs ({self.binding} binds: throughput bound "
            f"{self.throughput_gpus}, memory bound "
            f"{'not checked' if self.memory_gpus is None else self.memory_gpus})"
        )
        lines.extend(f"   note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [s.__dict__ for s in self.steps],
            **pick(self, "decode_gpus throughput_gpus memory_gpus total_gpus binding notes"),
        }


def _fmt(x: float) -> str:
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.3g}" if abs(x) < 100 else f"{x:,.0f}"


def _check_traffic(completion_tokens: float, peak_rps: float, headroom: float) -> None:
    if not completion_tokens > 0:
        raise ConfigError(f"--completion-tokens must be > 0, got {completion_tokens}")
    if not peak_rps > 0:
        raise ConfigError(f"--peak-rps must be > 0, got {peak_rps}")
    if headroom < 0:
        raise ConfigError(f"--headroom must be >= 0 (0.3 = 30 %), got {headroom}")


def size_from_figures(
    decode_tokens_per_s: float,
    completion_tokens: float,
    peak_rps: float,
    headroom: float = 0.3,
    memory: MemoryCheck | None = None,
) -> Plan:
    """The sequence from given figures; with ``memory``, the cross-check too.

    In the cross-check a request's decode speed is the GPU's figure shared by ``batch``
    streams (tokens/s per stream = decode_tokens_per_s / batch), and its prefill comes from
    the roofline.
    """
    if not decode_tokens_per_s > 0:
        raise ConfigError(f"--decode-tokens-per-s must be > 0, got {decode_tokens_per_s}")
    _check_traffic(completion_tokens, peak_rps, headroom)
    plan = Plan()
    tps = plan.add("decode throughput per GPU, batched", decode_tokens_per_s, "tokens/s")
    plan.add("average completion length", completion_tokens, "tokens")
    cps = plan.add(
        "completions per GPU per second",
        tps / completion_tokens,
        "",
        f"{_fmt(tps)} / {_fmt(completion_tokens)}",
    )
    plan.add("peak completions per second needed", peak_rps)
    raw = peak_rps / cps
    plan.decode_gpus = ceil_gpus(raw)
    how = f"{_fmt(peak_rps)} / {_fmt(cps)}"
    if plan.decode_gpus != raw:
        how += f" = {_fmt(raw)}, rounded up"
    plan.add("GPUs for decode", plan.decode_gpus, "", how)
    plan.throughput_gpus = ceil_gpus(plan.decode_gpus * (1 + headroom))
    plan.add(
        f"add prefill capacity and headroom (+{headroom:.0%})",
        plan.throughput_gpus,
        "GPUs",
        f"{plan.decode_gpus} x {1 + headroom:g}",
    )
    if memory is not None:
        step_s = memory.batch / decode_tokens_per_s  # per-stream time per token
        prefill_s = roofline.prefill(
            memory.model, memory.hardware, memory.prompt_tokens, cached_tokens=memory.cached_tokens
        ).time_s
        _memory_check(plan, memory, completion_tokens, peak_rps, headroom, prefill_s, step_s)
    _decide(plan)
    return plan


def size_first_principles(
    check: MemoryCheck, completion_tokens: int, peak_rps: float, headroom: float = 0.3
) -> Plan:
    """The sequence with every figure from the roofline: decode throughput at ``check.batch``,
    prefill GPU time added explicitly, then the memory cross-check."""
    _check_traffic(completion_tokens, peak_rps, headroom)
    m, plan = check.model, Plan()
    tokens = check.prompt_tokens + completion_tokens
    k = roofline.gpus_per_replica(m, check.hardware, tokens, check.reserve_fraction)
    hw = roofline.replica(check.hardware, k)
    if k > 1:
        plan.notes.append(f"{m.name} needs {k} x {check.hardware.name} per copy (tensor parallel)")
    context = check.prompt_tokens + completion_tokens // 2
    step = roofline.decode_step(m, hw, check.batch, context)
    plan.add(
        f"decode step, batch {check.batch}, context {context:,}",
        step.time_s * 1e3,
        f"ms ({step.bound}-bound)",
    )
    tps = plan.add(
        "decode throughput per GPU, batched",
        check.batch / step.time_s / k,
        "tokens/s",
        f"{check.batch} / {step.time_s * 1e3:.3g} ms / {k}",
    )
    plan.add("average completion length", completion_tokens, "tokens")
    cps = plan.add(
        "completions per GPU per second", tps / completion_tokens, "",
        f"{_fmt(tps)} / {completion_tokens}",
    )  # fmt: skip
    plan.add("peak completions per second needed", peak_rps)
    decode = plan.add("GPUs for decode", peak_rps / cps, "", f"{_fmt(peak_rps)} / {_fmt(cps)}")
    cached = check.cached_tokens
    pre = roofline.prefill(m, hw, check.prompt_tokens, cached_tokens=cached)
    what = f"{check.prompt_tokens:,}-token prompts"
    if cached:
        what += f", {cached:,} cached: {check.prompt_tokens - cached:,} computed"
    prefill_gpus = plan.add(
        f"GPUs for prefill ({what})",
        peak_rps * pre.time_s * k,
        "",
        f"{_fmt(peak_rps)} x {pre.time_s * 1e3:.3g} ms x {k}",
    )
    plan.decode_gpus = ceil_gpus(decode)
    # whole model copies of k GPUs each
    plan.throughput_gpus = k * ceil_gpus((decode + prefill_gpus) * (1 + headroom) / k)
    plan.add(
        f"decode + prefill, + {headroom:.0%} headroom",
        plan.throughput_gpus,
        "GPUs",
        f"({_fmt(decode)} + {_fmt(prefill_gpus)}) x {1 + headroom:g}",
    )
    _memory_check(plan, check, completion_tokens, peak_rps, headroom, pre.time_s, step.time_s)
    _decide(plan)
    return plan


def _memory_check(
    plan: Plan,
    check: MemoryCheck,
    completion_tokens: float,
    peak_rps: float,
    headroom: float,
    prefill_s: float,
    step_s: float,
) -> None:
    m = check.model
    tokens = check.prompt_tokens + completion_tokens
    k = roofline.gpus_per_replica(m, check.hardware, tokens, check.reserve_fraction)
    hw = roofline.replica(check.hardware, k)
    plan.add("KV cache bytes per token", m.kv_bytes_per_token, "bytes",
             f"2 x {m.n_layers} x {m.n_kv_heads} x {m.head_dim} x {m.dtype_bytes}")  # fmt: skip
    cached = check.cached_tokens
    own = tokens - cached  # a request's own blocks; its cached prefix is shared
    per_req = roofline.kv_bytes_per_request(m, own)
    how = f"{_fmt(tokens)} tokens" + (f" - {cached:,} shared" if cached else "")
    plan.add("KV cache per request", per_req / 1e9, "GB", how)
    free = hw.memory_bytes * (1 - check.reserve_fraction) - m.weight_bytes
    shared = check.shared_prefixes * roofline.kv_bytes_per_request(m, cached) if cached else 0.0
    if cached:
        plan.add("shared prefix KV, counted once", shared / 1e9, "GB",
                 f"{check.shared_prefixes} x {cached:,} tokens")  # fmt: skip
    max_conc = max(0, math.floor((free - shared) / per_req + 1e-9))
    plan.add(
        f"max requests in flight per {'GPU' if k == 1 else f'{k}-GPU copy'}",
        max_conc,
        "",
        f"{(free - shared) / 1e9:,.1f} GB free / {per_req / 1e9:.3g} GB",
    )
    mean_s = prefill_s + completion_tokens * step_s
    plan.add("mean request time", mean_s, "s",
             f"{prefill_s:.3g} s prefill + {_fmt(completion_tokens)} x {step_s * 1e3:.3g} ms")  # fmt: skip
    need = roofline.concurrency_needed(peak_rps, mean_s)
    plan.add("requests in flight (Little's law)", need, "", f"{_fmt(peak_rps)} x {mean_s:.3g} s")
    bare = ceil_gpus(need / max_conc) * k
    plan.add("GPUs for memory", bare, "", f"ceil({need:.3g} / {max_conc}) x {k}")
    plan.memory_gpus = k * ceil_gpus(bare * (1 + headroom) / k)  # whole copies
    plan.add(f"memory bound + {headroom:.0%} headroom", plan.memory_gpus, "GPUs")


def _decide(plan: Plan) -> None:
    mem = plan.memory_gpus or 0
    plan.binding = "memory" if mem > plan.throughput_gpus else "throughput"
    plan.total_gpus = max(mem, plan.throughput_gpus)
    plan.add(f"total ({plan.binding} binds)", plan.total_gpus, "GPUs")
