"""Length distributions: seeded moments, clamps, truncation, empirical files, errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from loadlab.workloads._lengths import DATASETS, parse_dist, sample_pairs
from loadlab.workloads._params import WorkloadError

N = 20_000


def draw(spec, *, integer=True, seed=0, n=N):
    d = parse_dist(spec, "prompt_tokens", integer=integer)
    rng = np.random.default_rng(seed)
    return d.sample_int(rng, n) if integer else d.sample(rng, n)


def test_fixed_number_and_table():
    assert set(draw(128, n=10)) == {128}
    assert set(draw({"dist": "fixed", "value": 7}, n=10)) == {7}


def test_uniform_bounds_and_mean():
    x = draw({"dist": "uniform", "low": 100, "high": 300})
    assert x.min() >= 100 and x.max() <= 300
    # mean 200, sd (200 / sqrt 12) / sqrt N = 0.41: 5 is > 10 standard errors
    assert abs(x.mean() - 200) < 5


def test_normal_moments_when_truncation_is_negligible():
    x = draw({"dist": "normal", "mean": 500, "std": 100})
    assert abs(x.mean() - 500) < 5  # standard error 0.7
    assert abs(x.std() - 100) < 5


def test_normal_is_truncated_not_clipped_at_one_token():
    # mean 0, std 10: clipping would put ~54 % of the mass on 1 (P(X < 1.5));
    # truncation redraws, so each value near the floor has only its own density
    x = draw({"dist": "normal", "mean": 0, "std": 10})
    assert x.min() >= 1
    assert (x == 1).mean() < 0.15
    # E[X | X > 0.5] for N(0, 10^2) is about 10 * phi(0.05) / (1 - Phi(0.05)) = 8.3
    assert 7.0 < x.mean() < 9.5


def test_lognormal_by_median_mean_and_mu():
    x = draw({"dist": "lognormal", "median": 400, "sigma": 0.5}, integer=False)
    assert abs(np.median(x) / 400 - 1) < 0.03
    y = draw({"dist": "lognormal", "mean": 500, "sigma": 0.5}, integer=False)
    assert abs(y.mean() / 500 - 1) < 0.03
    z = draw({"dist": "lognormal", "mu": math.log(400), "sigma": 0.5}, integer=False)
    assert abs(np.median(z) / 400 - 1) < 0.03
    assert parse_dist({"dist": "lognormal", "mean": 500, "sigma": 0.5}, "k").mean() == (
        pytest.approx(500)
    )


def test_exponential_mean_for_times():
    x = draw({"dist": "exponential", "mean": 3.0}, integer=False)
    assert x.min() >= 0
    assert abs(x.mean() - 3.0) < 0.1  # standard error 0.02


def test_clamps_min_and_max():
    x = draw({"dist": "lognormal", "median": 400, "sigma": 1.5, "min": 50, "max": 1000})
    assert x.min() == 50 and x.max() == 1000


def test_empirical_mean_matches_the_file():
    path = DATASETS["sharegpt"]
    with path.open() as f:
        col = [float(r["num_decode_tokens"]) for r in csv.DictReader(f)]
    x = draw({"dist": "empirical", "file": "sharegpt", "column": "num_decode_tokens"})
    assert abs(x.mean() / np.mean(col) - 1) < 0.02
    assert set(x.tolist()) <= {round(v) for v in col}


def test_azure_conv_lengths_are_the_shared_traces_columns():
    """The packaged copy is the trace's two length columns, row for row (README's stats)."""
    trace = Path(__file__).resolve().parents[2] / "../shared/data/traces"
    src = trace / "AzureLLMInferenceTrace_conv.csv"
    if not src.exists():
        pytest.skip("the shared traces are not next to this checkout")
    with src.open(newline="") as f:
        want = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    with DATASETS["azure_conv"].open(newline="") as f:
        got = [
            (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)
        ]
    assert got == want and len(got) == 19366
    out = np.array([b for _, b in got])
    assert round(out.mean()) == 211 and np.median(out) == 129


def test_empirical_scale_and_pairs_are_rows_of_the_file():
    half = draw({"dist": "empirical", "file": "arxiv", "scale": 0.5})
    full = draw({"dist": "empirical", "file": "arxiv"})
    assert abs(half.mean() / full.mean() - 0.5) < 0.02
    pairs = sample_pairs("arxiv", np.random.default_rng(0), 500)
    with DATASETS["arxiv"].open() as f:
        rows = {
            (int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f)
        }
    assert all((int(a), int(b)) in rows for a, b in pairs)


def test_seeded_sampling_is_reproducible():
    spec = {"dist": "lognormal", "median": 300, "sigma": 0.8}
    assert np.array_equal(draw(spec, seed=5, n=100), draw(spec, seed=5, n=100))
    assert not np.array_equal(draw(spec, seed=5, n=100), draw(spec, seed=6, n=100))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"dist": "lognormal", "sigma": 1}, "exactly one of mu, median, mean"),
        ({"dist": "lognormal", "median": 4, "mean": 5, "sigma": 1}, "exactly one of"),
        ({"dist": "gauss", "mean": 1}, "choose one of fixed, uniform"),
        ({"dist": "normal", "mean": 5, "sdt": 1}, "did you mean 'std'"),
        ({"dist": "uniform", "low": 9, "high": 3}, "low (9) must be <= high (3)"),
        ({"dist": "normal", "mean": 5, "std": 1, "min": 9, "max": 3}, "min (9) must be <= max (3)"),
        ({"dist": "empirical", "file": "sharegpt", "column": "nope"}, "no column 'nope'"),
        (0, "must be >= 1"),
        ("many", "give a number or a table"),
    ],
)
def test_bad_specs_name_the_key_and_fix(spec, message):
    with pytest.raises(WorkloadError, match="prompt_tokens") as info:
        parse_dist(spec, "prompt_tokens")
    assert message in str(info.value)
