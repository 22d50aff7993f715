"""Open-loop load over Locust's master and three workers, each worker a "machine" of its own: a
network namespace with its own address (``tests/helpers/netns.py``), reaching the master and
the fixed-schedule server only over a bridge, never over the master's 127.0.0.1.

Every scheduled request must come back as one record, the file must be the one-machine
schedule request for request (ids, intended times), the server must see each request near its
intended time from the common start (loose bounds: a loaded 2-core machine; the tight figure is
``benchmarks/distributed_sender.py``'s), and a worker killed mid-run must be counted lost.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadlab._commands.flags import add_run_arguments, config_from_args
from loadlab.results import Results, read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from loadlab.workloads import build_requests
from tests.helpers.locust import finish, get_json, post
from tests.helpers.loopback import ROOT, free_port
from tests.helpers.netns import Fleet, fleet, why_not

pytestmark = [pytest.mark.locust, pytest.mark.slow]

LOCUSTFILE = str(ROOT / "examples" / "locust_openloop.py")
WORKERS = 3
KILL_AFTER_S = 2.0  # of the 5 s the schedule lasts
LEAD_S = 5  # three workers start their shard's `loadlab run` at once: ready 0.8-1.2 s after the
# master sent the shards on a quiet 2-core machine; 5 s leaves room for a busy one (1 s late is
# still accepted)


@pytest.fixture(scope="module")
def machines() -> Any:
    reason = why_not()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    with fleet(WORKERS) as f:
        yield f


@pytest.fixture(scope="module")
def server(machines: Fleet) -> Any:
    with FixedServerProcess(ttft_ms=10, itl_ms=2, tokens=8, host=machines.bridge_ip) as url:
        yield url


def _spawn(cmd: list[str], log: Path, tmp: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)}
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def _run(
    f: Fleet, server: str, tmp: Path, run_args: str, kill_after_s: float | None = None
) -> tuple[int, Results, str]:
    """Master on the bridge, a worker in each namespace; returns (exit code, file, master log).
    The server's arrival log starts empty."""
    post(server + "/truth/reset")
    port, out = free_port(), tmp / "run.json"
    locust = [sys.executable, "-m", "locust", "-f", LOCUSTFILE]
    master_log = tmp / "master.log"
    procs = [_spawn([*locust, "--master", "--master-bind-host", f.bridge_ip,
                     "--master-bind-port", str(port), "--headless", "--expect-workers",
                     str(WORKERS), "-u", str(WORKERS), "-r", "100", "--loadlab-run", run_args,
                     "--loadlab-out", str(out), "--loadlab-lead", str(LEAD_S)],
                    master_log, tmp)]  # fmt: skip
    procs += [_spawn([*f.exec(i), *locust, "--worker", "--master-host", f.bridge_ip,
                      "--master-port", str(port)], tmp / f"worker{i}.log", tmp)
              for i in range(WORKERS)]  # fmt: skip
    if kill_after_s is not None:
        start = _start_time(master_log, procs[0])
        time.sleep(max(0.0, start + kill_after_s - time.time()))
        procs[2].send_signal(signal.SIGKILL)  # namespace 1's Locust worker; its shard follows it
    codes = finish(procs, timeout_s=180)
    log = master_log.read_text(errors="replace")
    assert out.exists(), log[-3000:]
    return codes[0], read_results(out), log


def _start_time(log: Path, master: subprocess.Popen[bytes]) -> float:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and master.poll() is None:
        m = re.search(r"shards start at ([\d.]+)", log.read_text(errors="replace"))
        if m:
            return float(m.group(1))
        time.sleep(0.2)
    raise AssertionError(f"the master never started the shards:\n{log.read_text()[-3000:]}")


def _one_machine_schedule(run_args: str) -> list[tuple[str, int]]:
    import argparse
    import shlex

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    cfg = config_from_args(p.parse_args(shlex.split(run_args)))
    specs = build_requests(cfg, read_ahead=0)
    return [(s.request_id, int(s.intended_at_s * 1e9)) for s in specs][: cfg.requests]  # type: ignore[operator]


def _arrival_lateness_ms(res: Results, truth: dict[str, Any]) -> np.ndarray:
    """When the server saw each request, minus its intended time from the common start."""
    wall_minus_mono = time.time_ns() - time.perf_counter_ns()  # one host: one monotonic clock
    start_ns = res.extra["distributed"]["start_at"] * 1e9
    late = [
        (truth[r.request_id]["recv_ns"] + wall_minus_mono - start_ns - r.intended_ns) / 1e6
        for r in res.records
        if r.ok and r.intended_ns is not None
    ]
    return np.array(late)


