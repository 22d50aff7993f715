"""Arrival processes: seeded offsets (seconds from the run start) at which requests are due.

    constant  evenly spaced, 1/rate apart
    poisson   exponential gaps (CV = 1)
    gamma     gamma gaps with the given coefficient of variation (CV > 1 is bursty, < 1 regular);
              shape k = 1/CV^2, scale = 1/(rate k), so the mean gap stays 1/rate

Example::

    >>> arrival_times("constant", rate_rps=2.0, n=3)
    [0.0, 0.5, 1.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["PROCESSES", "arrival_times"]

PROCESSES = ("constant", "poisson", "gamma")


def arrival_times(
    process: str,
    rate_rps: float,
    n: int | None = None,
    duration_s: float | None = None,
    cv: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """The first ``n`` arrivals, or all arrivals before ``duration_s`` (whichever ends first)."""
    if process not in PROCESSES:
        raise ValueError(
            f"unknown arrival process {process!r}; choose one of {', '.join(PROCESSES)}"
        )
    if not rate_rps > 0:
        raise ValueError(
            f"rate must be > 0 requests/s, got {rate_rps}; for closed loop use concurrency"
        )
    if n is None and duration_s is None:
        raise ValueError("arrival_times needs n or duration_s to know when to stop")
    if process == "gamma" and not cv > 0:
        raise ValueError(f"gamma arrivals need cv > 0, got {cv}")
    limit = n if n is not None else int(rate_rps * float(duration_s or 0) * 1.5 + 20)
    if duration_s is not None and n is not None:
        limit = min(n, int(rate_rps * duration_s * 1.5 + 20))
    rng = np.random.default_rng(seed)
    times: list[float] = []
    t = 0.0
    while len(times) < limit:
        # the first request is due at t = 0; each later one one gap after the previous
        times.append(t)
        if process == "constant":
            gap = 1.0 / rate_rps
        elif process == "poisson":
            gap = float(rng.exponential(1.0 / rate_rps))
        else:
            shape = 1.0 / (cv * cv)
            gap = float(rng.gamma(shape, 1.0 / (rate_rps * shape)))
        t += gap
        if len(times) == limit and duration_s is not None and n is None and t < duration_s:
            limit += int(rate_rps * duration_s) + 20  # a slow draw: keep going to the end
    if duration_s is not None:
        times = [x for x in times if x < duration_s]
    return times
