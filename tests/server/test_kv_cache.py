"""The block manager alone: allocation, growth across block boundaries, free, no leak."""

from __future__ import annotations

import pytest

from reference_server.kv_cache import BlockManager, blocks_for_tokens
from reference_server.sequence import SamplingParams, Sequence


def _seq(name: str, n_prompt: int) -> Sequence:
    return Sequence(name, list(range(n_prompt)), SamplingParams(max_tokens=4))


def test_blocks_for_tokens_is_a_ceiling() -> None:
    assert [blocks_for_tokens(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_allocate_covers_tokens_and_grows_across_block_boundaries() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    s = _seq("a", 5)
    bm.allocate(s, 5)  # 5 tokens -> 2 blocks
    assert len(s.block_table) == 2 and bm.num_used_blocks == 2 and bm.num_free_blocks == 2
    bm.allocate(s, 8)  # still 2 blocks: slots 6..8 fit in block 2
    assert len(s.block_table) == 2
    bm.allocate(s, 9)  # token 9 crosses into a third block
    assert len(s.block_table) == 3 and bm.num_free_blocks == 1
    assert len(set(s.block_table)) == 3


def test_can_allocate_refuses_when_short_and_allocate_raises() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    a, b = _seq("a", 8), _seq("b", 8)
    bm.allocate(a, 8)
    assert not bm.can_allocate(b, 8) and bm.can_allocate(b, 4)
    with pytest.raises(RuntimeError, match="exhausted"):
        bm.allocate(b, 8)
    assert b.block_table == [] and bm.num_free_blocks == 1  # a failed allocate takes nothing


def test_free_returns_every_block_and_preempt_cycle_never_leaks() -> None:
    bm = BlockManager(num_blocks=6, block_size=2)
    seqs = [_seq(str(i), 3) for i in range(3)]
    for _round in range(50):
        for s in seqs:
            if bm.can_allocate(s, s.num_tokens + 1):
                bm.allocate(s, s.num_tokens + 1)
                s.output_token_ids.append(1)
            else:  # "preempt": free and start over, as recompute does
                bm.free(s)
                s.output_token_ids.clear()
        owned = sum(len(s.block_table) for s in seqs)
        assert owned == bm.num_used_blocks and bm.num_used_blocks + bm.num_free_blocks == 6
    for s in seqs:
        bm.free(s)
    assert bm.num_free_blocks == 6 and bm.num_used_blocks == 0


def test_double_free_is_caught() -> None:
    bm = BlockManager(num_blocks=2, block_size=2)
    s = _seq("a", 2)
    bm.allocate(s, 2)
    stolen = list(s.block_table)
    assert bm.free(s) == 1
    s.block_table = stolen
    with pytest.raises(RuntimeError, match="held by nobody"):
        bm.free(s)


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
