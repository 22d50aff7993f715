"""Fit a step-time model to measurements: the reference model's own step times (white box),
or what any endpoint showed in a sweep (black box); print the residuals; know the range.

Both end in ``LinearStepTime`` (``steptime.py``): ``c0 + c_pre prefill tokens + c_dec
decode rows + c_pair attention pairs + c_kv cached tokens read``, fitted by non-negative least squares on
relative error (each point weighted by 1 / its time, so a 20 ms decode step counts as much as
a 2 s prefill). The model carries the range it was fitted on (prompt tokens per prefill step,
decode batch, decode context); ``extrapolation`` compares a simulation's steps with it, and
``loadlab simulate`` refuses to go far beyond it unless told to (``--extrapolate``).

Black box (``points_from_results``): from one results file per load level,

- a **prefill point** for each prompt length at a level where about one request was in flight
  (mean in flight <= 1.5): the median TTFT is one prefill step of that prompt, alone;
- **decode points**: each token gap is a decode step of as many requests as were between
  their first and last token at its middle; for every such batch size seen by enough gaps,
  the median gap is that step, at the requests' mean context (prompt + half the output).
  Gaps in which another request got its first token are left out: that request's prefill
  shared the step (in a measured continuous sweep near saturation, such steps were the
  median gap of batch 14-15, 64-109 ms against 28 ms for a plain step of 16 rows).

Server steps (``points_from_step_log``): the reference server's own step log (``GET
/v1/step_log``: each step's wall time from scheduling to its tokens handed to the API, and
its shape) under a calibration load. Steps are grouped by shape (decode rows, prompt tokens
in quarter-octave bins, cached tokens read in half-octave bins) and each group (of decode
steps: with at least 3 steps) is one point: its median time at its mean shape. Unlike the
model timed alone, these steps carry what the server adds on this machine: scheduling and
token hand-off, the API thread and the load generator sharing the cores (and the GIL),
disaggregated workers pinned and niced as they run. The fit also keeps how the steps of one
shape spread about their median (``step_log_jitter``), which the simulator draws each step's
factor from.

Example::

    points = measure_reference("cpu", batches=[1, 4, 16], contexts=[128, 512], prompts=[64, 512])
    model = fit_linear(points, source="reference cpu preset")
    print(residual_table(model))
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from loadlab.simulate._steptime import LinearStepTime, RoleStepTime, StepTimeModel

__all__ = [
    "EXTRAPOLATION_FACTOR",
    "StepPoint",
    "extrapolation",
    "fit_linear",
    "fit_reference",
    "fit_results",
    "fit_step_log",
    "fit_warning",
    "measure_reference",
    "points_from_results",
    "points_from_step_log",
    "read_step_log",
    "residual_table",
    "step_log_jitter",
]

# How far past the fitted range a simulation may go before it is refused (1.5 = 50 % past).
EXTRAPOLATION_FACTOR = 1.5
RANGE_KEYS = ("prompt_tokens", "decode_batch", "context_tokens")
# A step-log group is a point (and its spread counts) with this many steps; one of prompt
# tokens needs one: those are few (a batch's prompts vary) and long.
MIN_STEPS, MIN_PREFILL_STEPS = 3, 1


@dataclass(frozen=True)
class StepPoint:
    """One measured step: its shape (``steptime`` features) and its seconds."""

    kind: str  # "prefill" | "decode" | "mixed" (both in one step: server step logs)
    prefill_tokens: float
    decode_tokens: float
    attn_pairs: float
    kv_read_tokens: float
    seconds: float
    label: str = ""

    @classmethod
    def prefill(cls, prompt_tokens: float, seconds: float, label: str = "") -> StepPoint:
        p = prompt_tokens
        return cls("prefill", p, 0, p * (p + 1) / 2, 0, seconds, label)

    @classmethod
    def decode(
        cls, batch: float, context_tokens: float, seconds: float, label: str = ""
    ) -> StepPoint:
        """``batch`` sequences, each with ``context_tokens`` tokens including the new one."""
        return cls("decode", 0, batch, batch * context_tokens, batch * (context_tokens - 1),
                   seconds, label)  # fmt: skip

    @classmethod
    def step(cls, prefill: float, decode: float, pairs: float, kv: float, seconds: float,
             label: str = "") -> StepPoint:  # fmt: skip
        """Any step by its four features; its kind from which tokens it has."""
        kind = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        return cls(kind, prefill, decode, pairs, kv, seconds, label)

    def features(self) -> tuple[float, float, float, float]:
        return (self.prefill_tokens, self.decode_tokens, self.attn_pairs, self.kv_read_tokens)

    @property
    def size(self) -> float:
        """Prompt tokens (prefill) or batch (decode)."""
        return self.decode_tokens if self.kind == "decode" else self.prefill_tokens


def fit_linear(points: Sequence[StepPoint], source: str) -> LinearStepTime:
    """Non-negative least squares on relative error; residuals and range kept on the model."""
    from scipy.optimize import nnls

    if len(points) < 2:
        raise ValueError(f"need at least 2 measured steps to fit, got {len(points)}")
    a = np.array([(1.0, *p.features()) for p in points])
    y = np.array([p.seconds for p in points])
    if not (y > 0).all():
        raise ValueError("every measured step time must be > 0")
    scale = a.max(axis=0)
    scale[scale == 0] = 1.0
    w = 1.0 / y
    coef, _ = nnls((a / scale) * w[:, None], np.ones(len(y)))
    coef = coef / scale
    predicted = a @ coef
    rows = [
        {"kind": p.kind, "label": p.label, "size": p.size,
         "measured_s": p.seconds, "predicted_s": float(s), "error_pct": float((s / p.seconds - 1) * 100)}
        for p, s in zip(points, predicted, strict=True)
    ]  # fmt: skip
    errors = np.array([r["error_pct"] for r in rows])
    residuals: dict[str, Any] = {
        "points": rows,
        "max_abs_error_pct": float(np.abs(errors).max()),
        "rms_error_pct": float(np.sqrt((errors**2).mean())),
    }
    return LinearStepTime(
        base_s=float(coef[0]),
        per_prefill_token_s=float(coef[1]),
        per_decode_token_s=float(coef[2]),
        per_pair_s=float(coef[3]),
        per_kv_token_s=float(coef[4]),
        source=source,
        fit_range=_range(points),
        residuals=residuals,
    )


def _range(points: Sequence[StepPoint]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    pre = [p.prefill_tokens for p in points if p.prefill_tokens]
    rows = [p.decode_tokens for p in points if p.decode_tokens]
    if pre:
        out["prompt_tokens"] = (min(pre), max(pre))
    if rows:
        out["decode_batch"] = (min(rows), max(rows))
    ctx = [p.kv_read_tokens / p.decode_tokens + 1 for p in points if p.kind == "decode"]
    if ctx:
        out["context_tokens"] = (min(ctx), max(ctx))
    return out


def residual_table(model: StepTimeModel) -> str:
    """The fit's points, measured against fitted, as text (each role's, for a role model)."""
    if isinstance(model, RoleStepTime):
        return "\n".join(f"{role} workers: " + residual_table(m)
                         for role, m in (("prefill", model.prefill), ("decode", model.decode)))  # fmt: skip
    if not isinstance(model, LinearStepTime):
        return model.describe()
    res = model.residuals
    lines = [model.describe(), f"{'kind':<8} {'size':>7} {'measured ms':>12} "
             f"{'fitted ms':>10} {'error':>7}  label"]  # fmt: skip
    for r in res.get("points", []):
        lines.append(f"{r['kind']:<8} {r['size']:>7.1f} "
                     f"{r['measured_s'] * 1e3:>12.2f} {r['predicted_s'] * 1e3:>10.2f} "
                     f"{r['error_pct']:>+6.1f}%  {r['label']}")  # fmt: skip
    if res:
        lines.append(f"residuals: max |error| {res['max_abs_error_pct']:.1f} %, "
                     f"rms {res['rms_error_pct']:.1f} % over {len(res['points'])} points")  # fmt: skip
    ranges = ", ".join(f"{k} {lo:g}-{hi:g}" for k, (lo, hi) in model.fit_range.items())
    if ranges:
        lines.append(f"fitted on: {ranges}")
    poor = fit_warning(model)
    if poor:
        lines.append(poor)
    return "\n".join(lines)


POOR_FIT_RMS_PCT = 25.0  # a fit whose steps miss by more than this (rms) is said to be poor


def fit_warning(model: LinearStepTime) -> str | None:
    """A line when the fit's own points miss it by ``POOR_FIT_RMS_PCT`` or more (rms): a
    step time that far off moves every latency the simulator predicts as far."""
    rms = model.residuals.get("rms_error_pct")
    if rms is None or rms < POOR_FIT_RMS_PCT:
        return None
    worst = model.residuals.get("max_abs_error_pct", rms)
    return (f"WARNING: a poor fit: its own steps miss it by {rms:.0f} % rms (worst "
            f"{worst:.0f} %), so predictions from it can be off by as much. The steps vary "
            "more than their sizes explain: fit on a log taken under a steadier load, or on "
            "more steps of each shape, and check the residuals above")  # fmt: skip


def extrapolation(
    model: Any, seen: dict[str, float], factor: float = EXTRAPOLATION_FACTOR
) -> list[str]:
    """What a simulation asked of ``model`` beyond ``factor`` x its fitted range (empty: fine).

    ``seen`` maps ``RANGE_KEYS`` to the largest value the simulation's steps reached."""
    fit_range = getattr(model, "fit_range", None) or {}
    out = []
    for key in RANGE_KEYS:
        if key in fit_range and key in seen and seen[key] > fit_range[key][1] * factor:
            lo, hi = fit_range[key]
            out.append(f"{key} reached {seen[key]:g}, the step-time model was fitted on "
                       f"{lo:g}-{hi:g}")  # fmt: skip
    return out


