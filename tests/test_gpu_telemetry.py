"""GPU telemetry beside the load and the energy per token: the DCGM page read, the energy
integral by hand, a real run sampling a replayed DCGM exporter, and NVML's clear failure."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from loadlab._analysis.server_metrics import parse_prometheus_text
from loadlab._analysis.telemetry import energy_of, gpu_series
from loadlab._report.text import render_summary
from loadlab._runner.telemetry import nvml_sample
from loadlab.cli import main
from loadlab.records import RequestRecord
from loadlab.results import Results, read_results
from loadlab.selftest._fixed_server import FixedServerProcess
from tests.helpers.dcgm import PAGE, DcgmReplay

S = 1_000_000_000


def test_the_recorded_dcgm_page_reads_as_two_gpus() -> None:
    metrics = parse_prometheus_text(PAGE.read_text())
    [g0, g1] = gpu_series([{"t_ns": 5 * S, "metrics": metrics}], t0_ns=2 * S)
    assert (g0["gpu"], g0["host"], g0["model"]) == ("0", "gpu-node-7", "NVIDIA H100 80GB HBM3")
    assert g1["uuid"] == "GPU-8b27c0e9-41d5-f3a6-72b1-c4e0d93f6a18"
    assert g0["t_ns"] == [3 * S]
    assert g0["power_w"] == [70.012] and g1["power_w"] == [71.994]
    assert g0["memory_used_mib"] == [4.0] and g0["sm_clock_mhz"] == [345.0]
    assert g0["temperature_c"] == [31.0] and g0["gpu_util_pct"] == [0.0]
    assert g0["energy_j"] == [pytest.approx(183266734.721)]  # the counter is in mJ


def _run(telemetry: dict[str, Any], records: list[RequestRecord], window_s: tuple[float, float],
         pricing: dict[str, Any] | None = None) -> Results:  # fmt: skip
    return Results(
        records=records,
        window_ns=(int(window_s[0] * S), int(window_s[1] * S)),
        config={"pricing": {"*": pricing}} if pricing else {},
        extra={"gpu_telemetry": telemetry},
    )


def _done(rid: str, end_s: float, tokens: int) -> RequestRecord:
    chunks = [int((end_s - 0.1 * (tokens - 1 - k)) * S) for k in range(tokens)]
    return RequestRecord(request_id=rid, sent_ns=chunks[0] - S // 10, chunk_ns=chunks,
                         output_tokens=tokens, output_tokens_source="usage")  # fmt: skip


def test_energy_by_hand() -> None:
    # one GPU: idle 50 W at -2 and -1 s (the baseline); then 200, 200, 300, 300, 200 W at 0..4 s
    g = {"gpu": "0", "t_ns": [t * S for t in (-2, -1, 0, 1, 2, 3, 4)],
         "power_w": [50.0, 50.0, 200.0, 200.0, 300.0, 300.0, 200.0]}  # fmt: skip
    tel = {"gpus": [g], "baseline_ns": [-2 * S, -1 * S]}
    records = [_done("a", 1.5, 10), _done("b", 3.0, 30), _done("late", 3.9, 5)]
    e = energy_of(_run(tel, records, (0.5, 3.5), pricing={"usd_per_kwh": 0.36}))
    assert e is not None and not e.missing
    # ∫ over [0.5, 3.5] s: 0.5-1: 200 W x 0.5 = 100; 1-2: (200+300)/2 = 250; 2-3: 300;
    # 3-3.5: (300 + 250)/2 x 0.5 = 137.5  -> 787.5 J
    assert e.joules == pytest.approx(787.5)
    assert e.gpus[0].idle_w == 50.0 and e.gpus[0].idle_samples == 2
    assert e.joules_above_idle == pytest.approx(787.5 - 50 * 3.0)
    assert e.baseline_s == 1.0
    # output tokens inside the window: a's 10 (1.3 .. 1.5 s... all after 0.5 s) + b's 30 - the
    # ones b sent before 0.5 s (b's tokens at 0.1 .. 3.0 s: 26 inside) ; c's 5 are at 3.5 .. 3.9
    tokens = sum(1 for r in records for t in r.chunk_ns if 0.5 * S <= t <= 3.5 * S)
    assert e.output_tokens == tokens and e.requests == 2
    assert e.joules_per_output_token == pytest.approx(787.5 / tokens)
    assert e.joules_per_request == pytest.approx(787.5 / 2)
    assert e.usd == pytest.approx(787.5 / 3.6e6 * 0.36)


def test_no_power_sensor_no_figure() -> None:
    g = {"gpu": "0", "t_ns": [0, S, 2 * S], "power_w": [None] * 3, "gpu_util_pct": [1, 2, 3]}
    res = _run({"gpus": [g], "baseline_ns": None}, [_done("a", 1.0, 3)], (0, 2))
    e = energy_of(res)
    assert e is not None and e.joules is None and e.joules_per_output_token is None
    assert "no power sensor" in e.missing
    text = render_summary(res)
    assert "no power sensor in the GPU telemetry: no energy figure" in text
    assert " J over " not in text


class _FakeNvml:
    """What pynvml answers on a one-GPU machine (mocked: no GPU here)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return "GPU-0000"

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=42)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=3 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 250_500  # mW

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return 1980

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 55

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        raise self.NVMLError("Not Supported")  # an older board: left out, not invented


