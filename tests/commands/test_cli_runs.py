"""`loadlab run` as a user runs it, against the fixed-schedule server in its own process:
Ctrl-C still writes the results, and --workers 2 merges into one file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._analysis.metrics import count_outcomes
from loadlab.results import read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from tests.helpers.loopback import ROOT


@pytest.fixture(scope="module")
def fixed_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=100, itl_ms=20, tokens=64) as url:
        yield url


@pytest.fixture(scope="module")
def fast_url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=10, itl_ms=2, tokens=8) as url:
        yield url


def _http(url: str, method: str = "GET") -> bytes:
    req = urllib.request.Request(url, method=method)  # noqa: S310 - the fixture's loopback URL
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - the fixture's loopback URL
        return bytes(resp.read())


def _truth(url: str) -> dict[str, object]:
    return dict(json.loads(_http(f"{url}/truth")))


def _loadlab(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "loadlab", "run", "--no-progress", *args]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_ctrl_c_cancels_in_flight_and_writes_results(fixed_url: str, tmp_path: Path) -> None:
    _http(f"{fixed_url}/truth/reset", "POST")
    out = tmp_path / "r.json"
    proc = _loadlab(
        "--endpoint",
        fixed_url,
        "--concurrency",
        "6",
        "--duration",
        "60",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "64",
        "--tokenizer",  # no calibration requests: the first request seen is the run's
        "none",
        "--out",
        str(out),
    )
    try:
        deadline = time.monotonic() + 30
        while not _truth(fixed_url) and time.monotonic() < deadline:  # requests are flowing
            time.sleep(0.1)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and str(out) in stdout
    res = read_results(out)
    c = count_outcomes(res.records, res.scheduled_count)
    assert c.scheduled == c.sent + c.dropped and c.sent == c.ok + c.failed
    # each request lives ~1.4 s: the six in flight at Ctrl-C were cancelled, and kept
    assert c.by_outcome.get("cancelled", 0) >= 1
    assert res.extra["interrupted"] is True


def test_two_workers_write_one_file_with_every_request(fast_url: str, tmp_path: Path) -> None:
    out = tmp_path / "w.json"
    proc = _loadlab(
        "--endpoint",
        f"fx={fast_url}",
        "--concurrency",
        "8",
        "--requests",
        "16",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "8",
        "--workers",
        "2",
        "--out",
        str(out),
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    res = read_results(out)
    assert len(res.records) == 16 and res.workers == 2
    assert {r.worker for r in res.records} == {0, 1}
    assert {r.endpoint for r in res.records} == {"fx"}
    assert len({r.request_id for r in res.records}) == 16
    assert all(r.ok and r.output_tokens == 8 for r in res.records)


def test_interleave_sends_the_same_requests_to_each_endpoint_at_once(
    fast_url: str, tmp_path: Path
) -> None:
    import argparse

    from loadlab._commands import run as run_cmd

    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    out = tmp_path / "x.json"
    args = p.parse_args(
        ["--endpoint", f"a={fast_url}", "--endpoint", f"b={fast_url}", "--interleave",
         "--concurrency", "2", "--requests", "6", "--prompt-tokens", "8", "--no-progress",
         "--out", str(out)]
    )  # fmt: skip
    assert run_cmd.run(args) == 0
    a, b = read_results(tmp_path / "x-a.json"), read_results(tmp_path / "x-b.json")
    assert sorted(r.request_id for r in a.records) == sorted(r.request_id for r in b.records)
    assert len(a.records) == 6 and {r.endpoint for r in b.records} == {"b"}
    assert a.extra["t0_ns"] == b.extra["t0_ns"]  # one schedule for both