def measure_reference(
    preset: str,
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32),
    contexts: Sequence[int] = (64, 256, 1024),
    prompts: Sequence[int] = (32, 128, 512, 1024, 2048),
    *,
    threads: int | None = None,
    repeats: int = 3,
    typical: bool = False,
    log: IO[str] | None = None,
) -> list[StepPoint]:
    """Time the reference model's steps here (``reference_server.bench``; needs torch).

    Each point is the fastest of ``repeats`` (the model's own cost), or with ``typical`` their
    median: on a machine others load, what a server's steps take on average, which is what a
    prediction of that server's latencies needs."""
    import importlib

    bench = importlib.import_module("reference_server.bench")
    runner_cls = importlib.import_module("reference_server.model_runner").ModelRunner
    runner = runner_cls(preset, kv_cache_bytes=1 << 30, threads=threads)

    def timed(step: Any) -> float:
        if not typical:
            return float(step(repeats, True))
        step(1, True)  # warm-up once, then single timings
        return statistics.median(float(step(1, False)) for _ in range(repeats))

    points = []
    for p in prompts:
        s = timed(lambda r, w, p=p: bench.prefill_time_s(runner, p, 1, r, warmup=w))
        points.append(StepPoint.prefill(p, s, f"prefill {p}"))
        _say(log, points[-1])
    for c in contexts:
        for b in batches:
            s = timed(lambda r, w, b=b, c=c: bench.decode_step_time_s(runner, b, c, r, warmup=w))
            points.append(StepPoint.decode(b, c, s, f"decode {b} x {c}"))
            _say(log, points[-1])
    return points


