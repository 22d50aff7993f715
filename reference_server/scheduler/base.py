"""The scheduling interface every serving mode implements, and the bookkeeping they share.

A mode is a policy for one question: which tokens of which sequences go into the next forward
pass. The engine drives any policy with the same three calls per step (nano-vllm's verbs)::

    batch = scheduler.schedule()          # a ScheduledBatch (empty when nothing can run)
    tokens = runner.run(batch)            # one sampled token (or None) per item
    updated = scheduler.postprocess(batch, tokens)   # sequences that gained a token

``add`` queues a sequence, ``abort`` drops one wherever it is and frees its KV blocks. The
engine never asks which mode runs; a mode that hands requests to other processes (prefill and
decode workers) implements these same verbs and returns the batches its own runner executes.
Preemption is by recompute: the victim's blocks are freed, ``num_computed_tokens`` goes back to
0, and it waits at the front of the queue (its generated tokens are kept and re-prefilled).

Prefix caching: every mode admits the head of the queue the same way (``_start``): the block
manager's cached blocks of its leading tokens become its first blocks and count as computed,
so only the rest is scheduled (a recompute after preemption hits its own blocks while they
stay cached). ``prefix_cache_queries`` and ``prefix_cache_hits`` count prompt tokens at first
admissions, as vLLM's counters of the same names (recomputes are not queries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from reference_server.checks import at_least
from reference_server.kv_cache import BlockManager
from reference_server.sequence import ScheduledBatch, ScheduledSeq, SeqStatus, Sequence

__all__ = ["Scheduler", "default_decode"]


def default_decode(token_ids: list[int]) -> str:
    """Byte-level detokenization (ids >= 256 are special and produce no text)."""
    return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


class Scheduler(ABC):
    """Waiting queue, running set, finishing rules and preemption; subclasses decide ``schedule``.

    ``max_num_batched_tokens`` caps the tokens of one forward pass (a whole prompt may exceed it
    when it is the only item, so a long prompt can always run).
    """

    mode: str = "base"

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
        max_num_batched_tokens: int | None = None,
        eos_id: int = 256,
        decode: Callable[[list[int]], str] = default_decode,
    ) -> None:
        at_least("max_num_seqs", max_num_seqs, 1)
        at_least("max_model_len", max_model_len, 2)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens or max(max_model_len, 8192)
        at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        self.eos_id = eos_id
        self.decode = decode
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_finished = 0
        self.num_aborted = 0
        self.prefix_cache_queries = 0  # prompt tokens of first admissions
        self.prefix_cache_hits = 0  # of which found in the prefix cache

    # -- the interface ---------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` (FCFS)."""
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq_id: str) -> Sequence | None:
        """Drop ``seq_id`` wherever it is and free its blocks; None if it is not here."""
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                break
        else:
            seq = next((s for s in self.running if s.seq_id == seq_id), None)  # type: ignore[assignment]
            if seq is None:
                return None
            self.running.remove(seq)
        self.num_aborted += 1
        self._release(seq, "abort")
        return seq

    @abstractmethod
    def schedule(self) -> ScheduledBatch:
        """The next forward pass; blocks for every scheduled token are allocated on return."""

    def postprocess(self, batch: ScheduledBatch, tokens: list[int | None]) -> list[Sequence]:
        """Advance computed tokens, append sampled ones, finish; returns sequences that gained a token."""
        if len(tokens) != len(batch.items):
            raise ValueError(f"runner returned {len(tokens)} tokens for {len(batch.items)} items")
        updated: list[Sequence] = []
        for item, token in zip(batch.items, tokens, strict=True):
            seq = item.seq
            if seq.is_finished:  # aborted after scheduling: nothing to keep
                continue
            seq.num_computed_tokens += item.num_new_tokens
            if token is None:
                continue
            seq.output_token_ids.append(token)
            updated.append(seq)
            reason = self.finish_reason(seq)
            if reason is not None:
                self.running.remove(seq)
                self.num_finished += 1
                self._release(seq, reason)
        return updated

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_batch_slots(self) -> int:
        """Rows the forward pass runs (static mode also counts finished members)."""
        return len(self.running)

    # -- shared rules ----------------------------------------------------------------------

    def finish_reason(self, seq: Sequence) -> str | None:
        """ "stop" on eos (unless ignore_eos) or a stop string, "length" at max_tokens or the context."""
        params = seq.params
        if not params.ignore_eos and seq.output_token_ids[-1] == self.eos_id:
            return "stop"
        if params.stop:
            # A stop string of k characters spans at most 4k UTF-8 bytes: decode only the tail.
            tail = max(len(s) for s in params.stop) * 4 + 4
            text = self.decode(seq.output_token_ids[-tail:])
            if any(s in text for s in params.stop):
                return "stop"
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _release(self, seq: Sequence, reason: str) -> None:
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute later: free the KV, forget progress, wait at the front of the queue."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _ensure_blocks(self, seq: Sequence, num_tokens: int, victims: list[Sequence]) -> bool:
        """Allocate for ``seq``, preempting from the end of ``victims`` (newest first) as needed.

        When no victim is left, ``seq`` itself is preempted and False is returned.
        """
        bm = self.block_manager
        while not bm.can_allocate(seq, num_tokens):
            if victims:
                self._preempt(victims.pop())
            else:
                self._preempt(seq)
                return False
        bm.allocate(seq, num_tokens)
        return True

    def _schedule_running(self, batch: ScheduledBatch, budget: int, chunk_size: int) -> int:
        """Schedule running sequences: decodes (one token each) oldest first, then slices of
        prompts already under way (at most ``chunk_size`` tokens); returns tokens used.

        Victims for preemption are taken from the end of the not-yet-scheduled list: the
        newest prompt in progress first, then the newest decodes.
        """
        queue = [s for s in self.running if not s.is_prefill]
        queue += [s for s in self.running if s.is_prefill]
        used = 0
        while queue and used < budget:
            seq = queue.pop(0)
            remaining = seq.num_tokens - seq.num_computed_tokens
            n = min(remaining, chunk_size, budget - used) if seq.is_prefill else remaining
            if self._ensure_blocks(seq, seq.num_computed_tokens + n, queue):
                batch.items.append(ScheduledSeq(seq, n))
                used += n
        return used

    def _cached_prefix(self, seq: Sequence) -> tuple[list[int], int]:
        """The cached blocks ``seq`` would start with, and the tokens left to compute."""
        bm = self.block_manager
        hit = bm.match_prefix(seq)
        return hit, seq.num_tokens - len(hit) * bm.block_size

    def _start(self, seq: Sequence, num_tokens: int, hit: list[int]) -> None:
        """Admit the waiting ``seq``: its ``hit`` blocks, blocks up to ``num_tokens`` tokens
        (the caller checked ``can_allocate``), and the prefix-cache counters."""
        bm = self.block_manager
        bm.allocate(seq, num_tokens, hit)
        seq.num_computed_tokens = len(hit) * bm.block_size
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
            self.prefix_cache_queries += seq.num_prompt_tokens
            self.prefix_cache_hits += seq.num_cached_tokens
        self._admit(seq)

    def _admit(self, seq: Sequence) -> None:
        self.waiting.remove(seq)
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)
