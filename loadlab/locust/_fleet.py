"""An open-loop run spread over Locust workers: clocks, streamed records, one results file.

Pure data and files, no Locust or gevent import (unit-tested in the pytest process; the glue
that sends the messages lives in ``loadlab.locust._openloop``). Each worker runs shard K of N
of the run's one schedule (``loadlab run --shard K/N --start-at T``, loadlab's own runner);
the master keeps a ``ShardRun`` per worker and joins them with ``assemble``.

Clocks. The master measures each worker host's wall-clock offset NTP-style: it stamps a ping
(``t_send``), the worker stamps its answer (``t_worker``), the master stamps the answer's
arrival (``t_recv``); ``offset = t_worker - (t_send + t_recv) / 2`` is right within half the
round trip, so of several pings the one with the shortest round trip is kept
(``clock_offset``). The common start sent to worker K is the master's start plus K's offset,
so every shard's zero is the same instant to within that bound; the offsets measured at the
end show how far the clocks drifted during the run.

Records stream as they finish: the shard's run journals them (``loadlab.journal``), the
worker reads the journal's new lines (``JournalTail``) and ships them. A worker that
disappears leaves its unfinished part of the schedule: ``assemble`` rebuilds that part's ids
and intended times and counts each request no record came for as lost (a failed record,
``incomplete``, error "lost: ..."), never hidden.

Example::

    >>> clock_offset([(0, 1_500, 1_000), (10_000, 10_600, 10_200)])
    {'offset_ms': 0.0005, 'rtt_ms': 0.0002, 'pings': 2}
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadlab.records import OUTCOME_INCOMPLETE, RequestRecord
from loadlab.results import Results, merge_results

__all__ = ["JournalTail", "ShardRun", "assemble", "clock_offset", "clock_verdict", "worker_start"]

Ping = tuple[int, int, int]  # (t_send, t_worker, t_recv): wall-clock ns, master / worker / master
Schedule = Callable[[int, int], Iterable[tuple[str, float | None]]]  # (k, n) -> (id, intended s)


def clock_offset(pings: Sequence[Ping]) -> dict[str, Any]:
    """The worker clock's offset from the master's (worker minus master, ms) by the ping with
    the shortest round trip; ``rtt_ms`` bounds its error (at most half of it)."""
    if not pings:
        raise ValueError("clock_offset needs at least one ping")
    t_send, t_worker, t_recv = min(pings, key=lambda p: p[2] - p[0])
    offset_ns = t_worker - (t_send + t_recv) / 2
    return {
        "offset_ms": round(offset_ns / 1e6, 4),
        "rtt_ms": round((t_recv - t_send) / 1e6, 4),
        "pings": len(pings),
    }


def worker_start(start_at: float, clock: dict[str, Any] | None) -> float:
    """The common start ``start_at`` (Unix s on the master's clock) on a worker's clock, whose
    offset ``clock`` measured (none measured: the clocks taken as agreeing).

    >>> worker_start(100.0, {"offset_ms": 2.0, "rtt_ms": 0.2})  # the worker's clock is ahead
    100.002
    """
    return start_at + (clock or {}).get("offset_ms", 0.0) / 1e3


def clock_verdict(start: dict[str, Any], end: dict[str, Any] | None, bound_ms: float) -> str | None:
    """Why a shard's intended times may be off from the master's by more than ``bound_ms``
    (the offset's uncertainty at start, plus its drift until the end), or None."""
    error_ms = start["rtt_ms"] / 2
    if end is not None:
        error_ms += abs(end["offset_ms"] - start["offset_ms"]) + end["rtt_ms"] / 2
    if error_ms > bound_ms:
        return f"clock uncertain by up to {error_ms:.2f} ms (> {bound_ms:g} ms)"
    return None


class JournalTail:
    """The records a journal gained since the last ``read`` (complete lines only)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:  # not yet written, or deleted once the results file held all
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            entry = json.loads(line)
            if "record" in entry:  # the header has none
                out.append(entry["record"])
        return out


@dataclass
class ShardRun:
    """The master's view of one worker's shard."""

    index: int
    node: str  # Locust's id of the worker
    host: str = ""
    address: str = ""  # the worker's address toward the master
    records: list[RequestRecord] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    result: dict[str, Any] | None = None  # the shard's results file, less its records, at the end
    error: str | None = None  # why the shard's run failed, as its worker said
    clock_start: dict[str, Any] | None = None
    clock_end: dict[str, Any] | None = None

    def add(self, records: Iterable[dict[str, Any]]) -> list[RequestRecord]:
        """Take streamed records (each request once); returns the new ones."""
        new = []
        for d in records:
            r = RequestRecord.from_dict(d)
            if r.request_id in self.ids:
                continue
            r.worker, r.host = self.index, self.host
            self.ids.add(r.request_id)
            new.append(r)
        self.records += new
        return new

    @property
    def finished(self) -> bool:
        return self.result is not None or self.error is not None

    def results(self, count: int, schedule: Schedule, lost_why: str) -> Results:
        """This shard as one part of the run; what it never reported counted lost."""
        if self.result is not None:
            return Results.from_dict({**self.result, "records": []}, f"shard {self.index}")
        lost = [
            RequestRecord(rid, OUTCOME_INCOMPLETE, worker=self.index, host=self.host or None,
                          intended_ns=None if t is None else int(t * 1e9),
                          error=f"lost: {lost_why}; nothing is known of this request")
            for rid, t in schedule(self.index, count)
            if rid not in self.ids
        ]  # fmt: skip
        return Results(records=lost, kind="run", generator={"saturated": False, "lost": True})


def assemble(
    shards: Sequence[ShardRun],
    config: dict[str, Any],
    schedule: Schedule,
    *,
    engine: dict[str, Any],
    clock_bound_ms: float,
) -> Results:
    """One results file from every worker's shard (sorted by index): the records, the counts,
    each host's clock offsets at start and end, and the lost requests of a vanished worker."""
    count = len(shards)
    parts, workers = [], {}
    for s in sorted(shards, key=lambda s: s.index):
        why = s.error or f"worker {s.index} ({s.host or s.node}) stopped before its shard ended"
        part = s.results(count, schedule, why)
        part.records = [*s.records, *part.records]
        parts.append(part)
        lost = sum(1 for r in part.records if (r.error or "").startswith("lost: "))
        shard_info = (s.result or {}).get("extra", {}).get("shard", {})
        workers[str(s.index)] = {
            "node": s.node, "host": s.host, "address": s.address,
            "finished": s.result is not None, "error": s.error,
            "records": len(s.records), "lost": lost, "saturated": part.saturated,
            "clock_start": s.clock_start, "clock_end": s.clock_end,
            "clock_warning": clock_verdict(s.clock_start, s.clock_end, clock_bound_ms)
            if s.clock_start else "no clock offset measured",
            "ready_before_start_ms": shard_info.get("ready_before_start_ms"),
        }  # fmt: skip
    merged = merge_results(parts)
    merged.config = dict(config)
    merged.kind = "run"
    merged.records = sorted(
        merged.records, key=lambda r: (r.intended_ns is None, r.intended_ns or 0, r.request_id)
    )
    first = next((p.extra for p in parts if p.extra), {})
    merged.extra = {k: v for k, v in first.items() if k != "shard"}
    merged.extra["distributed"] = {
        **engine,
        "count": count,
        "workers": workers,
        "workers_lost": [int(k) for k, w in workers.items() if not w["finished"]],
        "records_lost": sum(w["lost"] for w in workers.values()),
        "clock_bound_ms": clock_bound_ms,
        "clock_ok": not any(w["clock_warning"] for w in workers.values()),
    }
    return merged
