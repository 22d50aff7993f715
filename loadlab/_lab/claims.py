"""The lesson's claims, each judged by one figure per round against a threshold.

A claim is **shown** when every round's figure is on the claim's side of its threshold. When
the spread over rounds straddles the threshold, or every round is on the other side, the
claim is **not shown on this machine**, with the reason: the spread, and the rounds whose
measurement was busy (other processes, steal, the server's step jitter; see
``loadlab._lab.machine``). The lab never reports a claim as failed: a machine too busy to show
an effect has not disproved it, and one that is quiet and still does not show it says that
these settings do not show it here.

The figures do not depend on how many gaps a stream happens to have:

=========  ==================================================================  =========
claim      figure, per round                                                   threshold
=========  ==================================================================  =========
decode     decode tokens/s at the largest batch (16) / at batch 1               >= 6
prefill    prefill tokens/s at the largest batch / at batch 1                   <= 1.3
static     useful decode rows per step while documents wait, continuous /      >= 2
           static (the batch job; server counters)
chunked    longest stall per stream in flight, chunked / continuous            <= 1/3
disagg     longest stall per stream in flight, disaggregated / its baseline   <= 1.5
=========  ==================================================================  =========
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loadlab._lab.figures import dig, ratio

__all__ = ["CHECKS", "CLAIMS", "condense", "judge", "judge_claims"]

# The lesson's claims, each number in the report names one of them.
CLAIMS = {
    "decode": "decode is memory-bandwidth-bound → batching multiplies decode throughput",
    "prefill": "prefill is compute-bound → batching barely helps prefill",
    "static": "static batching wastes finished slots; continuous batching refills them every step",
    "stall": "a long prompt stalls everyone's stream unless chunked or disaggregated",
    "chunked": "chunked prefill: everyone slows a little instead of stopping",
    "chunk_cost": "chunking costs the long prompt itself some TTFT",
    "disagg": "disaggregation: a long prompt cannot interfere with anyone's decode",
    "disagg_cost": "disaggregation's cost: the KV cache must be transferred before decode",
}

# claim -> (what the figure is, direction, threshold)
CHECKS: dict[str, tuple[str, str, float]] = {
    "decode": ("decode tokens/s, largest batch / batch 1", ">=", 6.0),
    "prefill": ("prefill tokens/s, largest batch / batch 1", "<=", 1.3),
    "static": ("useful decode rows per step while documents wait, continuous / static", ">=", 2.0),
    "chunked": ("longest stall per stream in flight, chunked / continuous", "<=", 1 / 3),
    "disagg": ("longest stall per stream in flight, disaggregated / its baseline", "<=", 1.5),
}


def judge(
    values: Sequence[float | None],
    direction: str,
    threshold: float,
    busy: Mapping[int, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Judge one claim from its per-round figures (round ``i + 1`` is ``values[i]``).

    >>> judge([2.4, 2.6, 2.2], ">=", 2.0)["status"]
    'shown'
    >>> judge([2.4, 1.8, 2.2], ">=", 2.0, {2: ["other processes took 0.9 cores"]})["reason"]
    'the spread over rounds (1.80-2.40) straddles 2; busy rounds: 2 (other processes took 0.9 cores)'
    """
    busy = busy or {}
    vals = [v for v in values if v is not None]
    out: dict[str, Any] = {
        "direction": direction,
        "threshold": threshold,
        "rounds": list(values),
        "median": float(np.median(vals)) if vals else None,
        "lo": min(vals) if vals else None,
        "hi": max(vals) if vals else None,
        "busy_rounds": sorted(busy),
    }
    if not vals:
        return out | {"status": "not measured", "reason": "a mode it needs did not run"}
    side = [v >= threshold if direction == ">=" else v <= threshold for v in vals]
    if all(side):
        return out | {"status": "shown", "reason": ""}
    spread = f"{min(vals):.2f}-{max(vals):.2f}"
    why = (
        f"the spread over rounds ({spread}) straddles {threshold:.3g}"
        if any(side)
        else f"every round ({spread}) is on the other side of {threshold:.3g}"
    )
    if busy:
        why += "; busy rounds: " + ", ".join(
            f"{r} ({'; '.join(reasons)})" for r, reasons in sorted(busy.items())
        )
    elif not any(side):
        why += " on a quiet machine: these settings do not show it here"
    return out | {"status": "not shown on this machine", "reason": why}


