"""Scheduling policies on the fake runner: who runs each step, budgets, preemption order.

Every expectation below is worked out by hand from the policy's rules; the fake runner
checks block tables on every step and samples ``ord("a") + position % 26``.
"""

from __future__ import annotations

import random

import pytest

from reference_server.fake_runner import FakeClock, FakeModelRunner
from reference_server.kv_cache import BlockManager
from reference_server.scheduler import (
    ChunkedScheduler,
    ContinuousScheduler,
    Scheduler,
    StaticScheduler,
    make_scheduler,
)
from reference_server.sequence import SamplingParams, SeqStatus, Sequence

Step = list[tuple[str, int]]


def _seq(name: str, prompt: int, max_tokens: int, **params: object) -> Sequence:
    return Sequence(name, [ord("x")] * prompt, SamplingParams(max_tokens=max_tokens, **params))  # type: ignore[arg-type]


def _step(sched: Scheduler, runner: FakeModelRunner) -> Step:
    batch = sched.schedule()
    if not batch:
        return []
    sched.postprocess(batch, runner.run(batch))
    return runner.steps[-1]


def _setup(cls: type[Scheduler], blocks: int = 64, block_size: int = 4, **kw: object):
    bm = BlockManager(blocks, block_size)
    return cls(bm, **kw), FakeModelRunner(blocks, block_size), bm  # type: ignore[arg-type]


def test_continuous_refills_a_finished_slot_on_the_next_step() -> None:
    sched, runner, bm = _setup(ContinuousScheduler, max_num_seqs=2)
    for s in (_seq("a", 4, 3), _seq("b", 4, 1), _seq("c", 4, 2)):
        sched.add(s)
    assert _step(sched, runner) == [("a", 4), ("b", 4)]  # b finishes (max_tokens 1)
    assert _step(sched, runner) == [("a", 1), ("c", 4)]  # c takes b's slot at once, whole prompt
    assert _step(sched, runner) == [("a", 1), ("c", 1)]  # both finish (3 and 2 tokens)
    assert _step(sched, runner) == [] and not sched.has_work
    assert bm.num_free_blocks == 64 and sched.num_finished == 3


def test_static_keeps_finished_slots_idle_until_the_longest_member_ends() -> None:
    sched, runner, bm = _setup(StaticScheduler, max_num_seqs=2, finished_slots="idle")
    for s in (_seq("a", 4, 3), _seq("b", 4, 1), _seq("c", 4, 2)):
        sched.add(s)
    assert _step(sched, runner) == [("a", 4), ("b", 4)]  # b finishes at once
    assert isinstance(sched, StaticScheduler) and sched.num_batch_slots == 2
    assert _step(sched, runner) == [("a", 1)]  # b's slot idles; c does not join
    assert sched.num_waiting == 1 and sched.num_batch_slots == 2
    assert _step(sched, runner) == [("a", 1)]  # a finishes: the batch is over
    assert _step(sched, runner) == [("c", 4)]
    assert _step(sched, runner) == [("c", 1)]
    assert not sched.has_work and bm.num_free_blocks == 64


def test_static_pads_finished_rows_and_holds_their_blocks_until_the_batch_ends() -> None:
    sched, runner, bm = _setup(StaticScheduler, max_num_seqs=2)  # finished_slots="pad"
    a, b, c = _seq("a", 4, 3), _seq("b", 4, 1), _seq("c", 4, 2)
    for s in (a, b, c):
        sched.add(s)
    assert _step(sched, runner) == [("a", 4), ("b", 4)]  # b finishes at once
    assert b.is_finished and b.output_token_ids == [ord("a") + 4]
    assert bm.num_used_blocks == 4  # a: 7 tokens, b: 5 tokens, blocks of 4, both still held
    batch = sched.schedule()  # b's row is computed again: its last token, at its last position
    assert [(i.seq.seq_id, i.num_new_tokens, i.padding) for i in batch.items] == [
        ("a", 1, False),
        ("b", 1, True),
    ]
    assert batch.num_decode_tokens == 1 and batch.num_padding_tokens == 1
    assert sched.postprocess(batch, runner.run(batch)) == [a]  # b's sampled token is dropped
    assert b.output_token_ids == [ord("a") + 4] and b.num_computed_tokens == 4
    assert _step(sched, runner) == [("a", 1), ("b", 1)]  # a finishes: the batch is over
    assert bm.num_used_blocks == 0 and a.output_token_ids == [ord("a") + p % 26 for p in (4, 5, 6)]
    assert _step(sched, runner) == [("c", 4)]
    assert _step(sched, runner) == [("c", 1)]
    assert not sched.has_work and bm.num_free_blocks == 64


