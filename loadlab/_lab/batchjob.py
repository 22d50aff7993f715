"""The lab's batch job: answer lengths from production, and what static batching wastes on them.

Static batching holds a batch until its longest answer ends, so with ``B`` slots it makes
``mean`` useful tokens per slot while paying for ``E[max of B lengths]`` steps: continuous
batching, which refills a slot the step after it frees, keeps up to ``E[max]/mean`` times the
useful decode rows per step (``expected_max``). How large that is depends on the spread of
the lengths, so the job draws them from production: the Azure 2023 conversation trace's
output lengths (``loadlab/data/azure_conv_lengths.csv``; mean 211, p50 129, p99 601 tokens),
scaled down so a CPU finishes the job in seconds (the shape, and so the bound, is kept).

``stratified_lengths`` takes the job's ``n`` lengths at evenly spaced quantiles of the trace
(then shuffles them, seeded), so even a small job has the trace's spread: 48 random draws give
a bound (16 slots) from 1.9x to 2.8x (5th to 95th percentile over seeds).

Whether more useful rows per step also means as many more requests per second depends on the
job and the step cost. A finite job drains: once nothing waits, continuous batching's last
answers run in ever emptier steps, so its whole-job gain is below the bound (the lab judges
the claim by the rows of the steps run while documents waited, which leave the drain out).
And a step's cost depends on its rows: on a GPU a decode step costs about the same at batch 1
and 16; on a CPU a step at batch 16 costs ~2x a batch-1 step. ``step_cost_gain`` replays both
schedules of the job on this machine's measured step-cost curve (``step_s``; decode steps
only) and gives the requests/s gain that curve allows, to set beside the one measured.

Example::

    lengths = stratified_lengths(azure_output_lengths(), 48, scale=1 / 16, seed=0)
    expected_max(lengths, 16) / np.mean(lengths)       # the bound, ~2.3
    step_cost_gain(lengths, 16, {1: 0.05, 16: 0.1})    # the requests/s gain that curve allows
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from loadlab._lab.figures import dig, figure, ratio
from loadlab.workloads._lengths import load_column

if TYPE_CHECKING:
    from loadlab._lab.settings import LabSettings

__all__ = [
    "azure_output_lengths",
    "batch_job_summary",
    "expected_max",
    "job_lengths",
    "schedule_rows",
    "step_cost_gain",
    "step_time_s",
    "stratified_lengths",
    "useful_rows_while_waiting",
]


def azure_output_lengths() -> np.ndarray:
    """Every output length (``GeneratedTokens``) of the Azure 2023 conversation trace."""
    return np.asarray(load_column("azure_conv", "num_decode_tokens"))


def stratified_lengths(
    population: Sequence[float] | np.ndarray, n: int, scale: float = 1.0, cap: int | None = None,
    seed: int = 0,
) -> list[int]:  # fmt: skip
    """``n`` lengths at the quantiles ``(i + 0.5) / n`` of ``population``, times ``scale``,
    rounded and clamped to ``[1, cap]``, in a seeded random order.

    >>> sorted(stratified_lengths([1, 2, 3, 4, 100, 200, 300, 400], 4))
    [1, 3, 100, 300]
    """
    q = (np.arange(n) + 0.5) / n
    x = np.quantile(np.asarray(population, dtype=float), q, method="inverted_cdf") * scale
    out = np.clip(np.rint(x), 1, cap if cap is not None else np.inf).astype(int)
    np.random.default_rng(seed).shuffle(out)
    return [int(v) for v in out]


def job_lengths(s: LabSettings) -> list[int]:
    """The lab's batch job: ``s.batch_documents`` Azure output lengths at evenly spaced
    quantiles, times ``s.batch_length_scale``, in the order ``s.seed`` gives."""
    return stratified_lengths(
        azure_output_lengths(), s.batch_documents, s.batch_length_scale, seed=s.seed
    )


def expected_max(population: Sequence[int], batch: int) -> float:
    """E[max of ``batch`` i.i.d. draws] from the empirical distribution of ``population``:
    sum over values x of x * (F(x)^B - F(x-)^B).

    >>> expected_max([1, 3], 2)      # max of two fair draws: 1 with prob. 1/4, else 3
    2.5
    """
    v = np.sort(np.asarray(population, dtype=float))
    values = np.unique(v)
    at_or_below = np.searchsorted(v, values, side="right") / len(v)
    below = np.searchsorted(v, values, side="left") / len(v)
    return float(np.sum(values * (at_or_below**batch - below**batch)))


def schedule_rows(lengths: Sequence[int], batch: int, policy: str) -> list[tuple[int, int, bool]]:
    """(rows computed, useful decode rows, requests waiting) of each decode step, in order.

    A request of length L is prefilled (its first token) and then decodes L - 1 steps.
    ``static``: batches of ``batch`` in order; a finished member's row is computed as padding
    until the batch's longest ends (the reference server's default). ``continuous``: a slot
    frees the step after its request ends and the next request is prefilled in it.
    Prefill steps are left out (the same prompts in both policies).

    >>> schedule_rows([1, 3, 2], 2, "static")
    [(2, 1, True), (2, 1, True), (1, 1, False)]
    >>> schedule_rows([1, 3, 2], 2, "continuous")
    [(1, 1, False), (2, 2, False)]
    """
    steps: list[tuple[int, int, bool]] = []
    if policy == "static":
        for i in range(0, len(lengths), batch):
            group, waiting = lengths[i : i + batch], i + batch < len(lengths)
            steps += [
                (len(group), sum(1 for x in group if x > k), waiting) for k in range(1, max(group))
            ]
        return steps
    if policy != "continuous":
        raise ValueError(f"policy must be static or continuous, got {policy!r}")
    queue: list[int] = list(lengths)
    running: list[int] = []  # tokens each still has to decode
    while queue or running:
        new: list[int] = []
        while queue and len(running) + len(new) < batch:
            new.append(queue.pop(0) - 1)  # prefilled: its first token is made
        if running:
            steps.append((len(running), len(running), bool(queue)))
        running = [x - 1 for x in running if x > 1] + [x for x in new if x > 0]
    return steps


def useful_rows_while_waiting(lengths: Sequence[int], batch: int, policy: str) -> float | None:
    """Useful decode rows per step over the steps run while requests waited (what the server's
    ``decode_tokens_while_waiting_total / steps_while_waiting_total`` measures)."""
    steps = [useful for _, useful, waiting in schedule_rows(lengths, batch, policy) if waiting]
    return sum(steps) / len(steps) if steps else None


def step_time_s(curve: Mapping[int, float], rows: int) -> float:
    """A decode step's seconds at ``rows`` rows, linear between the measured batch sizes
    (and beyond the largest: its slope continued).

    >>> step_time_s({1: 0.05, 16: 0.2}, 6)
    0.1
    """
    xs = sorted(curve)
    if len(xs) == 1:
        return curve[xs[0]]
    if rows >= xs[-1]:
        a, b = xs[-2], xs[-1]
        return curve[b] + (curve[b] - curve[a]) / (b - a) * (rows - b)
    return float(np.interp(rows, xs, [curve[x] for x in xs]))


def step_cost_gain(lengths: Sequence[int], batch: int, curve: Mapping[int, float]) -> float | None:
    """The job's time under static batching over its time under continuous batching, both
    replayed on the step-cost ``curve`` (seconds per decode step at each batch size)."""
    if not curve or not lengths:
        return None
    static = sum(step_time_s(curve, s[0]) for s in schedule_rows(lengths, batch, "static"))
    cont = sum(step_time_s(curve, s[0]) for s in schedule_rows(lengths, batch, "continuous"))
    return static / cont if cont else None


def batch_job_summary(
    s: LabSettings,
    per_round: Mapping[str, Sequence[Mapping[str, Any]]],
    batching: Mapping[str, Any],
) -> dict[str, Any]:
    """The static-batching claim's companions: the job's lengths, the bound E[max]/mean, the
    ratio a replay of both schedules gives, and the requests/s gain this machine's step-cost
    curve allows against the gain measured."""
    lengths = job_lengths(s)
    b = s.max_num_seqs
    curve = {
        int(k): v["step_ms"]["median"] / 1e3
        for k, v in (batching.get("decode") or {}).items()
        if v["step_ms"]["median"]
    }
    static_rows = useful_rows_while_waiting(lengths, b, "static")
    cont_rows = useful_rows_while_waiting(lengths, b, "continuous")
    st, co = per_round.get("static", []), per_round.get("continuous", [])
    busy = [
        i + 1
        for i, (x, y) in enumerate(zip(st, co, strict=False))
        if "batch" in x.get("busy", {}) or "batch" in y.get("busy", {})
    ]
    gain = [
        ratio(dig(x, "batch", "job_s"), dig(y, "batch", "job_s"))
        for x, y in zip(st, co, strict=False)
    ]
    return {
        "documents": len(lengths),
        "batch_slots": b,
        "length_mean": float(np.mean(lengths)),
        "length_p50": float(np.median(lengths)),
        "length_max": max(lengths),
        "bound": expected_max(lengths, b) / float(np.mean(lengths)),
        "replay_useful_rows": {"static": static_rows, "continuous": cont_rows},
        "replay_ratio": ratio(cont_rows, static_rows),
        "step_curve_s": {str(k): v for k, v in sorted(curve.items())},
        "curve_gain": step_cost_gain(lengths, b, curve) if curve else None,
        "measured_gain": figure(gain, busy),
    }
