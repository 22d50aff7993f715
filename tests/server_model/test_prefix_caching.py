"""Prefix caching on the real model (tiny preset): the same greedy tokens with caching on and
off in every mode, under preemption, each equal to a dense forward's; and the cached part of
each prompt really skipped (fewer prefill tokens through the model)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from reference_server.kv_cache import BlockManager
from reference_server.model_runner import ModelRunner
from reference_server.scheduler import make_scheduler
from reference_server.sequence import SamplingParams, Sequence
from tests.helpers.model_driver import greedy_from_dense, prompt_of

BLOCK_SIZE = 4
NUM_BLOCKS = 28  # 112 token slots for up to 6 requests of up to 82 tokens: preemption


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner("tiny", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, device="cpu")


@dataclass(frozen=True)
class Served:
    outputs: dict[str, list[int]]
    prefill_tokens: int
    hits: int
    preemptions: int
    seqs: list[Sequence]


def _requests() -> list[Sequence]:
    rng = random.Random(3)
    prefixes = [prompt_of(rng.randint(30, 60), salt) for salt in range(3)]
    out = []
    for i in range(14):
        prompt = rng.choice(prefixes) + prompt_of(rng.randint(1, 12), 100 + i)
        out.append(Sequence(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(4, 10))))
    return out


def _serve(runner: ModelRunner, mode: str, caching: bool) -> Served:
    bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, prefix_caching=caching)
    sched = make_scheduler(mode, bm, max_num_seqs=6, max_model_len=NUM_BLOCKS * BLOCK_SIZE,
                           max_num_batched_tokens=96, chunk_size=24)  # fmt: skip
    seqs = _requests()
    pending = seqs[:]
    prefill = 0
    for _ in range(2000):
        for _ in range(3):  # three arrivals per step
            if pending:
                sched.add(pending.pop(0))
        batch = sched.schedule()
        if not batch:
            if not pending:
                break
            continue
        prefill += batch.num_prefill_tokens
        sched.postprocess(batch, runner.run(batch))
    assert all(s.finish_reason == "length" for s in seqs)
    outputs = {s.seq_id: s.output_token_ids for s in seqs}
    return Served(outputs, prefill, sched.prefix_cache_hits, sched.num_preemptions, seqs)


@pytest.mark.parametrize("mode", ["static", "continuous", "chunked"])
def test_greedy_outputs_are_identical_with_caching_on_and_off(
    runner: ModelRunner, mode: str
) -> None:
    off = _serve(runner, mode, caching=False)
    on = _serve(runner, mode, caching=True)
    assert on.outputs == off.outputs
    assert off.hits == 0 and on.hits > 0
    assert on.prefill_tokens < off.prefill_tokens  # the cached part was not computed
    if mode != "static":
        assert on.preemptions > 0 and off.preemptions > 0
    for s in on.seqs:  # and right, not just equal: the dense model's greedy tokens
        if s.num_cached_tokens:
            assert s.output_token_ids == greedy_from_dense(runner, s), s.seq_id
