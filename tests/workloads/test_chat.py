"""Chat sessions: structure, think-time distribution, default lengths, context cap."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from loadlab._limits import MAX_DURATION_S
from loadlab.config import RunConfig
from loadlab.workloads import build_requests, workload_extra
from loadlab.workloads._arrivals import arrival_times
from loadlab.workloads._params import TRACES

THINK = {"dist": "lognormal", "median": 2.0, "sigma": 0.5}


def chat_cfg(**workload):
    return RunConfig(
        rate_rps=0.5,
        requests=100,
        seed=3,
        workload={"kind": "chat", "sessions": 20, "turns": 5, "think_time_s": THINK, **workload},
    )


def test_20_sessions_of_5_turns_are_contiguous_and_ordered():
    cfg = chat_cfg(prompt_tokens=40, output_tokens=20)
    specs = list(build_requests(cfg))
    assert len(specs) == 100
    sessions = [list(g) for _, g in itertools.groupby(specs, key=lambda s: s.session_id)]
    assert len(sessions) == 20 and len({s[0].session_id for s in sessions}) == 20
    starts = arrival_times("poisson", 0.5, n=20, seed=3)
    for i, turns in enumerate(sessions):
        assert [t.turn for t in turns] == [0, 1, 2, 3, 4]
        assert turns[0].intended_at_s == starts[i] and turns[0].think_time_s == 0.0
        assert all(t.intended_at_s is None and t.think_time_s > 0 for t in turns[1:])
        # each spec carries only the NEW user message: the runner prepends the history
        assert all(t.prompt_tokens == 40 == len(t.prompt) and t.max_tokens == 20 for t in turns)
        assert all(t.request_class == "chat" for t in turns)
    assert len({s.request_id for s in specs}) == 100
    stream = build_requests(cfg)
    assert len(list(stream)) == 100
    assert workload_extra(stream) == {
        "kind": "chat",
        "sessions": 20,
        "turns": 100,
        "sessions_cut_by_context": 0,
    }


def test_think_times_follow_the_configured_lognormal():
    specs = list(build_requests(chat_cfg(prompt_tokens=10, output_tokens=5)))
    think = np.array([s.think_time_s for s in specs if s.turn > 0])
    assert think.size == 80
    # seeded, so this is a fixed verdict: Kolmogorov-Smirnov against lognormal(ln 2, 0.5);
    # D below the 5 % critical value 1.36 / sqrt(n) (Smirnov's asymptotic table)
    x = np.sort(think)
    cdf = np.array(
        [0.5 * (1 + math.erf((math.log(v) - math.log(2.0)) / (0.5 * math.sqrt(2)))) for v in x]
    )
    n = x.size
    d = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert d < 1.36 / math.sqrt(n)
    assert abs(np.log(think).mean() - math.log(2.0)) < 3 * 0.5 / math.sqrt(80)


def test_default_lengths_split_sharegpt_prompts_over_the_turns():
    specs = list(build_requests(chat_cfg(turns=4)))
    assert all(s.prompt_tokens <= math.ceil(8141 / 4) for s in specs)  # ShareGPT max 8141
    assert all(1 <= s.max_tokens <= 1024 for s in specs)  # ShareGPT completions max 1024


def test_context_cap_ends_sessions_before_they_overflow():
    cfg = chat_cfg(prompt_tokens=300, output_tokens=200, max_context_tokens=1100)
    stream = build_requests(cfg)
    specs = list(stream)
    # turn 0: 500; turn 1: 500 + 2 separators + 500 = 1002; turn 2 would be 1504 > 1100
    assert {s.turn for s in specs} == {0, 1} and len(specs) == 40
    assert workload_extra(stream)["sessions_cut_by_context"] == 20


def test_closed_loop_sessions_have_no_times_and_stop_at_requests():
    cfg = RunConfig(concurrency=4, requests=12, workload={"kind": "chat", "turns": 5})
    specs = list(build_requests(cfg))
    assert len(specs) == 12 and all(s.intended_at_s is None for s in specs)
    assert [s.turn for s in specs] == [0, 1, 2, 3, 4] * 2 + [0, 1]


def test_closed_loop_duration_run_is_endless():
    cfg = RunConfig(concurrency=4, duration_s=10, workload={"kind": "chat", "turns": 2})
    assert len(list(itertools.islice(build_requests(cfg), 500))) == 500


def test_session_arrivals_from_a_trace():
    path = TRACES["azure-2023-conv"]
    cfg = RunConfig(
        rate_rps=1,
        requests=30,
        workload={"kind": "chat", "turns": 3, "arrival_trace": str(path), "arrival_time_scale": 2},
    )
    firsts = [s.intended_at_s for s in build_requests(cfg) if s.turn == 0]
    assert firsts[:2] == [0.0, pytest.approx(4.314579 / 2)]


def test_open_loop_without_sessions_stops_at_requests():
    cfg = RunConfig(rate_rps=1, requests=12, workload={"kind": "chat", "turns": 5})
    specs = list(build_requests(cfg))
    assert [s.turn for s in specs] == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert [s.intended_at_s is not None for s in specs].count(True) == 3


def test_read_ahead_zero_builds_each_request_when_asked(monkeypatch):
    """A Locust user's stream (an endless closed-loop chat) reading 2,048 requests ahead at
    start costs ~80 ms on the gevent loop per user; with read_ahead=0 it builds none until
    asked, then one per request. A run still reads ahead by default."""
    import loadlab.workloads._sessions as sessions  # chat's turns are built there

    built = []
    real = sessions.prompt_text
    monkeypatch.setattr(sessions, "prompt_text", lambda *a, **k: built.append(1) or real(*a, **k))
    cfg = RunConfig(concurrency=1, duration_s=MAX_DURATION_S, workload={"kind": "chat", "turns": 3})
    lazy = build_requests(cfg, read_ahead=0)
    assert built == []
    first = next(lazy)
    assert len(built) == 1 and first.turn == 0
    build_requests(cfg)
    assert len(built) == 1 + 2048
