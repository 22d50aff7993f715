"""Seeded arrival processes: asked rate and burstiness (CV) within tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from loadlab.workloads._arrivals import arrival_times


def _rate_cv(times: list[float]) -> tuple[float, float]:
    gaps = np.diff(times)
    return 1.0 / gaps.mean(), gaps.std() / gaps.mean()


def test_constant_is_exact() -> None:
    assert arrival_times("constant", 4.0, n=5) == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize(("process", "cv"), [("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5)])
def test_rate_and_cv_within_tolerance(process: str, cv: float) -> None:
    times = arrival_times(process, 20.0, n=20_000, cv=cv, seed=7)
    rate, got_cv = _rate_cv(times)
    # 20k gaps: the sampling error of the mean is ~cv/sqrt(n) < 1.5 %; of the CV a few %
    assert rate == pytest.approx(20.0, rel=0.05)
    assert got_cv == pytest.approx(cv, rel=0.08)


def test_seeded_and_duration_bound() -> None:
    a = arrival_times("poisson", 10.0, duration_s=5.0, seed=3)
    assert a == arrival_times("poisson", 10.0, duration_s=5.0, seed=3)
    assert a != arrival_times("poisson", 10.0, duration_s=5.0, seed=4)
    assert all(0 <= t < 5.0 for t in a) and a[0] == 0.0
    assert 25 <= len(a) <= 80  # 50 expected; Poisson sd ~7


def test_bad_input_says_the_fix() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        arrival_times("poisson", 0.0, n=3)
    with pytest.raises(ValueError, match="choose one of"):
        arrival_times("uniform", 1.0, n=3)
