"""compare: runs from seeded distributions, built directly (no server)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from loadlab._analysis.compare import _boot_quantile, _Resampler, compare
from loadlab._slo import parse_slo
from loadlab.cli import main
from loadlab.results import read_results, write_results
from tests.helpers.synth import make_results


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


@pytest.mark.parametrize("sizes", [[100], [30, 70]], ids=["one run", "two runs"])
def test_cluster_bootstrap_matches_brute_force(sizes: list[int]) -> None:
    """The windowed weighted quantile equals np.percentile(method="inverted_cdf") of the
    explicitly resampled data, replicate by replicate (with one run, or two runs drawn
    first)."""
    rng = np.random.default_rng(0)
    values = rng.exponential(size=600)
    cluster = np.repeat(np.arange(100), 6)
    res = _Resampler(sizes, 50, (7,))
    fast = _boot_quantile(values, cluster, 0.9, res)
    w = res.weights(0)
    for b in range(50):
        data = np.concatenate([values[cluster == k].repeat(w[b, k]) for k in range(100)])
        assert fast[b] == pytest.approx(np.percentile(data, 90, method="inverted_cdf"))


def test_two_level_weights_draw_runs_then_requests() -> None:
    """Each replicate draws the runs with replacement (their draws sum to the number of
    runs), then each drawn run's requests: a run's weights sum to its draws times its size."""
    res = _Resampler([3, 5, 0, 4], 400, (1,))  # the empty run adds nothing
    w = res.weights(0)
    assert w.shape == (400, 12)
    per_run = np.stack([w[:, :3].sum(1) / 3, w[:, 3:8].sum(1) / 5, w[:, 8:].sum(1) / 4], 1)
    assert np.allclose(per_run, np.round(per_run)) and (per_run.sum(1) == 3).all()
    assert (per_run == 0).any() and (per_run >= 2).any()  # runs are left out and repeated


def _setup(scales: list[float], seed: int) -> list[object]:
    return [make_results(600, seed=seed + i, tokens=4, ttft_scale=x) for i, x in enumerate(scales)]


def test_repeated_runs_count_the_spread_between_runs_as_noise() -> None:
    """Each setup's second run 30 % slower than its first (a machine whose speed moved), and
    the second setup 30 % slower than the first in each. Pooled into one file per setup, the
    requests call that significant; as two runs per setup (files that share a label), the
    runs are drawn too and it is not: two runs cannot tell such a change from the drift. A
    change far beyond the spread between runs still is significant."""
    a, b = _setup([1.0, 1.3], seed=10), _setup([1.3, 1.6], seed=20)

    def ttft(cmp: object) -> object:
        return {r.metric: r for r in cmp.rows}["ttft_ms.p50"]  # type: ignore[attr-defined]

    def pooled(runs: list[object]) -> object:
        return dataclasses.replace(runs[0], records=[x for r in runs for x in r.records])  # type: ignore[attr-defined]

    one_file = compare([pooled(a), pooled(b)], ["a", "b"], n_boot=500)
    assert ttft(one_file).significant[1] and ttft(one_file).change_pct[1] > 15
    grouped = compare([*a, *b], ["a", "a", "b", "b"], n_boot=500)
    assert grouped.labels == ("a", "b") and grouped.repeats == (2, 2)
    assert ttft(grouped).change_pct[1] == pytest.approx(ttft(one_file).change_pct[1])
    assert not ttft(grouped).significant[1], ttft(grouped).ci_pct[1]
    slower = _setup([2.0, 2.1], seed=30)
    real = compare([a[0], slower[0], a[1], slower[1]], ["a", "b", "a", "b"], n_boot=500)
    assert ttft(real).significant[1] and ttft(real).change_pct[1] > 50
    assert real.exit_code(fail_on_regression_pct=10) == 1


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


def test_only_labels_group_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two files of one name in two folders are two setups (named by their paths); files are
    grouped into one setup's runs only by an explicit shared label."""
    (tmp_path / "main").mkdir()
    (tmp_path / "pr").mkdir()
    a = write_results(make_results(300, seed=1, tokens=4), tmp_path / "main" / "run.json")
    b = write_results(make_results(300, seed=3, tokens=4), tmp_path / "pr" / "run.json")
    assert main(["compare", str(a), str(b), "--bootstrap", "200"]) == 0
    out = capsys.readouterr().out
    assert f"{b} vs {a}" in out
    assert main(["compare", str(a), str(a), "--bootstrap", "200"]) == 0  # the same file twice
    assert f"{a} #2 vs {a}" in capsys.readouterr().out
    assert (
        main(["compare", str(a), str(b), "--labels", "x,x"]) == 2
    )  # one setup: nothing to compare
    assert "at least two setups" in capsys.readouterr().err
    args = ["compare", str(a), str(b), str(b), str(a), "--labels", "m,p,p,m", "--bootstrap", "200"]
    assert main(args) == 0
    assert "m (2 runs) (baseline)" in capsys.readouterr().out