def _paired(
    rows_a: Sequence[Mapping[str, Any]],
    rows_b: Sequence[Mapping[str, Any]],
    path_a: tuple[str, str],
    path_b: tuple[str, str],
    experiments: tuple[str, ...],
) -> tuple[list[float | None], dict[int, list[str]]]:
    """Per round: ``rows_a[i][path_a] / rows_b[i][path_b]``, and the busy reasons of either."""
    values, busy = [], {}
    for i, (a, b) in enumerate(zip(rows_a, rows_b, strict=False)):
        values.append(
            ratio(a.get(path_a[0], {}).get(path_a[1]), b.get(path_b[0], {}).get(path_b[1]))
        )
        reasons = [
            why
            for row in (a, b)
            for e, whys in row.get("busy", {}).items()
            if e in experiments
            for why in whys
        ]
        if reasons:
            busy[i + 1] = condense(reasons)
    return values, busy


def condense(reasons: Sequence[str]) -> list[str]:
    """One reason per kind, with the largest figure of that kind ("up to").

    >>> condense(["other processes took 0.90 cores", "other processes took 1.20 cores", "steal 6%"])
    ['other processes took up to 1.20 cores', 'steal up to 6%']
    >>> condense(["server decode steps p90/p50 3.82", "server decode steps p90/p50 1.90"])
    ['server decode steps p90/p50 up to 3.82']
    """
    best: dict[str, tuple[float, str]] = {}
    for why in reasons:
        m = re.search(r"(\d+(?:\.\d+)?)\D*$", why)  # the figure: the last number
        if not m:
            best.setdefault(why, (0.0, why))
            continue
        kind = why[: m.start()]
        value = float(m.group(1))
        if kind not in best or value > best[kind][0]:
            best[kind] = (value, f"{kind}up to {why[m.start() :]}")
    return [text for _, text in best.values()]


def _batching_values(batching: Mapping[str, Any], phase: str) -> list[float | None]:
    sizes = sorted(int(b) for b in (batching.get(phase) or {}))
    if len(sizes) < 2:
        return []
    return list(batching[phase][str(sizes[-1])]["speedup"]["rounds"])


def shared_gpu(summary: Mapping[str, Any]) -> str | None:
    """The GPU a disaggregated server's prefill and decode workers both run on, or None.

    >>> w = [{"role": "prefill", "device": "cuda:0"}, {"role": "decode", "device": "cuda:0"}]
    >>> shared_gpu({"modes": {"disaggregated": {"server_info": {"workers": w}}}})
    'cuda:0'
    >>> w[1]["device"] = "cuda:1"
    >>> shared_gpu({"modes": {"disaggregated": {"server_info": {"workers": w}}}}) is None
    True
    """
    workers = dig(summary, "modes", "disaggregated", "server_info", "workers") or []
    on = {role: {str(w.get("device")) for w in workers if w.get("role") == role}
          for role in ("prefill", "decode")}  # fmt: skip
    both = sorted(d for d in on["prefill"] & on["decode"] if d.startswith("cuda"))
    return both[0] if both else None


def judge_claims(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every claim of ``CHECKS`` judged from a lab summary's per-round rows and batching."""
    rounds = summary.get("per_round", {})
    batching = summary.get("batching") or {}
    b_busy = {int(k): v for k, v in (batching.get("busy") or {}).items()}
    st, co = rounds.get("static", []), rounds.get("continuous", [])
    ch, di = rounds.get("chunked", []), rounds.get("disaggregated", [])
    stall = ("stalls", "longest_stall_ms")
    inputs: dict[str, tuple[list[float | None], dict[int, list[str]]]] = {
        "decode": (_batching_values(batching, "decode"), b_busy),
        "prefill": (_batching_values(batching, "prefill"), b_busy),
        "static": _paired(
            co, st, ("batch", "useful_rows_waiting"), ("batch", "useful_rows_waiting"), ("batch",)
        ),
        "chunked": _paired(ch, co, stall, stall, ("interference", "baseline")),
        "disagg": _paired(
            di, di, stall, ("stalls", "baseline_longest_stall_ms"), ("interference", "baseline")
        ),
    }
    out = []
    for key, (what, direction, threshold) in CHECKS.items():
        values, busy = inputs[key]
        verdict = judge(values, direction, threshold, busy)
        gpu = shared_gpu(summary) if key == "disagg" else None
        if gpu and verdict["status"] == "not shown on this machine":
            # One GPU runs both pools' kernels: a long prompt's prefill takes the device the
            # decodes need, and its KV goes through host memory. The design is not on trial.
            verdict["reason"] = (
                f"its prefill and decode workers share one GPU ({gpu}), so a long prompt's "
                "prefill runs on the device that decodes and its KV cache travels through host "
                "memory: the lab cannot separate them here (give each pool its own GPU); "
                + verdict["reason"]
            )
        out.append({"claim": key, "text": CLAIMS[key], "figure": what} | verdict)
    return out
