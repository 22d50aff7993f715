"""A batch workload's job, as a whole: how long its documents took from the first send to the
last token, and its rate.

A batch job (``kind = "batch"``, alone or as a part of a mix) is judged by when it is done,
not by how fast each answer starts: over the records of the job's request class (every one,
not only those of the measurement window, since the job is the unit)::

    completion_s          last token of any document - first send of any document
    documents_per_s       documents completed ok / completion_s
    output_tokens_per_s   output tokens of the ok documents / completion_s
    total_tokens_per_s    (prompt + output tokens) of the ok documents / completion_s
    e2e_ms                each ok document's E2E latency (send to last token)

Example::

    job = batch_jobs(read_results("reports/batch.json"))[0]
    job.completion_s, job.documents_per_s
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadlab._analysis.metrics import NS_PER_S, Distribution, distribution, e2e_ms
from loadlab._analysis.metrics import output_token_count as _output_tokens
from loadlab.records import RequestRecord, pick

if TYPE_CHECKING:
    from loadlab.results import Results

__all__ = ["BatchJob", "batch_classes", "batch_jobs"]


@dataclass(frozen=True)
class BatchJob:
    """One batch job's figures (module docstring); ``completion_s`` None when nothing ended."""

    request_class: str
    documents: int  # records of the job (dropped ones included)
    ok: int
    failed: int
    completion_s: float | None
    documents_per_s: float | None
    output_tokens_per_s: float | None
    total_tokens_per_s: float | None
    e2e_ms: Distribution

    def to_dict(self) -> dict[str, Any]:
        return pick(
            self,
            "request_class documents ok failed completion_s documents_per_s "
            "output_tokens_per_s total_tokens_per_s e2e_ms",
        )


def batch_classes(workload: Mapping[str, Any]) -> list[str]:
    """The request classes of the batch jobs a run's workload (``results.extra["workload"]``)
    sent: the batch kind's own, or each batch part's of a mix."""
    if workload.get("kind") == "batch":
        return [str(workload.get("request_class") or "batch")]
    parts = workload.get("parts") if workload.get("kind") == "mix" else None
    return [c for p in parts or () if isinstance(p, Mapping) for c in batch_classes(p)]


def _job(request_class: str, records: Sequence[RequestRecord]) -> BatchJob:
    ok = [r for r in records if r.ok]
    sent = [r.sent_ns for r in records if r.sent_ns is not None]
    last = [r.chunk_ns[-1] for r in ok if r.chunk_ns]
    span = (max(last) - min(sent)) / NS_PER_S if sent and last else None

    def rate(n: float) -> float | None:
        return n / span if span else None

    out = sum(_output_tokens(r) for r in ok)
    prompt = sum(r.prompt_tokens or r.prompt_tokens_requested or 0 for r in ok)
    return BatchJob(
        request_class=request_class,
        documents=len(records),
        ok=len(ok),
        failed=sum(1 for r in records if r.failed),
        completion_s=span,
        documents_per_s=rate(len(ok)),
        output_tokens_per_s=rate(out),
        total_tokens_per_s=rate(out + prompt),
        e2e_ms=distribution([v for r in ok if (v := e2e_ms(r)) is not None]),
    )


def batch_jobs(results: Results) -> list[BatchJob]:
    """Each batch job of a run (``Results``), in the workload's order; [] for other runs."""
    classes = batch_classes(results.extra.get("workload") or {})
    jobs = []
    for cls in classes:
        records = [r for r in results.records if r.request_class == cls]
        if records:
            jobs.append(_job(cls, records))
    return jobs