def test_runs_that_did_not_start_equally_cold_are_said_so_and_every_column_has_a_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs of one server, the second finding the first's prompts cached: the comparison
    says their hit rates differ (the gate is left as it is); alike runs get no such line."""
    from loadlab._report.comparison import _header

    def with_cache(seed: int, cached: int) -> Path:
        res = make_results(300, seed=seed, tokens=4)
        for r in res.records:
            r.prompt_tokens, r.cached_prompt_tokens = 100, cached
        return write_results(res, tmp_path / f"{seed}-{cached}.json")

    cold, warm = with_cache(1, 46), with_cache(3, 88)
    args = ["compare", str(cold), str(warm), "--labels", "a,b", "--bootstrap", "200"]
    assert main([*args, "--fail-on-regression", "50"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: prefix-cache hit rates differ (a 46.0 %, b 88.0 % of prompt tokens)" in out
    assert "--cache-bust" in out
    header = out.splitlines()[0].split()
    assert header[-1] == "verdict"
    alike = ["compare", str(cold), str(with_cache(3, 47)), "--bootstrap", "200"]
    assert main(alike) == 0
    assert "hit rates differ" not in capsys.readouterr().out
    cmp = compare([read_results(cold), read_results(warm)], ["a", "b"], n_boot=100)
    assert all(_header(cmp)) and cmp.valid() and cmp.to_dict()["cautions"]


@pytest.mark.parametrize("n", ["0", "-5", "99", "100001"])
def test_bootstrap_out_of_range_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n: str
) -> None:
    """--bootstrap 0 once gave [nan, nan] intervals and passed a +607 % regression."""
    a = write_results(make_results(300, seed=1, tokens=4), tmp_path / "a.json")
    b = write_results(make_results(300, seed=3, tokens=4, ttft_scale=7), tmp_path / "b.json")
    assert main(["compare", str(a), str(b), "--bootstrap", n, "--fail-on-regression", "10"]) == 2
    captured = capsys.readouterr()
    assert "--bootstrap must be a whole number from 100 to 100,000" in captured.err
    assert captured.out == ""  # refused before anything was read or printed


def test_a_gate_never_passes_a_change_it_cannot_judge() -> None:
    """A baseline whose TTFT is 0 (first token in the same ns as the send) has no finite
    relative change: the gate says not valid evidence instead of passing."""
    base = make_results(300, seed=1, tokens=4)
    for r in base.records:
        if r.ok:
            r.chunk_ns[0] = r.sent_ns  # type: ignore[assignment]
    cmp = compare([base, make_results(300, seed=3, tokens=4)], ["a", "b"], n_boot=200)
    ttft = {r.metric: r for r in cmp.rows}["ttft_ms.p50"]
    assert ttft.ci_pct[1] is not None and not np.isfinite(ttft.ci_pct[1][0])
    assert not ttft.significant[1]
    assert any("ttft_ms.p50: the bootstrap interval of the change is not finite" in w
               for w in cmp.warnings)  # fmt: skip
    assert cmp.exit_code(10) == 2 and cmp.exit_code(None) == 0


def test_crossing_counts_running_totals_below_the_target() -> None:
    """The block-wise search finds what a full running sum finds, row by row."""
    from loadlab._analysis.compare import _crossing

    rng = np.random.default_rng(3)
    for width in (1, 5, 256, 257, 1000):
        w = rng.poisson(1.0, size=(40, width))
        under = rng.integers(0, 5, 40)
        target = rng.uniform(0, width + 5, 40)
        cum = under[:, None] + np.cumsum(w, axis=1)
        naive = (cum < target[:, None]).sum(axis=1)
        got = _crossing(w, under, target)
        assert (np.where(naive == width, -1, naive) == got).all(), width


@pytest.mark.parametrize(("per", "runs", "q"), [(1, 1, 0.5), (5, 1, 0.9), (1, 3, 0.5)])
def test_poisson_bootstrap_has_the_distribution_of_the_full_one(
    per: int, runs: int, q: float
) -> None:
    """The windowed, grouped Poisson bootstrap of a quantile against the Poisson bootstrap
    done in full (a weight for every request of every replicate), over the same data: the
    replicates' spread and centre agree."""
    from loadlab._analysis.compare import _poisson_quantile

    rng = np.random.default_rng(11)
    k = 3000
    cluster = np.repeat(np.arange(k), per)
    values = rng.gamma(2.0, 10.0, k * per) + 5 * (cluster % 7)  # requests differ
    run_of = np.repeat(np.arange(runs), -(-k // runs))[:k]
    values += run_of[cluster] * 3.0  # and so do runs
    fast = _poisson_quantile(values, cluster, q, run_of, 3000, [5])
    order = np.argsort(values, kind="stable")
    v, c = values[order], cluster[order]
    full = np.empty(3000)
    for b in range(3000):
        drawn = rng.multinomial(runs, [1 / runs] * runs) if runs > 1 else np.ones(1)
        w = rng.poisson(drawn[run_of])[c]
        cum = np.cumsum(w)
        full[b] = v[min(int((cum < q * cum[-1]).sum()), v.size - 1)]
    assert np.std(fast) == pytest.approx(np.std(full), rel=0.12)
    assert abs(np.mean(fast) - np.mean(full)) < 0.15 * np.std(full)


def test_large_setups_take_the_poisson_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past EXACT_CELLS the comparison draws Poisson weights over a window: it finds the
    30 % regression and no change where there is none, as the full bootstrap does."""
    import loadlab._analysis.compare as cmp_module

    monkeypatch.setattr(cmp_module, "EXACT_CELLS", 1000)
    base, slow = _run(1), _run(3, ttft_scale=1.3)
    rows = {r.metric: r for r in compare([base, slow], ["main", "pr"], n_boot=1000).rows}
    assert rows["ttft_ms.p50"].regression(1, 10)
    assert not rows["itl_ms.p50"].significant[1] and not rows["tpot_ms.p50"].significant[1]
    a, b = _setup([1.0, 1.3], seed=10), _setup([1.3, 1.6], seed=20)
    grouped = compare([*a, *b], ["a", "a", "b", "b"], n_boot=500)
    assert not {r.metric: r for r in grouped.rows}["ttft_ms.p50"].significant[1]


@pytest.mark.parametrize(("m", "q"), [(2000, 0.5), (2000, 0.99), (1700, 0.9)])
def test_order_statistic_bootstrap_has_the_law_of_resampling(m: int, q: float) -> None:
    """One value a request (1,700 of 2,000 requests with one: the rest failed), with ties:
    the quantile drawn from its Beta law against the requests resampled and the quantile
    read off, replicate by replicate, over the same data: the distributions agree (their
    quantiles within Monte-Carlo noise, a two-sample Kolmogorov-Smirnov distance under 5 %)."""
    from loadlab._analysis.compare import _order_statistic_quantile

    rng = np.random.default_rng(4)
    k, b = 2000, 4000
    values = np.round(rng.gamma(2.0, 10.0, m), 1)  # ties: a tenth of a ms
    fast = _order_statistic_quantile(values, q, k, b, np.random.default_rng(5))
    slow = np.empty(b)
    for t in range(b):
        drawn = rng.integers(0, k, k)
        data = values[drawn[drawn < m]]  # requests m..k-1 hold no value
        slow[t] = np.percentile(data, q * 100, method="inverted_cdf")
    grid = np.union1d(fast, slow)
    cdf = [np.searchsorted(np.sort(x), grid, side="right") / b for x in (fast, slow)]
    assert np.abs(cdf[0] - cdf[1]).max() < 0.05
    for p in (0.025, 0.5, 0.975):
        assert abs(np.quantile(fast, p) - np.quantile(slow, p)) <= 0.25 * np.std(slow) + 0.1


def test_large_setups_keep_the_intervals_of_the_full_bootstrap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same comparison with every request resampled and with the large-setup draws (the
    order statistics' Beta law for TTFT, TPOT and E2E, Poisson weights for ITL): each row's
    interval ends agree within the Monte-Carlo noise of 2,000 replicates."""
    import loadlab._analysis.compare as cmp_module

    base, slow = make_results(3000, seed=1, tokens=8), make_results(3000, seed=3, tokens=8,
                                                                       ttft_scale=1.1)  # fmt: skip
    full = compare([base, slow], ["a", "b"], n_boot=2000)
    monkeypatch.setattr(cmp_module, "EXACT_CELLS", 1000)
    fast = compare([base, slow], ["a", "b"], n_boot=2000)
    for f, s in zip(full.rows, fast.rows, strict=True):
        if f.ci_pct[1] is None:
            assert s.ci_pct[1] is None
            continue
        width = f.ci_pct[1][1] - f.ci_pct[1][0]
        assert s.ci_pct[1] == pytest.approx(f.ci_pct[1], abs=0.2 * width), f.metric
        assert s.significant == f.significant, f.metric


def test_the_mean_of_many_seconds_is_drawn_from_its_normal_law() -> None:
    """Over 10,000 seconds of mildly skewed throughput the bootstrap mean is drawn from
    N(mean, sd / sqrt(n)), which matches resampling; few seconds, or heavily skewed ones,
    are resampled."""
    from loadlab._analysis.compare import _normal_mean

    rng = np.random.default_rng(8)
    x = rng.gamma(20.0, 10.0, 12_000)
    law = _normal_mean(x, 0.005)
    assert law is not None and law[0] == pytest.approx(x.mean())
    resampled = rng.choice(x, size=(400, x.size)).mean(axis=1)
    assert law[1] == pytest.approx(resampled.std(), rel=0.12)
    assert _normal_mean(x[:5000], 0.005) is None  # too few seconds
    assert _normal_mean(rng.pareto(2.5, 12_000), 0.005) is None  # too skewed
    assert _normal_mean(np.full(20_000, 3.0), 0.005) == (3.0, 0.0)


def test_fisher_exact_equals_scipy() -> None:
    from scipy import stats

    from loadlab._analysis.compare import _fisher_exact

    rng = np.random.default_rng(2)
    tables = [[[0, 10], [0, 10]], [[10, 0], [0, 10]], [[5, 95], [30, 70]],
              [[10_100, 989_900], [10_300, 989_700]], [[0, 1_000_000], [500, 999_500]]]  # fmt: skip
    tables += rng.integers(0, 60, (200, 2, 2)).tolist()
    for t in tables:
        if sum(t[0]) and sum(t[1]):
            assert _fisher_exact(t) == pytest.approx(stats.fisher_exact(t).pvalue, rel=1e-8), t


def test_poisson_thresholds_equal_scipys_cdf() -> None:
    from scipy import stats

    from loadlab._analysis.compare import _poisson_table

    for mean in range(1, 12):
        table = np.floor(stats.poisson.cdf(np.arange(mean * 4 + 40), mean) * 2.0**32)
        assert (_poisson_table(mean) == table[table < 2.0**32]).all(), mean


def test_normal_rank_bootstrap_of_clustered_values_matches_resampling() -> None:
    """Several values a request (ITL), 20,000 requests: the replicate ranks drawn from their
    normal law against the requests resampled, on the same data: centre and spread agree
    within Monte-Carlo noise. Too few requests for that law: None (the Poisson bootstrap)."""
    from loadlab._analysis.compare import _normal_rank_quantile

    rng = np.random.default_rng(1)
    k = 20_000
    cluster = np.repeat(np.arange(k), rng.integers(1, 30, k))
    values = rng.gamma(8.0, 2.5, cluster.size) + rng.gamma(2.0, 2.0, k)[cluster]
    sizes = np.bincount(cluster, minlength=k)
    fast = _normal_rank_quantile(values, cluster, 0.5, sizes, 8000, np.random.default_rng(2), 0.005)
    assert fast is not None
    full = np.concatenate(
        [_boot_quantile(values, cluster, 0.5, _Resampler([k], 2000, (s,))) for s in range(2)]
    )
    ranked = np.sort(values)
    fast_rank, full_rank = np.searchsorted(ranked, fast), np.searchsorted(ranked, full)
    assert np.std(fast_rank) == pytest.approx(np.std(full_rank), rel=0.06)
    assert abs(np.mean(fast_rank) - np.mean(full_rank)) < 0.1 * np.std(full_rank)
    few = cluster < 300
    small = _normal_rank_quantile(values[few], cluster[few], 0.5, sizes[:300], 100,
                                  np.random.default_rng(2), 0.005)  # fmt: skip
    assert small is None
