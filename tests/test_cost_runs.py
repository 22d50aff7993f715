"""Prices on real runs: a run against the reference server (its prefix cache reports cached
tokens), a short sweep and a two-endpoint comparison show dollars per million output tokens
that each test recomputes from the records and the prices; cost SLO objectives pass and fail."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._report.cost import usd
from loadlab.cli import main
from loadlab.results import Results, read_results
from loadlab.selftest._fixed_server import FixedServerProcess

pytestmark = pytest.mark.slow  # real servers and runs
S = 1_000_000_000


def api_usd_per_mtok(res: Results, p_in: float, p_cached: float, p_out: float) -> float:
    """The API definition, written out: ok requests sent in the window, server usage."""
    lo, hi = res.measurement_window_ns()
    usd = tokens = 0.0
    for r in res.records:
        if r.ok and r.sent_ns is not None and lo <= r.sent_ns <= hi:
            assert r.prompt_tokens is not None and r.output_tokens is not None
            cached = r.cached_prompt_tokens or 0
            usd += (
                (r.prompt_tokens - cached) * p_in + cached * p_cached + r.output_tokens * p_out
            ) / 1e6
            tokens += r.output_tokens
    return usd / tokens * 1e6


def gpu_usd_per_mtok(res: Results, usd_per_hour: float) -> float:
    """The self-hosted definition: the window's hours x the price over its output tokens."""
    lo, hi = res.measurement_window_ns()
    tokens = sum(len([t for t in r.chunk_ns if lo <= t <= hi]) for r in res.records)
    return usd_per_hour * (hi - lo) / (3600 * S) / tokens * 1e6


@pytest.fixture(scope="module")
def reference_url() -> Iterator[str]:
    launch = pytest.importorskip("reference_server.launch")
    with launch.start_server(mode="continuous", preset="fake", timeout_s=90) as server:
        yield server.url


