"""Fitting step-time models: exact recovery, a black box recovered from simulated sweeps,
residuals, the fitted range, and the refusal to extrapolate silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadlab.config import RunConfig
from loadlab.results import write_results
from loadlab.simulate import LinearStepTime, ServerConfig, Simulator
from loadlab.simulate._fit import (
    StepPoint,
    extrapolation,
    fit_linear,
    fit_step_log,
    points_from_results,
    points_from_step_log,
)
from loadlab.simulate._steptime import RoleStepTime, model_from_dict
from loadlab.workloads import build_requests

TRUTH = LinearStepTime(base_s=0.012, per_prefill_token_s=4e-4, per_decode_token_s=1.5e-3,
                       per_pair_s=2e-8, per_kv_token_s=3e-6)  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


def truth_points() -> list[StepPoint]:
    pts = [StepPoint.prefill(p, float(TRUTH.step_s(p, 0, p * (p + 1) / 2, 0)))
           for p in (16, 64, 256, 1024)]  # fmt: skip
    for b in (1, 4, 16):
        for c in (64, 512):
            pts.append(StepPoint.decode(b, c, float(TRUTH.step_s(0, b, b * c, b * (c - 1)))))
    return pts


def test_fit_recovers_a_linear_model_exactly() -> None:
    model = fit_linear(truth_points(), "synthetic")
    for f in (
        "base_s",
        "per_prefill_token_s",
        "per_decode_token_s",
        "per_pair_s",
        "per_kv_token_s",
    ):
        assert getattr(model, f) == pytest.approx(getattr(TRUTH, f), rel=1e-6, abs=1e-12), f
    assert model.residuals["max_abs_error_pct"] < 1e-6
    assert model.fit_range == {"prompt_tokens": (16, 1024), "decode_batch": (1, 16),
                               "context_tokens": (64, 512)}  # fmt: skip
    again = model_from_dict(json.loads(json.dumps(model.to_dict())))
    assert again == model


def test_black_box_fit_from_a_simulated_sweep(tmp_path: Path) -> None:
    """The simulator plays the endpoint (continuous batching priced by TRUTH): a concurrency
    sweep of synthetic requests with drawn prompt lengths. The fit from those results files
    alone prices prefills and decode steps within 10 % of TRUTH in the range it saw."""
    files = []
    for c in (1, 2, 4, 8):
        wl = {"kind": "synthetic", "prompt_tokens": {"dist": "uniform", "low": 32, "high": 512},
              "output_tokens": 40}  # fmt: skip
        cfg = RunConfig(concurrency=c, requests=60, workload=wl, seed=c)
        out = Simulator(cfg, ServerConfig(max_num_seqs=16), TRUTH).run(build_requests(cfg))
        files.append(write_results(out.to_results(), tmp_path / f"c{c}.json"))
    from loadlab.results import read_results

    points = points_from_results(read_results(f) for f in files)
    assert {p.kind for p in points} == {"prefill", "decode"}
    model = fit_linear(points, "black box")
    for p in (64, 256, 500):
        want = TRUTH.step_s(p, 0, p * (p + 1) / 2, 0)
        assert model.step_s(p, 0, p * (p + 1) / 2, 0) == pytest.approx(want, rel=0.10)
    for b in (1, 4, 8):
        c = 300
        want = TRUTH.step_s(0, b, b * c, b * (c - 1))
        assert model.step_s(0, b, b * c, b * (c - 1)) == pytest.approx(want, rel=0.10)


def test_extrapolation_is_named() -> None:
    model = fit_linear(truth_points(), "synthetic")
    assert extrapolation(model, {"decode_batch": 20, "prompt_tokens": 1500}) == []
    msgs = extrapolation(model, {"decode_batch": 64, "prompt_tokens": 1500})
    assert msgs == ["decode_batch reached 64, the step-time model was fitted on 1-16"]
    assert extrapolation(TRUTH, {"decode_batch": 1e9}) == []  # set by hand: no range to hold


def test_simulate_refuses_to_extrapolate_silently(tmp_path: Path) -> None:
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps(fit_linear(truth_points(), "synthetic").to_dict()))
    base = ["simulate", "--step-model", str(fit), "--concurrency", "64", "--requests", "128",
            "--max-num-seqs", "64", "--out", str(tmp_path / "p.json")]  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for extra, code in (([], 2), (["--extrapolate"], 0)):
        done = subprocess.run([sys.executable, "-m", "loadlab", *base, *extra], text=True,
                              capture_output=True, env=env, timeout=120, cwd=ROOT)  # fmt: skip
        assert done.returncode == code, done.stderr
        assert "decode_batch reached 64" in done.stderr


def test_fit_command_prints_residuals_and_writes_the_model(tmp_path: Path) -> None:
    cfg = RunConfig(concurrency=1, requests=20, workload={"kind": "synthetic",
                    "prompt_tokens": {"dist": "uniform", "low": 32, "high": 512}, "output_tokens": 20})  # fmt: skip
    out = Simulator(cfg, ServerConfig(), TRUTH).run(build_requests(cfg))
    res = write_results(out.to_results(), tmp_path / "c1.json")
    cfg4 = cfg.replace(concurrency=4, requests=40)
    out4 = Simulator(cfg4, ServerConfig(), TRUTH).run(build_requests(cfg4))
    res4 = write_results(out4.to_results(), tmp_path / "c4.json")
    fit = tmp_path / "fit.json"
    argv = ["simulate", "--fit-results", str(res), str(res4), "--fit-out", str(fit)]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "loadlab", *argv], text=True,
                          capture_output=True, env=env, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "residuals: max |error|" in done.stdout and "fitted on:" in done.stdout
    assert model_from_dict(json.loads(fit.read_text())).source == "black box, 2 results files"


def _step_log(model: LinearStepTime, role: str = "engine", copies: int = 3) -> list[dict]:
    """A server step log whose every step takes what ``model`` says (3 alike per shape)."""
    shapes = [(p, 0, p * (p + 1) // 2, 0) for p in (16, 64, 256, 1024)]
    shapes += [(0, b, b * c, b * (c - 1)) for b in (1, 4, 16) for c in (64, 512)]
    shapes += [(p, b, p * (p + 1) // 2 + b * 100, b * 99) for p in (32, 200) for b in (2, 8)]
    log, t = [], 0
    for pre, dec, pairs, kv in shapes:
        for _ in range(copies):
            ns = round(float(model.step_s(pre, dec, pairs, kv)) * 1e9)
            log.append({"role": role, "rank": 0, "start_ns": t, "end_ns": t + ns,
                        "prefill_tokens": pre, "decode_tokens": dec, "attn_pairs": pairs,
                        "kv_read_tokens": kv})  # fmt: skip
            t += ns
    return log


def test_fit_from_a_server_step_log_recovers_its_model_mixed_steps_included() -> None:
    log = _step_log(TRUTH)
    points = points_from_step_log(log)
    assert {p.kind for p in points} == {"prefill", "decode", "mixed"}
    assert len(points) == 14  # one per shape
    # a decode shape seen fewer than 3 times is no point; a step with prompt tokens is one
    (one,) = points_from_step_log(log[:1])
    assert (one.features(), one.seconds) == (points[0].features(), points[0].seconds)
    decodes = [e for e in log if not e["prefill_tokens"]]
    assert points_from_step_log(decodes[:2]) == []
    model = fit_step_log(log, "synthetic")
    assert isinstance(model, LinearStepTime)
    for p, b in ((100, 0), (0, 8), (100, 8)):
        args = (p, b, p * (p + 1) / 2 + b * 300, b * 299)
        assert model.step_s(*args) == pytest.approx(TRUTH.step_s(*args), rel=1e-4)
    assert model.fit_range["decode_batch"] == (1, 16)
    assert model.fit_range["prompt_tokens"] == (16, 1024)


def test_disaggregated_step_log_fits_each_role_and_the_simulator_gives_each_worker_its_own(
    tmp_path: Path,
) -> None:
    slow = LinearStepTime(base_s=0.05, per_prefill_token_s=2e-3, per_decode_token_s=1e-3)
    log = _step_log(slow, "prefill") + _step_log(TRUTH, "decode")
    model = fit_step_log(log, "synthetic")
    assert isinstance(model, RoleStepTime)
    assert model.prefill.step_s(64, 0, 0, 0) == pytest.approx(slow.step_s(64, 0, 0, 0), rel=1e-4)
    assert model.decode.step_s(0, 4, 400, 396) == pytest.approx(
        TRUTH.step_s(0, 4, 400, 396), rel=1e-4
    )
    assert model_from_dict(json.loads(json.dumps(model.to_dict()))) == model
    cfg = RunConfig(rate_rps=6, duration_s=4, prompt_tokens=64, max_tokens=16, seed=3)
    server = ServerConfig(mode="disaggregated", num_kv_blocks=512, max_num_seqs=8)
    both = Simulator(cfg, server, RoleStepTime(slow, TRUTH)).run(build_requests(cfg))
    apart = Simulator(cfg, server, slow, decode_model=TRUTH).run(build_requests(cfg))
    assert [r.end_s for r in both.requests] == [r.end_s for r in apart.requests]
    assert both.requests[0].end_s != Simulator(cfg, server, TRUTH).run(
        build_requests(cfg)).requests[0].end_s  # fmt: skip
    # the command line: a saved step log in, the role model out
    (tmp_path / "steps.json").write_text(json.dumps(log))
    fit = tmp_path / "fit.json"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "loadlab", "simulate", "--fit-steps",
                           str(tmp_path / "steps.json"), "--fit-out", str(fit)], text=True,
                          capture_output=True, env=env, timeout=120, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "prefill workers: linear" in done.stdout and "decode workers: linear" in done.stdout
    assert isinstance(model_from_dict(json.loads(fit.read_text())), RoleStepTime)


def test_black_box_decode_points_leave_out_gaps_that_shared_a_step_with_a_prefill(
    tmp_path: Path,
) -> None:
    """Open loop, continuous batching: a prefill of another request often shares a decode
    step (a 256-token prompt makes that step ~8x a plain one). Gaps in which another
    request's first token came are those steps; the decode points leave them out, so the
    fit prices a plain decode step as TRUTH does (with them in, the median gap of a batch
    seen mostly around arrivals was a mixed step, and per-row cost came out far too high)."""
    from loadlab.results import read_results

    files = []
    for rate in (2.0, 6.0, 10.0):
        cfg = RunConfig(rate_rps=rate, duration_s=30.0, prompt_tokens=256, max_tokens=32,
                        workload={"kind": "synthetic"}, seed=int(rate))  # fmt: skip
        out = Simulator(cfg, ServerConfig(max_num_seqs=16), TRUTH).run(build_requests(cfg))
        files.append(write_results(out.to_results(), tmp_path / f"r{rate:g}.json"))
    points = points_from_results(read_results(f) for f in files)
    decode = [p for p in points if p.kind == "decode"]
    assert max(p.decode_tokens for p in decode) >= 8
    for p in decode:  # every point is a plain decode step of its batch, not a mixed one
        want = TRUTH.step_s(0, p.decode_tokens, p.attn_pairs, p.kv_read_tokens)
        assert p.seconds == pytest.approx(want, rel=0.15), p.label


def test_a_poor_fit_is_said_beside_its_residuals() -> None:
    """Steps that vary three-fold at one size (a busy machine) fit no line: the table warns
    instead of leaving a large error to be noticed; an exact fit does not."""
    from loadlab.simulate._fit import residual_table

    log = _step_log(TRUTH)
    for i, e in enumerate(log):  # every other shape three times slower, then three faster
        scale = 3.0 if (i // 3) % 2 else 1 / 3
        e["end_ns"] = e["start_ns"] + round((e["end_ns"] - e["start_ns"]) * scale)
    poor = fit_step_log(log, "noisy")
    assert poor.residuals["rms_error_pct"] > 25
    assert "WARNING: a poor fit" in residual_table(poor)
    assert "WARNING" not in residual_table(fit_step_log(_step_log(TRUTH), "exact"))
