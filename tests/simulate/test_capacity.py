"""``loadlab capacity --simulate``: the SLO-max rate, the objective that binds, replicas, cost."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab._slo import load_slo
from loadlab.config import RunConfig
from loadlab.simulate import LinearStepTime, ServerConfig
from loadlab.simulate._capacity import ceilings_only, enough_requests, plan_capacity, rate_levels

MODEL = LinearStepTime(base_s=0.010, per_prefill_token_s=1e-4, per_decode_token_s=1e-3)
ROOT = Path(__file__).resolve().parents[2]


def test_rate_levels_are_geometric() -> None:
    assert rate_levels(1, 8, 4) == [1.0, 2.0, 4.0, 8.0]
    with pytest.raises(ValueError):
        rate_levels(2, 1)


def test_plan_names_the_binding_objective_and_sizes_replicas(tmp_path: Path) -> None:
    """Decode steps cost 10 ms + 1 ms per row: an ITL p99 ceiling of 30 ms holds while about
    20 requests decode together; the TTFT ceiling is loose, so the ITL objective binds."""
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 20\nobjectives = ["ttft_ms.p90 <= 5000", "itl_ms.p99 <= 30",'
                   ' "output_tokens_per_s >= 1"]\n')  # fmt: skip
    spec, floors = ceilings_only(load_slo(slo))
    assert floors == ["output_tokens_per_s >= 1"]
    cfg = RunConfig(rate_rps=1.0, duration_s=120, workload={"kind": "synthetic",
                    "prompt_tokens": 100, "output_tokens": 100})  # fmt: skip
    plan = plan_capacity(cfg, ServerConfig(max_num_seqs=64), MODEL, spec,
                         [1.0, 2.0, 4.0, 8.0, 16.0], peak_rps=100, gpus_per_replica=2,
                         gpu_hour_price=3.0)  # fmt: skip
    rate = plan.max_rate_rps
    assert rate is not None and 2.0 <= rate < 16.0
    assert plan.binding_objective is not None and plan.binding_objective.startswith("itl_ms.p99")
    assert plan.replicas == math.ceil(round(100 / rate, 9))
    assert plan.gpus == 2 * (plan.replicas or 0)
    cost = plan.cost_per_million_output_tokens
    assert cost == pytest.approx(3.0 * 2 / (plan.output_tokens_per_s * 3600) * 1e6)
    text = plan.to_text()
    assert "the SLO binds: itl_ms.p99" in text and "per million output tokens" in text


def test_capacity_simulate_command(tmp_path: Path) -> None:
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 20\nobjectives = ["ttft_ms.p90 <= 300", "itl_ms.p99 <= 40"]\n')
    argv = ["capacity", "--simulate", "--slo", str(slo), "--model", "llama-3-8b", "--hardware",
            "h100", "--prompt-tokens", "500", "--completion-tokens", "100", "--peak-rps", "50",
            "--gpu-hour-price", "2", "--max-num-seqs", "128", "--sim-duration", "60",
            "--json", str(tmp_path / "plan.json")]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "loadlab", *argv], text=True,
                          capture_output=True, env=env, timeout=300, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "req/s per replica" in done.stdout and "replicas" in done.stdout
    assert (tmp_path / "plan.json").is_file()


def test_levels_send_the_requests_the_slo_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With min_requests = 50, a 60 s level at 0.1 req/s sends 6: each low level was INVALID
    and the plan said the SLO binds at any load. Each level now sends at least 50."""
    from loadlab.cli import main

    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 50\nobjectives = ["ttft_ms.p90 <= 5000", "itl_ms.p99 <= 30"]\n')
    argv = ["capacity", "--simulate", "--slo", str(slo), "--model", "llama-3-8b", "--hardware",
            "h100", "--prompt-tokens", "500", "--completion-tokens", "100", "--sim-duration", "60",
            "--rates", "0.1,0.2,0.4", "--json", str(tmp_path / "plan.json")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "INVALID" not in out and "binds at any load" not in out
    assert "=> 0.4 req/s per replica" in out
    cfg = RunConfig(rate_rps=0.1, duration_s=60, workload={"kind": "synthetic"})
    assert enough_requests(cfg, 50).requests == 50 and enough_requests(cfg, 50).duration_s is None
    assert enough_requests(cfg.replace(rate_rps=1.0), 50) == cfg.replace(rate_rps=1.0)
