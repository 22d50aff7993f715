"""The batch job's lengths, the E[max]/mean bound and both schedules, against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loadlab._lab import settings_for
from loadlab._lab.batchjob import (
    azure_output_lengths,
    expected_max,
    job_lengths,
    schedule_rows,
    step_cost_gain,
    step_time_s,
    stratified_lengths,
    useful_rows_while_waiting,
)


def test_expected_max_matches_enumeration() -> None:
    pop = [1, 2, 2, 7]
    for b in (1, 2, 3):
        brute = np.mean([max(c) for c in itertools.product(pop, repeat=b)])
        assert expected_max(pop, b) == pytest.approx(brute)


def test_azure_bound_matches_the_benchmark() -> None:
    pop = azure_output_lengths()
    assert len(pop) == 19366
    # the population's bound at 16 slots; a stratified 48-document job keeps it
    bound = expected_max(list(pop), 16) / pop.mean()
    job = stratified_lengths(pop, 48, scale=1 / 16)
    assert 2.3 < bound < 2.5
    assert expected_max(job, 16) / np.mean(job) == pytest.approx(bound, rel=0.05)


def test_schedules_by_hand() -> None:
    # static, 2 slots: [1, 3] runs 2 decode steps (1 useful each, 2 rows computed) while
    # [2] waits, then [2] decodes 1 step alone
    assert schedule_rows([1, 3, 2], 2, "static") == [(2, 1, True), (2, 1, True), (1, 1, False)]
    # continuous: step 1 prefills 1 and 3 (1 is done); step 2 decodes 3 and prefills 2;
    # step 3 decodes both; 3 is done after its 2 decodes, 2 after its 1
    assert schedule_rows([1, 3, 2], 2, "continuous") == [(1, 1, False), (2, 2, False)]
    assert useful_rows_while_waiting([1, 3, 2], 2, "static") == 1.0
    assert useful_rows_while_waiting([1, 3, 2], 2, "continuous") is None
    with pytest.raises(ValueError, match="policy"):
        schedule_rows([1], 1, "fifo")


def test_step_cost_gain_flat_curve_is_the_step_ratio() -> None:
    job = stratified_lengths(azure_output_lengths(), 48, scale=1 / 16)
    steps = {p: len(schedule_rows(job, 16, p)) for p in ("static", "continuous")}
    flat = step_cost_gain(job, 16, {1: 0.05, 16: 0.05})
    assert flat == pytest.approx(steps["static"] / steps["continuous"])
    # static pads every row of every step; continuous's drain steps (few rows) get cheaper
    steep = step_cost_gain(job, 16, {1: 0.05, 16: 0.1})
    assert steep is not None and flat is not None and 1.0 < flat < steep
    assert step_time_s({1: 0.05, 4: 0.08}, 8) == pytest.approx(0.12)  # slope continued
    assert step_cost_gain([], 16, {1: 0.05}) is None


def test_batch_lengths_follow_the_azure_trace() -> None:
    s = settings_for("cpu")
    lengths = job_lengths(s)
    assert len(lengths) == s.batch_documents == 48
    assert lengths == job_lengths(settings_for("cpu"))  # seeded
    assert lengths != job_lengths(settings_for("cpu", seed=1))
    # the trace's output lengths (mean 211, p50 129) at 1/16: mean ~13, median 8
    assert 11 < sum(lengths) / len(lengths) < 15 and sorted(lengths)[24] == 8