def _say(log: IO[str] | None, p: StepPoint) -> None:
    if log is not None:
        print(f"  {p.label}: {p.seconds * 1e3:.2f} ms", file=log, flush=True)


def points_from_results(results: Iterable[Any], min_gaps: int = 20) -> list[StepPoint]:
    """Black-box step points from a sweep's results files (see the module docstring)."""
    from loadlab._analysis import metrics

    points: list[StepPoint] = []
    for res in results:
        ok = [r for r in res.records if r.ok and len(r.chunk_ns) >= 2 and r.sent_ns is not None]
        if not ok:
            continue
        label = f"load {res.config.get('rate_rps') or res.config.get('concurrency')}"
        ctx = statistics.fmean((r.prompt_tokens or 0) + len(r.chunk_ns) / 2 for r in ok)
        for batch, seconds in _decode_steps(ok, min_gaps):
            points.append(StepPoint.decode(batch, ctx, seconds, f"ITL p50, batch {batch}, {label}"))
        lo, hi = res.measurement_window_ns()
        in_flight = sum(r.chunk_ns[-1] - r.sent_ns for r in ok) / max(1, hi - lo)
        if in_flight <= 1.5:  # about one request at a time: a TTFT is one prefill alone
            by_len: dict[int, list[float]] = defaultdict(list)
            for r in ok:
                ttft = metrics.ttft_ms(r)
                if ttft is not None and r.prompt_tokens:
                    by_len[r.prompt_tokens].append(ttft)
            for p, ttfts in sorted(by_len.items()):
                points.append(StepPoint.prefill(p, statistics.median(ttfts) / 1e3,
                                                f"TTFT p50, {p} tokens, {label}"))  # fmt: skip
    return points


