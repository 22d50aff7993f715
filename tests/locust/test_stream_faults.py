"""The Locust user's transport against a real misbehaving server: every fault becomes the same
outcome class as in the asyncio client, keep-alive reuses the socket, nothing raises; and
over TLS with a private CA trusted through SSL_CERT_FILE."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadlab.selftest._fixed_server import FixedScheduleServer
from tests.helpers.fault_server import FaultServer
from tests.helpers.loopback import (
    FAULT_OUTCOMES,
    ROOT,
    free_port,
    self_signed_cert,
    serve_in_thread,
)


def _probe(*args: str, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.locust.stream_probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fault_server() -> Iterator[FaultServer]:
    yield from serve_in_thread(FaultServer)


def test_each_fault_becomes_its_outcome_under_gevent(fault_server: FaultServer) -> None:
    out = _probe(fault_server.url, f"http://127.0.0.1:{free_port()}")
    assert {m: out[m]["outcome"] for m in FAULT_OUTCOMES} == FAULT_OUTCOMES
    assert all(out[m]["timed"] for m in FAULT_OUTCOMES)
    assert out["429"]["retry_after_s"] == 7.0 and "model overloaded" in out["429"]["error"]
    assert "500 Internal Server Error" in out["500_html"]["error"]
    assert out["ok"]["chunks"] == 3 and out["ok"]["tokens"] == 3
    assert out["reset"]["chunks"] == 1 and out["eof"]["chunks"] == 2
    assert "read timeout" in out["stall"]["error"]
    assert out["keep_alive"] == {"both_ok": True, "same_socket": True}
    assert out["refused"]["outcome"] == "connect_error"


def test_streams_over_tls_and_keeps_the_connection(tmp_path: Path) -> None:
    cert = self_signed_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    servers = serve_in_thread(lambda: FixedScheduleServer(ttft_ms=5, itl_ms=1, ssl_context=ctx))
    srv = next(servers)
    try:
        assert srv.url.startswith("https://")
        out = _probe("--reuse", srv.url, env={"SSL_CERT_FILE": str(cert[0])})
    finally:
        servers.close()
    assert [(r["outcome"], r["chunks"], r["tokens"]) for r in out["records"]] == [("ok", 3, 3)] * 2
    assert out["same_socket"] is True
