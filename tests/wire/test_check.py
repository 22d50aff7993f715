"""``loadlab selftest --wire`` as a user types it: its flags, and a run against the
fixed-schedule server (root or CAP_NET_RAW; skipped without, saying so)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab._wire.check import render_section, run_wire_check
from loadlab.config import EndpointConfig, RunConfig
from loadlab.selftest._fixed_server import FixedScheduleServer, FixedServerProcess
from tests.helpers.loopback import ROOT, self_signed_cert, serve_in_thread
from tests.helpers.wire import needs_capture


def _selftest(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "loadlab", "selftest", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--endpoint", "http://127.0.0.1:9"], "--endpoint belongs to the wire check: add --wire"),
        (["--wire"], "--wire needs --endpoint URL"),
        (
            ["--wire", "--endpoint", "http://127.0.0.1:9", "--levels", "1"],
            "--levels sets the fixed",
        ),
        (["--wire", "--endpoint", "http://127.0.0.1:9", "--preset", "quick"], "--preset sets"),
        (["--wire", "--endpoint", "http://127.0.0.1:9", "--tolerance-ms", "1,2"], "three numbers"),
        (["--wire", "--endpoint", "http://127.0.0.1:9", "--extra-body", "[1]"], "JSON object"),
        (["--wire", "--endpoint", "http://127.0.0.1:9", "--concurrency", "0"], "--concurrency"),
        (["--wire", "--endpoint", "ftp://127.0.0.1:9"], "http:// or https://"),
    ],
)
def test_bad_flags_exit_2_before_any_request(args: list[str], message: str) -> None:
    proc = _selftest(*args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


@needs_capture
@pytest.mark.slow
def test_selftest_wire_against_the_fixed_server(tmp_path: Path) -> None:
    out, pcap = tmp_path / "r.json", tmp_path / "c.pcap"
    with FixedServerProcess(ttft_ms=20, itl_ms=3, tokens=12) as url:
        proc = _selftest(
            "--wire", "--endpoint", url, "--model", "m", "--concurrency", "3",
            "--requests", "18", "--prompt-tokens", "16", "--max-tokens", "12",
            # loose bounds: this checks the path, the benchmark the figures
            "--tolerance-ms", "50,50,100", "--out", str(out), "--pcap", str(pcap),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in ("TTFT ", "ITL ", "E2E ", "verdict: within", "18 requests joined of 18"):
        assert line in proc.stdout, proc.stdout
    data = json.loads(out.read_text())
    wire = data["extra"]["wire"]
    assert wire["tls"] is False and wire["within_claim"] is True
    assert wire["figures"]["joined"] == 18 and wire["figures"]["mismatched"] == 0
    assert wire["figures"]["claims_ms"] == {"p50": 50.0, "p90": 50.0, "p99": 100.0}
    assert wire["capture"]["dropped"] == 0 and wire["exchanges"] == 18
    ids = {r["request_id"] for r in data["records"]}
    assert set(wire["truth"]) == ids
    for r in data["records"]:
        t = wire["truth"][r["request_id"]]
        assert len(t["chunk_ns"]) == len(r["chunk_ns"]) == 12
        # the wire's times are on the run's clock: loadlab sent just before the bytes left,
        # and read each token after it arrived
        assert r["sent_ns"] - 1_000_000 <= t["sent_ns"] <= r["sent_ns"] + 50_000_000
        assert all(w <= c + 100_000 for w, c in zip(t["chunk_ns"], r["chunk_ns"], strict=True))
    assert pcap.read_bytes()[:4] == (0xA1B23C4D).to_bytes(4, "little")
    assert pcap.stat().st_mode & 0o777 == 0o600  # it holds every byte sent


@needs_capture
@pytest.mark.slow
def test_over_https_the_wire_gives_packet_times_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crt, key = self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(crt))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, key)
    servers = serve_in_thread(lambda: FixedScheduleServer(ttft_ms=5, itl_ms=2, ssl_context=ctx))
    srv = next(servers)
    try:
        ep = EndpointConfig(url=srv.url, name="tls", model="m")
        cfg = RunConfig(endpoints=(ep,), concurrency=2, requests=6, prompt_tokens=8,
                        max_tokens=8, progress=False)  # fmt: skip
        res = run_wire_check(cfg, ep, say=lambda _s: None)
    finally:
        servers.close()
    wire = res.extra["wire"]
    assert wire["tls"] is True and wire["within_claim"] is None and "figures" not in wire
    assert wire["capture"]["connections"] == 2 and wire["capture"]["packets"] > 0
    assert wire["server_packet_gap_ms"]["p50"] is not None
    text = render_section(wire, res.records)
    assert "encrypted" in text and "verdict: not judged" in text


@needs_capture
def test_an_interface_that_does_not_exist_exits_2() -> None:
    proc = _selftest("--wire", "--endpoint", "http://127.0.0.1:9", "--interface", "nope0")
    assert proc.returncode == 2 and "--interface nope0: cannot capture there" in proc.stderr
