"""Master and two workers as separate processes against the fixed-schedule server.

Each user runs sessions of a short turn (5 tokens) then a long one (150 tokens, ~3 s), and the
run ends after 2.5 s: long streams are in flight at stop. With ``--stop-timeout 0`` they must
come back as ``cancelled`` (test_single_process checks that ``--stop-timeout`` lets them
complete). The master's file holds every request the server saw (its /truth), from both
workers, on one time base.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from loadlab._analysis import metrics
from loadlab._analysis.summary import summarize
from loadlab.results import read_results
from tests.helpers.locust import finish, locust_cmd, spawn
from tests.helpers.loopback import free_port

pytestmark = pytest.mark.locust


def run_distributed(tmp_path: Path, host: str, *extra: str) -> tuple[int, Path]:
    port = free_port()
    out = tmp_path / "dist.json"
    common = ["--turns", "2", "--first-tokens", "5", "--max-tokens", "150", "--think-time", "0"]
    master = spawn(
        locust_cmd(
            "--master",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(port),
            "--expect-workers",
            "2",
            "--headless",
            "-u",
            "6",
            "-r",
            "20",
            "-t",
            "3s",
            "--host",
            host,
            "--loadlab-out",
            str(out),
            "--csv",
            str(tmp_path / "st"),
            *common,
            *extra,
        ),
        tmp_path / "master.log",
    )
    workers = [
        spawn(
            locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
            tmp_path / f"worker{i}.log",
        )
        for i in range(2)
    ]
    codes = finish([master, *workers], timeout_s=60)
    log = (tmp_path / "master.log").read_text()
    assert out.exists(), log[-3000:]
    return codes[0], out


def check_against_truth(out: Path, truth: dict) -> Counter[str]:
    res = read_results(out)
    assert res.kind == "locust" and res.workers == 2
    info = res.extra["locust"]
    assert info["workers_missing_final"] == []
    assert info["records_received"] == info["records_shipped"] == len(res.records)
    by_id = {r.request_id: r for r in res.records}
    assert len(by_id) == len(res.records), "request ids repeat"
    # every request the server saw is in the file, and nothing else
    assert set(by_id) == set(truth), set(by_id) ^ set(truth)
    assert {r.worker for r in res.records} == {0, 1}
    t0 = info["t0_perf_ns"]
    lags_ms = []
    for rid, r in by_id.items():
        written = truth[rid]["chunk_ns"]
        if r.ok:
            assert len(r.chunk_ns) == len(written), rid
        else:
            assert r.outcome == "cancelled", (rid, r.outcome, r.error)
            assert len(r.chunk_ns) <= len(written)
        lags_ms += [
            (read + t0 - wrote) / 1e6 for read, wrote in zip(r.chunk_ns, written, strict=False)
        ]
    # One clock (CLOCK_MONOTONIC) on both sides: a token is read after it was written. The
    # server stamps a chunk just after handing it to the socket, so a reader may beat the stamp
    # by a little; a worker whose records were not re-based onto the master's t0 would be off
    # by its own start delay for every token.
    assert min(lags_ms) > -50 and max(lags_ms) < 2000, (min(lags_ms), max(lags_ms))
    assert float(np.median(lags_ms)) > -1.0, float(np.median(lags_ms))
    # the file's percentiles are the exact ones of the raw records (no bucketing)
    ttft = [metrics.ttft_ms(r) for r in res.records if r.ok]
    summary = summarize(res).ttft_ms
    for q in (50, 90, 99):
        assert summary.at(q) == pytest.approx(float(np.percentile(ttft, q)), rel=1e-12)
    return Counter(r.outcome for r in res.records)


@pytest.mark.slow
def test_in_flight_streams_are_cancelled_not_lost(tmp_path: Path, fixed_server: str, truth) -> None:
    code, out = run_distributed(tmp_path, fixed_server)
    outcomes = check_against_truth(out, truth())
    assert outcomes["cancelled"] >= 1 and outcomes["ok"] >= 6, outcomes
    assert code == 0  # cancelled-at-stop is recorded, not a Locust failure
    # Locust's own rows: one TTFT sample per ok request, ITL rows present
    rows = (tmp_path / "st_stats.csv").read_text()
    assert f"TTFT,default,{outcomes['ok']},0" in rows


def test_a_worker_killed_mid_run_has_its_started_requests_counted_lost(
    tmp_path: Path, fixed_server: str, truth
) -> None:
    """kill -9 of a worker. The master writes the file once, soon after the run
    (it waited --loadlab-final-wait four times, 86 s after the kill), and the requests the
    dead worker had started but never reported are counted lost, not silently missing."""
    port = free_port()
    out = tmp_path / "lost.json"
    master = spawn(
        locust_cmd("--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                   "--expect-workers", "2", "--headless", "-u", "6", "-r", "20", "-t", "8s",
                   "--host", fixed_server, "--loadlab-out", str(out), "--turns", "1",
                   "--max-tokens", "250", "--think-time", "0"),
        tmp_path / "master.log",
    )  # fmt: skip
    workers = [
        spawn(locust_cmd("--worker", "--master-host", "127.0.0.1", "--master-port", str(port)),
              tmp_path / f"worker{i}.log")
        for i in range(2)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 40
        while len(truth()) < 6 and time.monotonic() < deadline:  # every user is streaming
            time.sleep(0.1)
        time.sleep(1.6)  # a flush (every second) has told the master what was started
        workers[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        codes = finish([master, workers[1]], timeout_s=90)
        after_kill_s = time.monotonic() - killed_at
    finally:
        finish(workers, timeout_s=1)
    log = (tmp_path / "master.log").read_text()
    assert out.exists(), log[-3000:]
    res = read_results(out)
    info = res.extra["locust"]
    [dead] = info["lost_by_worker"]  # the worker that lost requests is the killed one
    assert len(info["workers_missing_final"]) == 1 and codes[0] == 3, (codes, log[-2000:])
    # 3 users on the dead worker, each in a 5 s stream started before the last batch it sent
    assert info["records_lost"] == 3, info
    seen = [rid for rid in truth() if rid.startswith(f"w{dead}u")]
    received = [
        r for r in res.records if r.worker == int(dead) and not r.request_id.startswith("lost-")
    ]
    assert len(received) + info["records_lost"] == len(seen), (len(received), seen)
    assert f"LOST 3: started on Locust worker(s) {dead}" in log
    assert log.count("no final records") == 1 and after_kill_s < 20, (after_kill_s, log[-2000:])
