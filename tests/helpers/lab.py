"""Hand-made lab results: records with chunk times in ms, results with server counter deltas,
and the summary of a lab run made of them (no server)."""

from __future__ import annotations

from typing import Any

from loadlab._lab import LabOutcome, lab_summary, settings_for
from loadlab.records import RequestRecord
from loadlab.results import Results

__all__ = ["MS", "rec", "results", "summary_of", "two_streams"]

MS = 1_000_000


def rec(rid: str, chunks_ms: list[float], cls: str = "chat", **kw: object) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        request_class=cls,
        sent_ns=0,
        chunk_ns=[int(c * MS) for c in chunks_ms],
        output_tokens=len(chunks_ms),
        **kw,  # type: ignore[arg-type]
    )


def results(
    records: list[RequestRecord],
    deltas: dict[str, float] | None = None,
    machine: dict[str, float] | None = None,
    experiment: str = "interference",
) -> Results:
    lab = {
        "server_deltas": deltas or {},
        "server_info": {"kv_bytes_per_token": 8},
        "experiment": experiment,
        "machine": machine or {},
    }
    return Results(records=records, window_ns=(0, 100 * MS), extra={"lab": lab})


def two_streams() -> Results:
    # stream a: gaps 5, 5, 5, 40 (median 5; 40 > 3 x 5 is one stall); stream b: gaps 10, 10
    return results(
        [
            rec("a", [5, 10, 15, 20, 60]),
            rec("b", [10, 20, 30]),
            rec("long", [200], cls="long_prompt"),
            RequestRecord("failed", outcome="timeout", request_class="chat", sent_ns=0),
        ],
        {"loadlab_server_preemptions_total": 2.0, "loadlab_server_kv_transfer_bytes_total": 640.0},
    )


def summary_of(
    modes: dict[str, dict[str, Results | list[Results]]], **kw: object
) -> dict[str, Any]:
    """The summary of a lab run made of these results (one round unless given a list)."""
    rounds = {
        m: {e: r if isinstance(r, list) else [r] for e, r in d.items()} for m, d in modes.items()
    }
    out = LabOutcome(results=rounds, **kw)  # type: ignore[arg-type]
    return lab_summary(out, settings_for("tiny"))
