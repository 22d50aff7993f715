"""Paged attention against a dense reference (same weights, no cache), on the tiny preset.

Block size 4 and shuffled block tables, so every sequence crosses several non-adjacent blocks.
"""

from __future__ import annotations

import pytest
import torch

from reference_server.model_runner import ModelRunner
from reference_server.sequence import ScheduledBatch, ScheduledSeq, Sequence
from tests.helpers.model_driver import (
    Driver,
    assert_close,
    dense_forward,
    greedy_from_dense,
    prompt_of,
    seq,
)

ATOL = 2e-4  # fp32; paged and dense differ only in summation order


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner("tiny", num_kv_blocks=256, block_size=4, device="cpu", seed=0)


def assert_kv_matches_dense(runner: ModelRunner, s: Sequence) -> None:
    n = s.num_computed_tokens
    _, dense_kv = dense_forward(runner, s.token_ids[:n])
    assert_close(runner.export_kv(s), dense_kv, ATOL)


def assert_greedy_as_dense(runner: ModelRunner, *seqs: Sequence) -> None:
    for s in seqs:
        assert s.output_token_ids == greedy_from_dense(runner, s), s.seq_id


def test_mixed_lengths_in_one_batch_match_dense(runner: ModelRunner) -> None:
    drv = Driver(runner, shuffle_seed=1)
    seqs = [seq(f"s{i}", prompt_of(n, i)) for i, n in enumerate([1, 5, 13, 30])]
    items = [ScheduledSeq(s, s.num_prompt_tokens) for s in seqs]
    for s in seqs:  # blocks first, so logits() can run before postprocess
        s.block_table = [drv.free.pop() for _ in range(-(-s.num_prompt_tokens // 4))]
    done, logits = runner.logits(ScheduledBatch(items))
    assert done == [0, 1, 2, 3]
    for row, s in enumerate(seqs):
        ref, _ = dense_forward(runner, s.prompt_token_ids)
        assert_close(logits[row], ref[-1], ATOL)

    out = runner.run(ScheduledBatch(items))
    for s, tok in zip(seqs, out, strict=True):
        s.num_computed_tokens = s.num_prompt_tokens
        s.output_token_ids.append(tok)  # type: ignore[arg-type]
    drv.decode(seqs, 7)  # decode together; sequences cross block boundaries at different steps
    assert_greedy_as_dense(runner, *seqs)
    for s in seqs:
        assert_kv_matches_dense(runner, s)


def test_chunked_prefill_mixed_with_decode_matches_whole(runner: ModelRunner) -> None:
    drv = Driver(runner, shuffle_seed=2)
    other = seq("other", prompt_of(9, 20))
    drv.step([(other, 9)])
    long = seq("long", prompt_of(31, 21))
    results = []
    while long.num_computed_tokens < long.num_prompt_tokens:  # slices of 7 beside a decode
        n = min(7, long.num_prompt_tokens - long.num_computed_tokens)
        results.append(drv.step([(other, 1), (long, n)]))
    assert [r[1] is None for r in results] == [True] * 4 + [False]
    drv.decode([other, long], 5)
    assert_greedy_as_dense(runner, long, other)
    assert_kv_matches_dense(runner, long)


def test_recompute_after_preemption_continues_identically(runner: ModelRunner) -> None:
    drv = Driver(runner, shuffle_seed=3)
    a, b = seq("a", prompt_of(11, 30)), seq("b", prompt_of(6, 31))
    drv.step([(a, 11), (b, 6)])
    drv.decode([a, b], 4)
    old_blocks = list(a.block_table)
    drv.preempt(a)
    drv.decode([b], 3)  # b reuses a's freed blocks, overwriting a's old K/V
    assert set(b.block_table) & set(old_blocks)
    drv.step([(a, a.num_tokens), (b, 1)])  # recompute prompt + outputs in one slice
    assert not set(a.block_table) & set(b.block_table)
    drv.decode([a, b], 3)
    assert_greedy_as_dense(runner, a, b)
    assert_kv_matches_dense(runner, a)


def test_export_import_round_trip_continues_identically(runner: ModelRunner) -> None:
    drv = Driver(runner, shuffle_seed=4)
    s = seq("s", prompt_of(21, 40))
    drv.step([(s, 21)])
    drv.decode([s], 2)
    kv = runner.export_kv(s)
    assert kv.shape == (2, 2, 23, 2, 16) and kv.is_contiguous()

    other = ModelRunner("tiny", num_kv_blocks=32, block_size=8, device="cpu", seed=0)
    twin = seq("s", s.prompt_token_ids)
    twin.output_token_ids = list(s.output_token_ids)
    twin.block_table = [7, 2, 30]  # different block size and blocks: only token order matters
    other.import_kv(twin, kv.clone())
    twin.num_computed_tokens = kv.shape[2]
    assert torch.equal(other.export_kv(twin), kv)

    Driver(other).decode([twin], 4)
    drv.decode([s], 4)
    assert twin.output_token_ids == s.output_token_ids


def test_import_rejects_wrong_shape(runner: ModelRunner) -> None:
    s = seq("s", [1, 2, 3])
    s.block_table = [0]
    with pytest.raises(ValueError, match="n_kv_heads"):
        runner.import_kv(s, torch.zeros(2, 2, 3, 4, 16))


def test_block_table_too_small_is_an_error(runner: ModelRunner) -> None:
    s = seq("s", prompt_of(9, 50))
    s.block_table = [0, 1]  # holds 8 tokens
    with pytest.raises(ValueError, match="block table holds 8"):
        runner.run(ScheduledBatch([ScheduledSeq(s, 9)]))


def test_run_does_not_mutate_sequences(runner: ModelRunner) -> None:
    s = seq("s", prompt_of(5, 60))
    s.block_table = [3, 4]
    out = runner.run(ScheduledBatch([ScheduledSeq(s, 3)]))
    assert out == [None]  # a first slice samples nothing
    assert (s.num_computed_tokens, s.output_token_ids, s.block_table) == (0, [], [3, 4])


def test_seeded_sampling_is_reproducible_across_batches(runner: ModelRunner) -> None:
    def generate(seed: int, with_neighbour: bool) -> Sequence:
        drv = Driver(runner, shuffle_seed=seed)
        s = seq("s", prompt_of(8, 70), temperature=0.9, top_p=0.95, seed=seed)
        work = [s]
        if with_neighbour:
            work.append(seq("n", prompt_of(5, 71), temperature=1.0))
        drv.step([(w, w.num_prompt_tokens) for w in work])
        drv.decode(work, 11)
        return s

    s7 = generate(7, with_neighbour=False)
    first = s7.output_token_ids
    assert generate(7, with_neighbour=True).output_token_ids == first
    assert generate(8, with_neighbour=False).output_token_ids != first
    assert len(first) == 12 and all(0 <= t < 256 for t in first)
    assert first != greedy_from_dense(runner, s7)  # sampled, not greedy


def test_info_and_kv_bytes(runner: ModelRunner) -> None:
    info = runner.info()
    # 2 (K, V) * 2 layers * 2 KV heads * 16 head_dim * 4 bytes (fp32)
    assert runner.kv_bytes_per_token == 512
    assert info["num_kv_blocks"] == 256 and info["block_size"] == 4
    assert info["dtype"] == "float32" and info["device"] == "cpu" and info["preset"] == "tiny"


def test_cache_size_from_bytes() -> None:
    r = ModelRunner("tiny", kv_cache_bytes=512 * 16 * 10 + 100, device="cpu")
    assert r.num_kv_blocks == 10
    with pytest.raises(ValueError, match="no block"):
        ModelRunner("tiny", kv_cache_bytes=100, device="cpu")
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelRunner("huge")


def test_static_padding_rows_change_no_output_and_no_cache(runner: ModelRunner) -> None:
    """A static batch's finished rows keep running as padding: the real model computes them,
    and the other members' tokens and every K/V in the cache still equal the dense reference."""
    from reference_server.kv_cache import BlockManager
    from reference_server.scheduler import StaticScheduler

    sched = StaticScheduler(BlockManager(runner.num_kv_blocks, runner.block_size), max_num_seqs=3)
    seqs = [seq(f"p{i}", prompt_of(n, 40 + i)) for i, n in enumerate([3, 9, 6])]
    for s, m in zip(seqs, [2, 9, 5], strict=True):
        s.params = type(s.params)(max_tokens=m)
        sched.add(s)
    padded = 0
    while sched.has_work:
        batch = sched.schedule()
        padded += batch.num_padding_tokens
        sched.postprocess(batch, runner.run(batch))
    assert padded == (9 - 2) + (9 - 5)  # rows padded from their end to the longest member's
    for s in seqs:
        assert len(s.output_token_ids) == s.params.max_tokens
        assert s.output_token_ids == greedy_from_dense(runner, s)
    assert sched.block_manager.num_free_blocks == runner.num_kv_blocks
