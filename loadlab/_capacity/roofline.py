"""Roofline estimates for serving a decoder: prefill time, decode step time, memory bounds.

The model (Williams, Waterman & Patterson 2009, "Roofline"; applied to LLM inference in
Chen, "Transformer Inference Arithmetic", kipp.ly 2022): a forward pass takes at least
``max(FLOPs / achieved FLOP/s, bytes / achieved bytes/s)``, plus a fixed per-pass overhead
that only a measurement can give (``Hardware.step_overhead_s``; 0 on datasheet presets).

- Prefill of P prompt tokens is compute-bound: ``2 * N * P`` FLOPs for the matmuls (Kaplan et
  al. 2020, "Scaling Laws for Neural Language Models", eq. 2.2: C_forward ~ 2N per token) plus
  attention over the causal pairs.
- A decode step of B sequences is memory-bound: it streams every weight once (shared by the
  B sequences: the whole reason batching pays) plus each sequence's KV cache.

Example::

    >>> from loadlab._capacity.models import get_model
    >>> from loadlab._capacity.hardware import get_hardware
    >>> m, h = get_model("llama-3-8b"), get_hardware("h100").derated(1.0, 1.0)
    >>> round(decode_step(m, h, batch=1, context_tokens=0).time_s * 1e3, 2)   # ms
    4.48
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from loadlab._capacity.hardware import DEFAULT_MEMORY_RESERVE_FRACTION, Hardware
from loadlab._capacity.models import ModelSpec
from loadlab.errors import ConfigError

__all__ = [
    "Estimate",
    "concurrency_needed",
    "decode_bytes",
    "decode_flops",
    "decode_step",
    "gpus_per_replica",
    "kv_bytes_per_request",
    "max_concurrency",
    "prefill",
    "prefill_bytes",
    "prefill_flops",
    "replica",
    "request_time_s",
]


@dataclass(frozen=True)
class Estimate:
    """One forward pass: its FLOPs and bytes, the time each alone would take, and the bound."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """ "compute" or "memory": which roof the pass sits under."""
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops / self.bytes


def _estimate(hw: Hardware, flops: float, nbytes: float) -> Estimate:
    return Estimate(
        flops=flops,
        bytes=nbytes,
        compute_s=flops / hw.achieved_flops_per_s,
        memory_s=nbytes / hw.achieved_bytes_per_s,
        overhead_s=hw.step_overhead_s,
    )


def _attention_flops(model: ModelSpec, query_tokens: int, context_tokens: int) -> float:
    # QK^T and softmax(.)V each cost one multiply-add (2 FLOPs) per (query, key, attn dim)
    # triple: 4 * d_attn FLOPs per (query, key) pair per layer (Kaplan et al. 2020, Table 1,
    # counts the same 2 * n_layer * n_ctx * d_attn per token for each of the two products).
    # With a causal mask, P new tokens after C cached ones see C*P + P(P+1)/2 pairs.
    p, c = query_tokens, context_tokens
    pairs = c * p + p * (p + 1) / 2
    return 4.0 * model.n_layers * model.attn_dim * pairs


def prefill_flops(
    model: ModelSpec, prompt_tokens: int, batch: int = 1, cached_tokens: int = 0
) -> float:
    """FLOPs to prefill ``batch`` prompts of ``prompt_tokens``: 2*N*P matmuls + causal attention.

    With ``cached_tokens`` of each prompt served from a prefix cache only the rest, P - C, goes
    through the model, attending to the C cached tokens as well as to itself."""
    _check_tokens(prompt_tokens, batch)
    _check_cached(prompt_tokens, cached_tokens)
    new = prompt_tokens - cached_tokens
    per_seq = 2.0 * model.matmul_params * new + _attention_flops(model, new, cached_tokens)
    return batch * per_seq


def prefill_bytes(
    model: ModelSpec, prompt_tokens: int, batch: int = 1, cached_tokens: int = 0
) -> float:
    """Bytes moved by a prefill: the weights once, plus the KV cache written for every token
    computed and read for every cached one."""
    _check_tokens(prompt_tokens, batch)
    _check_cached(prompt_tokens, cached_tokens)
    return model.weight_bytes_read_per_step + batch * prompt_tokens * model.kv_bytes_per_token


def prefill(
    model: ModelSpec, hw: Hardware, prompt_tokens: int, batch: int = 1, cached_tokens: int = 0
) -> Estimate:
    """Prefill of ``batch`` prompts of ``prompt_tokens`` each (the TTFT floor of one request),
    the first ``cached_tokens`` of each served from a prefix cache (priced as a KV read)."""
    flops = prefill_flops(model, prompt_tokens, batch, cached_tokens)
    return _estimate(hw, flops, prefill_bytes(model, prompt_tokens, batch, cached_tokens))


def _check_cached(prompt_tokens: int, cached_tokens: int) -> None:
    # A server always computes the last prompt token: its logits give the first output token.
    if not 0 <= cached_tokens < prompt_tokens:
        raise ConfigError(
            f"cached tokens must be in [0, prompt tokens), got {cached_tokens} of {prompt_tokens}"
        )


def decode_flops(model: ModelSpec, batch: int, context_tokens: int) -> float:
    """FLOPs of one decode step: per sequence 2*N (matmuls) + attention over its context."""
    _check_tokens(1, batch, context_tokens)
    return batch * (2.0 * model.matmul_params + _attention_flops(model, 1, context_tokens))


def decode_bytes(model: ModelSpec, batch: int, context_tokens: int) -> float:
    """Bytes of one decode step: all weights once + every sequence's KV cache (read)."""
    _check_tokens(1, batch, context_tokens)
    kv = batch * context_tokens * model.kv_bytes_per_token
    return model.weight_bytes_read_per_step + kv


