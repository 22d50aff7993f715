"""``loadlab sweep --predict``: the predicted sweep beside the measured one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab._slo import load_slo
from loadlab.config import RunConfig
from loadlab.selftest._fixed_server import FixedServerProcess
from loadlab.simulate import LinearStepTime, ServerConfig
from loadlab.simulate._capacity import predicted_sweep
from loadlab.simulate._versus import curves_of, max_load_error_pct, versus_html, versus_text

ROOT = Path(__file__).resolve().parents[2]
FAST = LinearStepTime(base_s=0.010, per_prefill_token_s=1e-4, per_decode_token_s=1e-3)
SLOW = LinearStepTime(base_s=0.012, per_prefill_token_s=1e-4, per_decode_token_s=1.2e-3)


def test_two_sweeps_side_by_side(tmp_path: Path) -> None:
    """Two simulated sweeps stand in for measured and predicted: the SLO-max loads, their
    error, and every load's percentiles are set side by side."""
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 20\nobjectives = ["itl_ms.p99 <= 30"]\n')
    spec = load_slo(slo)
    cfg = RunConfig(rate_rps=1.0, duration_s=60, workload={"kind": "synthetic",
                    "prompt_tokens": 100, "output_tokens": 50})  # fmt: skip
    levels = [2.0, 4.0, 8.0, 16.0, 32.0]
    meas, mruns = predicted_sweep(cfg, ServerConfig(max_num_seqs=64), SLOW, spec, levels)
    pred, pruns = predicted_sweep(cfg, ServerConfig(max_num_seqs=64), FAST, spec, levels)
    assert meas.max_passing_load is not None and pred.max_passing_load is not None
    assert pred.max_passing_load > meas.max_passing_load  # the faster model carries more
    err = max_load_error_pct(meas, pred)
    assert err == pytest.approx((pred.max_passing_load / meas.max_passing_load - 1) * 100)
    curves = {"measured": curves_of(mruns), "predicted": curves_of(pruns)}
    text = versus_text(meas, pred, curves)
    assert f"error {err:+.1f} %" in text and "ttft" in text and "itl" in text
    assert "<svg" in versus_html(meas, pred, curves) or "data:image/svg+xml" in versus_html(
        meas, pred, curves
    )


def test_sweep_predict_command(tmp_path: Path) -> None:
    """A real (fixed-schedule) endpoint swept at two rates, predicted beside it."""
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 3\nobjectives = ["ttft_ms.p90 <= 1000"]\n')
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps(FAST.to_dict()))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    with FixedServerProcess(ttft_ms=30, itl_ms=10, tokens=8) as url:
        argv = ["sweep", "--endpoint", url, "--model", "m", "--slo", str(slo), "--rates", "2,4",
                "--duration", "3", "--prompt-tokens", "16", "--max-tokens", "8", "--no-progress",
                "--out-dir", str(tmp_path / "sw"), "--predict", "--step-model", str(fit),
                "--bisect-steps", "0", "--inconclusive", "pass",
                # the plumbing is under test, not the timing: a loaded machine's loop lag
                # must not void a level
                "--saturation-lag-ms", "1000"]  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "loadlab", *argv], text=True,
                              capture_output=True, env=env, timeout=240, cwd=ROOT)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: the loaded machine failed a level
    assert "highest load meeting the SLOs: measured" in done.stdout
    assert "predicted 4 rps" in done.stdout
    data = json.loads((tmp_path / "sw" / "predicted.json").read_text())
    assert set(data["curves"]["measured"]) == {"2.0", "4.0"}
    assert (tmp_path / "sw" / "predicted.html").is_file()
