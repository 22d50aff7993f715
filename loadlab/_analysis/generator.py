"""The ``generator`` section of a results file: was the load generator itself the bottleneck?

The section is written by ``loadlab._runner.monitor.LoopMonitor`` (one process) or by
``merge_parts`` (a ``--workers N`` run: its processes' sections sit under ``"parts"``);
Locust runs write the same keys. These readers are pure, so an offline ``loadlab report``
reads the section without loading the runner or the HTTP client::

    {"saturated": bool, "threshold_ms": 20.0, "loop_lag_ms_p99": ..., "loop_lag_ms_max": ...,
     "parse_backlog_ms_p50": ..., "cpu_percent_mean": ..., "samples": [...]}
    {"saturated": bool, "loop_lag_ms_max": ..., "parts": [<one process's section>, ...]}

Example::

    >>> calm = {"threshold_ms": 20.0, "loop_lag_ms_p99": 4.0, "parse_backlog_ms_p50": 1.0}
    >>> behind = {"threshold_ms": 20.0, "loop_lag_ms_p99": 6.0, "parse_backlog_ms_p50": 44.0}
    >>> section = merge_parts([calm, behind])
    >>> worst_process(section), parser_fell_behind(section)
    ((6.0, 44.0, 20.0), 44.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "STALLED_SHARE",
    "generator_parts",
    "merge_parts",
    "parser_fell_behind",
    "saturation_warning",
    "stalled_first_tokens",
    "stalled_later_tokens",
    "worst_process",
]

# a run is saturated when more than this share of its first tokens were read after the loop
# had been away the threshold or more (``loadlab._runner.monitor.LoopMonitor.judge_tokens``)
STALLED_SHARE = 0.01


def merge_parts(sections: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's section from its processes' sections: saturated if any process was."""
    parts = list(sections)
    return {
        "saturated": any(bool(g.get("saturated")) for g in parts),
        "loop_lag_ms_max": max((float(g.get("loop_lag_ms_max", 0.0)) for g in parts), default=0.0),
        "parts": parts,
    }


def generator_parts(generator: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each process's generator section (a --workers run merges them under "parts")."""
    return list(generator.get("parts") or [generator])


def worst_process(generator: Mapping[str, Any]) -> tuple[float, float, float | None]:
    """(loop-lag p99, parse-backlog p50, threshold) of the run's worst process."""
    parts = generator_parts(generator)
    lag = max(float(p.get("loop_lag_ms_p99") or 0.0) for p in parts)
    backlog = max(float(p.get("parse_backlog_ms_p50") or 0.0) for p in parts)
    threshold = generator.get("threshold_ms", next((p.get("threshold_ms") for p in parts), None))
    return lag, backlog, None if threshold is None else float(threshold)


def parser_fell_behind(generator: Mapping[str, Any]) -> float | None:
    """The worst median parse backlog (ms) when it passed the threshold, else None."""
    _, backlog, threshold = worst_process(generator)
    return backlog if threshold is not None and backlog > threshold else None


def stalled_first_tokens(generator: Mapping[str, Any]) -> tuple[int, int, float] | None:
    """(first tokens read after a stall of the threshold or more, first tokens, the longest
    such stall in ms) over the run's processes, when they passed ``STALLED_SHARE``; else
    None (also for sections written before the watch existed)."""
    got = _stalled(generator, "stalled_first_tokens", "first_tokens")
    if got is None:
        return None
    worst = max(
        float(p.get("stalled_first_token_ms_max") or 0.0) for p in generator_parts(generator)
    )
    return (*got, worst)


def stalled_later_tokens(generator: Mapping[str, Any]) -> tuple[int, int] | None:
    """(tokens after a request's first read after a stall of the threshold or more, such
    tokens looked up) over the run's processes, when they passed ``STALLED_SHARE``; else None."""
    return _stalled(generator, "stalled_later_tokens", "later_tokens_checked")


def _stalled(generator: Mapping[str, Any], count: str, total: str) -> tuple[int, int] | None:
    parts = generator_parts(generator)
    if not all(count in p for p in parts):
        return None
    stalled = sum(int(p[count]) for p in parts)
    seen = sum(int(p.get(total) or 0) for p in parts)
    return (stalled, seen) if stalled > STALLED_SHARE * seen else None


def saturation_warning(generator: Mapping[str, Any]) -> str | None:
    """The loud line the CLI prints for a saturated generator, or None."""
    if not generator.get("saturated"):
        return None
    cpu = generator.get("cpu_percent_mean")
    cpu_text = f", CPU {cpu:.0f}% of one core" if isinstance(cpu, int | float) else ""
    if isinstance(cpu, int | float) and cpu < 50:
        cause = (
            "loadlab itself was not busy: other processes on this machine (a server on the "
            "same host, other jobs) kept it waiting for a CPU. Run loadlab where it has a core."
        )
    else:
        cause = "use --workers N, lower the load, or run loadlab on another machine."
    lag, _, thr = worst_process(generator)
    threshold = thr or 0.0
    backlog = parser_fell_behind(generator)
    if backlog is not None and lag <= threshold:
        return (
            "GENERATOR SATURATED: loadlab read the responses in time but interpreted them late "
            f"(median parse backlog {backlog:.1f} ms, threshold {threshold:.0f} ms{cpu_text}). "
            "Timestamps are not affected, but each finished response was handled late, so a "
            f"closed loop started its next request late and sent less than asked; {cause}"
        )
    stalled = stalled_first_tokens(generator)
    if stalled is not None and lag <= threshold:
        n, total, worst = stalled
        return (
            f"GENERATOR SATURATED: {n} of {total} first tokens ({100 * n / total:.1f} %) were "
            f"read after loadlab's event loop had been away {threshold:.0f} ms or more (up to "
            f"{worst:.1f} ms{cpu_text}), in bursts its ticker's p99 does not show: those TTFTs "
            f"may be late by as much, enough to move the p99; {cause}"
        )
    later = stalled_later_tokens(generator)
    if later is not None and lag <= threshold:
        n, total = later
        return (
            f"GENERATOR SATURATED: {n} of {total} tokens after the first ({100 * n / total:.1f} "
            f"%) were read after loadlab's event loop had been away {threshold:.0f} ms or more"
            f"{cpu_text}, in bursts its ticker's p99 does not show: the gaps around them (ITL) "
            f"may be off by as much, enough to move the p99; {cause}"
        )
    return (
        "GENERATOR SATURATED: loadlab's own event loop lagged "
        f"p99 {lag:.1f} ms "
        f"(threshold {threshold:.0f} ms{cpu_text}). "
        f"Latencies include that delay; {cause}"
    )
