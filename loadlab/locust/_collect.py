"""Exact records across Locust workers: what a worker ships and how the master merges it.

Pure data, no Locust or gevent import (so it is unit-tested in the pytest process; the glue
that sends the batches lives in ``loadlab.locust._hooks``). A worker keeps its records relative to its
own ``t0`` (``perf_counter_ns`` at its ``test_start``) and ships them in batches::

    {"worker": 1, "host": "box", "t0_perf_ns": int, "t0_wall_ns": int, "seq": 3,
     "final": False, "shipped": 40, "started": 43, "records": [RequestRecord.to_dict(), ...]}

``started`` counts the requests the worker's users began: a worker that dies (``kill -9``)
before its final batch leaves ``started`` minus the records received as *lost* requests,
which the results file holds as failed records (``incomplete``, error "lost: ...") and
``extra.locust.records_lost`` counts.

The master re-bases every record onto its own ``t0``. On one host the offset comes from
``perf_counter_ns`` (``CLOCK_MONOTONIC`` is system-wide on Linux, so it is exact); across hosts
only wall clocks are shared, so the offset is ``t0_wall`` difference (NTP-accurate, a few ms at
worst). Durations inside a record (TTFT, ITL, E2E) are differences of one process's clock
and are never touched by the offset.

Example::

    >>> ship = RecordShipper(worker=1, host="a", t0_perf_ns=10, t0_wall_ns=0)
    >>> ship.add(RequestRecord("r1", sent_ns=5, chunk_ns=[7]))
    >>> col = RecordCollector(host="a", t0_perf_ns=0, t0_wall_ns=0)
    >>> [r.request_id for r in col.add_batch("node-1", ship.take_batch(final=True))]
    ['r1']
    >>> col.records[0].sent_ns, col.records[0].worker, col.finished_nodes
    (15, 1, {'node-1'})
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loadlab.records import OUTCOME_INCOMPLETE, RequestRecord
from loadlab.results import Results

__all__ = ["RecordCollector", "RecordShipper", "shift_record"]

_TIME_FIELDS = ("intended_ns", "sent_ns", "headers_ns", "end_ns")


def shift_record(r: RequestRecord, delta_ns: int) -> RequestRecord:
    """Move every timestamp of ``r`` by ``delta_ns`` in place (a change of time origin)."""
    if delta_ns:
        for name in _TIME_FIELDS:
            v = getattr(r, name)
            if v is not None:
                setattr(r, name, v + delta_ns)
        r.chunk_ns = [t + delta_ns for t in r.chunk_ns]
    return r


@dataclass
class RecordShipper:
    """Worker side: records completed since the last batch, and the clock they refer to."""

    worker: int
    host: str
    t0_perf_ns: int
    t0_wall_ns: int
    pending: list[RequestRecord] = field(default_factory=list)
    seq: int = 0
    shipped: int = 0
    final_sent: bool = False
    started: int = 0  # requests this worker's users began to send
    started_shipped: int = 0  # ``started`` as of the last batch

    def note_started(self) -> None:
        """One request is about to be sent: the master counts it lost if its record never
        arrives (a worker killed between two batches)."""
        self.started += 1

    @property
    def has_news(self) -> bool:
        """Records to ship, or requests started since the last batch."""
        return bool(self.pending) or self.started != self.started_shipped

    @classmethod
    def start_now(cls, worker: int, host: str) -> RecordShipper:
        # Both clocks read back to back: their pairing is what lets the master align workers.
        return cls(worker, host, time.perf_counter_ns(), time.time_ns())

    def add(self, record: RequestRecord) -> None:
        record.worker = self.worker
        self.pending.append(record)

    def take_batch(self, *, final: bool = False) -> dict[str, Any]:
        """The next message body; empties ``pending``. ``final`` marks the worker's last one."""
        records, self.pending = self.pending, []
        self.seq += 1
        self.shipped += len(records)
        self.started_shipped = self.started
        self.final_sent = self.final_sent or final
        return {
            "worker": self.worker,
            "host": self.host,
            "t0_perf_ns": self.t0_perf_ns,
            "t0_wall_ns": self.t0_wall_ns,
            "seq": self.seq,
            "final": final,
            "shipped": self.shipped,
            "started": self.started,
            # A shallow copy of each record's fields: dataclasses.asdict deep-copies every list,
            # ~50x slower, and the flush runs on the gevent loop that stamps every token.
            "records": [dict(vars(r)) for r in records],
        }


