"""Continuous batching (Orca, OSDI'22; vLLM): batch membership is decided every step.

A finished request leaves the batch at once and a waiting one takes its slot on the next step.
A new request's whole prompt is prefilled in one step (no chunking): while it runs, every
other stream waits for that step, which is the stall ``chunked`` mode removes. As in
nano-vllm, a step either admits waiting prompts (a prefill step) or decodes every running
sequence (a decode step).

Usage::

    sched = ContinuousScheduler(BlockManager(256, 16), max_num_seqs=32, max_model_len=2048)
"""

from __future__ import annotations

from reference_server.scheduler.base import Scheduler
from reference_server.sequence import ScheduledBatch, ScheduledSeq

__all__ = ["ContinuousScheduler"]


class ContinuousScheduler(Scheduler):
    mode = "continuous"

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_tokens - seq.num_computed_tokens  # the whole prompt (or recompute)
            if (batch and n > budget) or not bm.can_allocate(seq, seq.num_tokens):
                break
            bm.allocate(seq, seq.num_tokens)
            self._admit(seq)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n
        if batch:
            return batch
        self._schedule_running(batch, self.max_num_seqs, chunk_size=1)
        return batch
