"""The reference server's prefix cache (``reference_server/kv_cache.py``), on content keys.

The simulator has no token ids, so a request's tokens are described by *what they are*: its
prompt as pieces (text, the chat template's joins, earlier answers) followed by its own
answer. A block's content is the tuple of the pieces' slices it covers, and a full block is
known by a chain ``h_i = hash((h_{i-1}, content of block i))``, as the server hashes token
ids. On the reference server (byte tokenizer, one token per ASCII character) a text slice is
exactly the block's tokens; for another tokenizer a token stands for ``len(text) / tokens``
characters, an approximation.

An answer is known by the prompt it answers: greedy decoding gives the same answer to the same
prompt (the server's default temperature 0; the fake runner's tokens depend only on
position). A chat turn's prompt repeats the earlier prompts and answers the client received,
joined as the server's template joins them, so a later turn hits the blocks of the previous
turn's prompt (not of its answer: in the history a join precedes the answer).

``PrefixCache`` is ``BlockManager`` with ``prefix_caching=True`` rule for rule: reference
counts, publication when a block is scheduled, the LRU of free cached blocks evicted only
when no never-used block is left, a failed block losing its hash on free. Block ids are kept
(as the server's, FIFO reuse) though only which hashes are cached changes any timing.

Usage::

    cache = PrefixCache(num_blocks=1024, block_size=16)
    seq.content = Content([("a prompt of text", 16)])
    hit = cache.match(seq)
    if cache.need(seq, seq.num_tokens, hit) <= cache.num_free:
        cache.allocate(seq, seq.num_tokens, hit)
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from itertools import accumulate
from typing import Any, Protocol

__all__ = ["Content", "PrefixCache"]

_ROOT_HASH = 0x10AD1AB  # the parent of a sequence's first block (the server's constant)


class Content:
    """What a request's tokens are: prompt pieces ``(text or key, tokens)``, then its answer.

    A text piece (a ``str``) compares by its text; any other hashable key only to itself.
    ``answer`` is the key of the tokens generated after the prompt.
    """

    __slots__ = ("answer", "ends", "pieces", "prompt_tokens")

    def __init__(self, pieces: Iterable[tuple[Hashable, int]]) -> None:
        self.pieces = [(key, n) for key, n in pieces if n > 0]
        self.ends = list(accumulate(n for _, n in self.pieces))
        self.prompt_tokens = self.ends[-1] if self.ends else 0
        self.answer: Hashable = ("answer", hash(tuple(self.pieces)))

    def tokens(self, lo: int, hi: int) -> tuple[Any, ...]:
        """The content of tokens ``lo .. hi - 1`` (adjacent text merged, so only the text
        decides equality, not where pieces were cut)."""
        out: list[Any] = []
        pieces, ends = self.pieces, self.ends
        i = bisect_right(ends, lo)
        while lo < hi:
            if i >= len(pieces):
                p = self.prompt_tokens
                out.append((self.answer, lo - p, hi - p))
                break
            key, n = pieces[i]
            start = ends[i] - n
            end = min(hi, ends[i])
            part = _slice(key, n, lo - start, end - start)
            if isinstance(part, str) and out and isinstance(out[-1], str):
                out[-1] += part
            else:
                out.append(part)
            lo = end
            i += 1
        return tuple(out)


def _slice(key: Hashable, n: int, a: int, b: int) -> Any:
    if isinstance(key, str):
        if len(key) == n:
            return key[a:b]
        c = len(key) / n  # another tokenizer: a token stands for c characters
        return key[round(a * c) : round(b * c)]
    return (key, a, b)


class SimSeq(Protocol):
    """What the cache reads and writes of a simulated request (``policies.SimSeq`` is one):
    declared here so the cache needs nothing from the policies that use it."""

    idx: int
    prompt: int
    out: int
    computed: int
    blocks: int
    content: Content | None
    table: list[int]
    hashes: list[int]
    published: int

    @property
    def num_tokens(self) -> int: ...


class PrefixCache:
    """``reference_server.kv_cache.BlockManager(prefix_caching=True)`` over ``SimSeq``s
    (``table``, ``hashes``, ``published``, ``content``; ``blocks`` kept as ``len(table)``)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.empty: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # oldest use first
        self.refs = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # chain hash -> block

    @property
    def num_free(self) -> int:
        return len(self.empty) + len(self.evictable)

    def chain(self, seq: SimSeq, num_blocks: int) -> list[int]:
        """``seq``'s chain hashes, at least ``num_blocks`` of them (computed once each)."""
        hashes = seq.hashes
        if len(hashes) >= num_blocks:
            return hashes
        bs = self.block_size
        content = seq.content
        if content is None:
            content = seq.content = Content([(("seq", seq.idx), seq.prompt)])
        parent = hashes[-1] if hashes else _ROOT_HASH
        i = len(hashes)
        pieces, ends = content.pieces, content.ends
        while i < num_blocks:
            lo = i * bs
            j = bisect_right(ends, lo)
            if j < len(pieces) and ends[j] >= lo + bs:  # the block lies in one piece: hash
                key, n = pieces[j]  # its blocks there in one loop (the common case)
                start = ends[j] - n
                last = min(num_blocks, (ends[j] // bs))
                if isinstance(key, str) and len(key) == n:
                    for a in range(lo - start, (last * bs) - start, bs):
                        parent = hash((parent, (key[a : a + bs],)))
                        hashes.append(parent)
                else:
                    for a in range(lo - start, (last * bs) - start, bs):
                        parent = hash((parent, (_slice(key, n, a, a + bs),)))
                        hashes.append(parent)
                i = last
                continue
            parent = hash((parent, content.tokens(lo, lo + bs)))
            hashes.append(parent)
            i += 1
        return hashes

    def match(self, seq: SimSeq) -> list[int]:
        """``match_prefix``: cached blocks of ``seq``'s leading tokens, the last one left out."""
        if seq.table:
            return []
        hit: list[int] = []
        cached = self.cached
        num = (seq.prompt + seq.out - 1) // self.block_size
        if num < 1 or self.chain(seq, 1)[0] not in cached:  # the usual miss: one hash
            return hit
        hashes = self.chain(seq, num)
        for i in range(num):
            block = cached.get(hashes[i])
            if block is None:
                break
            hit.append(block)
        return hit

    def need(self, seq: SimSeq, num_tokens: int, hit: Sequence[int] = ()) -> int:
        new = max(0, -(-num_tokens // self.block_size) - len(seq.table) - len(hit))
        return new + sum(1 for b in hit if self.refs[b] == 0) if hit else new

    def allocate(self, seq: SimSeq, num_tokens: int, hit: Sequence[int] = ()) -> None:
        table = seq.table
        bs = self.block_size
        if (not hit and -(-num_tokens // bs) <= len(table)
                and min(num_tokens, seq.prompt + seq.out) // bs <= seq.published):  # fmt: skip
            return  # a decode inside its last block: nothing to take or publish
        refs = self.refs
        if hit:
            for block in hit:
                if refs[block] == 0:
                    del self.evictable[block]
                refs[block] += 1
            table.extend(hit)
            seq.published = len(hit)
        for _ in range(-(-num_tokens // self.block_size) - len(table)):
            block = self._take_free()
            refs[block] = 1
            table.append(block)
        seq.blocks = len(table)
        self.publish(seq, min(num_tokens, seq.prompt + seq.out) // self.block_size)

    def _take_free(self) -> int:
        if self.empty:
            return self.empty.popleft()
        block, _ = self.evictable.popitem(last=False)
        self._unhash(block)
        return block

    def publish(self, seq: SimSeq, num_full: int) -> None:
        done = seq.published
        if done >= num_full:
            return
        hashes = self.chain(seq, num_full)
        cached, table, block_hash = self.cached, seq.table, self.hash
        for i in range(done, num_full):
            h = hashes[i]
            if h not in cached:
                block = table[i]
                cached[h] = block
                block_hash[block] = h
        seq.published = num_full

    def _publish_one(self, seq: SimSeq, i: int, h: int) -> None:
        if h not in self.cached:
            block = seq.table[i]
            self.cached[h] = block
            self.hash[block] = h

    def _unhash(self, block: int) -> None:
        h = self.hash[block]
        if h is not None:
            del self.cached[h]
            self.hash[block] = None

    def free(self, seq: SimSeq) -> None:
        """Tail first; a block nobody holds is cached if hashed, else empty; a hashed block
        whose K/V ``seq`` had not finished computing loses its hash."""
        table = seq.table
        computed = seq.computed // self.block_size
        refs, hashes = self.refs, self.hash
        for i in range(len(table) - 1, -1, -1):
            block = table[i]
            refs[block] -= 1
            if refs[block]:
                continue
            if i >= computed:
                self._unhash(block)
            if hashes[block] is None:
                self.empty.append(block)
            else:
                self.evictable[block] = None
        seq.published = 0
        seq.table = []
        seq.blocks = 0

    def advance_decode(self, running: Sequence[SimSeq], k: int) -> None:
        """``k`` decode steps of ``running`` (the caller checked the blocks suffice): each
        step's ``allocate(seq, num_tokens)`` in the server's order (step, then running order,
        then its new block before its publication), but only the calls that do something."""
        bs = self.block_size
        events: list[
            tuple[int, int, int, int]
        ] = []  # (step, running index, 0 take / 1 publish, block)
        for r, seq in enumerate(running):
            t0 = seq.prompt + seq.out  # allocate(seq, t0 + j) at step j
            for b in range(len(seq.table), -(-(t0 + k - 1) // bs)):
                events.append((max(0, b * bs + 1 - t0), r, 0, b))
            for i in range(seq.published, (t0 + k - 1) // bs):
                events.append((max(0, (i + 1) * bs - t0), r, 1, i))
        events.sort()
        refs = self.refs
        for _j, r, kind, i in events:
            seq = running[r]
            if kind == 0:
                block = self._take_free()
                refs[block] = 1
                seq.table.append(block)
                seq.blocks += 1
            else:
                self._publish_one(seq, i, self.chain(seq, i + 1)[i])
                seq.published = i + 1

    def first_step_publishing(self, running: Sequence[SimSeq], index: int, h: int) -> int | None:
        """The first decode step (0 = the next) at which a running sequence would publish
        chain hash ``h`` as its block ``index``; None if none would."""
        bs = self.block_size
        best: int | None = None
        for seq in running:
            if seq.published > index:
                continue
            if self.chain(seq, index + 1)[index] == h:
                j = max(0, (index + 1) * bs - seq.prompt - seq.out)
                best = j if best is None else min(best, j)
        return best

    def evictions_before(self, hit: Sequence[int]) -> int:
        """How many cached free blocks go before the first of ``hit`` nobody holds (all of
        them when none is free)."""
        free_hits = {b for b in hit if self.refs[b] == 0}
        if not free_hits:
            return len(self.evictable)
        for pos, block in enumerate(self.evictable):
            if block in free_hits:
                return pos
        return len(self.evictable)  # unreachable: a free hashed block is evictable
