"""End to end against the real reference server (its "fake" preset: the real HTTP server,
engine and /metrics, with a model runner that needs no weights): ``loadlab run --scrape
--slo``, then ``slo``, ``compare`` and ``report`` on the files it wrote."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._analysis.server_metrics import server_series
from loadlab.cli import main
from loadlab.results import read_results

launch = pytest.importorskip("reference_server.launch")


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with launch.start_server(mode="continuous", preset="fake", timeout_s=90) as server:
        yield server.url


@pytest.mark.slow
def test_run_slo_compare_against_a_real_server(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slo = tmp_path / "slo.toml"
    slo.write_text(
        'min_requests = 20\nobjectives = ["ttft_ms.p50 <= 10000", "error_rate <= 0.5"]\n'
    )
    common = ["run", "--endpoint", server_url, "--rate", "20", "--requests", "30",
              "--prompt-tokens", "16", "--max-tokens", "8", "--no-progress",
              "--scrape", f"{server_url}/metrics", "--scrape-interval", "0.2",
              # The plumbing is under test, not this busy machine's event loop: a saturated
              # generator would (rightly) turn every exit code into 2.
              "--saturation-lag-ms", "100000"]  # fmt: skip
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main([*common, "--out", str(a), "--slo", str(slo)]) == 0
    assert "verdict: PASS (exit 0)" in capsys.readouterr().out
    assert main([*common, "--out", str(b), "--seed", "1"]) == 0

    res = read_results(a)
    assert sum(r.ok for r in res.records) == 30
    series = server_series(res.server_samples)
    assert {"queue_depth", "running_batch", "kv_cache_use"} <= set(series)
    # The server was seen working: its finished-requests counter grew between the scrapes (the
    # running-batch gauge can read 0 at every 0.2 s sample of a server busy 40 % of the time).
    finished = [
        sum(v for k, v in s["metrics"].items() if k.startswith("loadlab_server_requests_total"))
        for s in res.server_samples
    ]
    assert finished[-1] > finished[0]

    strict = tmp_path / "strict.toml"
    strict.write_text('min_requests = 20\nobjectives = ["ttft_ms.p50 <= 0.001"]\n')
    assert main(["slo", str(a), "--slo", str(strict)]) == 1
    assert main(["slo", str(a), "--slo", str(slo), "--junit", str(tmp_path / "j.xml")]) == 0

    # A run against itself: every change is exactly zero, nothing is significant.
    capsys.readouterr()
    assert main(["compare", str(a), str(a), "--fail-on-regression", "0", "--bootstrap", "200"]) == 0
    assert "none found" in capsys.readouterr().out
    code = main(["compare", str(a), str(b), "--labels", "seed0,seed1", "--bootstrap", "200"])
    out = capsys.readouterr().out
    assert code == 0 and "seed1 vs seed0" in out and "ttft_ms.p50" in out
    assert main(["report", str(b), "--csv", str(tmp_path / "b.csv")]) == 0
    assert len((tmp_path / "b.csv").read_text().splitlines()) == 31