@dataclass
class RecordCollector:
    """Master (or single-process) side: every worker's records on one time base."""

    host: str
    t0_perf_ns: int
    t0_wall_ns: int
    records: list[RequestRecord] = field(default_factory=list)
    seen_nodes: set[str] = field(default_factory=set)
    finished_nodes: set[str] = field(default_factory=set)
    shipped_by_node: dict[str, int] = field(default_factory=dict)  # what each worker says it sent
    started_by_node: dict[str, int] = field(default_factory=dict)  # requests it says it began
    workers_by_node: dict[str, int] = field(default_factory=dict)
    generator_by_node: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def start_now(cls, host: str) -> RecordCollector:
        return cls(host, time.perf_counter_ns(), time.time_ns())

    def offset_ns(self, batch: Mapping[str, Any]) -> int:
        """Add this to a worker's times to put them on the collector's time base."""
        if batch["host"] == self.host:
            return int(batch["t0_perf_ns"]) - self.t0_perf_ns
        return int(batch["t0_wall_ns"]) - self.t0_wall_ns

    def add_batch(self, node_id: str, batch: Mapping[str, Any]) -> list[RequestRecord]:
        """Take a worker's batch; returns its records on the collector's time base."""
        delta = self.offset_ns(batch)
        worker = int(batch["worker"])
        added = [shift_record(RequestRecord.from_dict(d), delta) for d in batch["records"]]
        for r in added:
            r.worker = worker
        self.records += added
        self.seen_nodes.add(node_id)
        self.workers_by_node[node_id] = worker
        self.shipped_by_node[node_id] = int(batch.get("shipped", 0))
        self.started_by_node[node_id] = int(batch.get("started", 0))
        if batch.get("generator"):
            self.generator_by_node[node_id] = dict(batch["generator"])
        if batch.get("final"):
            self.finished_nodes.add(node_id)
        return added

    def generator_summary(self, threshold_ms: float) -> dict[str, Any]:
        """Saturated when any worker's gevent loop lag p99 passed ``threshold_ms``."""
        parts = [self.generator_by_node[n] for n in sorted(self.generator_by_node)]
        lag_max = max((float(g.get("loop_lag_ms_max", 0.0)) for g in parts), default=0.0)
        lag_p99 = max((float(g.get("loop_lag_ms_p99", 0.0)) for g in parts), default=0.0)
        cpu = max((float(g.get("cpu_percent_mean", 0.0)) for g in parts), default=0.0)
        return {
            "saturated": lag_p99 > threshold_ms,
            "cpu_percent_mean": cpu,  # the busiest worker's, % of one core
            "loop_lag_ms_max": lag_max,
            "loop_lag_ms_p99": lag_p99,
            "threshold_ms": threshold_ms,
            "parts": parts,
        }

    def missing(self, expected: Iterable[str] = ()) -> set[str]:
        """Workers (seen or expected) whose final batch has not arrived."""
        return (self.seen_nodes | set(expected)) - self.finished_nodes

    def lost_by_node(self) -> dict[str, int]:
        """Requests a worker reported started whose records never came (it died before
        shipping them), by node. A worker that sent its final batch lost none; requests a
        dead worker started after its last batch are unknown to the master and not here."""
        received = self.received_by_node()
        lost = {n: self.started_by_node.get(n, 0) - received.get(n, 0) for n in self.missing()}
        return {n: k for n, k in sorted(lost.items()) if k > 0}

    def received_by_node(self) -> dict[str, int]:
        counts = {n: 0 for n in self.seen_nodes}
        by_worker = {w: n for n, w in self.workers_by_node.items()}
        for r in self.records:
            node = by_worker.get(r.worker)
            if node is not None:
                counts[node] += 1
        return counts

    def results(
        self,
        *,
        duration_ns: int,
        config: Mapping[str, Any],
        environment: Mapping[str, Any],
        started_at: str,
        extra: Mapping[str, Any] | None = None,
    ) -> Results:
        """One results file (kind ``locust``) holding every worker's records, sorted by send."""
        recs = sorted(self.records, key=lambda r: (r.sent_ns is None, r.sent_ns or 0))
        lost = self.lost_by_node()
        recs += _lost_records(lost, self.workers_by_node)
        info = {
            # The master's clock at t0: record time + this = perf_counter_ns on its host.
            "t0_perf_ns": self.t0_perf_ns,
            "host": self.host,
            "workers_reported": sorted(self.workers_by_node.values()),
            "workers_missing_final": sorted(self.missing()),
            "records_shipped": sum(self.shipped_by_node.values()),
            "records_received": len(self.records),
            "records_lost": sum(lost.values()),
            "lost_by_worker": {str(self.workers_by_node[n]): k for n, k in lost.items()},
        }
        return Results(
            records=recs,
            config=dict(config),
            environment=dict(environment),
            started_at=started_at,
            duration_ns=duration_ns,
            window_ns=None,
            scheduled=None,
            workers=max(1, len(self.seen_nodes)),
            kind="locust",
            extra={**(extra or {}), "locust": info},
        )


def _lost_records(lost: Mapping[str, int], workers: Mapping[str, int]) -> list[RequestRecord]:
    """One failed record per lost request, so the run's counts keep scheduled = sent +
    dropped and sent = ok + failed: they were sent, and nothing is known of their answers."""
    out = []
    for node, n in lost.items():
        w = workers[node]
        msg = (f"lost: worker {w} ({node}) started this request and stopped without reporting "
               "it (killed?); nothing is known of its answer")  # fmt: skip
        out += [
            RequestRecord(f"lost-w{w}-{i}", OUTCOME_INCOMPLETE, worker=w, error=msg)
            for i in range(n)
        ]
    return out
