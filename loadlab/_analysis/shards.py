"""One run from its shards: ``loadlab run --shard K/N`` files joined into one results file.

A shard run keeps ``extra["shard"]``: its index K, the count N, the run's identity (a hash of
every setting that shapes the schedule, the shard itself and the output paths left out, plus
the common start time) and its host. ``merge_shards`` refuses files of different runs or of one
shard twice, joins the rest (records, counts, the union of the windows; the generator is
saturated if any shard was) and keeps which shards are missing: a shard that never arrived is
counted, never hidden. Each record says where it was sent from, as a Locust fleet's do: its
``worker`` is its shard's index and its ``host`` that shard's host.

Example::

    merged = merge_shards([read_results(p) for p in paths])
    merged.extra["shards"]["missing"]     # [] when all N came
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from loadlab.errors import ConfigError
from loadlab.results import Results, merge_results

__all__ = ["merge_shards", "run_notes", "shard_of"]


def shard_of(results: Results, name: str) -> dict[str, Any]:
    shard = results.extra.get("shard")
    if not isinstance(shard, dict) or not {"index", "count", "run_id"} <= set(shard):
        raise ConfigError(f"{name}: not a shard's results file (run with --shard K/N)")
    return shard


def merge_shards(parts: Sequence[Results], names: Sequence[str] | None = None) -> Results:
    """The run the shards in ``parts`` belong to (see the module docstring)."""
    names = list(names or [f"file {i + 1}" for i in range(len(parts))])
    if not parts:
        raise ConfigError("merge needs at least one shard's results file")
    shards = [shard_of(p, n) for p, n in zip(parts, names, strict=True)]
    first = shards[0]
    for shard, name in zip(shards[1:], names[1:], strict=True):
        if shard["run_id"] != first["run_id"] or shard["count"] != first["count"]:
            raise ConfigError(
                f"{name} is a shard of another run than {names[0]} (run {shard['run_id']} of "
                f"{shard['count']} shards, not {first['run_id']} of {first['count']}); merge the "
                f"shards of one run only"
            )
    seen: dict[int, str] = {}
    for shard, name in zip(shards, names, strict=True):
        if shard["index"] in seen:
            raise ConfigError(f"{name} and {seen[shard['index']]} are both shard {shard['index']}")
        seen[shard["index"]] = name
    stamped = []  # a file read as columns makes each record anew: stamp a list of them
    for part, shard in zip(parts, shards, strict=True):
        records = list(part.records)
        for r in records:
            r.worker, r.host = int(shard["index"]), r.host or shard.get("host")
        stamped.append(dataclasses.replace(part, records=records))
    merged = merge_results(stamped)
    count = int(first["count"])
    merged.extra = {
        **{k: v for k, v in parts[0].extra.items() if k != "shard"},
        "shards": {
            "run_id": first["run_id"],
            "count": count,
            "merged": sorted(seen),
            "missing": [k for k in range(count) if k not in seen],
            "hosts": {str(s["index"]): s.get("host") for s in shards},
            "ready_before_start_ms": {
                str(s["index"]): s.get("ready_before_start_ms") for s in shards
            },
        },
    }
    return merged


def run_notes(extra: dict[str, Any]) -> list[str]:
    """What a run spread over machines says beside its figures: senders lost, shards missing,
    clocks too uncertain for its timing (``extra["distributed"]``, ``extra["shards"]``)."""
    notes = []
    fleet = extra.get("distributed")
    if isinstance(fleet, dict):
        if fleet.get("workers_lost"):
            notes.append(
                f"LOST SENDERS: shards {fleet['workers_lost']} of {fleet['count']} stopped before "
                f"their part of the schedule ended: {fleet['records_lost']:,} requests counted "
                "lost (failed, incomplete)"
            )
        for k, w in sorted(fleet.get("workers", {}).items()):
            if w.get("clock_warning"):
                notes.append(
                    f"CLOCK: shard {k} ({w.get('host')}): {w['clock_warning']}; its intended "
                    "times line up with the other shards' only that closely"
                )
    shards = extra.get("shards")
    if isinstance(shards, dict) and shards.get("missing"):
        notes.append(
            f"MISSING SHARDS: {shards['missing']} of {shards['count']}: their part of the "
            "schedule is not in this file"
        )
    return notes