def _decode_steps(records: Sequence[Any], min_gaps: int) -> list[tuple[int, float]]:
    """(batch, median gap in s) for every batch size seen by at least ``min_gaps`` gaps. A
    gap's batch is the number of requests between their first and last token at its middle
    (counted per gap, not per second: a gap sees the batches that make gaps)."""
    firsts = np.sort(np.array([r.chunk_ns[0] for r in records], dtype=np.float64))
    lasts = np.sort(np.array([r.chunk_ns[-1] for r in records], dtype=np.float64))
    chunks = [np.asarray(r.chunk_ns, dtype=np.float64) for r in records]
    gaps = np.concatenate([np.diff(c) for c in chunks])
    mids = np.concatenate([(c[1:] + c[:-1]) / 2 for c in chunks])
    batch = np.searchsorted(firsts, mids, side="right") - np.searchsorted(lasts, mids, side="left")
    # Another request's first token in the gap, or read just after its end (one step's tokens
    # reach the client over a short spread, the next step's a whole step later): that
    # request's prefill shared the step, which is not a decode step of this batch.
    starts = np.concatenate([c[:-1] for c in chunks])
    ends = np.concatenate([c[1:] for c in chunks]) + 0.25 * gaps
    mixed = np.searchsorted(firsts, ends, side="right") > np.searchsorted(
        firsts, starts, side="right"
    )
    gaps, batch = gaps[~mixed], batch[~mixed]
    out = []
    for b in np.unique(batch):
        sel = gaps[batch == b]
        if b >= 1 and len(sel) >= min_gaps:
            out.append((int(b), float(np.median(sel)) / 1e9))
    return out


def points_from_step_log(
    entries: Iterable[dict[str, Any]],
    role: str | None = None,
    min_steps: int = MIN_STEPS,
    min_prefill_steps: int = MIN_PREFILL_STEPS,
) -> list[StepPoint]:
    """Step points from a reference server's step log (see the module docstring); ``role``
    keeps one kind of worker (``engine``, or disaggregated ``prefill`` / ``decode``). A group
    of decode steps needs ``min_steps`` steps, one with prompt tokens ``min_prefill_steps``:
    those are few (a batch's prompts vary) and long, so each is a measurement of its own."""
    return _group_points(_step_groups(entries, role), min_steps, min_prefill_steps)


def _group_points(groups: dict[tuple[int, int, int], list[tuple[float, ...]]], min_steps: int,
                  min_prefill_steps: int) -> list[StepPoint]:  # fmt: skip
    points = []
    for (dec, pre_bin, _), steps in sorted(groups.items()):
        if len(steps) < (min_steps if pre_bin < 0 else min_prefill_steps):
            continue
        arr = np.array(steps, dtype=np.float64)
        pre, _d, pairs, kv = arr[:, :4].mean(axis=0)
        seconds = float(np.median(arr[:, 4]))
        label = f"{len(steps)} steps" + (f", {pre:.0f} prompt tokens" if pre else "") + (
            f", {dec} rows" if dec else "")  # fmt: skip
        points.append(StepPoint.step(float(pre), float(dec), float(pairs), float(kv), seconds,
                                     label))  # fmt: skip
    return points


def step_log_jitter(
    entries: Iterable[dict[str, Any]], role: str | None = None, min_steps: int = MIN_STEPS
) -> tuple[float, ...]:
    """The spread of a step log's steps about their shape's median: each step's time over
    the median of its group (the groups of ``points_from_step_log`` with at least
    ``min_steps`` steps), as ``JITTER_QUANTILES`` equally likely factors. Under load the
    same shape takes different times (the API thread, the load generator and the other
    worker share the cores); a simulation that prices every step at its median puts a
    latency percentile above the median too low (measured: ITL p90 under-predicted by
    15-26 % at loads where p50 was right)."""
    return _group_jitter(_step_groups(entries, role), min_steps)


