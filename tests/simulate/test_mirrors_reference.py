"""The simulator against the reference server's own schedulers, step for step.

The real ``reference_server.scheduler`` classes, their block manager and the fake model runner
(which checks block tables every step) are driven by a loop that does what ``Engine.step``
does, on a simulated clock priced by the same step-time model. Every request's token times
must equal the simulator's, with and without its decode shortcut, in every mode, including
runs that preempt, with prefix caching on (prompts sharing prefixes, repeated whole, chat
sessions whose later turns carry their history) and off. The fake runner checks the K/V it
is asked to read was written by the same prefix (``check_kv``). Each reference step is
priced from ``ScheduledBatch.step_shape`` (the server's step log), the simulator's from its
own count of the same four features.
"""

from __future__ import annotations

import dataclasses

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
    """Drive the real schedulers as ``Engine.step`` does, and the client as the runner does:
    a session's next turn goes ``think_time_s`` after the previous one ended, its prompt the
    history (earlier prompts and the answers received) and its own, joined by "\\n" as the
    server's chat template joins messages."""
    bm = BlockManager(server.num_kv_blocks, server.block_size, prefix_caching=server.caching)
    sched = make_scheduler(
        server.mode,
        bm,
        max_num_seqs=server.max_num_seqs,
        max_model_len=server.context_tokens,
        max_num_batched_tokens=server.max_num_batched_tokens,
        chunk_size=server.chunk_size,
        finished_slots=server.static_finished,
    )
    runner = FakeModelRunner(server.num_kv_blocks, server.block_size, check_kv=True)
    later = {(s.session_id, s.turn): s for s in specs if s.turn > 0}
    pending = [(s.intended_at_s or 0.0, i, s, "") for i, s in enumerate(specs) if s.turn == 0]
    history: dict[str, str] = {}  # request id -> the prompt it was sent (for the next turn)
    times: dict[str, list[float]] = {s.request_id: [] for s in specs}
    order = len(specs)
    now = 0.0
    while pending or sched.has_work:
        pending.sort(key=lambda p: (p[0], p[1]))
        while pending and pending[0][0] <= now:
            _, _, s, past = pending.pop(0)
            prompt = past + s.prompt
            history[s.request_id] = prompt
            sched.add(Sequence(s.request_id, list(prompt.encode()), SamplingParams(s.max_tokens)))
        batch = sched.schedule()
        if not batch:
            now = pending[0][0]
            continue
        # the server's own step shape (what its step log records), priced as the simulator
        # prices its steps: so the two shape computations are held to each other here too
        dt = MODEL.step_s(*batch.step_shape())
        tokens = runner.run(batch)
        now += dt
        for seq in sched.postprocess(batch, tokens):
            times[seq.seq_id].append(now)
            if seq.is_finished:
                spec = next(x for x in specs if x.request_id == seq.seq_id)
                nxt = later.get((spec.session_id, spec.turn + 1))
                if nxt is not None:
                    answer = bytes(seq.output_token_ids).decode()
                    past = f"{history[seq.seq_id]}\n{answer}\n"
                    pending.append((now + nxt.think_time_s, order, nxt, past))
                    order += 1
        bm.check()
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


PREFIXES = ["", "You are a helpful assistant. " * 3, "Summarize this: ", "Q" * 37]


