"""Disaggregated mode by hand, and the decode shortcut against step-by-step everywhere."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.simulate import LinearStepTime, ServerConfig, SimOutput, Simulator

MODEL = LinearStepTime(base_s=0.010, per_prefill_token_s=0.0001, per_decode_token_s=0.0011)
# four steps in five at 0.9 of the price, one at 1.6: a skewed spread, like a loaded server's
SKEWED = dataclasses.replace(MODEL, jitter=(0.9,) * 80 + (1.6,) * 20)
DISAGG = dict(mode="disaggregated", kv_bytes_per_token=1000, kv_transfer_bytes_per_s=1e6,
              kv_transfer_latency_s=0.002)  # fmt: skip


def step_ms(prefill: int, decode: int) -> float:
    return 10.0 + 0.1 * prefill + 1.1 * decode


def spec(rid: str, prompt: int, out: int, at: float = 0.0, text: str = "") -> RequestSpec:
    text = text or (rid + "x" * prompt)[:prompt]  # unlike the others unless given
    return RequestSpec(rid, text, out, intended_at_s=at, prompt_tokens=prompt)


def run(specs: list[RequestSpec], fast: bool = True, **server: object):  # type: ignore[no-untyped-def]
    cfg = RunConfig(rate_rps=1.0, requests=len(specs))
    return Simulator(cfg, ServerConfig(**{**DISAGG, **server}), MODEL, fast=fast).run(specs)  # type: ignore[arg-type]


def times_ms(out, i: int) -> list[float]:  # type: ignore[no-untyped-def]
    rec = out.to_results().records[i]
    return [(t - rec.sent_ns) / 1e6 for t in rec.chunk_ns]


@pytest.mark.parametrize("fast", [True, False])
def test_one_request_prefill_transfer_decode(fast: bool) -> None:
    """First token from the prefill worker's step; the KV (100 tokens x 1,000 bytes at 1 MB/s,
    + 2 ms) then moves; the decode worker decodes one token per step from there."""
    t = times_ms(run([spec("a", 100, 4)], fast=fast), 0)
    prefill = step_ms(100, 0)
    transfer = 2.0 + 100 * 1000 / 1e6 * 1e3  # 102 ms
    decode = step_ms(0, 1)
    assert t == pytest.approx([prefill] + [prefill + transfer + k * decode for k in (1, 2, 3)])


def test_prefill_pauses_at_max_held_and_decode_pulls_by_slots() -> None:
    """One decode slot: the second request is prefilled at once but waits, held, for the first
    to finish before its KV is pulled; with max_held 1 the third cannot even be prefilled
    until the second is pulled."""
    specs = [spec("a", 10, 5), spec("b", 10, 5), spec("c", 10, 5)]
    out = run(specs, max_num_seqs=1, max_held=1)
    a, b, c = (times_ms(out, i) for i in range(3))
    transfer = 2.0 + 10 * 1000 / 1e6 * 1e3
    assert a[0] == pytest.approx(step_ms(10, 0))  # a alone in the first prefill step
    assert b[0] == pytest.approx(2 * step_ms(10, 0))  # b next (a batch holds max_num_seqs)
    # b's KV is pulled when a's last token is out (a frees the decode slot), then c prefills
    assert b[1] == pytest.approx(a[-1] + transfer + step_ms(0, 1))
    assert c[0] == pytest.approx(a[-1] + step_ms(10, 0))


@pytest.mark.parametrize("caching", [True, False])
def test_prefill_worker_serves_a_repeated_prompt_from_its_cache(caching: bool) -> None:
    """The prefill side caches (as the server's): a prompt seen before prefills only its
    uncached rest, (100 - 1) // 16 = 6 blocks = 96 tokens cached, 4 computed; the decode side
    still receives the whole prompt's KV."""
    text = "y" * 100
    out = run([spec("a", 100, 2, text=text), spec("b", 100, 2, at=1.0, text=text)],
              prefix_caching=caching)  # fmt: skip
    b = times_ms(out, 1)
    transfer = 2.0 + 100 * 1000 / 1e6 * 1e3
    assert b[0] == pytest.approx(step_ms(4 if caching else 100, 0))
    assert b[1] == pytest.approx(b[0] + transfer + step_ms(0, 1))
    assert out.to_results().records[1].server.get("cached_tokens", 0) == (96 if caching else 0)


def test_two_prefill_workers_share_arrivals() -> None:
    out = run([spec("a", 500, 2), spec("b", 500, 2)], prefill_workers=2, decode_workers=2)
    a, b = times_ms(out, 0), times_ms(out, 1)
    assert a[0] == pytest.approx(step_ms(500, 0)) and b[0] == pytest.approx(step_ms(500, 0))
    assert {r.prefill_rank for r in out.requests} == {0, 1}
    assert {r.decode_rank for r in out.requests} == {0, 1}


@settings(max_examples=30, deadline=None)
@given(
    mode=st.sampled_from(["static", "continuous", "chunked", "disaggregated"]),
    blocks=st.integers(40, 300),
    seqs=st.integers(1, 16),
    budget=st.integers(8, 300),
    timeout=st.sampled_from([0.3, 1.0, 100.0]),
    closed=st.booleans(),
    seed=st.integers(0, 10_000),
    spread=st.booleans(),
)
# CI derandomizes Hypothesis; a case random runs found: the decode worker's preempted head
# waits on blocks, so the base rule said arrivals could not matter and the stretch ran past a
# request that, prefilled and pulled, joins the running set without passing that queue
@example(mode="disaggregated", blocks=46, seqs=13, budget=290, timeout=100.0, closed=False,
         seed=7381, spread=False)  # fmt: skip
def test_shortcut_equals_step_by_step(mode: str, blocks: int, seqs: int, budget: int,
                                      timeout: float, closed: bool, seed: int,
                                      spread: bool) -> None:  # fmt: skip
    """Whatever the mode, load shape, preemption and timeouts: the decode shortcut gives the
    same token times as stepping one by one; with a step spread (``LinearStepTime.jitter``)
    too, as the n-th step of a worker gets the same factor inside a decode stretch as alone."""
    model = SKEWED if spread else MODEL
    shortcut_against_steps(mode, blocks, seqs, budget, timeout, closed, seed, model=model)


@pytest.mark.timeout(60)
def test_two_waiting_workers_wait_for_the_next_event() -> None:
    """A prefill worker short of blocks and a decode worker whose preempted head is short of
    blocks, one KV transfer in flight: each used to wait for the other's next step, taking
    turns one float step at a time (for ever in effect); both now wait for the transfer."""
    slow = shortcut_against_steps("disaggregated", 48, 13, 44, 100.0, False, 4843)
    assert slow.preemptions > 0
    # none timed out (a 400: a chat history grown past max_model_len)
    assert {r.outcome for r in slow.requests} == {"ok", "http_400"}


def shortcut_against_steps(mode: str, blocks: int, seqs: int, budget: int, timeout: float,
                           closed: bool, seed: int,
                           model: LinearStepTime = MODEL) -> SimOutput:  # fmt: skip
    """Chat sessions against a small server, with and without the decode shortcut: checks
    that both give the same outcomes and token times; returns the step-by-step run."""
    server = ServerConfig(mode=mode, num_kv_blocks=blocks, block_size=4, max_num_seqs=seqs,
                          max_num_batched_tokens=budget, chunk_size=max(1, budget // 2),
                          kv_bytes_per_token=64, max_model_len=160)  # fmt: skip
    wl = {"kind": "chat", "sessions": 8, "turns": 3, "think_time_s": 0.05,
          "prompt_tokens": {"dist": "uniform", "low": 1, "high": 60},
          "output_tokens": {"dist": "uniform", "low": 1, "high": 30}}  # fmt: skip
    load = {"concurrency": 3} if closed else {"rate_rps": 30.0}
    cfg = RunConfig(requests=24, timeout_s=timeout, seed=seed, workload=wl, **load)  # type: ignore[arg-type]
    from loadlab.workloads import build_requests

    slow_out = Simulator(cfg, server, model, fast=False).run(build_requests(cfg))
    fast = Simulator(cfg, server, model, fast=True).run(build_requests(cfg)).to_results()
    slow = slow_out.to_results()
    assert [r.outcome for r in fast.records] == [r.outcome for r in slow.records]
    for f, s in zip(fast.records, slow.records, strict=True):
        assert len(f.chunk_ns) == len(s.chunk_ns), f.request_id
        np.testing.assert_allclose(f.chunk_ns, s.chunk_ns, rtol=0, atol=5)
    return slow_out
