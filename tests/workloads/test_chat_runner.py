"""A chat run through the real runner, client and reference server (its "fake" preset: the
real HTTP server and engine, with a model runner that emits ASCII letters, so answer text is
exactly as long as its token count). Each turn's prompt, as the server counted it in
``usage.prompt_tokens``, must be the previous turns plus the new message."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from loadlab._runner.run import run_specs
from loadlab.config import EndpointConfig, RunConfig
from loadlab.workloads import build_requests

launch = pytest.importorskip("reference_server.launch")


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    with launch.start_server(mode="continuous", preset="fake", timeout_s=60) as server:
        yield server.url


def test_20_sessions_of_5_turns_send_the_growing_history(fake_server):
    cfg = RunConfig(
        rate_rps=50,
        requests=100,
        seed=2,
        progress=False,
        workload={
            "kind": "chat",
            "sessions": 20,
            "turns": 5,
            "prompt_tokens": {"dist": "uniform", "low": 10, "high": 40},
            "output_tokens": {"dist": "uniform", "low": 5, "high": 15},
            "think_time_s": {"dist": "exponential", "mean": 0.02},
        },
    )
    endpoint = EndpointConfig(url=fake_server, model="loadlab-ref")
    results = run_specs(cfg, endpoint, build_requests)
    specs = {s.request_id: s for s in build_requests(cfg)}
    records = sorted(results.records, key=lambda r: (r.session_id or "", r.turn))
    assert len(records) == 100 and {r.outcome for r in records} == {"ok"}
    for _, group in itertools.groupby(records, key=lambda r: r.session_id):
        turns = list(group)
        assert [r.turn for r in turns] == [0, 1, 2, 3, 4]
        history = 0  # tokens of the earlier user messages and answers
        for prev, r in zip([None, *turns], turns, strict=False):
            spec = specs[r.request_id]
            # the chat template joins the 2k + 1 messages with "\n": 2k separators
            assert r.prompt_tokens == history + spec.prompt_tokens + 2 * r.turn
            assert r.prompt_tokens_requested == spec.prompt_tokens
            assert r.output_tokens == spec.max_tokens
            if prev is not None:
                # sent no sooner than the think time after the previous answer ended
                gap_s = (r.sent_ns - prev.chunk_ns[-1]) / 1e9
                assert gap_s >= spec.think_time_s - 0.005
            history += spec.prompt_tokens + r.output_tokens
