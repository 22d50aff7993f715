"""A dead endpoint: connect errors back off instead of spinning, add
nothing to any throughput figure, and the summary's first line says the run mostly failed to
connect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadlab._analysis.metrics import throughput
from loadlab._runner.runner import CONNECT_BACKOFF_MAX_S
from loadlab.records import RequestRecord
from loadlab.results import read_results
from tests.helpers.loopback import ROOT, free_port


def test_requests_that_never_connected_add_no_prompt_tokens() -> None:
    ok = RequestRecord("ok", sent_ns=0, chunk_ns=[10, 20], end_ns=20, prompt_tokens=100)
    answered_then_cut = RequestRecord(
        "cut", outcome="incomplete", sent_ns=0, chunk_ns=[10], prompt_tokens_requested=100
    )
    dead = [
        RequestRecord(f"d{i}", outcome="connect_error", sent_ns=5, prompt_tokens_requested=100)
        for i in range(1000)
    ]
    http_500 = RequestRecord("e", outcome="http_500", sent_ns=5, headers_ns=6,
                             prompt_tokens_requested=100)  # fmt: skip
    t = throughput([ok, answered_then_cut, *dead, http_500], (0, 1_000_000_000))
    assert t.total_tokens_per_s == pytest.approx(3 + 200)  # 3 output tokens + 2 prompts
    assert t.requests_per_s == pytest.approx(1)


@pytest.mark.slow
def test_a_dead_endpoint_backs_off_and_says_so_first(tmp_path: Path) -> None:
    out = tmp_path / "dead.json"
    cmd = [sys.executable, "-m", "loadlab", "run", "--no-progress", "--endpoint",
           f"http://127.0.0.1:{free_port()}", "--concurrency", "8", "--duration", "4",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("MOSTLY NOT CONNECTED: "), done.stdout[:300]
    res = read_results(out)
    assert all(r.outcome == "connect_error" for r in res.records)
    # without back-off: thousands a second; with it, each of 8 workers waits up to 1 s
    assert len(res.records) < 8 * (7 + 4 / CONNECT_BACKOFF_MAX_S) + 8, len(res.records)
    assert res.extra["connect_backoff_s"] > 4
    summary = res.to_dict()["summary"]["throughput"]
    assert summary["total_tokens_per_s"] == 0 and summary["requests_per_s"] == 0