def test_a_run_prices_cached_input_as_cached_and_a_cost_slo_decides(
    reference_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    code = main(["run", "--endpoint", reference_url, "--api", "completions", "--concurrency", "2",
                 "--requests", "16", "--prefix-tokens", "64", "--prefixes", "1",
                 "--suffix-tokens", "16", "--cache-block-size", "16", "--max-tokens", "8",
                 "--cache-bust", "--price", "input=1.0,cached_input=0.1,output=4.0",
                 "--no-progress", "--saturation-lag-ms", "100000", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    res = read_results(out)
    assert res.config["pricing"] == {"*": {"usd_per_million_input_tokens": 1.0,
        "usd_per_million_cached_input_tokens": 0.1, "usd_per_million_output_tokens": 4.0}}  # fmt: skip
    cached = sum(r.cached_prompt_tokens or 0 for r in res.records)
    assert cached >= 15 * 64 * 0.9  # every request after the first finds the prefix cached
    expected = api_usd_per_mtok(res, 1.0, 0.1, 4.0)
    uncached = api_usd_per_mtok(res, 1.0, 1.0, 4.0)
    assert expected < uncached * 0.8  # cached tokens made a difference, priced as cached
    assert f"per million output tokens: {usd(expected)}" in printed
    assert "of them cached" in printed

    for op, factor, want in (("<=", 1.01, 0), ("<=", 0.99, 1), (">=", 0.5, 0)):
        slo = tmp_path / "slo.toml"
        slo.write_text(f'min_requests = 10\nobjectives = ["usd_per_million_output_tokens {op} '
                       f'{expected * factor:.6f}"]\n')  # fmt: skip
        assert main(["slo", str(out), "--slo", str(slo)]) == want, (op, factor)
    capsys.readouterr()
    # a run without prices cannot meet a cost objective, and says why; priced afterwards, it can
    bare = tmp_path / "bare.json"
    data = json.loads(out.read_text())
    data["config"]["pricing"] = {}
    bare.write_text(json.dumps(data))
    slo.write_text('min_requests = 10\nobjectives = ["usd_per_1k_requests <= 1000"]\n')
    assert main(["slo", str(bare), "--slo", str(slo)]) == 1
    assert "the run has no prices" in capsys.readouterr().out
    pricing = tmp_path / "pricing.toml"
    pricing.write_text("usd_per_million_input_tokens = 1.0\nusd_per_million_output_tokens = 4.0\n")
    assert main(["slo", str(bare), "--slo", str(slo), "--pricing", str(pricing)]) == 0


def test_a_sweep_states_the_cost_at_its_slo_max_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slo = tmp_path / "slo.toml"
    slo.write_text('min_requests = 2\nobjectives = ["error_rate <= 0.5"]\n')
    with FixedServerProcess(ttft_ms=10, itl_ms=5, tokens=8) as url:
        code = main(["sweep", "--endpoint", url, "--rates", "2,4", "--duration", "2",
                     "--bisect-steps", "0", "--slo", str(slo), "--max-tokens", "8",
                     "--inconclusive", "pass", "--arrival", "constant",
                     "--price", "gpu_hour=2.5,gpus=4", "--no-progress", "--tokenizer", "byte",
                     "--saturation-lag-ms", "100000", "--out-dir", str(tmp_path / "sw")])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    sweep = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert sweep["max_passing_load"] == 4.0
    for lv in sweep["levels"]:
        res = read_results(lv["path"])
        assert lv["usd_per_million_output_tokens"] == pytest.approx(gpu_usd_per_mtok(res, 10.0))
        lo, hi = res.measurement_window_ns()
        done = sum(1 for r in res.records if r.ok and lo <= r.chunk_ns[-1] <= hi)
        assert lv["usd_per_1k_requests"] == pytest.approx(
            10.0 * (hi - lo) / (3600 * S) / done * 1000
        )
    top = sweep["levels"][-1]
    assert (f"cost at the SLO-max load (4 requests/s): "
            f"{usd(top['usd_per_million_output_tokens'])} per million output tokens") in printed  # fmt: skip


def test_two_endpoints_compared_by_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pricing = tmp_path / "pricing.toml"
    pricing.write_text(
        "[endpoints.vendor]\nusd_per_million_input_tokens = 0.5\n"
        "usd_per_million_output_tokens = 1.5\n[endpoints.ours]\nusd_per_gpu_hour = 2.0\ngpus = 1\n"
    )
    out = tmp_path / "cmp.json"
    with (FixedServerProcess(ttft_ms=30, itl_ms=10, tokens=16) as slow,
          FixedServerProcess(ttft_ms=10, itl_ms=4, tokens=16) as fast):  # fmt: skip
        code = main(["run", "--endpoint", f"vendor={slow}", "--endpoint", f"ours={fast}",
                     "--rate", "6", "--duration", "6", "--arrival", "constant",
                     "--max-tokens", "16", "--pricing", str(pricing), "--tokenizer", "byte",
                     "--no-progress", "--saturation-lag-ms", "100000", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    vendor, ours = (
        read_results(tmp_path / "cmp-vendor.json"),
        read_results(tmp_path / "cmp-ours.json"),
    )
    want = [api_usd_per_mtok(vendor, 0.5, 0.5, 1.5), gpu_usd_per_mtok(ours, 2.0)]
    cmp = json.loads((tmp_path / "cmp.compare.json").read_text())
    rows = {r["metric"]: r for r in cmp["rows"]}
    row = rows["usd_per_million_output_tokens"]
    assert row["values"] == pytest.approx(want)
    assert row["ci_pct"][1] is not None  # an interval, as latency rows have
    lo, hi = row["ci_pct"][1]
    assert lo < hi and row["p_value"][1] is not None
    assert "usd_per_million_output_tokens" in printed
    # loadlab compare on the saved files, priced by label, gives the same values
    capsys.readouterr()
    code = main(["compare", str(tmp_path / "cmp-vendor.json"), str(tmp_path / "cmp-ours.json"),
                 "--labels", "vendor,ours", "--pricing", str(pricing), "--bootstrap", "300"])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("usd_per_million_output_tokens"))
    assert f"{want[0]:,.2f}" in line and f"{want[1]:,.2f}" in line
