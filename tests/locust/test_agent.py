"""A Locust user runs tool-calling sessions as the runner does: each answer that called a tool
gets the tool's result next, in the chat API's form, against the reference server acting as
an agent (``--tool-call-rate 1``: every answer that may call a tool does)."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab.results import read_results
from tests.helpers.locust import finish, spawn
from tests.helpers.loopback import ROOT
from tests.helpers.server import serve_agent

pytestmark = pytest.mark.locust
pytest.importorskip("reference_server.launch")


@pytest.fixture(scope="module")
def agent_server() -> Iterator[str]:
    yield from serve_agent(reasoning_tokens=2)


@pytest.mark.slow
def test_a_locust_user_answers_tool_calls_for_three_rounds(
    tmp_path: Path, agent_server: str
) -> None:
    out = tmp_path / "agent.json"
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "tests" / "locust" / "locustfile_agent.py"),
           "--headless", "-u", "1", "-r", "1", "-t", "3s", "--stop-timeout", "5",
           "--host", agent_server, "--model", "loadlab-ref", "--loadlab-out", str(out),
           "--saturation-lag-ms", "100000"]  # fmt: skip
    code = finish([spawn(cmd, tmp_path / "locust.log")], timeout_s=60)[0]
    log = (tmp_path / "locust.log").read_text()
    assert code == 0, log[-3000:]
    records = [r for r in read_results(out).records if r.outcome == "ok"]
    sessions = {
        sid: sorted(group, key=lambda r: r.turn)
        for sid, group in itertools.groupby(
            sorted(records, key=lambda r: (r.session_id or "", r.turn)), key=lambda r: r.session_id
        )
    }
    whole = [s for s in sessions.values() if [r.turn for r in s] == [0, 1, 2, 3]]
    assert whole, {k: [r.turn for r in v] for k, v in sessions.items()}
    for turns in whole:
        assert all(r.tool_calls == 1 and r.reasoning_chunks == 2 for r in turns)
        # each round's prompt adds the answer's call (its ~20-token arguments) and the tool's
        # 20-token result: a round that sent the result as a user message would add only ~22
        assert all(b.prompt_tokens >= a.prompt_tokens + 40 for a, b in itertools.pairwise(turns))
