"""Calibration cache and the estimate-vs-measured table (pure parts; no model is run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadlab._capacity.calibrate import best_time_s, cache_path, load_or_calibrate
from loadlab._capacity.hardware import Hardware
from loadlab._capacity.measured import Comparison, format_table
from loadlab.cli import main


def test_best_time_is_the_fastest_repeat() -> None:
    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # durations 5, 2, 3 after no warm-up
    assert best_time_s(lambda: None, repeats=3, warmup=0, clock=lambda: next(ticks)) == 2.0


def test_cached_calibration_is_loaded_without_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOADLAB_CACHE_DIR", str(tmp_path))
    hw = Hardware("this-machine", 50e9, 10e9, 16e9, 1.0, 1.0, kind="cpu",
                  extra={"cache_version": 1})  # fmt: skip
    path = cache_path(host="h", threads=2)
    assert path == tmp_path / "this-machine-h-2t.json"
    path.write_text(json.dumps(hw.to_dict()))
    assert load_or_calibrate(path=path) == hw


def test_ratio_table() -> None:
    # predicted 110 ms vs measured 100 ms: ratio 1.10, +10 %; roofline 50 ms: ratio 0.50
    row = Comparison("decode", 8, 256, 0.100, 0.050, 0.110, flops=2e9, bytes=1e9,
                     parts={"matmul_s": 0.1})  # fmt: skip
    assert row.ratio == pytest.approx(1.1)
    assert row.error_pct == pytest.approx(10.0)
    hw = Hardware("this-machine", 40e9, 20e9, 16e9, 1.0, 1.0)
    text = format_table([row], hw)
    assert "1.10" in text and "+10.0%" in text and "0.50" in text
    # achieved: 2e9 FLOPs / 0.1 s = 20 GFLOP/s = 50 % of 40; 1e9 B / 0.1 s = 10 GB/s = 50 %
    assert "20.0 GFLOP/s (  50%)" in text
    assert "worst shaped error: 10.0 %" in text


def test_sweep_cli_rejects_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    slo = tmp_path / "slo.toml"
    slo.write_text('objectives = ["ttft_ms.p95 <= 500"]\n')
    base = ["sweep", "--endpoint", "http://127.0.0.1:9", "--duration", "1", "--slo", str(slo)]
    assert main(base) == 2
    assert "exactly one of --rates" in capsys.readouterr().err
    assert main([*base, "--rates", "4,2"]) == 2
    assert "rising" in capsys.readouterr().err
    assert main([*base, "--rates", "1,2", "--rate", "3"]) == 2
    assert "sets the load itself" in capsys.readouterr().err


def test_results_file_capacity_section() -> None:
    from loadlab._capacity.hardware import get_hardware
    from loadlab._capacity.models import get_model
    from loadlab._capacity.vs_run import compare_run
    from loadlab.records import RequestRecord
    from loadlab.results import Results

    ms = 1_000_000
    rec = RequestRecord("r1", sent_ns=0, chunk_ns=[100 * ms + i * 10 * ms for i in range(11)],
                        end_ns=201 * ms, prompt_tokens=1000, output_tokens=11,
                        output_tokens_source="usage")  # fmt: skip
    res = Results(records=[rec], config={"concurrency": 4}, duration_ns=300 * ms)
    hw = get_hardware("h100").derated(compute=1.0, bandwidth=1.0)
    ttft, tpot = compare_run(res, get_model("llama-3-8b"), hw)
    # prefill 1000 tokens: (2 * 7,504,924,672 * 1000 + 4 * 32 * 4096 * 500,500) FLOPs
    # = 15,272,255,488,000 / 989.4e12 = 15.436 ms, against a measured TTFT of 100 ms
    assert (ttft.what, ttft.size, ttft.measured_ms) == ("ttft", 1000, 100.0)
    assert ttft.predicted_ms == pytest.approx(15.436, abs=1e-3)
    # TPOT 100 ms / 10 = 10 ms; decode at batch 4, context 1000 + 11 / 2 -> 1005:
    # (15,009,849,344 + 4 * 1005 * 131,072) B / 3.35e12 = 4.6378 ms
    assert (tpot.size, tpot.measured_ms) == (4, 10.0)
    assert tpot.predicted_ms == pytest.approx(4.6378, abs=1e-4)


def test_a_cached_request_is_compared_with_the_prefill_of_its_uncached_tokens() -> None:
    from loadlab._capacity.hardware import get_hardware
    from loadlab._capacity.models import get_model
    from loadlab._capacity.vs_run import compare_run, format_run_table
    from loadlab.records import RequestRecord
    from loadlab.results import Results

    ms = 1_000_000
    recs = [RequestRecord(f"r{c}", sent_ns=0, chunk_ns=[20 * ms], end_ns=21 * ms, prompt_tokens=1000,
                          cached_prompt_tokens=c, output_tokens=1, output_tokens_source="usage")
            for c in (0, 800)]  # fmt: skip
    hw = get_hardware("h100").derated(compute=1.0, bandwidth=1.0)
    m = get_model("llama-3-8b")
    rows = compare_run(Results(records=recs, config={"concurrency": 1}, duration_ns=30 * ms), m, hw)
    # 200 new tokens after 800 cached: 2 * 7,504,924,672 * 200 + 4 * 32 * 4096 *
    # (800 * 200 + 200 * 201 / 2) = 3,096,394,137,600 FLOPs / 989.4e12 = 3.130 ms, less than
    # reading the weights and the KV: (15,009,849,344 + 1000 * 131,072) B / 3.35e12 = 4.5197 ms,
    # so the cached prefill is memory-bound (the uncached one, 15.436 ms, compute-bound)
    assert [(r.size, r.cached) for r in rows] == [(1000, 0), (1000, 800)]
    assert rows[0].predicted_ms == pytest.approx(15.436, abs=1e-3)
    assert rows[1].predicted_ms == pytest.approx(4.5197, abs=1e-4)
    assert "1000 tok, 800 cached" in format_run_table(rows, m, hw)
