"""A model runner without a model: deterministic tokens, optional step time on an injected clock.

It has ``ModelRunner``'s interface (``run(batch)``, ``num_kv_blocks``, ``block_size``,
``kv_bytes_per_token``, ``info()``) and checks the scheduler's side of the contract in
``sequence.py`` on every step (block tables cover the scheduled tokens, no block is shared),
so scheduler tests fail loudly on a bookkeeping bug. It serves deterministic scheduler and
engine tests, and ``loadlab-server --preset fake`` (no torch: harness development and tests).

Usage::

    clock = FakeClock()
    runner = FakeModelRunner(num_kv_blocks=64, block_size=16, clock=clock,
                             step_ns=lambda batch: 1_000_000 + 10_000 * batch.num_tokens)
    tokens = runner.run(batch)   # next token = "a".."z" by position; clock advanced
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from reference_server.sequence import ScheduledBatch

__all__ = ["FakeClock", "FakeModelRunner"]


class FakeClock:
    """A monotonic nanosecond clock that only moves when told to (``clock()`` reads it)."""

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns


class FakeModelRunner:
    """Deterministic stand-in for ``ModelRunner``: the token sampled after position p is
    ``ord("a") + p % 26`` (or ``eos_id`` at position ``eos_at`` when given)."""

    def __init__(
        self,
        num_kv_blocks: int = 256,
        block_size: int = 16,
        *,
        clock: FakeClock | None = None,
        step_ns: Callable[[ScheduledBatch], int] | None = None,
        sleep_s_per_step: float = 0.0,
        eos_id: int = 256,
        eos_at: int | None = None,
        max_model_len: int = 2048,
    ) -> None:
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.kv_bytes_per_token = 0
        self.max_model_len = max_model_len
        self.clock = clock
        self.step_ns = step_ns
        self.sleep_s_per_step = sleep_s_per_step
        self.eos_id = eos_id
        self.eos_at = eos_at
        self.steps: list[list[tuple[str, int]]] = []  # (seq_id, num_new_tokens) per step

    def run(self, batch: ScheduledBatch) -> list[int | None]:
        seen: set[int] = set()
        out: list[int | None] = []
        for item in batch.items:
            seq = item.seq
            end = seq.num_computed_tokens + item.num_new_tokens
            if item.num_new_tokens < 1 or end > seq.num_tokens:
                raise AssertionError(f"{seq.seq_id}: bad slice ending at {end} of {seq.num_tokens}")
            if len(seq.block_table) * self.block_size < end:
                raise AssertionError(f"{seq.seq_id}: block table too short for {end} tokens")
            if seen & set(seq.block_table):
                raise AssertionError(f"{seq.seq_id}: shares a KV block with another sequence")
            seen.update(seq.block_table)
            out.append(self._token(end) if item.completes else None)
        self.steps.append([(i.seq.seq_id, i.num_new_tokens) for i in batch.items])
        if self.clock is not None and self.step_ns is not None:
            self.clock.advance(self.step_ns(batch))
        if self.sleep_s_per_step:
            time.sleep(self.sleep_s_per_step)
        return out

    def _token(self, position: int) -> int:
        if self.eos_at is not None and position == self.eos_at:
            return self.eos_id
        return ord("a") + position % 26

    def info(self) -> dict[str, Any]:
        return {
            "preset": "fake",
            "num_params": 0,
            "dtype": "none",
            "device": "none",
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "block_size": self.block_size,
            "num_kv_blocks": self.num_kv_blocks,
            "max_model_len": self.max_model_len,
        }
