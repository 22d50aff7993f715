"""Paged KV-cache bookkeeping: fixed-size blocks and per-sequence block tables, no torch.

The model runner owns the K/V tensors (``num_blocks`` blocks of ``block_size`` token slots);
this module only decides which block ids a sequence may write. A sequence holding ``n``
tokens of K/V needs ``ceil(n / block_size)`` blocks; admission asks ``can_allocate`` first and
the scheduler preempts (frees a victim, which later recomputes) when it says no.

Usage::

    bm = BlockManager(num_blocks=8, block_size=16)
    if bm.can_allocate(seq, seq.num_tokens):
        bm.allocate(seq, seq.num_tokens)   # seq.block_table now covers every token
    bm.free(seq)                           # blocks back to the pool, block_table == []
"""

from __future__ import annotations

from collections import deque

from reference_server.sequence import Sequence

__all__ = ["BlockManager", "blocks_for_tokens"]


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ``ceil(num_tokens / block_size)``."""
    return -(-num_tokens // block_size)


class BlockManager:
    """Hands out KV blocks to sequences; admission by free blocks; never leaks.

    Invariant: ``num_free_blocks + num_used_blocks == num_blocks``, and every used block
    belongs to exactly one sequence's ``block_table``.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}; raise the KV budget")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO reuse: a just-freed block is handed out last, which makes reuse bugs visible.
        self._free: deque[int] = deque(range(num_blocks))
        self._owner: dict[int, str] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs so its table covers ``num_tokens`` tokens (0 if it does)."""
        return max(0, blocks_for_tokens(num_tokens, self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether the pool can grow ``seq.block_table`` to cover ``num_tokens`` tokens now."""
        return self.blocks_needed(seq, num_tokens) <= len(self._free)

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover ``num_tokens`` tokens (a no-op if it already does).

        Raises ``RuntimeError`` when the pool is short: callers check ``can_allocate`` first.
        """
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self._free):
            raise RuntimeError(
                f"KV cache exhausted: {seq.seq_id} needs {need} blocks, {len(self._free)} free; "
                "check can_allocate() and preempt first"
            )
        for _ in range(need):
            block = self._free.popleft()
            self._owner[block] = seq.seq_id
            seq.block_table.append(block)

    def free(self, seq: Sequence) -> int:
        """Return all of ``seq``'s blocks to the pool; returns how many were freed."""
        n = len(seq.block_table)
        for block in seq.block_table:
            owner = self._owner.pop(block, None)
            if owner != seq.seq_id:
                raise RuntimeError(f"block {block} freed by {seq.seq_id} but owned by {owner}")
            self._free.append(block)
        seq.block_table = []
        return n