def _check_whole_run(res: Results, run_args: str, server: str) -> None:
    got = [(r.request_id, r.intended_ns) for r in res.records]
    assert sorted(got) == sorted(_one_machine_schedule(run_args))  # type: ignore[arg-type]
    assert all(r.ok for r in res.records), {r.outcome for r in res.records}
    info = res.extra["distributed"]
    assert info["count"] == WORKERS and info["workers_lost"] == [] and info["records_lost"] == 0
    hosts = {w["address"] for w in info["workers"].values()}
    assert len(hosts) == WORKERS and "127.0.0.1" not in hosts  # each worker its own address
    assert {r.worker for r in res.records} == set(range(WORKERS))
    assert all(r.host for r in res.records)
    for w in info["workers"].values():
        assert w["clock_start"]["pings"] >= 1 and w["clock_end"] is not None
        assert abs(w["clock_start"]["offset_ms"]) < 50  # one host: the same clock
        assert w["ready_before_start_ms"] > -1000  # every shard started (at most 1 s late)
    assert len(res.generator["parts"]) == WORKERS  # each shard's own saturation checks
    lateness = _arrival_lateness_ms(res, get_json(server + "/truth"))
    assert len(lateness) == len(res.records)
    # never sent ahead of its time; near it (loose: other jobs share these two cores; a wrong
    # common start or clock offset would be off by seconds)
    assert lateness.min() > -5, lateness.min()
    assert np.percentile(lateness, 50) < 100, np.percentile(lateness, [50, 99])
    assert np.percentile(lateness, 99) < 1000, np.percentile(lateness, [50, 99])


def test_a_poisson_schedule_spread_over_three_machines(
    machines: Fleet, server: str, tmp_path: Path
) -> None:
    run_args = (f"--endpoint {server} --rate 30 --requests 90 --seed 11 --tokenizer none "
                "--max-tokens 8")  # fmt: skip
    code, res, log = _run(machines, server, tmp_path, run_args)
    assert code == 0, log[-3000:]
    _check_whole_run(res, run_args, server)
    report = subprocess.run([sys.executable, "-m", "loadlab", "report", str(tmp_path / "run.json")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert report.returncode == 0 and "TTFT" in report.stdout, report.stderr
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p50 <= 5000", "error_rate <= 0.5"]\n')
    verdict = subprocess.run([sys.executable, "-m", "loadlab", "slo", str(tmp_path / "run.json"),
                              "--slo", str(slo)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert verdict.returncode == 0 and "PASS" in verdict.stdout, verdict.stdout + verdict.stderr


def test_a_trace_replayed_over_three_machines(machines: Fleet, server: str, tmp_path: Path) -> None:
    scenario = tmp_path / "trace.toml"
    scenario.write_text(
        'rate_rps = 1.0\nrequests = 80\nstream = true\n\n[workload]\nkind = "trace"\n'
        'trace = "azure-2023-conv"\ntime_scale = 10.0\nduration_s = 60.0\n'
    )
    run_args = f"--scenario {scenario} --endpoint {server} --seed 5 --tokenizer none"
    code, res, log = _run(machines, server, tmp_path, run_args)
    assert code == 0, log[-3000:]
    _check_whole_run(res, run_args, server)


def test_a_worker_killed_mid_run_is_counted_lost(
    machines: Fleet, server: str, tmp_path: Path
) -> None:
    run_args = (f"--endpoint {server} --rate 40 --requests 200 --seed 3 --tokenizer none "
                "--max-tokens 8")  # fmt: skip
    code, res, log = _run(machines, server, tmp_path, run_args, kill_after_s=KILL_AFTER_S)
    assert code == 3, log[-3000:]
    got = sorted(r.request_id for r in res.records)
    assert got == sorted(rid for rid, _ in _one_machine_schedule(run_args))  # one record each
    info = res.extra["distributed"]
    # the shard the killed worker (namespace 1) had: the master deals them in joining order
    (k,) = [int(i) for i, w in info["workers"].items() if w["address"] == machines.addresses[1]]
    assert info["workers_lost"] == [k]
    lost = [r for r in res.records if r.error and r.error.startswith("lost: ")]
    assert len(lost) == info["records_lost"] > 0
    assert {r.worker for r in lost} == {k}
    assert any(r.ok for r in res.records if r.worker == k)  # what it reported before it died
    assert all(r.ok for r in res.records if r.worker != k)
    # its shard's process stopped with it: nothing of that shard reached the server later
    killed_ns = (info["start_at"] + KILL_AFTER_S) * 1e9
    wall_minus_mono = time.time_ns() - time.perf_counter_ns()
    truth = get_json(server + "/truth")
    arrivals = [truth[r.request_id]["recv_ns"] + wall_minus_mono
                for r in res.records if r.worker == k and r.request_id in truth]  # fmt: skip
    assert arrivals and max(arrivals) < killed_ns + 2e9, (max(arrivals) - killed_ns) / 1e9
    assert res.scheduled_count == len(got)
