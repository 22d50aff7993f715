"""Chunked prefill (Sarathi-Serve, OSDI'24): a per-step token budget shared by decodes and
slices of prompts.

Each step schedules every running decode first (one token each), then slices of prompts
already under way, then slices of waiting prompts, until ``max_num_batched_tokens`` is used;
no slice is longer than ``chunk_size``. All of it is one forward pass, so a long prompt costs
each in-flight stream a little per step instead of one long stall.

Usage::

    sched = ChunkedScheduler(BlockManager(256, 16), max_num_seqs=32, max_model_len=4096,
                             max_num_batched_tokens=512, chunk_size=256)
"""

from __future__ import annotations

from reference_server.checks import at_least
from reference_server.kv_cache import BlockManager
from reference_server.scheduler.base import Scheduler
from reference_server.sequence import ScheduledBatch, ScheduledSeq

__all__ = ["ChunkedScheduler"]


class ChunkedScheduler(Scheduler):
    mode = "chunked"

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_batched_tokens: int = 512,
        chunk_size: int = 256,
        **kwargs: object,
    ) -> None:
        super().__init__(block_manager, max_num_batched_tokens=max_num_batched_tokens, **kwargs)  # type: ignore[arg-type]
        at_least("chunk_size", chunk_size, 1)
        self.chunk_size = chunk_size

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        budget -= self._schedule_running(batch, budget, self.chunk_size)
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, remaining = self._cached_prefix(seq)
            n = min(remaining, self.chunk_size, budget)
            end = seq.num_tokens - remaining + n
            # Never preempt for a newcomer: it waits until blocks are free.
            if not bm.can_allocate(seq, end, hit):
                break
            self._start(seq, end, hit)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n
        return batch
