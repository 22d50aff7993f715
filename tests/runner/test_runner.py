"""The runner against an in-process fake client: schedule precision, the in-flight cap,
closed-loop concurrency, chat sessions, stop rules and the record invariants."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import numpy as np
import pytest

from loadlab._analysis.metrics import Counts, count_outcomes
from loadlab._runner.runner import Runner, group_units
from loadlab.clients._base import Completion
from loadlab.config import RunConfig
from loadlab.records import RequestSpec
from loadlab.results import Results
from loadlab.workloads._arrivals import arrival_times
from tests.helpers.fakes import FakeClient


def _run(cfg: RunConfig, specs: object, client: object, **kw: object) -> Results:
    async def go() -> Results:
        return await Runner(cfg, specs, client, **kw).run()  # type: ignore[arg-type]

    return asyncio.run(go())


def _open(n: int, rate: float) -> list[RequestSpec]:
    times = arrival_times("constant", rate, n=n)
    return [RequestSpec(f"r{i}", "p", 3, intended_at_s=t) for i, t in enumerate(times)]


def _invariants(res: Results) -> Counts:
    c = count_outcomes(res.records, res.scheduled_count)
    assert c.scheduled == c.sent + c.dropped
    assert c.sent == c.ok + c.failed
    return c


def test_open_loop_sends_on_schedule_at_50_rps() -> None:
    res = _run(RunConfig(rate_rps=50, requests=60), _open(60, 50.0), FakeClient())
    errs = np.array([(r.sent_ns - r.intended_ns) / 1e6 for r in res.records])  # type: ignore[operator]
    assert len(errs) == 60 and errs.min() > -0.5  # never early
    # generous bounds: on a loaded 2-core machine the OS deschedules the process for tens of
    # ms now and then (at load average 12 the p90 of 60 sends reached 19 ms), and a freeze of
    # the whole process (a clean-clone CI run has seen half a second) makes every send due
    # during it late. A runner that drifted (sending at 25 rps) would be ~600 ms late at the
    # median and ~1 s at the p90, so the bounds still catch that.
    assert np.percentile(errs, 50) < 100.0 and np.percentile(errs, 90) < 300.0
    assert [r.intended_ns for r in sorted(res.records, key=lambda r: r.intended_ns or 0)][
        1
    ] == 20_000_000
    assert _invariants(res).ok == 60


def test_cap_drops_instead_of_delaying() -> None:
    client = FakeClient(ttft_s=0.25, tokens=1)
    res = _run(RunConfig(rate_rps=50, requests=20, max_in_flight=2), _open(20, 50.0), client)
    c = _invariants(res)
    assert client.max_in_flight <= 2
    assert c.scheduled == 20
    # two requests live 0.25 s each while 50/s arrive: most of the 20 (0.4 s) must drop
    assert 10 <= c.dropped <= 17
    dropped = [r for r in res.records if r.outcome == "dropped"]
    assert all(r.intended_ns is not None and r.sent_ns is None for r in dropped)


class BlockingClient(FakeClient):
    """Blocks the event loop once, as a saturated generator would."""

    async def send(self, spec: RequestSpec, **kw: object) -> Completion:  # type: ignore[override]
        if spec.request_id == "r0":  # blocks right after r0 took its send time
            asyncio.get_running_loop().call_soon(time.sleep, 0.2)
        return await super().send(spec, **kw)  # type: ignore[arg-type]


def test_requests_behind_schedule_are_marked_late() -> None:
    res = _run(
        RunConfig(rate_rps=100, requests=4),
        _open(4, 100.0),
        BlockingClient(),
        late_tolerance_ms=50.0,
    )
    late = {r.request_id: r.late for r in res.records}
    assert late == {"r0": False, "r1": True, "r2": True, "r3": True}
    assert _invariants(res).late == 3


def test_closed_loop_never_exceeds_concurrency() -> None:
    client = FakeClient(ttft_s=0.005, itl_s=0.001)
    specs = (RequestSpec(f"c{i}", "p", 3) for i in itertools.count())  # infinite: lazy
    res = _run(RunConfig(concurrency=3, requests=30), specs, client)
    assert client.max_in_flight == 3
    assert _invariants(res).ok == 30
    assert all(r.intended_ns is None for r in res.records)


def _session(sid: str, turns: int, think_s: float, at: float | None = None) -> list[RequestSpec]:
    return [
        RequestSpec(
            f"{sid}-{k}",
            f"q{k}",
            2,
            session_id=sid,
            turn=k,
            think_time_s=think_s,
            intended_at_s=at if k == 0 else None,
        )
        for k in range(turns)
    ]


def test_sessions_send_history_and_respect_think_time() -> None:
    client = FakeClient()
    specs = _session("a", 3, 0.1) + _session("b", 2, 0.1)
    res = _run(RunConfig(concurrency=2, requests=5), specs, client)
    hist = {c["id"]: c["history"] for c in client.calls}
    assert hist["a-0"] == []
    assert hist["a-2"] == [
        {"role": "user", "content": "q0"},
        {"role": "assistant", "content": "answer to a-0"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "answer to a-1"},
    ]
    by = {r.request_id: r for r in res.records}
    for prev, nxt in (("a-0", "a-1"), ("a-1", "a-2"), ("b-0", "b-1")):
        assert by[nxt].sent_ns - by[prev].end_ns >= 100_000_000  # type: ignore[operator]
    assert _invariants(res).ok == 5


def test_open_loop_session_later_turns_get_intended_times() -> None:
    specs = _session("s", 2, 0.05, at=0.0) + _session("t", 2, 0.05, at=0.02)
    res = _run(RunConfig(rate_rps=10, requests=4), specs, FakeClient())
    by = {r.request_id: r for r in res.records}
    assert by["t-0"].intended_ns == 20_000_000
    later = by["s-1"]
    assert later.intended_ns is not None and later.intended_ns >= by["s-0"].end_ns + 50_000_000  # type: ignore[operator]


def test_failed_turn_ends_its_session() -> None:
    client = FakeClient(fail_ids=frozenset({"a-1"}))
    res = _run(RunConfig(concurrency=1, requests=3), _session("a", 3, 0.0), client)
    assert [r.outcome for r in res.records] == ["ok", "http_500"]
    assert _invariants(res).failed == 1


def test_duration_run_cancels_after_drain_and_keeps_every_request() -> None:
    client = FakeClient(ttft_s=30.0)
    specs = (RequestSpec(f"c{i}", "p", 3) for i in itertools.count())
    start = time.perf_counter()
    res = _run(RunConfig(concurrency=4, duration_s=0.2), specs, client, drain_s=0.2)
    assert time.perf_counter() - start < 5.0
    assert [r.outcome for r in res.records] == ["cancelled"] * 4
    assert all(r.sent_ns is not None for r in res.records)
    assert _invariants(res).failed == 4


def test_stop_cancels_in_flight_and_records_them() -> None:
    async def go() -> tuple[Results, Runner]:
        runner = Runner(
            RunConfig(rate_rps=20, duration_s=60), _open(1200, 20.0), FakeClient(ttft_s=30.0)
        )
        asyncio.get_running_loop().call_later(0.3, runner.stop)
        return await runner.run(), runner

    res, runner = asyncio.run(go())
    assert runner.interrupted and res.extra["interrupted"] is True
    c = _invariants(res)
    assert 3 <= c.scheduled <= 20 and c.by_outcome == {"cancelled": c.scheduled}


def test_measurement_window_excludes_warmup_and_cooldown() -> None:
    specs = (RequestSpec(f"c{i}", "p", 3) for i in itertools.count())
    cfg = RunConfig(concurrency=1, duration_s=0.5, warmup_s=0.1, cooldown_s=0.15)
    res = _run(cfg, specs, FakeClient(ttft_s=0.01))
    assert res.window_ns == (100_000_000, 350_000_000)
    assert res.generator["threshold_ms"] == 20.0 and "loop_lag_ms_p99" in res.generator


def test_open_loop_needs_intended_times() -> None:
    with pytest.raises(ValueError, match="intended_at_s"):
        _run(RunConfig(rate_rps=5, requests=1), [RequestSpec("x", "p", 1)], FakeClient())


def test_group_units_keeps_sessions_whole_and_is_lazy() -> None:
    def stream() -> Iterator[RequestSpec]:
        yield from _session("a", 2, 0.0)
        yield RequestSpec("solo", "p", 1)
        yield from _session("b", 1, 0.0)
        raise AssertionError("read past what was asked")

    units = group_units(stream())
    assert [s.request_id for s in next(units)] == ["a-0", "a-1"]
    assert [s.request_id for s in next(units)] == ["solo"]


def test_the_heap_is_frozen_during_a_run_and_handed_back_after() -> None:
    import gc

    frozen: list[int] = []

    class Watching(FakeClient):
        async def send(self, spec: RequestSpec, **kw: object) -> Completion:  # type: ignore[override]
            frozen.append(gc.get_freeze_count())
            return await super().send(spec, **kw)  # type: ignore[arg-type]

    client = Watching(ttft_s=0.001)
    specs = (RequestSpec(f"c{i}", "p", 3) for i in itertools.count())
    _run(RunConfig(concurrency=2, requests=6), specs, client)
    assert min(frozen) > 0  # the startup heap is out of the collector's walks
    assert gc.get_freeze_count() == 0


def test_a_client_that_raises_is_recorded_and_the_run_goes_on() -> None:
    class Raising(FakeClient):
        async def send(self, spec: RequestSpec, **kw: object) -> Completion:  # type: ignore[override]
            if spec.request_id == "c1":
                raise RuntimeError("client bug")
            return await super().send(spec, **kw)  # type: ignore[arg-type]

    specs = (RequestSpec(f"c{i}", "p", 3) for i in itertools.count())
    res = _run(RunConfig(concurrency=2, requests=5), specs, Raising(ttft_s=0.001))
    c = _invariants(res)
    assert c.ok == 4 and c.by_outcome.get("protocol_error") == 1
    bad = next(r for r in res.records if r.request_id == "c1")
    assert "client bug" in (bad.error or "")


def test_open_loop_opens_a_spare_connection_ahead_of_each_due_request() -> None:
    """A client that can (``preconnect``) is asked for a spare connection before each request
    of an open loop, ``PRECONNECT_AHEAD_NS`` ahead where the schedule leaves room, and once
    before the run's zero, so that a session's first turn never waits for a connect; a closed
    loop asks for none."""
    from loadlab._runner.runner import PRECONNECT_AHEAD_NS

    class Preconnecting(FakeClient):
        def __init__(self) -> None:
            super().__init__()
            self.asked_ns: list[int] = []

        def preconnect(self) -> None:
            self.asked_ns.append(time.perf_counter_ns())

    client = Preconnecting()
    specs = [RequestSpec(f"r{i}", "p", 3, intended_at_s=0.2 * i) for i in range(3)]
    res = _run(RunConfig(rate_rps=5, requests=3), specs, client)
    t0 = res.extra["t0_ns"]
    sent = sorted(t0 + r.sent_ns for r in res.records)  # type: ignore[operator]
    first, *asked = client.asked_ns
    assert first < t0  # the run's first connection is made before its zero
    assert len(asked) == 3
    for i, (ask, at) in enumerate(zip(asked, sent, strict=True)):
        assert ask <= at  # asked before the send, and not before its time comes near
        assert ask >= t0 + int(0.2 * i * 1e9) - PRECONNECT_AHEAD_NS
    closed = Preconnecting()
    _run(
        RunConfig(concurrency=2, requests=4),
        [RequestSpec(f"c{i}", "p", 3) for i in range(4)],
        closed,
    )
    assert closed.asked_ns == []