def _group_jitter(
    groups: dict[tuple[int, int, int], list[tuple[float, ...]]], min_steps: int
) -> tuple[float, ...]:
    ratios = [
        np.asarray(times) / np.median(times)
        for times in ([s[4] for s in steps] for steps in groups.values())
        if len(times) >= min_steps
    ]
    return _quantiles(np.concatenate(ratios)) if ratios else ()


JITTER_QUANTILES = 100  # factors kept per model: each stands for 1 % of the steps


def _quantiles(ratios: np.ndarray) -> tuple[float, ...]:
    qs = (np.arange(JITTER_QUANTILES) + 0.5) / JITTER_QUANTILES
    return tuple(float(x) for x in np.quantile(ratios, qs))


def _step_groups(
    entries: Iterable[dict[str, Any]], role: str | None
) -> dict[tuple[int, int, int], list[tuple[float, ...]]]:
    """Steps by shape: (decode rows, prompt tokens in quarter-octave bins, cached tokens read
    in half-octave bins) -> [(prefill, decode, pairs, kv, seconds), ...]."""
    groups: dict[tuple[int, int, int], list[tuple[float, ...]]] = defaultdict(list)
    for e in entries:
        if role is not None and e["role"] != role:
            continue
        seconds = (e["end_ns"] - e["start_ns"]) / 1e9
        pre, dec = int(e["prefill_tokens"]), int(e["decode_tokens"])
        if seconds <= 0 or not (pre or dec):
            continue
        kv = int(e["kv_read_tokens"])
        key = (dec, round(4 * np.log2(pre)) if pre else -1, round(2 * np.log2(kv)) if kv else -1)
        groups[key].append((pre, dec, e["attn_pairs"], kv, seconds))
    return groups


def fit_reference(preset: str, *, threads: int | None = None, **grid: Any) -> LinearStepTime:
    """``fit_linear`` on the reference model's steps timed alone here (``measure_reference``
    with ``grid``: batches, contexts, prompts, repeats, typical, log)."""
    points = measure_reference(preset, threads=threads, **grid)
    return fit_linear(points, f"reference {preset} preset, {threads or 'default'} threads")


def fit_results(paths: Sequence[Any]) -> LinearStepTime:
    """The black box: ``fit_linear`` on what one sweep's results files show
    (``points_from_results``), nothing else."""
    from loadlab.results import read_results

    points = points_from_results(read_results(p) for p in paths)
    return fit_linear(points, f"black box, {len(paths)} results files")


def read_step_log(source: str) -> list[dict[str, Any]]:
    """A step log from a reference server's URL (``GET <url>/v1/step_log``) or a JSON file
    holding what that returned."""
    import json
    import urllib.request
    from pathlib import Path

    if source.startswith(("http://", "https://")):
        url = source.rstrip("/") + "/v1/step_log"
        with urllib.request.urlopen(url, timeout=30) as r:  # noqa: S310 (a URL the user gave)
            return list(json.loads(r.read()))
    return list(json.loads(Path(source).read_text(encoding="utf-8")))


def fit_step_log(entries: Sequence[dict[str, Any]], source: str) -> StepTimeModel:
    """``fit_linear`` on a server's step log; a disaggregated server's (prefill and decode
    worker steps) gives a ``RoleStepTime``, each role fitted on its own workers' steps."""
    roles = {e["role"] for e in entries}
    if {"prefill", "decode"} <= roles:
        return RoleStepTime(
            _fit_log(entries, "prefill", f"{source}, prefill workers"),
            _fit_log(entries, "decode", f"{source}, decode workers"),
        )
    return _fit_log(entries, None, source)


def _fit_log(entries: Sequence[dict[str, Any]], role: str | None, source: str) -> LinearStepTime:
    """One worker kind's fit, with its steps' spread (``step_log_jitter``): the log grouped
    once for both."""
    groups = _step_groups(entries, role)
    model = fit_linear(_group_points(groups, MIN_STEPS, MIN_PREFILL_STEPS), source)
    return dataclasses.replace(model, jitter=_group_jitter(groups, MIN_STEPS))
