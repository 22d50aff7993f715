"""Batch jobs and the synthetic workload."""

from __future__ import annotations

import itertools

from loadlab.config import RunConfig
from loadlab.workloads import build_requests
from loadlab.workloads._arrivals import arrival_times
from loadlab.workloads._exact import Sizing


def test_batch_open_loop_submits_the_whole_job_at_once():
    cfg = RunConfig(rate_rps=1, requests=50, workload={"kind": "batch", "documents": 40})
    specs = list(build_requests(cfg))
    assert len(specs) == 40 and {s.intended_at_s for s in specs} == {0.0}
    assert {s.request_class for s in specs} == {"batch"}
    # arXiv rows: long documents, short summaries
    assert sum(s.prompt_tokens for s in specs) > 5 * sum(s.max_tokens for s in specs)
    assert all(len(s.prompt) == s.prompt_tokens for s in specs)


def test_batch_under_a_concurrency_cap_is_closed_loop_with_caps():
    cfg = RunConfig(
        concurrency=8,
        requests=30,
        stream=False,
        workload={"kind": "batch", "max_prompt_tokens": 1000, "max_output_tokens": 50},
    )
    specs = list(build_requests(cfg))
    assert len(specs) == 30 and all(s.intended_at_s is None for s in specs)
    assert max(s.prompt_tokens for s in specs) <= 1000 and max(s.max_tokens for s in specs) <= 50


def test_batch_spread_by_rate():
    cfg = RunConfig(
        rate_rps=10, requests=20, arrival="constant", workload={"kind": "batch", "submit": "rate"}
    )
    assert [s.intended_at_s for s in build_requests(cfg)][:3] == [0.0, 0.1, 0.2]


def test_synthetic_uses_the_arrival_process_and_run_lengths():
    cfg = RunConfig(rate_rps=5, requests=50, arrival="gamma", cv=2.0, seed=9, prompt_tokens=33)
    specs = list(build_requests(cfg))
    assert [s.intended_at_s for s in specs] == arrival_times("gamma", 5, n=50, cv=2.0, seed=9)
    assert {(s.prompt_tokens, len(s.prompt), s.max_tokens) for s in specs} == {(33, 33, 64)}


def test_synthetic_class_and_distribution_and_exact_output():
    cfg = RunConfig(
        rate_rps=5,
        duration_s=4,
        workload={
            "kind": "synthetic",
            "request_class": "long_prompt",
            "prompt_tokens": {"dist": "uniform", "low": 2000, "high": 3000},
            "exact_output": True,
        },
    )
    specs = list(build_requests(cfg))
    assert specs and all(s.intended_at_s < 4 for s in specs)
    assert all(2000 <= s.prompt_tokens <= 3000 and s.request_class == "long_prompt" for s in specs)
    assert specs[0].extra_body == {"ignore_eos": True, "min_tokens": 64}


def test_chars_per_token_from_the_workload_wins():
    cfg = RunConfig(concurrency=1, requests=3, workload={"kind": "synthetic", "chars_per_token": 4})
    estimate = Sizing("estimate (2 chars/token)", 2.0, None)
    for how in (None, estimate):  # the workload's own estimate wins over the sizing's
        specs = list(build_requests(cfg, how))
        assert {(s.prompt_tokens, len(s.prompt)) for s in specs} == {(128, 512)}


def test_closed_loop_duration_synthetic_is_endless():
    cfg = RunConfig(concurrency=2, duration_s=5)
    assert len(list(itertools.islice(build_requests(cfg), 3000))) == 3000
