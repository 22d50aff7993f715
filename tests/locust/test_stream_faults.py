"""The Locust user's transport against a real misbehaving server: every fault becomes the same
outcome class as in the asyncio client, keep-alive reuses the socket, nothing raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from loadlab.testing.fault_server import FaultServer
from tests.clients.conftest import _serve_in_thread
from tests.clients.test_faults import EXPECTED
from tests.conftest import ROOT, free_port


@pytest.fixture(scope="module")
def fault_server() -> Iterator[FaultServer]:
    yield from _serve_in_thread(FaultServer)


def test_each_fault_becomes_its_outcome_under_gevent(fault_server: FaultServer) -> None:
    refused = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.locust.stream_probe", fault_server.url, refused],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {m: out[m]["outcome"] for m in EXPECTED} == EXPECTED
    assert all(out[m]["timed"] for m in EXPECTED)
    assert out["429"]["retry_after_s"] == 7.0 and "model overloaded" in out["429"]["error"]
    assert "500 Internal Server Error" in out["500_html"]["error"]
    assert out["ok"]["chunks"] == 3 and out["ok"]["tokens"] == 3
    assert out["reset"]["chunks"] == 1 and out["eof"]["chunks"] == 2
    assert "read timeout" in out["stall"]["error"]
    assert out["keep_alive"] == {"both_ok": True, "same_socket": True}
    assert out["refused"]["outcome"] == "connect_error"
