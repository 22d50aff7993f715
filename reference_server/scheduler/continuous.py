"""Continuous batching (Orca, OSDI'22; vLLM): batch membership is decided every step.

A finished request leaves the batch at once and a waiting one takes its slot on the next step.
Each step decodes every running sequence and, in the same forward pass, prefills the whole
prompt of each request admitted this step (no chunking): a long prompt makes that step long
for every stream in it, which is the stall ``chunked`` mode removes. (Mixing the admissions
into the decode step, as vLLM v1 does, rather than running them as prefill-only steps as
nano-vllm does, means a busy server with frequent admissions does not lose a decode step
to each one.)

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
        self._schedule_running(batch, self.max_num_seqs, chunk_size=1)  # decodes, oldest first
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        admitted = False
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)  # n: the rest of the prompt (or recompute)
            # Budget bounds the prompts of one step, but one prompt always fits alone.
            if (admitted and n > budget) or not bm.can_allocate(seq, seq.num_tokens, hit):
                break
            self._start(seq, seq.num_tokens, hit)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n
            admitted = True
        return batch
