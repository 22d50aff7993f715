"""Against the real reference server, the hit rate its counters
measure equals the one the workload expects from its own prompts within 2 percentage points;
the text, Markdown and HTML reports set them side by side with TTFT cached and uncached."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadlab._analysis.prefix_cache import prefix_cache_summary
from loadlab._report.html import render_html
from loadlab._report.markdown import render_verdict_markdown
from loadlab._slo import evaluate, parse_slo
from loadlab.cli import main
from loadlab.results import read_results

launch = pytest.importorskip("reference_server.launch")
pytestmark = pytest.mark.slow  # a server and five runs


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with launch.start_server(mode="continuous", preset="fake", timeout_s=90) as server:
        yield server.url


def run(url: str, out: Path, *extra: str, api: str = "completions") -> None:
    args = ["run", "--endpoint", url, "--api", api, "--concurrency", "4",
            "--requests", "48", "--prefix-tokens", "256", "--prefixes", "3",
            "--suffix-tokens", "40", "--cache-block-size", "16", "--max-tokens", "4",
            "--scrape", f"{url}/metrics", "--scrape-interval", "0.2", "--no-progress",
            "--saturation-lag-ms", "100000", "--out", str(out), *extra]  # fmt: skip
    assert main(args) == 0


# Each order once, each API once: the Messages API reports the cache as cache_read_input_tokens.
@pytest.mark.parametrize(
    ("order", "api"), [("grouped", "completions"), ("round_robin", "chat"), ("random", "anthropic")]
)
def test_measured_hit_rate_equals_expected(
    server_url: str, tmp_path: Path, order: str, api: str
) -> None:
    path = tmp_path / "run.json"
    run(server_url, path, "--cache-bust", "--prefix-order", order, api=api)
    pc = prefix_cache_summary(read_results(path))
    assert pc is not None and pc.expected_hit_rate is not None
    # 3 prefixes x 16 requests: 45 of 48 hit the 256-token prefix of a 296-token prompt
    assert abs(pc.expected_hit_rate - 45 * 256 / (48 * 296)) < 0.005
    assert pc.server_hit_rate is not None and pc.server_queries == 48 * 296
    assert abs(pc.server_hit_rate - pc.expected_hit_rate) <= 0.02
    assert pc.usage_hit_rate == pytest.approx(pc.server_hit_rate)
    assert pc.ttft_cached_ms.count == 45 and pc.ttft_uncached_ms.count == 3


def test_a_warm_rerun_is_flagged_and_reports_show_the_section(
    server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    run(server_url, first, "--seed", "5")
    run(server_url, second, "--seed", "5")  # same prompts: every prefix is cached already
    results = read_results(second)
    pc = prefix_cache_summary(results)
    assert pc is not None and pc.difference_pp is not None and pc.difference_pp > 2
    out = capsys.readouterr().out
    assert "expected hit rate" in out and "--cache-bust starts cold" in out
    html = render_html(results)
    assert "<h2>Prefix cache</h2>" in html and "TTFT, cached requests" in html
    verdict = evaluate(results, parse_slo({"objectives": ["error_rate <= 0.5"]}))
    assert "#### Prefix cache" in render_verdict_markdown(verdict, results)
