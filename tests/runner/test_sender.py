"""The gated open loop's sender thread and its garbage collection between sends."""

from __future__ import annotations

import asyncio
import gc
import random
import threading
import time
from collections.abc import Iterator

import pytest

from loadlab._runner import runner as runner_mod
from loadlab._runner.runner import Runner
from loadlab._runner.sender import Sender, priority
from loadlab.clients._gate import SendGate
from loadlab.clients._openai import OpenAIClient
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.loopback import serve_in_thread


@pytest.fixture(scope="module")
def server() -> Iterator[FixedScheduleServer]:
    yield from serve_in_thread(lambda: FixedScheduleServer(ttft_ms=2, itl_ms=1))


def test_the_sender_fires_each_gate_once_in_due_order_and_stop_returns_the_rest() -> None:
    async def go() -> None:
        lags: list[int] = []
        sender = Sender(lags)
        sender.start()
        now = time.perf_counter_ns()
        order: list[int] = []
        gates = [SendGate() for _ in range(4)]
        holds = [
            asyncio.ensure_future(g.hold(lambda i=i: order.append(i))) for i, g in enumerate(gates)
        ]
        await asyncio.sleep(0)
        sender.add(now + 60_000_000, gates[2])  # added out of order
        sender.add(now + 20_000_000, gates[0])
        sender.add(now + 40_000_000, gates[1])
        sender.add(now + 60_000_000_000, gates[3])  # a minute away: still waiting at stop
        assert sender.next_due_ns() == now + 20_000_000
        assert await asyncio.wait_for(asyncio.gather(*holds[:3]), 10) == [True] * 3
        assert order == [0, 1, 2] and len(lags) == 3 and min(lags) >= 0
        assert all(g.fired and g.fired_ns >= now for g in gates[:3])
        assert sender.stop() == [gates[3]] and sender.next_due_ns() is None
        gates[3].withdraw()
        assert await holds[3] is False and order == [0, 1, 2]
        sender.join(5)
        assert not sender.is_alive()

    asyncio.run(go())


def test_a_gate_fired_from_a_thread_before_it_is_held_writes_when_held() -> None:
    async def go() -> None:
        gate, writes = SendGate(), []
        t = threading.Thread(target=gate.fire_threadsafe)
        t.start()
        t.join()
        assert gate.fired and not gate.by_thread
        assert await gate.hold(lambda: writes.append("now"), lambda: None) is True
        assert writes == ["now"]

    asyncio.run(go())


def test_the_thread_asks_for_a_prompt_wake_up_and_says_what_it_got() -> None:
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(priority()))
    t.start()
    t.join()
    assert got[0] in ("realtime", "short slice", "default")


def test_a_gated_run_collects_garbage_itself_and_gives_back_the_automatic_collection(
    server: FixedScheduleServer,
) -> None:
    # the automatic collection is off while the run lasts, and the run collects by itself
    rng = random.Random(7)
    times = sorted(rng.uniform(0, 1.5) for _ in range(300))
    specs = [RequestSpec(f"c{i}", "hi", 2, intended_at_s=t) for i, t in enumerate(times)]
    starts: list[int] = []
    enabled: list[bool] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            starts.append(time.perf_counter_ns())

    async def go() -> Runner:
        async with OpenAIClient(EndpointConfig(url=server.url, model="m")) as client:
            runner = Runner(RunConfig(rate_rps=10, requests=300), iter(specs), client)
            task = asyncio.ensure_future(runner.run())
            await asyncio.sleep(0.5)
            enabled.append(gc.isenabled())
            res = await task
            assert len(res.records) == 300 and all(r.ok for r in res.records)
            assert res.generator["sender_priority"] in ("realtime", "short slice", "default")
            return runner

    before = gc.isenabled()
    gc.callbacks.append(note)
    try:
        runner = asyncio.run(go())
    finally:
        gc.callbacks.remove(note)
    assert enabled == [False] and gc.isenabled() == before
    assert runner.t0_ns is not None
    assert [s for s in starts if runner.t0_ns <= s <= runner.t0_ns + 1_500_000_000]


def test_a_collection_waits_for_a_moment_with_no_request_due() -> None:
    room, ms = runner_mod.GC_ROOM_NS, 1_000_000
    now = 10**12
    assert runner_mod._time_to_collect(now, None, now - ms, 0)  # nothing due
    assert runner_mod._time_to_collect(now, now + room + ms, now - ms, 0)
    assert not runner_mod._time_to_collect(now, now + room // 2, now - ms, 0)
    assert not runner_mod._time_to_collect(now, now - ms, now - ms, 0)  # one being sent
    # collections that took 3 ms need 6 ms of room
    assert not runner_mod._time_to_collect(now, now + 5 * ms, now - ms, 3 * ms)
    assert runner_mod._time_to_collect(now, now + 7 * ms, now - ms, 3 * ms)
    # a schedule with no room at all is collected anyway, once overdue
    overdue = now - runner_mod.GC_OVERDUE_NS - ms
    assert runner_mod._time_to_collect(now, now + room // 2, overdue, 0)
