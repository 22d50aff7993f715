"""Stop signals end ``loadlab run`` the same way, with real processes and real signals:
SIGTERM and SIGHUP like SIGINT (the file written, exit 128 + the signal),
signals during the write do not abort it, ``--workers`` children stop with their parent."""

from __future__ import annotations

import json
import os
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

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with FixedServerProcess(ttft_ms=100, itl_ms=20, tokens=64) as u:
        yield u


def _truth(url: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{url}/truth", timeout=10) as resp:  # noqa: S310 - loopback
        return dict(json.loads(resp.read()))


def start(url: str, out: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "loadlab", "run", "--no-progress", "--endpoint", url,
        "--concurrency", "6", "--duration", "60", "--prompt-tokens", "8", "--max-tokens", "64",
        "--out", str(out), *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_for_records(url: str, before: int, proc: subprocess.Popen[str]) -> None:
    """Until the server has seen requests from this run (a few have finished by then)."""
    deadline = time.monotonic() + 60
    while len(_truth(url)) <= before + 6 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1.6)  # the first requests (1.4 s each) have ended


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_write_the_file_like_ctrl_c(
    url: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    out = tmp_path / "r.json"
    proc = start(url, out)
    wait_for_records(url, len(_truth(url)), proc)
    proc.send_signal(sig)
    stdout, stderr = finish(proc)
    assert proc.returncode == code, stderr
    assert "interrupted" in stderr and str(out) in stdout and "TTFT" in stdout
    res = read_results(out)
    c = count_outcomes(res.records, res.scheduled_count)
    assert c.ok >= 1 and c.by_outcome.get("cancelled", 0) >= 1
    assert c.scheduled == c.sent + c.dropped and c.sent == c.ok + c.failed
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.journal.jsonl"))


def test_workers_stop_with_their_parent_and_their_records_are_merged(
    url: str, tmp_path: Path
) -> None:
    out = tmp_path / "w.json"
    proc = start(url, out, "--workers", "2")
    wait_for_records(url, len(_truth(url)), proc)
    kids = children(proc.pid)
    assert len(kids) == 2
    proc.send_signal(signal.SIGTERM)
    _, stderr = finish(proc)
    assert proc.returncode == 143, stderr
    assert not any(alive(k) for k in kids)
    res = read_results(out)
    assert {r.worker for r in res.records} == {0, 1} and res.workers == 2
    assert any(r.outcome == "cancelled" for r in res.records)


def test_workers_do_not_outlive_a_parent_killed_with_sigkill(url: str, tmp_path: Path) -> None:
    proc = start(url, tmp_path / "k.json", "--workers", "2")
    wait_for_records(url, len(_truth(url)), proc)
    kids = children(proc.pid)
    assert len(kids) == 2
    proc.kill()
    finish(proc)
    deadline = time.monotonic() + 20
    while any(alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(k) for k in kids), "a worker kept running as an orphan"


def test_a_burst_of_signals_still_leaves_a_whole_file(url: str, tmp_path: Path) -> None:
    """Two Ctrl-C 20 ms apart left a 0-byte .tmp; then SIGTERMs through the whole write."""
    out = tmp_path / "b.json"
    proc = start(url, out)
    wait_for_records(url, len(_truth(url)), proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        with_signal = signal.SIGTERM if int(time.monotonic() * 100) % 2 else signal.SIGINT
        try:
            os.kill(proc.pid, with_signal)
        except ProcessLookupError:
            break
        time.sleep(0.005)
    _, stderr = finish(proc)
    assert proc.returncode == 130, stderr  # the first signal decides
    assert "Traceback" not in stderr
    res = read_results(out)
    assert res.extra["interrupted"] is True and res.records
    assert not list(tmp_path.glob("*.tmp"))
