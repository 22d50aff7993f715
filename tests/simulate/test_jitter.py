"""The step-time spread (``LinearStepTime.jitter``): measured from a step log, drawn per step
by the simulator, and off on request (the same with and without the decode shortcut:
``test_disaggregated.test_shortcut_equals_step_by_step``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadlab.config import RunConfig
from loadlab.simulate import LinearStepTime, ServerConfig, Simulator
from loadlab.simulate._fit import JITTER_QUANTILES, fit_step_log, step_log_jitter
from loadlab.simulate._setup import step_model_from_args
from loadlab.simulate._steptime import RoleStepTime, model_from_dict, without_jitter
from loadlab.simulate._versus import curves_of
from loadlab.workloads import build_requests

from .test_disaggregated import MODEL, SKEWED

ROOT = Path(__file__).resolve().parents[2]


def entry(role: str, pre: int, dec: int, kv: int, ms: float, t: list[int]) -> dict[str, int | str]:
    start = t[0]
    t[0] += int(ms * 1e6) + 1000
    return {"role": role, "rank": 0, "start_ns": start, "end_ns": start + int(ms * 1e6),
            "prefill_tokens": pre, "decode_tokens": dec, "attn_pairs": pre * (pre + 1) // 2 + kv + dec,
            "kv_read_tokens": kv}  # fmt: skip


def step_log(role: str = "engine") -> list[dict[str, int | str]]:
    """Decode steps of 1 and 8 rows, each shape 10 steps at its median and 2 at twice it, and
    prefills of 64 tokens: the spread is the same ratio in every group."""
    t = [0]
    out = []
    for rows, ms in ((1, 10.0), (8, 20.0)):
        out += [entry(role, 0, rows, 80 * rows, ms, t) for _ in range(10)]
        out += [entry(role, 0, rows, 80 * rows, 2 * ms, t) for _ in range(2)]
    out += [entry(role, 64, 0, 0, 50.0 + i, t) for i in range(3)]
    out += [entry(role, 256, 0, 0, 150.0, t)]
    return out


def test_step_log_jitter_is_each_steps_ratio_to_its_shapes_median() -> None:
    jit = step_log_jitter(step_log())
    assert len(jit) == JITTER_QUANTILES
    assert list(jit) == sorted(jit)
    # 24 decode steps, 4 of them at twice their median; 3 prefills of 64 at 50-52 ms
    ratios = np.array(jit)
    assert np.median(ratios) == pytest.approx(1.0, abs=0.02)
    assert ratios.max() == pytest.approx(2.0)
    assert 0.10 < (ratios > 1.5).mean() < 0.20  # 4 of 27 steps
    model = fit_step_log(step_log(), "test")
    assert model.jitter == jit  # type: ignore[attr-defined]
    assert "p10-p90" in model.describe()


def test_a_role_model_keeps_each_roles_spread_and_a_file_keeps_it() -> None:
    log = step_log("prefill") + step_log("decode")
    model = fit_step_log(log, "test")
    assert isinstance(model, RoleStepTime)
    assert model.decode.jitter == step_log_jitter(log, "decode")  # type: ignore[attr-defined]
    back = model_from_dict(json.loads(json.dumps(model.to_dict())))
    assert isinstance(back, RoleStepTime)
    assert back.decode.jitter == pytest.approx(model.decode.jitter, abs=1e-4)  # type: ignore[attr-defined]
    plain = without_jitter(back)
    assert plain.prefill.jitter == () and plain.decode.jitter == ()  # type: ignore[attr-defined]


def test_a_factor_must_be_positive() -> None:
    with pytest.raises(ValueError, match="jitter"):
        LinearStepTime(base_s=0.01, jitter=(1.0, 0.0))


def load(mode: str, seed: int = 3) -> tuple[RunConfig, ServerConfig]:
    cfg = RunConfig(rate_rps=20.0, duration_s=20.0, prompt_tokens=64, max_tokens=32, seed=seed)
    return cfg, ServerConfig(mode=mode, max_num_seqs=16, num_kv_blocks=4096)


def itl(cfg: RunConfig, server: ServerConfig, model: LinearStepTime) -> dict[str, float]:
    res = Simulator(cfg, server, model).run(build_requests(cfg)).to_results()
    return curves_of({1.0: res})[1.0]["itl_ms"]


@pytest.mark.parametrize("mode", ["static", "continuous", "chunked", "disaggregated"])
def test_the_spread_moves_the_tail_not_the_median(mode: str) -> None:
    cfg, server = load(mode)
    plain, skewed = itl(cfg, server, MODEL), itl(cfg, server, SKEWED)
    # the median step is 0.9 of its price; one in five 1.6: the p90 gap is such a step
    assert skewed["p50"] == pytest.approx(0.9 * plain["p50"], rel=0.1)
    assert skewed["p90"] > 1.3 * plain["p90"]


def test_factors_of_one_change_nothing_and_the_seed_decides_the_draws() -> None:
    cfg, server = load("continuous")
    ones = dataclasses.replace(MODEL, jitter=(1.0,) * 10)
    assert itl(cfg, server, ones) == itl(cfg, server, MODEL)
    assert itl(cfg, server, SKEWED) == itl(cfg, server, SKEWED)  # same seed, same draws
    other = dataclasses.replace(cfg, seed=cfg.request_seed + 1)
    a = Simulator(cfg, server, SKEWED).run(build_requests(cfg)).to_results()
    b = Simulator(other, server, SKEWED).run(build_requests(cfg)).to_results()
    assert [r.chunk_ns for r in a.records] != [r.chunk_ns for r in b.records]


def test_step_jitter_off_prices_every_step_at_its_median(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "model.json"
    path.write_text(json.dumps(SKEWED.to_dict()), encoding="utf-8")
    ns = argparse.Namespace(step_model=str(path), step_jitter="on")
    assert step_model_from_args(ns).jitter == SKEWED.jitter  # type: ignore[attr-defined]
    ns.step_jitter = "off"
    assert step_model_from_args(ns).jitter == ()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--rate", "1", "--requests", "2"],
        ["capacity", "--simulate", "--slo", "SLO", "--prompt-tokens", "64",
         "--completion-tokens", "8", "--rates", "1"],
        # an endpoint nothing listens on: the model is refused before any level is measured
        ["sweep", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--slo", "SLO",
         "--rates", "1", "--predict"],
    ],
    ids=["simulate", "capacity", "sweep"],
)  # fmt: skip
def test_a_step_model_file_that_cannot_be_used_is_named(tmp_path, argv) -> None:  # type: ignore[no-untyped-def]
    """A negative factor, or no file at all: exit 2 with the file named, no traceback, and a
    sweep measures nothing first."""
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p90 <= 1000"]\n', encoding="utf-8")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**SKEWED.to_dict(), "jitter": [1.0, -1.0]}), encoding="utf-8")
    argv = [str(slo) if a == "SLO" else a for a in argv]
    for path, words in ((bad, "not a step-time model"), (tmp_path / "none.json", "cannot read")):
        out = tmp_path / "out"
        done = subprocess.run(
            [sys.executable, "-m", "loadlab", *argv, "--step-model", str(path),
             *(["--out-dir", str(out)] if argv[0] == "sweep" else [])],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr[-2000:]
        assert f"--step-model {path}" in done.stderr and words in done.stderr
        assert "Traceback" not in done.stderr
        assert not out.exists() or not any(out.glob("level-*.json"))
