"""One Locust process: --slo sets the exit code, --stop-timeout lets streams finish, and the
web UI lists loadlab's TTFT and ITL rows at /stats/requests."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from loadlab.results import read_results
from tests.helpers.locust import finish, get_json, locust_cmd, spawn
from tests.helpers.loopback import free_port

pytestmark = pytest.mark.locust

MET = 'min_requests = 1\nobjectives = ["ttft_ms.p50 <= 5000", "itl_ms.p50 <= 1000"]\n'
MISSED = 'min_requests = 1\nobjectives = ["ttft_ms.p50 <= 1"]\n'  # the server's TTFT is 50 ms
# These tests check the exit-code plumbing, not this machine's speed: a busy CI box must not
# turn the verdict into "generator saturated" (exit 2).
LENIENT = ("--saturation-lag-ms", "100000")


@pytest.mark.slow
def test_slo_met_exits_0_and_stop_timeout_completes_streams(
    tmp_path: Path, fixed_server: str, truth
) -> None:
    (tmp_path / "slo.toml").write_text(MET)
    out = tmp_path / "run.json"
    proc = spawn(
        locust_cmd(
            *LENIENT,
            "--headless",
            "-u",
            "10",
            "-r",
            "20",
            "-t",
            "3s",
            "--stop-timeout",
            "5",
            "--host",
            fixed_server,
            "--turns",
            "2",
            "--first-tokens",
            "3",
            "--max-tokens",
            "60",
            "--think-time",
            "0",
            "--loadlab-out",
            str(out),
            "--slo",
            str(tmp_path / "slo.toml"),
        ),
        tmp_path / "locust.log",
    )
    code = finish([proc], timeout_s=60)[0]
    log = (tmp_path / "locust.log").read_text()
    assert code == 0, log[-3000:]
    assert "verdict: PASS" in log
    res = read_results(out)
    seen = truth()
    assert Counter(r.outcome for r in res.records) == {"ok": len(seen)}  # all finished
    assert {r.request_id for r in res.records} == set(seen)


@pytest.mark.slow
def test_web_ui_lists_ttft_and_itl_rows_and_missed_slo_exits_nonzero(
    tmp_path: Path, fixed_server: str
) -> None:
    (tmp_path / "slo.toml").write_text(MISSED)
    out = tmp_path / "ui.json"
    port = free_port()
    proc = spawn(
        locust_cmd(
            *LENIENT,
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(port),
            "--autostart",
            "--autoquit",
            "0",
            "-u",
            "4",
            "-r",
            "10",
            "-t",
            "4s",
            "--host",
            fixed_server,
            "--turns",
            "1",
            "--max-tokens",
            "10",
            "--loadlab-out",
            str(out),
            "--slo",
            str(tmp_path / "slo.toml"),
        ),
        tmp_path / "locust.log",
    )
    rows: set[tuple[str, str]] = set()
    last_error = ""
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not {"TTFT", "ITL"} <= {m for m, _ in rows}:
            time.sleep(0.5)
            try:
                stats = get_json(f"http://127.0.0.1:{port}/stats/requests")["stats"]
            except OSError as exc:  # not listening yet
                last_error = repr(exc)
                continue
            rows = {(s["method"], s["name"]) for s in stats}
    finally:
        code = finish([proc], timeout_s=60)[0]
    log = (tmp_path / "locust.log").read_text()
    wanted = {("TTFT", "default"), ("ITL", "default"), ("E2E", "default")}
    assert wanted <= rows, (rows, last_error, log[-3000:])
    assert code == 1 and "verdict: FAIL" in log, log[-3000:]
    assert len(read_results(out).records) > 0
