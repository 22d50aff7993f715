"""Shipping and merging records across workers: pure data, tested in-process (no Locust)."""

from __future__ import annotations

import pytest

from loadlab._analysis.metrics import count_outcomes
from loadlab._report.text import render_summary
from loadlab.locust._collect import RecordCollector, RecordShipper, shift_record
from loadlab.records import RequestRecord


def rec(rid: str, sent: int, chunks: list[int]) -> RequestRecord:
    return RequestRecord(
        rid, sent_ns=sent, headers_ns=sent + 1, chunk_ns=chunks, end_ns=chunks[-1] + 1
    )


def test_shift_moves_every_timestamp_and_keeps_durations() -> None:
    r = shift_record(rec("a", 100, [150, 170]), 1_000)
    assert (r.sent_ns, r.headers_ns, r.chunk_ns, r.end_ns) == (1100, 1101, [1150, 1170], 1171)
    assert r.intended_ns is None  # absent stays absent


def test_same_host_uses_monotonic_offset_not_wall_clock() -> None:
    # worker started 2 ms after the master on the monotonic clock; wall clocks disagree by 1 s
    ship = RecordShipper(worker=3, host="box", t0_perf_ns=5_002_000_000, t0_wall_ns=1_000)
    ship.add(rec("r1", 10, [60, 80]))
    col = RecordCollector(host="box", t0_perf_ns=5_000_000_000, t0_wall_ns=1_000_000_001_000)
    col.add_batch("n3", ship.take_batch())
    r = col.records[0]
    assert (r.sent_ns, r.chunk_ns, r.worker) == (2_000_010, [2_000_060, 2_000_080], 3)


def test_other_host_uses_wall_clock_offset() -> None:
    ship = RecordShipper(worker=1, host="far", t0_perf_ns=7, t0_wall_ns=3_000)
    ship.add(rec("r1", 10, [20]))
    col = RecordCollector(host="near", t0_perf_ns=999_999, t0_wall_ns=1_000)
    col.add_batch("n1", ship.take_batch(final=True))
    assert col.records[0].sent_ns == 2_010


def test_batches_accumulate_and_final_marks_the_worker_done() -> None:
    ship = RecordShipper(worker=0, host="h", t0_perf_ns=0, t0_wall_ns=0)
    col = RecordCollector(host="h", t0_perf_ns=0, t0_wall_ns=0)
    col.add_batch("a", ship.take_batch())  # the empty hello
    assert col.missing() == {"a"}
    ship.add(rec("r1", 1, [2]))
    ship.add(rec("r2", 3, [4]))
    col.add_batch("a", ship.take_batch())
    ship.add(rec("r3", 5, [6]))
    col.add_batch("a", ship.take_batch(final=True))
    assert [r.request_id for r in col.records] == ["r1", "r2", "r3"]
    assert col.missing() == set() and col.missing(["b"]) == {"b"}
    assert ship.pending == [] and ship.final_sent and ship.seq == 3


def test_results_holds_every_worker_sorted_by_send() -> None:
    col = RecordCollector(host="h", t0_perf_ns=0, t0_wall_ns=0)
    for worker, node, sent in ((0, "a", 30), (1, "b", 10), (1, "b", 20)):
        ship = RecordShipper(worker=worker, host="h", t0_perf_ns=0, t0_wall_ns=0)
        ship.add(rec(f"{node}{sent}", sent, [sent + 5]))
        col.add_batch(node, ship.take_batch(final=True))
    res = col.results(duration_ns=100, config={"api_key": "sk-x"}, environment={}, started_at="t")
    assert [r.request_id for r in res.records] == ["b10", "b20", "a30"]
    assert res.kind == "locust" and res.workers == 2
    assert res.extra["locust"]["workers_reported"] == [0, 1]
    assert res.to_dict()["config"]["api_key"] == "***"


@pytest.mark.parametrize(("p99", "saturated"), [(19.9, False), (20.1, True)])
def test_generator_saturated_when_any_worker_lag_p99_passes_threshold(
    p99: float, saturated: bool
) -> None:
    col = RecordCollector(host="h", t0_perf_ns=0, t0_wall_ns=0)
    for node, lag in (("a", 1.0), ("b", p99)):
        batch = RecordShipper(worker=0, host="h", t0_perf_ns=0, t0_wall_ns=0).take_batch()
        batch["generator"] = {"loop_lag_ms_max": 50.0, "loop_lag_ms_p99": lag}
        col.add_batch(node, batch)
    g = col.generator_summary(20.0)
    assert g["saturated"] is saturated and g["loop_lag_ms_max"] == 50.0


def test_a_worker_that_dies_between_batches_leaves_its_started_requests_lost() -> None:
    """A worker killed with kill -9 never sends its final batch; the requests it said
    it started and never reported are counted lost, as failed records, so the invariants hold."""
    dead = RecordShipper(worker=1, host="a", t0_perf_ns=0, t0_wall_ns=0)
    alive = RecordShipper(worker=2, host="a", t0_perf_ns=0, t0_wall_ns=0)
    col = RecordCollector(host="a", t0_perf_ns=0, t0_wall_ns=0)
    for _ in range(5):
        dead.note_started()
        alive.note_started()
    assert dead.has_news and not RecordShipper(3, "a", 0, 0).has_news
    dead.add(RequestRecord("d1", sent_ns=1, chunk_ns=[2]))
    dead.add(RequestRecord("d2", sent_ns=1, chunk_ns=[2]))
    col.add_batch("n1", dead.take_batch())  # then kill -9: 3 started, never reported
    assert not dead.has_news
    dead.note_started()  # started after its last batch: the master cannot know it
    for i in range(5):
        alive.add(RequestRecord(f"a{i}", sent_ns=1, chunk_ns=[2]))
    col.add_batch("n2", alive.take_batch(final=True))
    assert col.lost_by_node() == {"n1": 3}
    res = col.results(duration_ns=10, config={}, environment={}, started_at="")
    info = res.extra["locust"]
    assert (info["records_lost"], info["lost_by_worker"]) == (3, {"1": 3})
    lost = [r for r in res.records if r.request_id.startswith("lost-")]
    assert [(r.worker, r.outcome) for r in lost] == [(1, "incomplete")] * 3
    assert "stopped without reporting" in (lost[0].error or "")
    counts = count_outcomes(res.records, res.scheduled_count)
    assert (counts.scheduled, counts.sent, counts.ok, counts.failed) == (10, 10, 7, 3)
    assert "LOST 3: started on Locust worker(s) 1" in render_summary(res)