def workload(
    seed: int, n: int, max_prompt: int, max_out: int, rate: float, *, turns: int = 1
) -> list[RequestSpec]:
    """Open-loop units of 1 to ``turns`` turns; prompts start with one of a few shared
    prefixes (or repeat an earlier prompt whole), then text of their own, so the prefix
    cache hits at every depth, including whole blocks of a previous turn."""
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1 / rate, n))
    seen: list[str] = []
    specs: list[RequestSpec] = []
    for i in range(n):
        session = f"s{i}" if turns > 1 else None
        for turn in range(int(rng.integers(1, turns + 1))):
            size = int(rng.integers(1, max_prompt + 1))
            if seen and rng.random() < 0.15:
                prompt = seen[int(rng.integers(len(seen)))]
            else:
                head = PREFIXES[int(rng.integers(len(PREFIXES)))]
                prompt = (head + f"<{i}.{turn}>" + "abc def " * 20)[:size]
                seen.append(prompt)
            specs.append(
                RequestSpec(
                    f"r{i}.{turn}",
                    prompt,
                    int(rng.integers(1, max_out + 1)),
                    intended_at_s=float(at[i]) if turn == 0 else None,
                    prompt_tokens=len(prompt),
                    session_id=session,
                    turn=turn,
                    think_time_s=float(rng.exponential(0.02)) if turn else 0.0,
                )
            )
    return specs


def fits(specs: list[RequestSpec], server: ServerConfig) -> list[RequestSpec]:
    """Units whose every turn (history included) fits the context, as the API would take them."""
    budget: dict[str, int] = {}
    for s in specs:
        key = s.session_id or s.request_id
        budget[key] = budget.get(key, 0) + len(s.prompt) + s.max_tokens + 2
    return [s for s in specs if budget[s.session_id or s.request_id] <= server.context_tokens]


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


@pytest.mark.parametrize("caching", [True, False], ids=["cache", "nocache"])
@pytest.mark.parametrize("server", CASES, ids=lambda s: f"{s.mode}-{s.num_kv_blocks}")
@pytest.mark.parametrize("seed", [0, 1])
def test_same_token_times_as_the_reference_schedulers(
    server: ServerConfig, seed: int, caching: bool
) -> None:
    server = dataclasses.replace(server, prefix_caching=caching)
    check_same(server, fits(workload(seed, 60, max_prompt=100, max_out=40, rate=40.0), server))


@pytest.mark.parametrize("server", CASES, ids=lambda s: f"{s.mode}-{s.num_kv_blocks}")
def test_chat_sessions_reuse_their_history(server: ServerConfig) -> None:
    """Later turns carry the earlier prompts and answers: with caching they hit the blocks of
    the previous turn's prompt, and the hits are the server's."""
    specs = fits(workload(3, 25, max_prompt=60, max_out=20, rate=30.0, turns=3), server)
    assert sum(s.turn > 0 for s in specs) >= 5
    check_same(server, specs)
    cfg = RunConfig(rate_rps=1.0, requests=len(specs), timeout_s=1e6)
    out = Simulator(cfg, server, MODEL).run(specs).to_results()
    later = [r.server["cached_tokens"] for r in out.records if r.turn > 0]
    assert sum(later) > 0


def test_preemption_happens_in_the_small_cache_cases() -> None:
    server = CASES[1]
    specs = workload(0, 60, max_prompt=100, max_out=40, rate=40.0)
    cfg = RunConfig(rate_rps=1.0, requests=len(specs), timeout_s=1e6)
    out = Simulator(cfg, server, MODEL).run(specs)
    assert out.preemptions > 0


@settings(max_examples=40, deadline=None)
@given(
    caching=st.booleans(),
    turns=st.integers(1, 3),
    mode=st.sampled_from(["static", "continuous", "chunked"]),
    blocks=st.integers(30, 200),
    seqs=st.integers(1, 24),
    budget=st.integers(4, 300),
    chunk=st.integers(1, 120),
    seed=st.integers(0, 10_000),
)
def test_same_token_times_property(
    caching: bool, turns: int, mode: str, blocks: int, seqs: int, budget: int, chunk: int, seed: int
) -> None:
    server = ServerConfig(
        mode=mode,
        num_kv_blocks=blocks,
        block_size=4,
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        chunk_size=chunk,
        max_model_len=min(blocks * 4, 200),
        prefix_caching=caching,
    )
    check_same(server, fits(workload(seed, 30, 90, 30, rate=60.0, turns=turns), server))
