"""Paged KV-cache bookkeeping with automatic prefix caching: blocks, block tables, no torch.

The model runner owns the K/V tensors (``num_blocks`` blocks of ``block_size`` token slots);
this module only decides which block ids a sequence may read and write. A sequence holding
``n`` tokens of K/V needs ``ceil(n / block_size)`` blocks; admission asks ``can_allocate``
first and the scheduler preempts (frees a victim, which later recomputes) when it says no.

Prefix caching (vLLM's automatic prefix caching, with the same rules): a *full* block is
known by the hash of its tokens and of every token before it, a chain
``h_i = hash((h_{i-1}, tokens of block i))``, so equal hashes mean equal prefixes and the K/V
of a block depends only on its prefix (causal attention, absolute positions). A block that
holds image tokens is known by the images' content hashes too (vLLM's extra keys): their K/V
come from the pixels, so text that spells an image's placeholder ids is not a hit. Blocks are
reference-counted: sequences with a common prefix hold the same blocks. A block whose count
falls to zero keeps its hash and its K/V (it is *cached*, free to reuse) and is evicted,
least recently used first, only when no never-used block is left. A new request's cached
blocks skip prefill; at most ``(num_tokens - 1) // block_size`` of them are used, so the last
known token is always computed and its logits sampled.

A block is published (hashed) when ``allocate`` hands out the slots its last token will be
computed into, that is when it is scheduled, as vLLM does: a request admitted later in the
same step may share it, which is safe because the runner writes every K/V of a step into the
cache, layer by layer, before any attention of that layer reads it.

Usage::

    bm = BlockManager(num_blocks=8, block_size=16)
    hit = bm.match_prefix(seq)                 # cached blocks of seq's leading tokens
    if bm.can_allocate(seq, seq.num_tokens, hit):
        bm.allocate(seq, seq.num_tokens, hit)  # seq.block_table covers every token
        seq.num_computed_tokens = len(hit) * bm.block_size
    bm.free(seq)                               # counts down; cached blocks keep their K/V
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence as Seq

from reference_server.checks import at_least
from reference_server.sequence import Sequence

__all__ = ["BlockManager", "blocks_for_tokens"]

_ROOT_HASH = 0x10AD1AB  # the "parent" of a sequence's first block


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ``ceil(num_tokens / block_size)``."""
    return -(-num_tokens // block_size)


class BlockManager:
    """Hands out KV blocks to sequences, shares cached prefixes, never leaks.

    Every block is in exactly one state: *held* (reference count >= 1, in one or more block
    tables), *cached* (count 0, hashed, evictable, in LRU order) or *empty* (count 0, no
    hash). ``num_free_blocks`` counts cached and empty blocks: both can be handed out.
    ``self.cached`` maps a chain hash to its block, and a block has a hash exactly when the
    map points to it (``check()`` verifies all of this).
    """

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = False) -> None:
        at_least("num_blocks", num_blocks, 1, "; raise the KV budget")
        at_least("block_size", block_size, 1)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        # FIFO reuse: a just-freed block is handed out last, which makes reuse bugs visible.
        self._empty: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, oldest use first
        self._refs = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        # What a hash stands for, checked on every hit: a 64-bit collision then costs a miss,
        # never another prompt's K/V. (parent hash, the block's tokens)
        self._key: list[tuple[int, tuple[object, ...]] | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self._published: dict[str, int] = {}  # seq_id -> leading blocks of its table handled

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``allocate`` can hand out: empty ones and cached ones (by eviction)."""
        return len(self._empty) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks with a hash (held or not): the prefixes a new request can hit."""
        return len(self.cached)

    # -- prefix lookup -----------------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding ``seq``'s leading tokens, in order (``[]`` with caching off).

        Stops at the first miss and leaves at least the last known token to compute. Takes
        nothing: pass the result to ``can_allocate`` and ``allocate`` in the same step.
        """
        if not self.prefix_caching or seq.block_table:
            return []
        bs = self.block_size
        hit: list[int] = []
        parent = _ROOT_HASH
        for i, h in enumerate(self._chain(seq, (seq.num_tokens - 1) // bs)):
            block = self.cached.get(h)
            if block is None or self._key[block] != (parent, _block_key(seq, i, bs)):
                break
            hit.append(block)
            parent = h
        return hit

    def _chain(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chain hashes of ``seq``'s first ``num_blocks`` full blocks, computed once per block."""
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH
            hashes.append(hash((parent, _block_key(seq, i, bs))))
        return hashes[:num_blocks]

    # -- allocation ---------------------------------------------------------------------------

    def blocks_needed(self, seq: Sequence, num_tokens: int, hit: Seq[int] = ()) -> int:
        """Blocks ``allocate`` takes from the free pool for ``seq`` to cover ``num_tokens``:
        new blocks beyond its table and ``hit``, plus each hit block nobody holds now."""
        new = max(
            0, blocks_for_tokens(num_tokens, self.block_size) - len(seq.block_table) - len(hit)
        )
        return new + sum(1 for b in hit if self._refs[b] == 0) if hit else new

    def can_allocate(self, seq: Sequence, num_tokens: int, hit: Seq[int] = ()) -> bool:
        """Whether the pool can grow ``seq.block_table`` (after ``hit``) to ``num_tokens`` now."""
        return self.blocks_needed(seq, num_tokens, hit) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int, hit: Seq[int] = ()) -> None:
        """Grow ``seq.block_table`` to cover ``num_tokens`` tokens: first the ``hit`` blocks
        (only into an empty table), then new ones; then publish the full blocks among the
        tokens about to be computed. A no-op for blocks it already covers.

        Raises ``RuntimeError`` when the pool is short: callers check ``can_allocate`` first.
        """
        need = self.blocks_needed(seq, num_tokens, hit)
        if need > self.num_free_blocks:
            raise RuntimeError(
                f"KV cache exhausted: {seq.seq_id} needs {need} blocks, "
                f"{self.num_free_blocks} free; check can_allocate() and preempt first"
            )
        table = seq.block_table
        if hit:
            if table:
                raise RuntimeError(f"{seq.seq_id}: cached blocks go only into an empty table")
            for block in hit:
                if self._refs[block] == 0:
                    del self._evictable[block]
                self._refs[block] += 1
            table.extend(hit)
            self._published[seq.seq_id] = len(hit)
        for _ in range(blocks_for_tokens(num_tokens, self.block_size) - len(table)):
            block = self._take_free()
            self._refs[block] = 1
            table.append(block)
        if self.prefix_caching:
            self._publish(seq, min(num_tokens, seq.num_tokens) // self.block_size)

    def _take_free(self) -> int:
        if self._empty:
            return self._empty.popleft()
        block, _ = self._evictable.popitem(last=False)  # least recently used
        self._unhash(block)
        return block

    def _publish(self, seq: Sequence, num_full: int) -> None:
        """Hash the first ``num_full`` blocks of ``seq``'s table (those not yet handled).

        A block whose hash is cached already (the same prefix computed twice, e.g. after its
        parent was evicted) stays unhashed: one copy serves every later request.
        """
        done = self._published.get(seq.seq_id, 0)
        if done >= num_full:
            return
        hashes = self._chain(seq, num_full)
        for i in range(done, num_full):
            h = hashes[i]
            if h not in self.cached:
                block = seq.block_table[i]
                parent = hashes[i - 1] if i else _ROOT_HASH
                self.cached[h] = block
                self._hash[block] = h
                self._key[block] = (parent, _block_key(seq, i, self.block_size))
        self._published[seq.seq_id] = num_full

    def _unhash(self, block: int) -> None:
        h = self._hash[block]
        if h is not None:
            del self.cached[h]
            self._hash[block] = None
            self._key[block] = None

    def free(self, seq: Sequence) -> int:
        """Release ``seq``'s blocks (its table becomes ``[]``); returns how many it held.

        A block nobody holds any more is cached if it has a hash, else empty. Blocks go back
        tail first, so a prefix outlives its continuations in the LRU order. A hashed block
        ``seq`` had not finished computing (a step that failed) loses its hash: its slots may
        hold anything.
        """
        table = seq.block_table
        computed = seq.num_computed_tokens // self.block_size  # blocks whose K/V are written
        for i in range(len(table) - 1, -1, -1):
            block = table[i]
            refs = self._refs[block] - 1
            if refs < 0:
                raise RuntimeError(f"block {block} freed by {seq.seq_id} but held by nobody")
            self._refs[block] = refs
            if refs:
                continue
            if i >= computed:
                self._unhash(block)
            if self._hash[block] is None:
                self._empty.append(block)
            else:
                self._evictable[block] = None
        self._published.pop(seq.seq_id, None)
        seq.block_table = []
        return len(table)

    # -- consistency ---------------------------------------------------------------------------

    def check(self, held: Seq[Sequence] | None = None) -> None:
        """Raise ``AssertionError`` unless the bookkeeping is consistent; with ``held`` (every
        sequence holding blocks), also that each block's count is the number of tables holding
        it. For tests and debugging: it walks every block."""
        if held is not None:
            refs = [0] * self.num_blocks
            for seq in held:
                for block in seq.block_table:
                    refs[block] += 1
            if refs != self._refs:
                raise AssertionError("reference counts disagree with the block tables")
        empty, evictable = set(self._empty), set(self._evictable)
        if len(empty) != len(self._empty) or empty & evictable:
            raise AssertionError("a free block is listed twice")
        for block in range(self.num_blocks):
            h = self._hash[block]
            free = self._refs[block] == 0
            if (block in empty) != (free and h is None) or (block in evictable) != (
                free and h is not None
            ):
                raise AssertionError(f"block {block} is in the wrong free list")
            if h is not None and self.cached.get(h) != block:
                raise AssertionError(f"block {block} has hash {h} but the map disagrees")
        if any(self._hash[b] != h for h, b in self.cached.items()):
            raise AssertionError("the hash map points at a block without that hash")


def _block_key(seq: Sequence, index: int, block_size: int) -> tuple[object, ...]:
    """Tokens of block ``index`` of ``seq`` (prompt then output), without concatenating both,
    then (content hash, offset) of each image whose tokens the block holds."""
    start, end = index * block_size, (index + 1) * block_size
    prompt = seq.prompt_token_ids
    p = len(prompt)
    if end <= p:
        tokens = tuple(prompt[start:end])
    elif start >= p:
        return tuple(seq.output_token_ids[start - p : end - p])  # no image past the prompt
    else:
        tokens = (*prompt[start:], *seq.output_token_ids[: end - p])
    if not seq.images:
        return tokens
    images = tuple(
        (image.key, first - start)
        for first, image in seq.images
        if first < end and first + image.num_tokens > start
    )
    return (*tokens, *images) if images else tokens
