"""Automatic prefix caching: the block manager's sharing, LRU eviction and hash table, and
every scheduling mode skipping the cached part of a prompt (fake runner, hand-worked steps),
then a property-based test of the accounting under random shared prefixes, preemption and
aborts: the fake runner checks on every step that each position a request attends to holds
that request's own K/V."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_server.fake_runner import FakeModelRunner
from reference_server.kv_cache import BlockManager
from reference_server.scheduler import Scheduler, make_scheduler
from reference_server.sequence import SamplingParams, Sequence
from reference_server.vision import Image


def _seq(name: str, prompt: list[int], max_tokens: int = 2) -> Sequence:
    return Sequence(name, list(prompt), SamplingParams(max_tokens=max_tokens))


def _run_alone(bm: BlockManager, seq: Sequence) -> list[int]:
    """Admit ``seq`` with its cached prefix, as a scheduler does; returns the hit blocks."""
    hit = bm.match_prefix(seq)
    bm.allocate(seq, seq.num_tokens, hit)
    seq.num_computed_tokens = seq.num_tokens
    return hit


# -- the block manager ---------------------------------------------------------------------


def test_a_shared_prefix_is_found_and_its_blocks_shared() -> None:
    bm = BlockManager(16, 4, prefix_caching=True)
    a = _seq("a", [*range(10)])  # blocks [0..3] [4..7] full, [8, 9] partial
    assert _run_alone(bm, a) == []
    b = _seq("b", [*range(8), 50, 51, 52])  # the same two full blocks, then its own
    hit = _run_alone(bm, b)
    assert hit == a.block_table[:2] and b.block_table[:2] == hit
    assert b.block_table[2] != a.block_table[2]
    assert bm.num_used_blocks == 4 and bm.num_cached_blocks == 2
    bm.check([a, b])
    bm.free(a)
    bm.check([b])
    assert bm.num_used_blocks == 3  # the shared two are still held by b


def test_the_last_token_is_always_computed() -> None:
    bm = BlockManager(16, 4, prefix_caching=True)
    _run_alone(bm, _seq("a", [*range(8)]))
    # An 8-token prompt equal to a cached one: the second block is full and cached, but its
    # last token must be computed for logits, so only the first block is a hit.
    assert len(bm.match_prefix(_seq("b", [*range(8)]))) == 1
    assert len(bm.match_prefix(_seq("c", [*range(9)]))) == 2


def test_the_hash_chains_over_the_whole_prefix() -> None:
    bm = BlockManager(16, 4, prefix_caching=True)
    _run_alone(bm, _seq("a", [1, 1, 1, 1, 2, 2, 2, 2, 9]))
    # Same second block, different first block: no hit at all (K/V depends on the prefix).
    assert bm.match_prefix(_seq("b", [0, 1, 1, 1, 2, 2, 2, 2, 9])) == []


def test_a_hash_that_names_other_tokens_is_a_miss() -> None:
    """What a 64-bit collision would look like: the map finds a block whose tokens differ."""
    bm = BlockManager(16, 4, prefix_caching=True)
    a = _seq("a", [*range(9)])
    _run_alone(bm, a)
    block = a.block_table[0]
    key = bm._key[block]
    assert key is not None
    bm._key[block] = (key[0], (7, 7, 7, 7))
    assert bm.match_prefix(_seq("b", [*range(9)])) == []


def _with_image(name: str, key: bytes | None) -> Sequence:
    """Tokens 0..3, then 6 placeholder ids (an image keyed ``key``, or text), then 20, 21."""
    s = _seq(name, [0, 1, 2, 3, *[33] * 6, 20, 21])
    if key is not None:
        s.images = [(4, Image(key, 56, 84, b"", "!" * 6))]
    return s


def test_image_blocks_are_keyed_by_the_image_s_content_not_only_its_placeholder_ids() -> None:
    bm = BlockManager(16, 4, prefix_caching=True)
    _run_alone(bm, _with_image("a", b"cat"))
    assert len(bm.match_prefix(_with_image("again", b"cat"))) == 2  # the same image: a hit
    # The same ids from another image, or spelt as text: only the text block before them.
    assert len(bm.match_prefix(_with_image("other", b"dog"))) == 1
    assert len(bm.match_prefix(_with_image("text", None))) == 1


def test_freed_blocks_stay_cached_and_are_evicted_only_when_empty_ones_run_out() -> None:
    bm = BlockManager(6, 2, prefix_caching=True)
    a = _seq("a", [1, 2, 3, 4, 5])  # 2 full blocks + 1 partial
    _run_alone(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2
    b = _seq("b", [7, 8, 9])  # needs 2 blocks: the 3 never-used ones go first
    _run_alone(bm, b)
    assert bm.num_cached_blocks == 3  # a's two, and b's full first block
    assert len(bm.match_prefix(_seq("a2", [1, 2, 3, 4, 5]))) == 2
    c = _seq("c", [20, 21, 22, 23, 24, 25, 26])  # 4 blocks: 2 empty + evicts 2 cached
    _run_alone(bm, c)
    bm.check([b, c])
    # LRU with a's tail freed first: a's second block went, then its first; b's is held.
    assert bm.match_prefix(_seq("a3", [1, 2, 3, 4, 5])) == []
    assert bm.num_cached_blocks == 1 + 3  # b's block and c's three full blocks


def test_taking_a_free_cached_block_counts_against_the_free_pool() -> None:
    bm = BlockManager(3, 2, prefix_caching=True)
    a = _seq("a", [1, 2, 3, 4, 5])
    _run_alone(bm, a)
    bm.free(a)
    b = _seq("b", [1, 2, 3, 4, 6])
    hit = bm.match_prefix(b)
    assert len(hit) == 2 and bm.blocks_needed(b, 5, hit) == 3 and bm.can_allocate(b, 5, hit)
    assert not bm.can_allocate(b, 7, hit)


def test_a_block_whose_step_failed_loses_its_hash() -> None:
    bm = BlockManager(8, 2, prefix_caching=True)
    a = _seq("a", [1, 2, 3, 4, 5])
    bm.allocate(a, 5)  # scheduled and published, then the step fails: nothing computed
    assert bm.num_cached_blocks == 2
    bm.free(a)
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 8
    bm.check()


def test_caching_off_matches_nothing() -> None:
    bm = BlockManager(8, 2)
    _run_alone(bm, _seq("a", [1, 2, 3, 4, 5]))
    assert bm.match_prefix(_seq("b", [1, 2, 3, 4, 5])) == [] and bm.num_cached_blocks == 0


# -- the schedulers ------------------------------------------------------------------------

PREFIX = [ord("p")] * 16 + [ord("q")] * 16  # 8 full blocks of 4


def _scheduler(mode: str, blocks: int = 64) -> tuple[Scheduler, FakeModelRunner, BlockManager]:
    bm = BlockManager(blocks, 4, prefix_caching=True)
    sched = make_scheduler(mode, bm, max_num_seqs=4, max_model_len=128,
                           max_num_batched_tokens=64, chunk_size=64)  # fmt: skip
    return sched, FakeModelRunner(blocks, 4, check_kv=True), bm


def _drain(sched: Scheduler, runner: FakeModelRunner) -> None:
    for _ in range(1000):
        batch = sched.schedule()
        if not batch:
            break
        sched.postprocess(batch, runner.run(batch))


@pytest.mark.parametrize("mode", ["static", "continuous", "chunked"])
def test_every_mode_computes_only_the_uncached_suffix(mode: str) -> None:
    sched, runner, bm = _scheduler(mode)
    first = _seq("first", [*PREFIX, 1, 2, 3], max_tokens=3)
    sched.add(first)
    _drain(sched, runner)
    assert runner.computed_tokens == 35 + 2  # the prompt, then two decodes
    runner.computed_tokens = 0
    second = _seq("second", [*PREFIX, 9, 9, 9, 9, 9], max_tokens=3)
    sched.add(second)
    _drain(sched, runner)
    assert second.num_cached_tokens == 32 and runner.steps[-3][0] == ("second", 5)
    assert runner.computed_tokens == 5 + 2
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (35 + 37, 32)
    assert second.output_token_ids == [ord("a") + p % 26 for p in (37, 38, 39)]
    bm.check()
    assert bm.num_used_blocks == 0


def test_requests_admitted_in_the_same_step_share_what_the_first_computes() -> None:
    sched, runner, _ = _scheduler("continuous")
    a, b = _seq("a", [*PREFIX, 1]), _seq("b", [*PREFIX, 2])
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert [(i.seq.seq_id, i.num_new_tokens) for i in batch.items] == [("a", 33), ("b", 1)]
    sched.postprocess(batch, runner.run(batch))  # check_kv: b read a's K/V of this step
    assert b.num_cached_tokens == 32 and a.block_table[:8] == b.block_table[:8]


def test_a_preempted_request_recomputes_from_its_own_cached_blocks() -> None:
    sched, runner, bm = _scheduler("continuous", blocks=12)
    a = _seq("a", [*PREFIX, 1, 2, 3], max_tokens=8)  # 9 blocks for the prompt
    sched.add(a)
    _drain_steps(sched, runner, 2)  # the prompt, then one decode: 36 tokens of K/V
    sched._preempt(a)
    assert a.block_table == [] and bm.num_cached_blocks == 9  # its full blocks stay cached
    _drain(sched, runner)
    assert runner.steps[2] == [("a", 1)]  # 37 known tokens, the first 36 cached
    assert a.num_cached_tokens == 0  # usage counts the first admission only
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (35, 0)
    assert a.output_token_ids == [ord("a") + p % 26 for p in range(35, 43)]


def _drain_steps(sched: Scheduler, runner: FakeModelRunner, steps: int) -> None:
    for _ in range(steps):
        batch = sched.schedule()
        sched.postprocess(batch, runner.run(batch))


# -- the property ---------------------------------------------------------------------------

_workload = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(["static", "continuous", "chunked"]),
        "seed": st.integers(0, 2**32 - 1),
        "num_prefixes": st.integers(1, 4),
        "num_requests": st.integers(1, 24),
        "num_blocks": st.integers(10, 40),
        "abort_rate": st.sampled_from([0.0, 0.05, 0.2]),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_workload)
def test_accounting_stays_exact_under_shared_prefixes_preemption_and_aborts(
    w: dict[str, object],
) -> None:
    """Random prompts built from a few random prefixes (cut at random lengths, so a shared
    part ends mid-block too), a cache small enough to preempt, random aborts and arrivals; after every
    step the block manager is consistent with the running sequences, and once idle every
    block is free (empty or cached) and the hash table agrees with the blocks."""
    rng = random.Random(int(w["seed"]))  # type: ignore[call-overload]
    bs, num_blocks = 4, int(w["num_blocks"])  # type: ignore[call-overload]
    bm = BlockManager(num_blocks, bs, prefix_caching=True)
    max_len = (num_blocks // 2) * bs  # one request always fits alone
    sched = make_scheduler(str(w["mode"]), bm, max_num_seqs=4, max_model_len=max_len,
                           max_num_batched_tokens=24, chunk_size=8)  # fmt: skip
    runner = FakeModelRunner(num_blocks, bs, check_kv=True)
    # Prefixes made of a few distinct blocks: equal blocks behind different prefixes and at
    # different positions are common, which a hash of a block's own tokens would confuse.
    pool = [[rng.randrange(3) for _ in range(bs)] for _ in range(3)]
    prefixes = [
        [t for _ in range(max_len // bs) for t in rng.choice(pool)]
        for _ in range(int(w["num_prefixes"]))  # type: ignore[call-overload]
    ]
    pending: list[Sequence] = []
    for i in range(int(w["num_requests"])):  # type: ignore[call-overload]
        max_tokens = rng.randint(1, 8)
        shared = rng.choice(prefixes)[: rng.randint(0, max_len - max_tokens - 1)]
        own = [
            rng.randrange(3, 6) for _ in range(rng.randint(1, max_len - max_tokens - len(shared)))
        ]
        pending.append(_seq(f"r{i}", shared + own, max_tokens))
    live: list[Sequence] = []
    for _ in range(3000):
        if pending and rng.random() < 0.4:
            live.append(pending.pop(0))
            sched.add(live[-1])
        if live and rng.random() < float(w["abort_rate"]):  # type: ignore[arg-type]
            sched.abort(rng.choice(live).seq_id)
        if not sched.has_work and not pending:
            break
        batch = sched.schedule()
        if batch:
            sched.postprocess(batch, runner.run(batch))
        bm.check([s for s in live if s.block_table])
    assert not sched.has_work and not pending
    bm.check([])
    assert bm.num_free_blocks == num_blocks and bm.num_used_blocks == 0
    for s in live:  # the fake model's greedy output depends on positions only
        if s.finish_reason == "length":
            p = s.num_prompt_tokens
            assert s.output_token_ids == [
                ord("a") + q % 26 for q in range(p, p + len(s.output_token_ids))
            ]
    assert sched.prefix_cache_hits <= sched.prefix_cache_queries
