"""Static batching: take up to ``max_num_seqs`` waiting requests, run them until the longest
finishes, then take the next batch.

Finished members' slots sit idle and nothing joins mid-batch: with output lengths from a
chat trace (one request stops at 20 tokens, another runs to 600), most slots do no useful
work for most of the batch's life. Like classic static batching (e.g. ``generate()`` over a
padded batch), each member's KV for ``prompt + max_tokens`` is reserved at admission, so a
batch never runs out of memory midway and never preempts.

Usage::

    sched = StaticScheduler(BlockManager(256, 16), max_num_seqs=32, max_model_len=2048)
"""

from __future__ import annotations

from reference_server.scheduler.base import Scheduler
from reference_server.sequence import ScheduledBatch, ScheduledSeq, Sequence

__all__ = ["StaticScheduler"]


class StaticScheduler(Scheduler):
    mode = "static"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.batch_members: list[Sequence] = []  # the current batch, finished members included

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        if not self.running:
            self._take_new_batch(batch)
            return batch
        for seq in self.running:  # decode every unfinished member; finished slots idle
            batch.items.append(ScheduledSeq(seq, seq.num_tokens - seq.num_computed_tokens))
        return batch

    def _take_new_batch(self, batch: ScheduledBatch) -> None:
        self.batch_members = []
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_tokens
            reserve = min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)
            if (batch and n > budget) or not bm.can_allocate(seq, reserve):
                break
            bm.allocate(seq, reserve)
            self._admit(seq)
            self.batch_members.append(seq)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n

    @property
    def num_batch_slots(self) -> int:
        """Slots the current batch occupies, idle (finished) ones included."""
        return len(self.batch_members) if self.running else 0