def test_static_padding_frees_its_blocks_when_the_last_member_is_aborted() -> None:
    sched, runner, bm = _setup(StaticScheduler, max_num_seqs=2)
    for s in (_seq("a", 4, 5), _seq("b", 4, 1)):
        sched.add(s)
    _step(sched, runner)  # b finished, padded
    assert sched.abort("a") is not None and not sched.running
    # The batch closes with the abort: an idle engine never calls schedule() again, so b's
    # padded blocks must not wait for it (the prefix-cache property test found them held).
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 64
    assert _step(sched, runner) == []


def test_static_rejects_an_unknown_finished_slots_policy() -> None:
    with pytest.raises(ValueError, match="finished_slots must be one of pad, idle"):
        StaticScheduler(BlockManager(8, 4), finished_slots="drop")


def test_static_reserves_prompt_plus_max_tokens_at_admission() -> None:
    sched, runner, bm = _setup(StaticScheduler, blocks=5, block_size=4, max_num_seqs=4)
    sched.add(_seq("a", 4, 8))  # 12 tokens -> 3 blocks
    sched.add(_seq("b", 4, 8))  # would need 3 more: only 2 left, so b waits for the next batch
    assert _step(sched, runner) == [("a", 4)]
    assert bm.num_used_blocks == 3 and sched.num_waiting == 1


def test_chunked_slices_prompts_and_schedules_decodes_first() -> None:
    sched, runner, _ = _setup(
        ChunkedScheduler, max_num_seqs=4, max_num_batched_tokens=6, chunk_size=4
    )
    sched.add(_seq("a", 10, 3))
    assert _step(sched, runner) == [("a", 4)]  # one chunk, not the budget
    assert _step(sched, runner) == [("a", 4)]
    sched.add(_seq("b", 9, 2))
    assert _step(sched, runner) == [("a", 2), ("b", 4)]  # a's last slice samples a token
    assert _step(sched, runner) == [("a", 1), ("b", 4)]  # the decode goes first
    assert _step(sched, runner) == [("a", 1), ("b", 1)]  # a finishes; b's last slice
    assert _step(sched, runner) == [("b", 1)]
    assert not sched.has_work


def test_chunked_budget_leaves_later_decodes_for_the_next_step() -> None:
    sched, runner, _ = _setup(
        ChunkedScheduler, max_num_seqs=8, max_num_batched_tokens=2, chunk_size=2
    )
    for name in "abc":
        sched.add(_seq(name, 1, 5))
    assert _step(sched, runner) == [("a", 1), ("b", 1)]  # 1-token prompts, budget 2
    assert _step(sched, runner) == [("a", 1), ("b", 1)]  # decodes first: c still waits
    assert sched.num_waiting == 1


def test_preemption_takes_the_newest_and_recomputes_it() -> None:
    sched, runner, bm = _setup(ContinuousScheduler, blocks=6, block_size=2, max_num_seqs=3)
    for name in "abc":
        sched.add(_seq(name, 2, 4))
    assert _step(sched, runner) == [("a", 2), ("b", 2), ("c", 2)]  # 1 block each
    assert _step(sched, runner) == [("a", 1), ("b", 1), ("c", 1)]  # 2 blocks each: full
    assert _step(sched, runner) == [("a", 1), ("b", 1), ("c", 1)]
    # Each now holds 5 tokens' worth of need; a third block each does not fit: c (newest) goes.
    assert _step(sched, runner) == [("a", 1), ("b", 1)]
    assert sched.num_preemptions == 1 and [s.seq_id for s in sched.waiting] == ["c"]
    c = sched.waiting[0]
    assert c.status is SeqStatus.WAITING and c.num_computed_tokens == 0 and c.block_table == []
    assert len(c.output_token_ids) == 3  # generated tokens are kept and recomputed
    # a and b finished (4 tokens): c re-prefills prompt + its 3 tokens in one step.
    assert _step(sched, runner) == [("c", 5)]
    assert c.is_finished and c.output_token_ids == [ord("a") + p % 26 for p in (2, 3, 4, 5)]
    assert bm.num_free_blocks == 6


