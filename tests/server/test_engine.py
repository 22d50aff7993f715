"""The engine loop on the fake runner and clock: events per token, phases, aborts, text."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import pytest

from reference_server.engine import Engine, TextStream
from reference_server.engine_like import TokenEvent
from reference_server.fake_runner import FakeClock, FakeModelRunner
from reference_server.kv_cache import BlockManager
from reference_server.scheduler import ChunkedScheduler
from reference_server.sequence import SamplingParams, ScheduledBatch, Sequence


def test_text_stream_never_splits_a_utf8_character() -> None:
    ts = TextStream()
    assert [ts.push(b, final=False) for b in "hé".encode()] == ["h", "", "é"]
    assert ts.push(0xE2, final=True) == "\ufffd"  # a dangling lead byte at the end


def test_text_stream_holds_back_a_possible_stop_string_and_cuts_it() -> None:
    ts = TextStream(stop=("xyz",))
    out = [ts.push(ord(c), final=False) for c in "abxy"]
    assert out == ["", "", "a", "b"]  # the last two characters are held: they could start "xyz"
    assert ts.push(ord("z"), final=True) == "" and ts.stopped
    ts2 = TextStream(stop=("xyz",))
    got = "".join(ts2.push(ord(c), final=i == 4) for i, c in enumerate("abxyq"))
    assert got == "abxyq" and not ts2.stopped


def _engine() -> tuple[Engine, FakeModelRunner]:
    """Blocks of 4 (32 of them), 4 sequences, 8 tokens a step; each step takes 1 ms a token."""
    clock = FakeClock()
    runner = FakeModelRunner(32, 4, clock=clock, step_ns=lambda b: 1_000_000 * b.num_tokens)
    sched = ChunkedScheduler(
        BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=8, chunk_size=8
    )
    return Engine(runner, sched, clock=clock), runner


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop for the engine to deliver on, closed after the test."""
    new = asyncio.new_event_loop()
    yield new
    new.close()


def _run_out(
    engine: Engine, loop: asyncio.AbstractEventLoop, *queues: asyncio.Queue[TokenEvent]
) -> list[list[TokenEvent]]:
    """Step until no work is left, let the loop deliver, and take each queue's events."""
    while engine.step():
        pass
    loop.run_until_complete(asyncio.sleep(0))
    return [[q.get_nowait() for _ in range(q.qsize())] for q in queues]


