"""The simulator against the reference server's own schedulers, step for step.

The real ``reference_server.scheduler`` classes, their block manager and the fake model runner
(which checks block tables every step) are driven by a loop that does what ``Engine.step``
does, on a simulated clock priced by the same step-time model. Every request's token times
must equal the simulator's, with and without its decode shortcut, in every mode, including
runs that preempt.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.simulate import LinearStepTime, ServerConfig, Simulator
from reference_server.fake_runner import FakeModelRunner
from reference_server.kv_cache import BlockManager
from reference_server.scheduler import make_scheduler
from reference_server.sequence import SamplingParams, Sequence

MODEL = LinearStepTime(
    base_s=0.004,
    per_prefill_token_s=2e-5,
    per_decode_token_s=3e-4,
    per_pair_s=1e-9,
    per_kv_token_s=2e-7,
)


def reference_token_times(server: ServerConfig, specs: list[RequestSpec]) -> dict[str, list[float]]:
    bm = BlockManager(server.num_kv_blocks, server.block_size)
    sched = make_scheduler(
        server.mode,
        bm,
        max_num_seqs=server.max_num_seqs,
        max_model_len=server.context_tokens,
        max_num_batched_tokens=server.max_num_batched_tokens,
        chunk_size=server.chunk_size,
        finished_slots=server.static_finished,
    )
    runner = FakeModelRunner(server.num_kv_blocks, server.block_size)
    pending = sorted(specs, key=lambda s: s.intended_at_s or 0.0)
    times: dict[str, list[float]] = {s.request_id: [] for s in specs}
    now = 0.0
    while pending or sched.has_work:
        while pending and (pending[0].intended_at_s or 0.0) <= now:
            s = pending.pop(0)
            sched.add(
                Sequence(s.request_id, [7] * (s.prompt_tokens or 0), SamplingParams(s.max_tokens))
            )
        batch = sched.schedule()
        if not batch:
            now = pending[0].intended_at_s or 0.0
            continue
        starts = np.array([i.seq.num_computed_tokens for i in batch.items], dtype=np.int64)
        ns = np.array([i.num_new_tokens for i in batch.items], dtype=np.int64)
        prefill, decode = int(ns[ns > 1].sum()), int((ns == 1).sum())
        pairs = int((starts * ns + ns * (ns + 1) // 2).sum())
        dt = MODEL.step_s(prefill, decode, pairs, int(starts.sum()))
        tokens = runner.run(batch)
        now += dt
        for seq in sched.postprocess(batch, tokens):
            times[seq.seq_id].append(now)
    return times


def simulated_token_times(
    server: ServerConfig, specs: list[RequestSpec], fast: bool
) -> dict[str, list[float]]:
    cfg = RunConfig(rate_rps=1.0, requests=len(specs), timeout_s=1e6)
    out = Simulator(cfg, server, MODEL, fast=fast).run(specs)
    assert all(r.outcome == "ok" for r in out.requests)
    return {
        r.spec.request_id: [t / 1e9 for t in rec.chunk_ns]
        for r, rec in zip(out.requests, out.to_results().records, strict=True)
    }


def workload(seed: int, n: int, max_prompt: int, max_out: int, rate: float) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1 / rate, n))
    return [
        RequestSpec(
            f"r{i}",
            "",
            int(rng.integers(1, max_out + 1)),
            intended_at_s=float(at[i]),
            prompt_tokens=int(rng.integers(1, max_prompt + 1)),
        )
        for i in range(n)
    ]


def check_same(server: ServerConfig, specs: list[RequestSpec]) -> None:
    ref = reference_token_times(server, specs)
    for fast in (False, True):
        sim = simulated_token_times(server, specs, fast)
        for rid, expected in ref.items():
            assert len(sim[rid]) == len(expected), (rid, fast)
            np.testing.assert_allclose(sim[rid], expected, rtol=0, atol=2e-9, err_msg=rid)


CASES = [
    ServerConfig(mode="continuous", num_kv_blocks=4096, max_num_seqs=8),
    ServerConfig(mode="continuous", num_kv_blocks=40, block_size=4, max_num_seqs=16),  # preempts
    ServerConfig(
        mode="chunked", num_kv_blocks=4096, max_num_seqs=8, chunk_size=48, max_num_batched_tokens=64
    ),
    ServerConfig(
        mode="chunked",
        num_kv_blocks=40,
        block_size=4,
        chunk_size=32,
        max_num_batched_tokens=40,
        max_num_seqs=16,
    ),
    ServerConfig(mode="static", num_kv_blocks=4096, max_num_seqs=4),
    ServerConfig(mode="static", num_kv_blocks=4096, max_num_seqs=4, static_finished="idle"),
    ServerConfig(mode="static", num_kv_blocks=30, block_size=4, max_num_seqs=8),
]


@pytest.mark.parametrize("server", CASES, ids=lambda s: f"{s.mode}-{s.num_kv_blocks}")
@pytest.mark.parametrize("seed", [0, 1])
def test_same_token_times_as_the_reference_schedulers(server: ServerConfig, seed: int) -> None:
    specs = workload(seed, 60, max_prompt=100, max_out=40, rate=40.0)
    max_len = server.context_tokens
    specs = [s for s in specs if (s.prompt_tokens or 0) + s.max_tokens <= max_len]
    check_same(server, specs)


def test_preemption_happens_in_the_small_cache_cases() -> None:
    server = CASES[1]
    specs = workload(0, 60, max_prompt=100, max_out=40, rate=40.0)
    cfg = RunConfig(rate_rps=1.0, requests=len(specs), timeout_s=1e6)
    out = Simulator(cfg, server, MODEL).run(specs)
    assert out.preemptions > 0


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(["static", "continuous", "chunked"]),
    blocks=st.integers(30, 200),
    seqs=st.integers(1, 24),
    budget=st.integers(4, 300),
    chunk=st.integers(1, 120),
    seed=st.integers(0, 10_000),
)
def test_same_token_times_property(
    mode: str, blocks: int, seqs: int, budget: int, chunk: int, seed: int
) -> None:
    server = ServerConfig(
        mode=mode,
        num_kv_blocks=blocks,
        block_size=4,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        chunk_size=chunk,
        max_model_len=min(blocks * 4, 200),
    )
    specs = [
        s
        for s in workload(seed, 30, 90, 30, rate=60.0)
        if (s.prompt_tokens or 0) + s.max_tokens <= server.context_tokens
    ]
    check_same(server, specs)
