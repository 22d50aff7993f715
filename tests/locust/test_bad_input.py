"""A Locust user records a request its workload could not build as ``bad_input``, never sends
it, and goes on with the next."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadlab.results import read_results
from tests.helpers.locust import finish, locust_cmd, spawn

pytestmark = pytest.mark.locust


@pytest.mark.slow
def test_a_bad_input_request_is_a_failure_and_the_user_goes_on(
    tmp_path: Path, fixed_server: str
) -> None:
    out = tmp_path / "run.json"
    cmd = locust_cmd("--headless", "-u", "1", "-r", "1", "-t", "2s", "--stop-timeout", "5",
                     "--host", fixed_server, "--turns", "1", "--max-tokens", "2",
                     "--think-time", "0", "--bad-input-every", "2", "--loadlab-out", str(out),
                     "--saturation-lag-ms", "100000")  # fmt: skip
    finish([spawn(cmd, tmp_path / "locust.log")], timeout_s=60)
    records = read_results(out).records
    bad = [r for r in records if r.outcome == "bad_input"]
    ok = [r for r in records if r.outcome == "ok"]
    assert bad and ok, (tmp_path / "locust.log").read_text()[-3000:]
    assert all(r.sent_ns is None and "gone.png" in (r.error or "") for r in bad)
    assert abs(len(bad) - len(ok)) <= 1  # every other one, in order