def test_engine_delivers_one_event_per_token_and_times_steps_by_phase(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine, _ = _engine()
    qa: asyncio.Queue[TokenEvent] = asyncio.Queue()
    qb: asyncio.Queue[TokenEvent] = asyncio.Queue()
    engine.submit(Sequence("a", [1] * 6, SamplingParams(max_tokens=3)), loop, qa)
    assert engine.queue_depth == 1
    assert engine.step()  # a: 6-token prefill, samples "g" (position 6)
    engine.submit(Sequence("b", [1] * 4, SamplingParams(max_tokens=2)), loop, qb)
    events_a, events_b = _run_out(engine, loop, qa, qb)
    assert [(e.text, e.completion_tokens, e.finish_reason) for e in events_a] == [
        ("g", 1, None), ("h", 2, None), ("i", 3, "length")]  # fmt: skip
    assert "".join(e.text for e in events_b) == "ef" and events_b[-1].finish_reason == "length"
    # Steps: prefill(a:6) | mixed(a:1 + b:4) | decode(a:1, b:1) -> a done, b done.
    stats = engine.stats
    assert (stats.num_steps("prefill"), stats.num_steps("mixed"), stats.num_steps("decode")) == (
        1,
        1,
        1,
    )
    text = stats.render(gauges={}, counters={})
    assert 'loadlab_server_step_seconds_sum{phase="mixed"} 0.005' in text  # 5 tokens x 1 ms
    assert 'loadlab_server_tokens_total{phase="prefill"} 10' in text
    assert 'loadlab_server_tokens_total{phase="decode"} 3' in text
    assert 'loadlab_server_requests_total{finish_reason="length"} 2' in text
    # The step log: each whole step (inbox, schedule, run, hand-off) and its shape in the
    # simulator's features: prefill slices, single-token rows, causal pairs, cached tokens.
    log = stats.step_log()
    # prefill(a:6) | mixed(a: 1 token at 6, b: 4 from 0) | decode(a at 7, b at 4)
    assert [(e["prefill_tokens"], e["decode_tokens"], e["attn_pairs"], e["kv_read_tokens"])
            for e in log] == [(6, 0, 21, 0), (4, 1, 7 + 10, 6), (0, 2, 8 + 5, 7 + 4)]  # fmt: skip
    assert {e["role"] for e in log} == {"engine"}
    # the fake runner advances the clock by 1 ms a token: each whole step at least that
    assert [e["end_ns"] - e["start_ns"] for e in log] == [6_000_000, 5_000_000, 2_000_000]
    assert all(b["start_ns"] >= a["end_ns"] for a, b in itertools.pairwise(log))


def test_abort_through_the_inbox_frees_blocks_and_sends_nothing_more(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine, _ = _engine()
    q: asyncio.Queue[TokenEvent] = asyncio.Queue()
    engine.submit(Sequence("a", [1] * 6, SamplingParams(max_tokens=50)), loop, q)
    engine.step()
    engine.abort("a")
    assert not engine.step()  # drained: nothing left to run
    loop.run_until_complete(asyncio.sleep(0))
    assert q.qsize() == 1
    assert engine.scheduler.block_manager.num_used_blocks == 0
    assert 'requests_total{finish_reason="abort"} 1' in engine.stats.render(gauges={}, counters={})


def test_a_failing_request_fails_alone_and_the_engine_goes_on(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine, runner = _engine()
    real_run = runner.run

    def run(batch: ScheduledBatch) -> list[int | None]:
        if any(i.seq.seq_id == "bad" for i in batch.items):
            raise RuntimeError("boom")
        return real_run(batch)

    runner.run = run  # type: ignore[method-assign]
    q_bad: asyncio.Queue[TokenEvent] = asyncio.Queue()
    q_ok: asyncio.Queue[TokenEvent] = asyncio.Queue()
    engine.submit(Sequence("bad", [1] * 3, SamplingParams(max_tokens=5)), loop, q_bad)
    engine.submit(Sequence("ok", [1] * 3, SamplingParams(max_tokens=2)), loop, q_ok)
    bad, ok = _run_out(engine, loop, q_bad, q_ok)
    assert len(bad) == 1 and bad[0].finish_reason == "error" and "RuntimeError" in str(bad[0].error)
    assert [e.completion_tokens for e in ok] == [1, 2] and ok[-1].finish_reason == "length"
    assert engine.scheduler.block_manager.num_used_blocks == 0 and not engine.scheduler.has_work


def test_gauges_follow_the_scheduler_and_the_inbox(loop: asyncio.AbstractEventLoop) -> None:
    engine, _ = _engine()
    q: asyncio.Queue[TokenEvent | None] = asyncio.Queue()
    engine.submit(Sequence("a", [1] * 6, SamplingParams(max_tokens=50)), loop, q)
    before = engine.gauges()
    engine.step()  # a: prefill of 6 tokens into 2 blocks of 4
    during = engine.gauges()
    engine.abort("a")
    engine.step()
    after = engine.gauges()
    assert (before.queue_depth, before.running_requests, before.kv_blocks_used) == (1, 0, 0)
    assert (during.queue_depth, during.running_requests, during.batch_slots) == (0, 1, 1)
    assert during.kv_blocks_used == 2 and during.kv_blocks_total == 32
    assert (after.running_requests, after.kv_blocks_used, after.preemptions_total) == (0, 0, 0)
    assert engine.max_num_seqs == 4 and engine.extra_metrics() == []


def test_steps_while_requests_wait_count_static_batchings_useful_rows(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Static, 2 slots, answers of 1, 3 and 1 tokens: while c waits, a's finished row pads."""
    from reference_server.scheduler import StaticScheduler

    clock = FakeClock()
    runner = FakeModelRunner(32, 4, clock=clock, step_ns=lambda b: 1_000_000)
    sched = StaticScheduler(BlockManager(32, 4), max_num_seqs=2)
    engine = Engine(runner, sched, clock=clock)
    for name, n in (("a", 1), ("b", 3), ("c", 1)):
        q: asyncio.Queue[TokenEvent] = asyncio.Queue()
        engine.submit(Sequence(name, [1] * 4, SamplingParams(max_tokens=n)), loop, q)
    while engine.step():
        pass
    # prefill(a, b) | decode(b; a pads) | decode(b; a pads) | prefill(c): c waited through the
    # two decode steps, each with one useful row
    text = engine.stats.render(gauges={}, counters={})
    assert "loadlab_server_steps_while_waiting_total 2" in text
    assert "loadlab_server_decode_tokens_while_waiting_total 2" in text
    assert 'loadlab_server_tokens_total{phase="padding"} 2' in text
