"""Static batching: take up to ``max_num_seqs`` waiting requests, run them until the longest
finishes, then take the next batch.

Nothing joins mid-batch: with output lengths from a chat trace (one request stops at 20
tokens, another runs to 600), most slots do no useful work for most of the batch's life. Like
classic static batching (e.g. ``generate()`` over a padded batch), each member's KV for
``prompt + max_tokens`` is reserved at admission, so a batch never runs out of memory midway
and never preempts.

What a finished member's slot costs is ``finished_slots``:

- ``"pad"`` (the default, as a padded ``generate()`` call, FasterTransformer or TGI before
  continuous batching run it): the batch keeps its shape. A finished member is computed again
  every step as a padding row (its last token at its last position: the same K/V rewritten,
  the sampled token thrown away) and holds its KV blocks until the whole batch ends.
- ``"idle"``: a finished member leaves the forward pass and frees its blocks at once; only the
  slot stays empty. Steps get cheaper as the batch empties, which matters where a step's cost
  grows with the batch (a CPU) and hardly at all where it does not (a GPU's decode).

Usage::

    sched = StaticScheduler(BlockManager(256, 16), max_num_seqs=32, max_model_len=2048)
"""

from __future__ import annotations

from typing import Any

from reference_server.scheduler.base import Scheduler
from reference_server.sequence import ScheduledBatch, ScheduledSeq, SeqStatus, Sequence

__all__ = ["FINISHED_SLOTS", "StaticScheduler"]

FINISHED_SLOTS = ("pad", "idle")


class StaticScheduler(Scheduler):
    mode = "static"

    def __init__(self, *args: Any, finished_slots: str = "pad", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if finished_slots not in FINISHED_SLOTS:
            raise ValueError(
                f"finished_slots must be one of {', '.join(FINISHED_SLOTS)}, got {finished_slots!r}"
            )
        self.finished_slots = finished_slots
        self.batch_members: list[Sequence] = []  # the current batch, finished members included
        self._held: list[Sequence] = []  # "pad": finished members whose blocks the batch keeps

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        if not self.running:
            self._take_new_batch(batch)
            return batch
        for seq in self.running:  # decode every unfinished member
            batch.items.append(ScheduledSeq(seq, seq.num_tokens - seq.num_computed_tokens))
        for seq in self._held:  # and, padding, every finished one
            batch.items.append(ScheduledSeq(seq, 1, padding=True))
        return batch

    def postprocess(self, batch: ScheduledBatch, tokens: list[int | None]) -> list[Sequence]:
        updated = super().postprocess(batch, tokens)
        if not self.running:
            self._end_batch()
        return updated

    def abort(self, seq_id: str) -> Sequence | None:
        seq = super().abort(seq_id)
        if not self.running:  # its last member was aborted: the padded rows go now, not at
            self._end_batch()  # the next schedule(), which an idle engine never calls
        return seq

    def _end_batch(self) -> None:
        """The batch is over: its padded rows give their blocks back."""
        for seq in self._held:
            self.block_manager.free(seq)
        self._held = []

    def _release(self, seq: Sequence, reason: str) -> None:
        if self.finished_slots == "pad" and reason != "abort" and self.running:
            # Finished, answered, but its row stays in the batch until the batch ends. Its
            # last token has no K/V yet: that is the one the padding row recomputes.
            seq.status, seq.finish_reason = SeqStatus.FINISHED, reason
            self._held.append(seq)
            return
        super()._release(seq, reason)

    def _take_new_batch(self, batch: ScheduledBatch) -> None:
        self.batch_members = []
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit, n = self._cached_prefix(seq)
            reserve = min(seq.num_prompt_tokens + seq.params.max_tokens, self.max_model_len)
            if (batch and n > budget) or not bm.can_allocate(seq, reserve, hit):
                break
            self._start(seq, reserve, hit)
            self.batch_members.append(seq)
            batch.items.append(ScheduledSeq(seq, n))
            budget -= n

    @property
    def num_batch_slots(self) -> int:
        """Slots the current batch occupies, idle (finished) ones included."""
        return len(self.batch_members) if self.running else 0
