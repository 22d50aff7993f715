"""A Locust master that dies, and options that cannot work, with real Locust processes: the
master (or single process) journals every record it takes in, so ``kill -9`` leaves them for
``loadlab report --from-journal``; the workers ``--processes`` forked die with it; and a bad
loadlab option stops Locust before any user starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadlab.journal import INTERVAL_S, journal_path
from loadlab.results import read_results
from tests.helpers.locust import finish, locust_cmd, spawn
from tests.helpers.loopback import ROOT

pytestmark = pytest.mark.locust

SHIP_S = 1.0  # a worker ships its records every second (loadlab.locust._hooks.FLUSH_INTERVAL_S)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps it here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _lines(path: Path) -> int:
    try:
        return len(path.read_bytes().splitlines())
    except OSError:
        return 0


@pytest.mark.parametrize("processes", [0, 2], ids=["single-process", "processes-2"])
def test_a_master_killed_with_kill_9_leaves_its_records_and_no_worker(
    tmp_path: Path, fixed_server: str, truth, processes: int
) -> None:
    out = tmp_path / "r.json"
    args = ["--headless", "-u", "4", "-r", "20", "-t", "120s", "--host", fixed_server,
            "--loadlab-out", str(out), "--turns", "2", "--max-tokens", "10",
            "--think-time", "0"]  # fmt: skip
    if processes:
        args += ["--processes", str(processes)]
    master = spawn(locust_cmd(*args), tmp_path / "locust.log")
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while _lines(journal_path(out)) < 100 and time.monotonic() < deadline:
            assert master.poll() is None, (tmp_path / "locust.log").read_text()[-3000:]
            time.sleep(0.2)
        workers = _children(master.pid)
        assert len(workers) == processes
        killed_ns = time.perf_counter_ns()  # CLOCK_MONOTONIC: the server's truth clock too
        master.kill()
        master.wait(timeout=10)
        deadline = time.monotonic() + 15
        while any(_running(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(w) for w in workers), "a worker outlived its master"
    finally:
        finish([master], timeout_s=1)
        for w in workers:
            if _running(w):
                subprocess.run(["kill", "-9", str(w)], check=False)
    seen = truth()
    time.sleep(1.0)
    assert len(truth()) == len(seen), "the endpoint still gets requests"
    rebuilt = tmp_path / "rebuilt.json"
    done = subprocess.run(
        [sys.executable, "-m", "loadlab", "report", "--from-journal", str(journal_path(out)),
         "--out", str(rebuilt)], cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    res = read_results(rebuilt)
    assert res.kind == "locust" and res.extra["interrupted"] is True
    # every request that ended more than a shipment and a journal flush before the kill
    margin_ns = int((SHIP_S + INTERVAL_S + 0.5) * 1e9)
    finished = {rid for rid, t in seen.items()
                if t["chunk_ns"] and t["chunk_ns"][-1] < killed_ns - margin_ns}  # fmt: skip
    ids = {r.request_id for r in res.records}
    assert len(finished) >= 20 and finished <= ids, sorted(finished - ids)[:5]
    assert ids <= set(seen)
    if processes:
        assert {r.worker for r in res.records} == set(range(processes))


@pytest.mark.parametrize(
    ("option", "says"),
    [
        (["--loadlab-out", "{tmp}"], "--loadlab-out {tmp} is a directory"),
        (["--loadlab-final-wait", "nan"], "--loadlab-final-wait must be a finite number >= 0"),
        (["--slo", "{tmp}/missing.toml"], "{tmp}/missing.toml: cannot read SLO file"),
        (["--request-timeout", "inf"], "--request-timeout must be a finite number > 0"),
    ],
    ids=["out-is-a-directory", "final-wait-nan", "slo-missing", "timeout-inf"],
)
def test_a_bad_loadlab_option_stops_locust_before_any_request(
    tmp_path: Path, fixed_server: str, truth, option: list[str], says: str
) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in option]
    proc = spawn(
        locust_cmd("--headless", "-u", "2", "-r", "20", "-t", "5s", "--host", fixed_server,
                   "--max-tokens", "5", "--think-time", "0", *args),
        tmp_path / "locust.log",
    )  # fmt: skip
    code = finish([proc], timeout_s=60)[0]
    log = (tmp_path / "locust.log").read_text()
    assert code == 2, log[-3000:]
    assert f"locust: loadlab: {says.replace('{tmp}', str(tmp_path))}" in log
    assert "Traceback" not in log
    assert truth() == {}  # not one request
    assert not list(tmp_path.glob("*.journal.jsonl"))
