"""A simulation as a normal results file, marked predicted.

Every simulated request becomes a ``RequestRecord`` like the client would have written: one
token-carrying chunk per token at the end of the step that sampled it, ``sent_ns`` at its
send time, ``intended_ns`` in open loop, usage-counted tokens. So ``loadlab report``, ``slo``
and ``compare`` read the file unchanged. What marks it as a prediction:

- ``run.kind`` is ``"simulate"`` (the report's header shows it);
- ``config["predicted"]`` is true and ``config["simulate"]`` holds the server settings and the
  step-time model; ``environment["predicted"]`` is true;
- each record's ``server`` dict has ``predicted: true``, ``queue_ms`` (arrival to the first
  step that ran any of its tokens) and ``preemptions``; with prefix caching, ``cached_tokens``
  (prompt tokens found in the cache at its first admission, as the server's usage reports).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from loadlab.records import RequestRecord
from loadlab.results import Results, environment_info

if TYPE_CHECKING:
    from loadlab.config import RunConfig
    from loadlab.records import RequestSpec
    from loadlab.simulate._policies import SimSeq
    from loadlab.simulate._server import ServerConfig
    from loadlab.simulate._steptime import StepTimeModel


class Request(Protocol):
    """What a record is made from (``engine.Request``; a protocol, so that the engine may
    import this module and not the other way round)."""

    spec: RequestSpec
    outcome: str
    error: str | None
    intended_s: float | None
    arrival_s: float
    end_s: float | None
    prompt_tokens: int
    seq: SimSeq | None
    dseq: SimSeq | None


class SimOutput(Protocol):
    """What a results file is made from (``engine.SimOutput``)."""

    cfg: RunConfig
    server: ServerConfig
    step_model: StepTimeModel
    step_start_s: np.ndarray
    step_end_s: np.ndarray
    end_s: float
    preemptions: int
    wall_s: float
    stretch_steps: int
    extra: dict[str, Any]

    @property
    def requests(self) -> Sequence[Request]: ...

    @property
    def num_steps(self) -> int: ...


__all__ = ["KIND", "is_predicted", "to_results"]

KIND = "simulate"
NS = 1_000_000_000


def is_predicted(results: Results) -> bool:
    """Whether a results file came from the simulator rather than a measurement."""
    return results.kind == KIND or bool(results.config.get("predicted"))


def to_results(out: SimOutput, endpoint: str = "predicted") -> Results:
    ends_ns = np.rint(out.step_end_s * NS).astype(np.int64)
    starts = out.step_start_s
    records = [_record(req, ends_ns, starts, endpoint) for req in out.requests]
    cfg = out.cfg
    config = cfg.to_dict()
    config["predicted"] = True
    config["simulate"] = {
        "server": dataclasses.asdict(out.server),
        "step_model": out.step_model.to_dict(),
        "step_model_text": out.step_model.describe(),
    }
    duration_ns = round(out.end_s * NS)
    return Results(
        records=records,
        config=config,
        environment={**environment_info(), "predicted": True},
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        duration_ns=duration_ns,
        window_ns=_window(cfg, records, duration_ns),
        scheduled=len(records),
        workers=1,
        kind=KIND,
        generator={"saturated": False},
        extra={
            "predicted": {
                "steps": out.num_steps,
                "stretch_steps": out.stretch_steps,
                "preemptions": out.preemptions,
                "wall_s": round(out.wall_s, 3),
                **out.extra,
            }
        },
    )


def _record(req: Request, ends_ns: np.ndarray, starts: np.ndarray, endpoint: str) -> RequestRecord:
    spec = req.spec
    rec = RequestRecord.for_spec(spec, outcome=req.outcome, error=req.error, endpoint=endpoint)
    if req.intended_s is not None:
        rec.intended_ns = round(req.intended_s * NS)
    if req.outcome == "dropped":
        return rec
    rec.sent_ns = round(req.arrival_s * NS)
    seq = req.seq
    steps = _token_steps(seq.segs) if seq is not None else np.empty(0, dtype=np.int64)
    chunk_ns = ends_ns[steps].tolist()
    end_s = req.end_s if req.end_s is not None else req.arrival_s
    rec.end_ns = chunk_ns[-1] if req.outcome == "ok" and chunk_ns else round(end_s * NS)
    if req.outcome != "ok":  # a step that ended after the client gave up: not received
        chunk_ns = [t for t in chunk_ns if t <= rec.end_ns]
    rec.chunk_ns = chunk_ns
    rec.chunk_tokens = [1] * len(chunk_ns)
    rec.prompt_tokens = req.prompt_tokens
    rec.output_tokens = len(chunk_ns)
    rec.output_tokens_source = "usage"
    rec.output_tokens_chunks = len(chunk_ns)
    if req.outcome == "ok":
        rec.finish_reason = "length"
        rec.http_status = 200
    elif req.outcome.startswith("http_"):
        rec.http_status = int(req.outcome[5:])
    server: dict[str, Any] = {"predicted": True}
    if seq is not None:
        server["preemptions"] = seq.preemptions
        if seq.content is not None:  # prefix caching was modelled
            server["cached_tokens"] = seq.cached
        if seq.first_step >= 0:
            server["queue_ms"] = (float(starts[seq.first_step]) - req.arrival_s) * 1e3
    rec.server = server
    return rec


def _token_steps(segs: list[int]) -> np.ndarray:
    """Step indices from ``[first, count, first, count, ...]``."""
    if not segs:
        return np.empty(0, dtype=np.int64)
    if len(segs) == 2:
        return np.arange(segs[0], segs[0] + segs[1], dtype=np.int64)
    return np.concatenate(
        [np.arange(a, a + n, dtype=np.int64) for a, n in zip(segs[::2], segs[1::2], strict=True)]
    )


def _window(cfg: Any, records: list[RequestRecord], duration_ns: int) -> tuple[int, int]:
    """The runner's measurement window: [warm-up, last response (or duration) - cool-down]."""
    lo = int(cfg.warmup_s * NS)
    last = max(
        (t for r in records for t in (r.end_ns, r.chunk_ns[-1] if r.chunk_ns else None)
         if t is not None),
        default=duration_ns,
    )  # fmt: skip
    if cfg.duration_s is not None:
        last = min(last, int(cfg.duration_s * NS))
    hi = last - int(cfg.cooldown_s * NS)
    return (lo, max(lo, hi))
