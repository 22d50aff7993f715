"""compare: runs from seeded distributions, built directly (no server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadlab.cli import main
from loadlab.compare import _boot_quantile, _Resampler, compare
from loadlab.results import write_results
from loadlab.slo import parse_slo
from loadlab.testing.synth import make_results


def _run(seed: int, **kw: object) -> object:
    return make_results(800, seed=seed, tokens=8, **kw)


def test_same_setup_reports_no_significant_change() -> None:
    a, b = make_results(1000, seed=1, tokens=8), make_results(1000, seed=2, tokens=8)
    cmp = compare([a, b], ["a", "b"], n_boot=1000)
    assert all(r.note == "" for r in cmp.rows[:8])  # 1,000 requests: p99 rows are tested too
    assert [r.metric for r in cmp.rows][:2] == ["ttft_ms.p50", "ttft_ms.p99"]
    assert not any(r.significant[1] for r in cmp.rows), [
        (r.metric, r.change_pct[1], r.ci_pct[1]) for r in cmp.rows if r.significant[1]
    ]
    assert cmp.exit_code(fail_on_regression_pct=5) == 0


def test_ttft_30_percent_higher_is_a_regression() -> None:
    base, slow = _run(1), _run(3, ttft_scale=1.3)
    cmp = compare([base, slow], ["main", "pr"], n_boot=1000)
    rows = {r.metric: r for r in cmp.rows}
    p50 = rows["ttft_ms.p50"]
    assert p50.significant[1] and p50.worse(1) and 15 < (p50.change_pct[1] or 0) < 45
    assert p50.regression(1, 10) and not p50.regression(1, 60)
    assert not rows["itl_ms.p50"].significant[1]  # ITL did not change
    assert cmp.exit_code(fail_on_regression_pct=10) == 1
    assert cmp.exit_code(fail_on_regression_pct=60) == 0  # smaller than the gate's percentage
    assert cmp.exit_code(None) == 0  # no gate asked


def test_error_rate_and_goodput_rows() -> None:
    spec = parse_slo({"objectives": ["ttft_ms.p95 <= 10000"]})
    cmp = compare([_run(1), _run(2, failures=80)], ["a", "b"], slo=spec, n_boot=200)
    rows = {r.metric: r for r in cmp.rows}
    assert rows["error_rate"].values == (0.0, 0.1)
    assert rows["error_rate"].significant[1] and rows["error_rate"].regression(1, 10)
    assert rows["goodput_rps"].higher_is_worse is False


def test_saturated_run_makes_the_gate_invalid() -> None:
    sat = _run(2)
    sat.generator = {"saturated": True}
    cmp = compare([_run(1), sat], ["a", "b"], n_boot=200)
    assert cmp.exit_code(10) == 2 and "saturated" in cmp.warnings[0]


def test_small_runs_leave_tail_percentiles_untested() -> None:
    """A p99 of 40 requests is nearly their maximum, whose bootstrap is unreliable: such a
    row is shown but never called significant, however large its change."""
    base, slow = make_results(40, seed=1, tokens=4), make_results(40, seed=2, tokens=4)
    cmp = compare([base, slow], ["a", "b"], n_boot=200)
    p99 = {r.metric: r for r in cmp.rows}["ttft_ms.p99"]
    assert abs(p99.change_pct[1] or 0) > 50  # a big change by chance (hand-checked seeds)
    assert not p99.significant[1] and "needs >= 1000 samples" in p99.note
    assert cmp.exit_code(10) == 0


def test_cluster_bootstrap_matches_brute_force() -> None:
    """The windowed weighted quantile equals np.percentile(method="inverted_cdf") of the
    explicitly resampled data, replicate by replicate."""
    rng = np.random.default_rng(0)
    values = rng.exponential(size=600)
    cluster = np.repeat(np.arange(100), 6)
    res = _Resampler(100, 50, (7,))
    fast = _boot_quantile(values, cluster, 0.9, res)
    w = res.weights(0)
    for b in range(50):
        data = np.concatenate([values[cluster == k].repeat(w[b, k]) for k in range(100)])
        assert fast[b] == pytest.approx(np.percentile(data, 90, method="inverted_cdf"))


def test_compare_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_results(make_results(300, seed=1, tokens=4), tmp_path / "a.json")
    b = write_results(make_results(300, seed=3, tokens=4, ttft_scale=1.5), tmp_path / "b.json")
    args = ["compare", str(a), str(b), "--labels", "main,pr", "--bootstrap", "300"]
    code = main([*args, "--fail-on-regression", "10", "--markdown", str(tmp_path / "c.md")])
    out = capsys.readouterr().out
    assert code == 1 and "REGRESSION" in out and "pr vs main" in out
    assert "❌ **REGRESSION**" in (tmp_path / "c.md").read_text()
    assert main([*args]) == 0  # no gate, no failure
    assert main(["compare", str(a), str(a), "--labels", "x"]) == 2
    assert main(["compare", str(a), str(tmp_path / "nope.json")]) == 2
