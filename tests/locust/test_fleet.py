"""The open-loop fleet's data: clock offsets, the journal's tail, one file from the shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab.locust._fleet import JournalTail, ShardRun, assemble, clock_offset, clock_verdict
from loadlab.records import RequestRecord


def test_the_offset_comes_from_the_fastest_round_trip() -> None:
    # worker 2 ms ahead; the first ping's answer waited 3 ms in a queue on the way back
    pings = [(0, 2_500_000, 4_000_000), (10_000_000, 12_400_000, 10_800_000)]
    got = clock_offset(pings)
    assert got == {"offset_ms": 2.0, "rtt_ms": 0.8, "pings": 2}
    with pytest.raises(ValueError, match="at least one ping"):
        clock_offset([])


def test_a_clock_too_uncertain_for_the_bound_is_said() -> None:
    start = {"offset_ms": 2.0, "rtt_ms": 0.4}
    assert clock_verdict(start, {"offset_ms": 2.1, "rtt_ms": 0.4}, bound_ms=1.0) is None
    drifted = clock_verdict(start, {"offset_ms": 3.5, "rtt_ms": 0.4}, bound_ms=1.0)
    assert drifted == "clock uncertain by up to 1.90 ms (> 1 ms)"  # 0.2 + 1.5 + 0.2
    assert clock_verdict({"offset_ms": 0.0, "rtt_ms": 5.0}, None, bound_ms=1.0) is not None


def test_the_tail_reads_complete_lines_once(tmp_path: Path) -> None:
    j = tmp_path / "s.journal.jsonl"
    tail = JournalTail(j)
    assert tail.read() == []  # not written yet
    header = json.dumps({"schema": "loadlab.journal"})
    rec = lambda i: json.dumps({"record": {"request_id": f"r{i}"}})  # noqa: E731
    j.write_text(f"{header}\n{rec(1)}\n{rec(2)[:9]}")
    assert [r["request_id"] for r in tail.read()] == ["r1"]
    j.write_text(f"{header}\n{rec(1)}\n{rec(2)}\n")
    assert [r["request_id"] for r in tail.read()] == ["r2"]
    assert tail.read() == []


def _record(rid: str, intended_ms: int) -> dict[str, object]:
    r = RequestRecord(rid, intended_ns=intended_ms * 1_000_000, sent_ns=intended_ms * 1_000_000)
    return r.to_dict()


def _schedule(k: int, n: int) -> list[tuple[str, float | None]]:
    ids = [f"r{i}" for i in range(6)]  # r0 at 0 s, r1 at 0.1 s, ...
    return [(rid, i / 10) for i, rid in enumerate(ids) if i % n == k]


def test_a_lost_worker_leaves_its_unreported_requests_counted() -> None:
    done = ShardRun(0, "node-a", host="a")
    assert len(done.add([_record("r0", 0), _record("r2", 200), _record("r0", 0)])) == 2
    done.add([_record("r4", 400)])
    done.result = {"schema": "loadlab.results", "version": 1, "scheduled": 3, "kind": "run",
                   "generator": {"saturated": True}, "records": []}  # fmt: skip
    done.clock_start = {"offset_ms": 0.1, "rtt_ms": 0.3}
    lost = ShardRun(1, "node-b", host="b")
    lost.add([_record("r1", 100)])
    lost.clock_start = {"offset_ms": 0.0, "rtt_ms": 4.0}
    res = assemble([lost, done], {"seed": 1}, _schedule, engine={"engine": "t"}, clock_bound_ms=1)
    assert [r.request_id for r in res.records] == ["r0", "r1", "r2", "r3", "r4", "r5"]
    assert [r.intended_ns for r in res.records] == [i * 100_000_000 for i in range(6)]
    assert [(r.worker, r.host) for r in res.records[:2]] == [(0, "a"), (1, "b")]
    gone = [r for r in res.records if r.request_id in ("r3", "r5")]
    assert all(r.outcome == "incomplete" and r.error.startswith("lost: ") for r in gone)  # type: ignore[union-attr]
    assert res.scheduled_count == 6 and res.saturated  # shard 0 was saturated
    info = res.extra["distributed"]
    assert info["workers_lost"] == [1] and info["records_lost"] == 2
    assert info["workers"]["1"]["clock_warning"] and not info["clock_ok"]
    assert info["workers"]["0"]["lost"] == 0 and info["workers"]["0"]["records"] == 3
    from loadlab._report.text import render_summary

    text = render_summary(res)
    assert "LOST SENDERS: shards [1] of 2" in text and "2 requests counted lost" in text
    assert "CLOCK: shard 1 (b): clock uncertain by up to 2.00 ms" in text
