"""Agent sessions (tool calls answered by tool results), reasoning effort, and mixed traffic
classes: the specs they build, then whole runs through the real runner and client against the
reference server (fake preset, reasoning mode, a tool call whenever tools are offered)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from loadlab._runner.run import run_specs
from loadlab._slo import evaluate, parse_slo
from loadlab.config import EndpointConfig, RunConfig
from loadlab.workloads import WorkloadError, build_requests
from tests.helpers.server import serve_agent

pytest.importorskip("reference_server.launch")

AGENT = {"kind": "agent", "sessions": 4, "tool_rounds": 3, "tools": ["search", "read"],
         "prompt_tokens": 30, "tool_result_tokens": 20, "output_tokens": 12,
         "think_time_s": 0.01}  # fmt: skip


def test_agent_sessions_are_a_task_then_tool_turns() -> None:
    cfg = RunConfig(concurrency=2, requests=100, workload={**AGENT, "reasoning_effort": "low"})
    specs = list(build_requests(cfg))
    assert len(specs) == 16  # 4 sessions x (task + 3 tool rounds)
    for _, group in itertools.groupby(specs, key=lambda s: s.session_id):
        turns = list(group)
        assert [(s.turn, s.tool_turn) for s in turns] == [
            (0, False),
            (1, True),
            (2, True),
            (3, True),
        ]
        assert [s.prompt_tokens for s in turns] == [30, 20, 20, 20]
    names = [t["function"]["name"] for t in specs[0].tools]
    assert names == ["search", "read"] and {s.reasoning_effort for s in specs} == {"low"}
    assert {s.request_class for s in specs} == {"agent"}


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ({**AGENT, "tools": 0}, "at least one tool"),
        ({**AGENT, "reasoning_effort": 3}, "reasoning_effort"),
        ({"kind": "mix", "mix": []}, "list of workload tables"),
        ({"kind": "mix", "mix": [{"kind": "chat"}, {"kind": "chat"}]}, "class 'chat' twice"),
        ({"kind": "mix", "mix": [{"kind": "agent", "share": -1}]}, "share"),
    ],
)
def test_bad_workloads_say_what(workload: dict[str, Any], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        build_requests(RunConfig(concurrency=1, requests=10, workload=workload))


MIX = {"kind": "mix", "mix": [
    {"kind": "chat", "share": 0.5, "sessions": 4, "turns": 2, "prompt_tokens": 20,
     "output_tokens": 8, "think_time_s": 0.01},
    {**AGENT, "share": 0.3},
    {"kind": "batch", "share": 0.2, "documents": 12, "prompt_tokens": 40, "output_tokens": 6},
]}  # fmt: skip


def test_a_mix_keeps_sessions_whole_and_ids_unique() -> None:
    closed = list(build_requests(RunConfig(concurrency=4, requests=40, workload=MIX)))
    assert len({s.request_id for s in closed}) == len(closed)
    assert {s.request_class for s in closed} == {"chat", "agent", "batch"}
    sessions = [s.session_id for s in closed if s.session_id]
    runs = [k for k, _ in itertools.groupby(sessions)]
    assert len(runs) == len(set(runs))  # each session's turns are contiguous
    opened = list(build_requests(RunConfig(rate_rps=20, requests=40, workload=MIX)))
    starts = [s.intended_at_s for s in opened if s.intended_at_s is not None]
    assert starts == sorted(starts)


@pytest.fixture(scope="module")
def reasoning_agent_server() -> Iterator[str]:
    yield from serve_agent(reasoning_tokens=4)


@pytest.mark.parametrize("api", ["chat", "anthropic", "responses"])
def test_agent_sessions_run_three_tool_rounds(reasoning_agent_server: str, api: str) -> None:
    cfg = RunConfig(concurrency=4, requests=100, seed=3, progress=False, workload=AGENT)
    endpoint = EndpointConfig(url=reasoning_agent_server, model="loadlab-ref", api=api)
    results = run_specs(cfg, endpoint, build_requests)
    records = sorted(results.records, key=lambda r: (r.session_id or "", r.turn))
    assert len(records) == 16 and {r.outcome for r in records} == {"ok"}
    for _, group in itertools.groupby(records, key=lambda r: r.session_id):
        turns = list(group)
        assert [r.turn for r in turns] == [0, 1, 2, 3]  # three rounds of tool results
        # every answer: 4 reasoning tokens, then a tool call's arguments, no answer text
        assert all(r.tool_calls == 1 and r.reasoning_chunks == 4 for r in turns)
        assert all(r.answer_ns is None for r in turns)
        # each round's prompt adds the answer's call (its ~20-token arguments) and the tool's
        # 20-token result: a round that sent the result as a user message would add only ~22
        assert all(b.prompt_tokens >= a.prompt_tokens + 40 for a, b in itertools.pairwise(turns))
        for prev, r in itertools.pairwise(turns):
            assert r.sent_ns is not None and (r.sent_ns - prev.chunk_ns[-1]) / 1e9 >= 0.005


def test_mixed_classes_in_one_run_with_per_class_slos(reasoning_agent_server: str) -> None:
    cfg = RunConfig(concurrency=4, requests=60, seed=5, progress=False, workload=MIX)
    endpoint = EndpointConfig(url=reasoning_agent_server, model="loadlab-ref")
    results = run_specs(cfg, endpoint, build_requests)
    by_class = {c: [r for r in results.records if r.request_class == c] for c in
                ("chat", "agent", "batch")}  # fmt: skip
    assert all(by_class.values()) and {r.outcome for r in results.records} == {"ok"}
    assert all(r.answer_ns is not None for r in by_class["chat"] + by_class["batch"])
    spec = parse_slo({
        "objectives": ["error_rate <= 0.01"],
        "classes": {
            "chat": {"objectives": ["ttfat_ms.p90 <= 60000"]},
            "agent": {"objectives": ["tool_call_tokens.p50 >= 1", "reasoning_tokens.p50 <= 4"]},
            "batch": {"objectives": ["answer_tokens.p50 >= 100"]},  # 6-token answers: fails
        },
    })  # fmt: skip
    rows = {(r.objective.request_class, r.objective.metric): r
            for r in evaluate(results, spec).rows}  # fmt: skip
    # a few requests per class: a met objective may stay inconclusive, never fail
    assert rows[("chat", "ttfat_ms")].measured is not None
    met = [("chat", "ttfat_ms"), ("agent", "tool_call_tokens"), ("agent", "reasoning_tokens")]
    assert all(rows[k].status != "fail" for k in met)
    assert rows[("agent", "reasoning_tokens")].measured == 4
    assert rows[("batch", "answer_tokens")].measured == 2  # 6 tokens, 4 of them reasoning
    assert rows[("batch", "answer_tokens")].status == "fail"
