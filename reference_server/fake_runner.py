"""A model runner without a model: deterministic tokens, optional step time on an injected clock.

It has ``ModelRunner``'s interface (``run(batch)``, ``num_kv_blocks``, ``block_size``,
``kv_bytes_per_token``, ``info()``) and checks the scheduler's side of the contract in
``sequence.py`` on every step (block tables cover the scheduled tokens, no KV slot is written
by two items), so scheduler tests fail loudly on a bookkeeping bug. It serves deterministic
scheduler and engine tests, and ``loadlab-server --preset fake`` (no torch: harness
development and tests).
``computed_tokens`` counts the tokens it was asked to compute, padding rows included.

``check_kv=True`` also models the cache's content: each slot written holds a stand-in for
its K/V (a hash of the sequence's tokens up to that position, what real K/V depends on),
and every earlier position an item attends to must hold its own sequence's value. A prefix
cache that hands out the wrong block, or a block before it is computed, fails here.

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
        check_kv: bool = False,
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
        self.computed_tokens = 0
        self.check_kv = check_kv
        self._kv: dict[int, int] = {}  # slot -> prefix hash of the token whose K/V it holds

    def run(self, batch: ScheduledBatch) -> list[int | None]:
        written: set[int] = set()
        out: list[int | None] = []
        bs = self.block_size
        for item in batch.items:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            if item.num_new_tokens < 1 or end > seq.num_tokens:
                raise AssertionError(f"{seq.seq_id}: bad slice ending at {end} of {seq.num_tokens}")
            if len(seq.block_table) * bs < end:
                raise AssertionError(f"{seq.seq_id}: block table too short for {end} tokens")
            # Cached prefix blocks may be shared (read by many); a slot is written by one item.
            slots = {seq.block_table[p // bs] * bs + p % bs for p in range(start, end)}
            if written & slots:
                raise AssertionError(f"{seq.seq_id}: writes a KV slot another item writes")
            written |= slots
            self.computed_tokens += item.num_new_tokens
            out.append(self._token(end) if item.completes else None)
        if self.check_kv:
            self._check_kv(batch)
        self.steps.append([(i.seq.seq_id, i.num_new_tokens) for i in batch.items])
        if self.clock is not None and self.step_ns is not None:
            self.clock.advance(self.step_ns(batch))
        if self.sleep_s_per_step:
            time.sleep(self.sleep_s_per_step)
        return out

    def _check_kv(self, batch: ScheduledBatch) -> None:
        """Write every item's slots, then check every item's reads, as the real runner writes
        a layer's K/V for the whole step before that layer's attention reads any."""
        bs = self.block_size
        reads: list[tuple[str, list[int], list[int]]] = []
        for item in batch.items:
            seq = item.seq
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + item.num_new_tokens
            want, h = [], 0
            for token in seq.token_ids[:end]:
                h = hash((h, token))
                want.append(h)
            slots = [seq.block_table[p // bs] * bs + p % bs for p in range(end)]
            for p in range(start, end):
                self._kv[slots[p]] = want[p]
            reads.append((seq.seq_id, slots[:start], want[:start]))
        for seq_id, slots, want in reads:
            got = [self._kv.get(slot) for slot in slots]
            if got != want:
                p = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
                raise AssertionError(f"{seq_id}: the K/V at position {p} is not its own")

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