def test_nvml_readings_use_the_loadlab_gpu_names() -> None:
    sample = {"t_ns": S, "metrics": nvml_sample(_FakeNvml(), "host-a")}
    [g] = gpu_series([sample])
    assert (g["gpu"], g["host"], g["model"], g["uuid"]) == (
        "0",
        "host-a",
        "NVIDIA H200",
        "GPU-0000",
    )
    assert g["power_w"] == [250.5] and g["gpu_util_pct"] == [42.0]
    assert g["memory_used_mib"] == [3072.0] and g["sm_clock_mhz"] == [1980.0]
    assert g["temperature_c"] == [55.0] and g["energy_j"] == [None]


def test_nvml_without_a_gpu_fails_clearly_before_any_request(tmp_path: Path) -> None:
    # a subprocess: the exit code and stderr a user sees; nothing listens on the endpoint
    out = tmp_path / "r.json"
    argv = ["run", "--endpoint", "http://127.0.0.1:9/v1", "--rate", "1", "--requests", "1",
            "--gpu-metrics", "nvml", "--no-progress", "--tokenizer", "byte", "--out", str(out)]  # fmt: skip
    cmd = [sys.executable, "-m", "loadlab", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--gpu-metrics nvml: no NVML/no GPU here" in proc.stderr
    assert not out.exists()


def test_a_page_without_gpu_metrics_is_refused(tmp_path: Path) -> None:
    with FixedServerProcess(ttft_ms=5, itl_ms=1, tokens=4) as url:
        code = main(["run", "--endpoint", url, "--rate", "5", "--requests", "2",
                     "--gpu-metrics", f"{url}/v1/models", "--no-progress",
                     "--out", str(tmp_path / "r.json")])  # fmt: skip
    assert code == 2
    assert not (tmp_path / "r.json").exists()


def _trapezoid(ts: list[float], ps: list[float], lo: float, hi: float) -> float:
    """The power integral over [lo, hi], written out by hand for the check."""
    grid = [lo, *[t for t in ts if lo < t < hi], hi]
    vals = [float(np.interp(x, ts, ps)) for x in grid]
    return sum((grid[i + 1] - grid[i]) * (vals[i] + vals[i + 1]) / 2 for i in range(len(grid) - 1))


@pytest.mark.slow
def test_a_run_samples_a_dcgm_exporter_and_reports_energy_per_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, html = tmp_path / "run.json", tmp_path / "run.html"
    with (
        FixedServerProcess(ttft_ms=20, itl_ms=10, tokens=16) as url,
        DcgmReplay(idle_s=1.25) as dcgm,
    ):
        code = main(["run", "--endpoint", url, "--rate", "8", "--duration", "3",
                     "--prompt-tokens", "16", "--max-tokens", "16", "--no-progress",
                     "--gpu-metrics", dcgm.url, "--gpu-interval", "0.2", "--gpu-baseline", "1.2",
                     "--price", "gpu_hour=3.6,gpus=2,kwh=0.2",
                     "--saturation-lag-ms", "100000", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    res = read_results(out)
    tel = res.extra["gpu_telemetry"]
    assert tel["source"] == dcgm.url and tel["failures"] == 0
    gpus = tel["gpus"]
    assert [g["gpu"] for g in gpus] == ["0", "1"] and gpus[0]["model"] == "NVIDIA H100 80GB HBM3"
    lo, hi = res.measurement_window_ns()
    b0, b1 = tel["baseline_ns"]
    assert b1 < 0 and (b1 - b0) / S == pytest.approx(1.2, abs=0.2)  # the baseline, before t0
    for g in gpus:
        n = len(g["t_ns"])
        assert n >= 12 and all(len(g[f]) == n for f in ("power_w", "gpu_util_pct", "sm_clock_mhz"))
        assert g["t_ns"][0] <= b0 and g["t_ns"][-1] >= hi  # the whole run is covered
    e = energy_of(res)
    assert e is not None and not e.missing
    total = 0.0
    for g, ge in zip(gpus, e.gpus, strict=True):
        ts, ps = [t / S for t in g["t_ns"]], g["power_w"]
        joules = _trapezoid(ts, ps, lo / S, hi / S)
        assert ge.joules == pytest.approx(joules, rel=1e-9)
        base = [p for t, p in zip(g["t_ns"], ps, strict=True) if b0 <= t <= b1]
        assert ge.idle_w == pytest.approx(sum(base) / len(base))
        idle_w = 70.0 + 2 * int(g["gpu"])  # the replay's idle power; the load starts after it
        assert ge.idle_w <= idle_w + (300 - idle_w) / len(base) + 1e-9  # at most one busy sample
        # the window is busy: 300 W (GPU 1: 280) ± 10 W ripple
        busy = 300.0 - 20 * int(g["gpu"])
        assert busy - 10 <= ge.mean_w <= busy + 10
        # the exporter's own energy counter agrees with the power integral
        assert ge.counter_joules == pytest.approx(joules, rel=0.05)
        total += joules
    tokens = sum(1 for r in res.records for t in r.chunk_ns if lo <= t <= hi)
    assert e.output_tokens == tokens
    assert e.joules_per_output_token == pytest.approx(total / tokens)
    above = sum(ge.joules - ge.idle_w * (hi - lo) / S for ge in e.gpus if ge.idle_w is not None)
    assert e.joules_per_output_token_above_idle == pytest.approx(above / tokens)
    assert e.usd == pytest.approx(total / 3.6e6 * 0.2)
    assert "energy      " in printed and "per output token" in printed
    assert "idle baseline 1.2 s before the load" in printed or "idle baseline 1.3 s" in printed
    # the HTML report plots the series next to the latency timeline
    assert main(["report", str(out), "--html", str(html)]) == 0
    page = html.read_text()
    assert "<h2>GPU telemetry</h2>" in page and "<h2>Cost and energy</h2>" in page
    assert page.index("<h2>Timeline") < page.index("<h2>GPU telemetry</h2>")
    assert page.count("data:image/svg+xml;base64,") >= 4
    json.loads(out.read_text())  # strict JSON: no NaN from a missing value
    assert not math.isnan(e.joules or math.nan)
    _check_in_chromium(html, tmp_path)


def _check_in_chromium(html: Path, tmp_path: Path) -> None:
    from tests.report.test_html import _chrome_args, _chromium

    binary = _chromium()
    if binary is None:
        return  # scripts/test.sh installs it; the report's own browser test says it skipped
    args = _chrome_args(binary, tmp_path / "profile")
    proc = subprocess.run([*args, "--dump-dom", html.as_uri()], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    console = [ln for ln in proc.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert proc.returncode == 0 and not console, console
    assert "<h2>GPU telemetry</h2>" in proc.stdout and 'alt="GPU utilisation' in proc.stdout