def test_a_sequence_alone_without_blocks_preempts_itself() -> None:
    sched, runner, bm = _setup(ContinuousScheduler, blocks=1, block_size=2, max_num_seqs=1)
    sched.add(_seq("a", 2, 4))
    assert _step(sched, runner) == [("a", 2)]
    assert _step(sched, runner) == []  # needs a second block: none anywhere
    assert sched.num_preemptions == 1 and bm.num_free_blocks == 1


@pytest.mark.parametrize(
    ("mode", "finished_slots"),
    [("static", "pad"), ("static", "idle"), ("continuous", "pad"), ("chunked", "pad")],
)
def test_random_workloads_finish_exactly_and_leak_nothing(mode: str, finished_slots: str) -> None:
    rng = random.Random(7)
    bm = BlockManager(24, 4)  # small on purpose: continuous and chunked must preempt
    sched = make_scheduler(
        mode,
        bm,
        max_num_seqs=6,
        max_model_len=64,
        max_num_batched_tokens=16,
        chunk_size=8,
        finished_slots=finished_slots,
    )
    runner = FakeModelRunner(24, 4)
    seqs = [_seq(f"s{i}", rng.randint(1, 30), rng.randint(1, 30)) for i in range(40)]
    pending = list(seqs)
    for _ in range(2000):
        if pending and rng.random() < 0.3:
            sched.add(pending.pop(0))
        if not sched.has_work and not pending:
            break
        step = _step(sched, runner)
        total = sum(n for _, n in step)
        assert len(step) <= 6
        if mode == "chunked":
            assert total <= 16 and all(n <= 8 for _, n in step)
    assert all(s.is_finished and s.finish_reason == "length" for s in seqs)
    for s in seqs:
        p = s.num_prompt_tokens
        assert s.output_token_ids == [ord("a") + q % 26 for q in range(p, p + s.params.max_tokens)]
    assert bm.num_free_blocks == 24
    if mode != "static":
        assert sched.num_preemptions > 0  # the cache was small enough to exercise preemption


def test_finish_rules_eos_stop_strings_and_length() -> None:
    sched, runner, _ = _setup(ContinuousScheduler)
    runner.eos_at = 6
    eos = _seq("eos", 4, 10, ignore_eos=False)
    ignored = _seq("ign", 4, 4)  # ignore_eos defaults to True: exactly max_tokens
    stop = _seq("stop", 4, 10, stop=("ef",))  # samples e, f, (eos), ...
    for s in (eos, ignored, stop):
        sched.add(s)
    while sched.has_work:
        _step(sched, runner)
    assert eos.finish_reason == "stop" and eos.output_token_ids[-1] == 256
    assert len(eos.output_token_ids) == 3
    assert ignored.finish_reason == "length" and len(ignored.output_token_ids) == 4
    assert 256 in ignored.output_token_ids
    assert stop.finish_reason == "stop" and bytes(stop.output_token_ids).decode() == "ef"


def test_abort_frees_blocks_wherever_the_sequence_is() -> None:
    sched, runner, bm = _setup(ContinuousScheduler, max_num_seqs=1)
    sched.add(_seq("a", 8, 5))
    sched.add(_seq("b", 8, 5))
    _step(sched, runner)
    assert (
        bm.num_used_blocks == 2
    )  # a: 8 prompt tokens in blocks of 4 (the sampled one has no K/V yet)
    a = sched.abort("a")
    assert a is not None and a.finish_reason == "abort" and bm.num_used_blocks == 0
    b = sched.abort("b")
    assert b is not None and b.is_finished and not sched.has_work
    assert sched.abort("nobody") is None


def test_fake_clock_times_steps() -> None:
    clock = FakeClock()
    bm = BlockManager(16, 4)
    sched = ContinuousScheduler(bm, max_num_seqs=4)
    runner = FakeModelRunner(16, 4, clock=clock, step_ns=lambda b: 1000 + 10 * b.num_tokens)
    sched.add(_seq("a", 8, 2))
    _step(sched, runner)
    assert clock() == 1080
    _step(sched, runner)
    assert clock() == 1080 + 1010


def test_bad_configuration_is_rejected_with_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown mode"):
        make_scheduler("bogus", BlockManager(4, 4))
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedScheduler(BlockManager(4, 4), chunk_size=0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        ContinuousScheduler(BlockManager(4, 4), max_num_seqs=0)