def decode_step(model: ModelSpec, hw: Hardware, batch: int, context_tokens: int) -> Estimate:
    """One decode step of ``batch`` sequences with ``context_tokens`` cached tokens each."""
    return _estimate(
        hw, decode_flops(model, batch, context_tokens), decode_bytes(model, batch, context_tokens)
    )


def kv_bytes_per_request(model: ModelSpec, tokens_per_request: float) -> float:
    """KV cache a request holds at its end: its prompt plus completion tokens."""
    return tokens_per_request * model.kv_bytes_per_token


def replica(hw: Hardware, gpus: int) -> Hardware:
    """``gpus`` devices serving one model copy with tensor parallelism, as one device.

    Ideal scaling (sum of FLOP/s, bandwidth and memory); the all-reduce cost is ignored, which
    is close for NVLink within a node (Pope et al. 2022, "Efficiently Scaling Transformer
    Inference", section 3) and optimistic across nodes.
    """
    if gpus == 1:
        return hw
    return dataclasses.replace(
        hw,
        name=f"{gpus}x{hw.name}",
        peak_flops_per_s=hw.peak_flops_per_s * gpus,
        peak_bytes_per_s=hw.peak_bytes_per_s * gpus,
        memory_bytes=hw.memory_bytes * gpus,
    )


def _kv_budget_bytes(model: ModelSpec, hw: Hardware, reserve_fraction: float) -> float:
    return hw.memory_bytes * (1.0 - reserve_fraction) - model.weight_bytes


def max_concurrency(
    model: ModelSpec,
    hw: Hardware,
    tokens_per_request: float,
    reserve_fraction: float = DEFAULT_MEMORY_RESERVE_FRACTION,
) -> int:
    """Requests whose KV cache fits at once: (memory - reserve - weights) / KV per request."""
    if tokens_per_request <= 0:
        raise ConfigError(f"tokens_per_request must be > 0, got {tokens_per_request}")
    budget = _kv_budget_bytes(model, hw, reserve_fraction)
    return max(0, math.floor(budget / kv_bytes_per_request(model, tokens_per_request) + 1e-9))


def gpus_per_replica(
    model: ModelSpec,
    hw: Hardware,
    tokens_per_request: float,
    reserve_fraction: float = DEFAULT_MEMORY_RESERVE_FRACTION,
    limit: int = 64,
) -> int:
    """Devices per model copy: the smallest power of two where the weights take at most half
    of the usable memory (the rest is KV cache: a copy that can hold only a few requests is
    not worth serving from) and at least one request's KV cache fits.

    Llama-3-8B on H100 -> 1; Llama-3-70B (141 GB in bf16) on H100 -> 4.
    """
    gpus = 1
    while True:
        group = replica(hw, gpus)
        usable = group.memory_bytes * (1.0 - reserve_fraction)
        fits = max_concurrency(model, group, tokens_per_request, reserve_fraction) >= 1
        if fits and model.weight_bytes <= usable / 2:
            return gpus
        if fits and gpus * 2 > limit:
            return gpus
        gpus *= 2
        if gpus > limit:
            raise ConfigError(
                f"{model.name} with {tokens_per_request:g}-token requests does not fit in "
                f"{limit} x {hw.name}; check --prompt-tokens and --dtype"
            )


def request_time_s(
    model: ModelSpec, hw: Hardware, prompt_tokens: int, completion_tokens: int, batch: int
) -> float:
    """Mean time a request is in flight: its prefill, then ``completion_tokens`` decode steps
    of a ``batch``-sequence batch at the mean context (prompt + half the completion)."""
    context = prompt_tokens + completion_tokens // 2
    step = decode_step(model, hw, batch, context).time_s
    return prefill(model, hw, prompt_tokens).time_s + completion_tokens * step


def concurrency_needed(rate_rps: float, mean_request_s: float) -> float:
    """Requests in flight on average: Little's law, L = lambda * W (Little 1961)."""
    if rate_rps < 0 or mean_request_s < 0:
        raise ConfigError("rate_rps and mean_request_s must be >= 0")
    return rate_rps * mean_request_s


def _check_tokens(tokens: int, batch: int, context: int = 0) -> None:
    if tokens < 1 or batch < 1 or context < 0:
        raise ConfigError(
            f"need tokens >= 1, batch >= 1, context >= 0; got {tokens}, {batch}, {context}"
        )
