"""Open loop with big prompts: units are built in the scheduler's waits, not when due, and a
request started ahead is written inside the call that fires its gate, in the run's sender
thread, while the event loop may be busy (against the fixed server on loopback, with the real
client). Structural properties only: none of these asserts a duration that a loaded machine
could miss."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from loadlab._runner import runner as runner_mod
from loadlab._runner.ahead import Lookahead
from loadlab._runner.runner import Runner
from loadlab.clients._gate import SendGate
from loadlab.clients._openai import OpenAIClient
from loadlab.config import EndpointConfig, RunConfig
from loadlab.records import RequestSpec
from loadlab.results import Results
from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.fakes import FakeClient
from tests.helpers.loopback import serve_in_thread

BIG = "word " * 6000  # a prompt of thousands of tokens (30,000 characters)


@pytest.fixture(scope="module")
def server() -> Iterator[FixedScheduleServer]:
    yield from serve_in_thread(lambda: FixedScheduleServer(ttft_ms=5, itl_ms=1))


def _slow_specs(
    times: list[float], built_ns: dict[str, int], cost_s: float
) -> Iterator[RequestSpec]:
    """Specs that each take ``cost_s`` of the loop to build (as a prompt fitted under a
    tokenizer does), noting when each was done."""
    for i, t in enumerate(times):
        time.sleep(cost_s)  # blocks the event loop, as building on it would
        spec = RequestSpec(f"r{i}", BIG, 2, intended_at_s=t)
        built_ns[spec.request_id] = time.perf_counter_ns()
        yield spec


def _run(cfg: RunConfig, specs: Iterator[RequestSpec], client: object) -> tuple[Results, Runner]:
    async def go() -> tuple[Results, Runner]:
        runner = Runner(cfg, specs, client)  # type: ignore[arg-type]
        return await runner.run(), runner

    return asyncio.run(go())


def test_a_burst_is_built_in_the_wait_before_it() -> None:
    # one request, then 20 due at once 0.4 s later: building them when due (2 ms each) would
    # send the last 40 ms late; they are built in the 0.4 s wait instead
    built: dict[str, int] = {}
    times = [0.0] + [0.4] * 20
    res, runner = _run(
        RunConfig(rate_rps=10, requests=21), _slow_specs(times, built, 0.002), FakeClient()
    )
    assert runner.t0_ns is not None
    burst_due = runner.t0_ns + 400_000_000
    late = [rid for rid, t in built.items() if rid != "r0" and t >= burst_due]
    assert late == [] and res.generator["built_late"] == 0
    assert len(res.records) == 21 and all(r.ok for r in res.records)


def test_a_unit_with_no_wait_before_it_is_built_when_taken_and_counted() -> None:
    # every unit due at 0: no wait leaves room, each is built as the scheduler takes it
    built: dict[str, int] = {}
    res, _ = _run(
        RunConfig(rate_rps=10, requests=5), _slow_specs([0.0] * 5, built, 0.002), FakeClient()
    )
    assert len(res.records) == 5 and res.generator["built_late"] >= 1


def test_a_gated_request_is_written_inside_the_call_that_fires_its_gate(
    server: FixedScheduleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fires: list[tuple[int, int, str]] = []  # (start, end, thread) of every fire
    encoded: dict[str, int] = {}
    fire, encode = SendGate.fire_threadsafe, OpenAIClient.encode_body

    def timed_fire(gate: SendGate) -> None:
        start = time.perf_counter_ns()
        fire(gate)
        fires.append((start, time.perf_counter_ns(), threading.current_thread().name))

    def timed_encode(client: OpenAIClient, spec: RequestSpec) -> bytes:
        encoded[spec.request_id] = time.perf_counter_ns()
        return encode(client, spec)

    monkeypatch.setattr(SendGate, "fire_threadsafe", timed_fire)
    monkeypatch.setattr(OpenAIClient, "encode_body", timed_encode)
    times = [0.05 + 0.01 * i for i in range(30)] + [0.4] * 10  # spaced, then a burst
    specs = [RequestSpec(f"g{i}", BIG, 2, intended_at_s=t) for i, t in enumerate(times)]

    async def go() -> tuple[Results, Runner]:
        ep = EndpointConfig(url=server.url, model="m")
        async with OpenAIClient(ep) as client:
            runner = Runner(RunConfig(rate_rps=10, requests=40), iter(specs), client)
            return await runner.run(), runner

    res, runner = asyncio.run(go())
    assert runner.t0_ns is not None
    t0 = runner.t0_ns
    assert len(res.records) == 40 and all(r.ok for r in res.records)
    assert len(fires) == 40 and {name for _, _, name in fires} == {"loadlab-sender"}
    for r in res.records:
        assert r.sent_ns is not None and r.intended_ns is not None
        assert r.sent_ns >= r.intended_ns  # never early
        sent = t0 + r.sent_ns
        # the stamp (and the write right after it) happened inside one fire call
        assert any(start <= sent <= end for start, end, _ in fires), r.request_id
        assert encoded[r.request_id] < t0 + r.intended_ns  # the body was encoded ahead
        assert server.truth[r.request_id]["recv_ns"] >= sent
    assert not runner._sender.is_alive()  # type: ignore[union-attr]  # stopped with the run
    assert runner.stats.ahead == runner.stats.fired == 40 and runner.stats.in_flight == 0


def test_a_request_due_while_the_loop_is_busy_goes_out_on_time(
    server: FixedScheduleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the loop computes for 0.6 s from 0.1 s, holding the interpreter: the requests due at
    # 0.12-0.14 s, started 50 ms ahead (SEND_LEAD_NS) before it began, are written by the
    # sender thread during that time, not after it. One of them is 4 MB, more than a loopback
    # socket takes at once: the loop writes the rest afterwards.
    monkeypatch.setattr(runner_mod, "SEND_LEAD_NS", 50_000_000)
    times = [0.0, 0.12, 0.13, 0.135, 0.14]
    specs = [RequestSpec(f"b{i}", "hi", 2, intended_at_s=t) for i, t in enumerate(times)]
    specs[3] = RequestSpec("b3", "word " * 800_000, 2, intended_at_s=0.135)
    busy: list[int] = []

    def compute() -> None:
        start = time.perf_counter_ns()
        while time.perf_counter_ns() - start < 600_000_000:
            sum(range(100))  # bytecode: the interpreter's lock is handed over between steps
        busy.extend((start, time.perf_counter_ns()))

    async def go() -> tuple[Results, Runner]:
        ep = EndpointConfig(url=server.url, model="m")
        async with OpenAIClient(ep) as client:
            runner = Runner(RunConfig(rate_rps=10, requests=5), iter(specs), client)
            task = asyncio.ensure_future(runner.run())
            await asyncio.sleep(0.01)  # t0 is set once the first connection is made
            while runner.t0_ns is None:
                await asyncio.sleep(0.001)
            due = (runner.t0_ns + 100_000_000 - time.perf_counter_ns()) / 1e9
            asyncio.get_running_loop().call_later(max(due, 0.0), compute)
            return await task, runner

    res, runner = asyncio.run(go())
    assert runner.t0_ns is not None and busy
    assert len(res.records) == 5 and all(r.ok for r in res.records), [
        (r.request_id, r.outcome, r.error) for r in res.records
    ]
    for r in res.records[1:]:
        assert r.sent_ns is not None and r.intended_ns is not None
        assert r.sent_ns >= r.intended_ns > busy[0] - runner.t0_ns  # due once it computed
        assert runner.t0_ns + r.sent_ns < busy[1], r.request_id  # and sent before it ended
    big = next(r for r in res.records if r.request_id == "b3")
    assert big.prompt_tokens == 800_000  # the whole body came (this server counts words)


def test_the_aiohttp_transport_sends_when_its_gate_fires(server: FixedScheduleServer) -> None:
    times = [0.02 * i for i in range(10)] + [0.3] * 5

    async def go() -> Results:
        ep = EndpointConfig(url=server.url, model="m")
        async with OpenAIClient(ep, transport="aiohttp") as client:
            return await Runner(
                RunConfig(rate_rps=10, requests=15), _specs("a", times), client
            ).run()

    res = asyncio.run(go())
    assert len(res.records) == 15 and all(r.ok for r in res.records)
    assert all(r.sent_ns >= r.intended_ns for r in res.records)  # type: ignore[operator]


def _specs(prefix: str, times: list[float]) -> Iterator[RequestSpec]:
    return iter([RequestSpec(f"{prefix}{i}", BIG, 2, intended_at_s=t) for i, t in enumerate(times)])


def test_stopping_withdraws_requests_started_ahead_unsent(
    server: FixedScheduleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # with a lead of 0.4 s, the requests due at 0.6 s are started at 0.2 s; the run stops
    # at 0.35 s: they are withdrawn, never written and never recorded
    monkeypatch.setattr(runner_mod, "SEND_LEAD_NS", 400_000_000)
    times = [0.0, 0.01] + [0.6] * 5
    specs = [RequestSpec(f"w{i}", "hi", 2, intended_at_s=t) for i, t in enumerate(times)]

    async def go() -> tuple[Results, Runner]:
        ep = EndpointConfig(url=server.url, model="m")
        async with OpenAIClient(ep) as client:
            runner = Runner(RunConfig(rate_rps=10, requests=7), iter(specs), client)
            asyncio.get_running_loop().call_later(0.35, runner.stop)
            return await runner.run(), runner

    res, runner = asyncio.run(go())
    assert runner.stats.ahead == runner.stats.fired == 2  # the withdrawn ones are not waiting
    assert {r.request_id for r in res.records} == {"w0", "w1"}
    assert res.scheduled_count == 2
    assert not any(f"w{i}" in server.truth for i in range(2, 7))


def test_the_lookahead_keeps_its_bounds() -> None:
    units = iter([[RequestSpec(f"u{i}", "x" * 100, 1)] for i in range(10)])
    ahead = Lookahead(units, lambda unit: unit[0].request_id.upper(), max_units=3)
    far = time.perf_counter_ns() + 10**12
    while ahead.build_one():
        pass
    assert len(ahead) == 3 and ahead.full() and not ahead.has_room(far)
    assert ahead.pop() == ([RequestSpec("u0", "x" * 100, 1)], "U0")
    chars = Lookahead(
        iter([[RequestSpec(f"c{i}", "x" * 100, 1)] for i in range(10)]), max_chars=250
    )
    while chars.build_one():
        pass
    assert len(chars) == 3  # 300 characters built: past 250, no more
    empty = Lookahead(iter([]))
    assert not empty.build_one() and not empty.has_room(far) and empty.pop() is None


def test_no_room_for_a_build_slower_than_the_wait() -> None:
    def slow() -> Iterator[list[RequestSpec]]:
        for i in range(5):
            time.sleep(0.01)
            yield [RequestSpec(f"s{i}", "x", 1)]

    ahead = Lookahead(slow())
    ahead.build_one()  # learns that a build takes ~10 ms
    assert ahead.cost_ns >= 10_000_000
    assert not ahead.has_room(time.perf_counter_ns() + 5_000_000)


def test_a_gate_writes_once_when_fired_and_never_when_withdrawn() -> None:
    async def go() -> None:
        writes: list[str] = []
        gate = SendGate()
        held = asyncio.ensure_future(gate.hold(lambda: writes.append("w")))
        await asyncio.sleep(0)
        assert writes == []
        gate.fire()
        assert writes == ["w"]  # inside fire(), before the holder resumes
        assert await held is True
        gate.fire()
        assert writes == ["w"]

        early = SendGate()
        early.fire()
        assert await early.hold(lambda: writes.append("late")) is True
        assert writes == ["w", "late"]

        dropped = SendGate()
        waiting = asyncio.ensure_future(dropped.hold(lambda: writes.append("never")))
        await asyncio.sleep(0)
        dropped.withdraw()
        dropped.fire()
        assert await waiting is False and writes == ["w", "late"] and not dropped.fired

    asyncio.run(go())


def test_a_run_shortens_the_thread_switch_interval_and_hands_it_back() -> None:
    seen: list[float] = []

    class Probe(FakeClient):
        async def send(self, spec, **options):  # type: ignore[no-untyped-def]
            seen.append(sys.getswitchinterval())
            return await super().send(spec, **options)

    before = sys.getswitchinterval()
    specs = [RequestSpec(f"p{i}", "x", 1, intended_at_s=0.001 * i) for i in range(3)]
    _run(RunConfig(rate_rps=10, requests=3), iter(specs), Probe())
    assert seen and max(seen) <= runner_mod.SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == before


def test_a_request_its_workload_could_not_build_is_recorded_at_its_time(
    server: FixedScheduleServer,
) -> None:
    # started ahead like the others, a broken request waits for its gate and is recorded
    # bad_input once it fired; it was lost before (its unit ended before its gate fired)
    specs = [RequestSpec(f"x{i}", "hi", 2, intended_at_s=0.05 * i) for i in range(6)]
    specs[2] = RequestSpec("x2", "hi", 2, intended_at_s=0.1, error="broken trace line 3")

    async def go() -> tuple[Results, Runner]:
        async with OpenAIClient(EndpointConfig(url=server.url, model="m")) as client:
            runner = Runner(RunConfig(rate_rps=10, requests=6), iter(specs), client)
            return await runner.run(), runner

    res, runner = asyncio.run(go())
    outcomes = {r.request_id: r.outcome for r in res.records}
    assert len(res.records) == 6 and res.scheduled_count == 6
    assert outcomes.pop("x2") == "bad_input" and set(outcomes.values()) == {"ok"}
    assert "x2" not in server.truth  # never sent
    assert runner.stats.fired == runner.stats.ahead == 6
